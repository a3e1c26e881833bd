"""Build of ifrtpy's Cython modules: the layer over the C API (ifrtpy._pjrt), the PjRt
backend's hot paths, and ExecuteResult.

The PJRT C API header is not part of this tree: it is taken from the ``xla-cpu-pjrt``
package (a build requirement), or from the directory named by ``IFRTPY_PJRT_INCLUDE_DIR``.
Nothing is linked against a PJRT library; plugins are loaded at run time with dlopen.
"""

import importlib.util
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = [f"ifrtpy._pjrt.{name}" for name in ("_base", "_kv", "_client", "_event", "_buffer", "_ffi", "_host_callback", "_executable", "_dlpack")]
MODULES += ["ifrtpy._execute_result", "ifrtpy._host_memory", "ifrtpy.backends._repeat", "ifrtpy.backends.pjrt._fastpath",
            "ifrtpy.backends.jax._fastpath"]


def _load_header_module():
    spec = importlib.util.spec_from_file_location(
        "_header", os.path.join(os.path.dirname(os.path.abspath(__file__)), "ifrtpy", "_pjrt", "_header.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


try:
    include_dir = _load_header_module().pjrt_include_dir()
except FileNotFoundError as e:
    raise SystemExit(str(e))

extensions = [
    Extension(
        name,
        [name.replace(".", "/") + ".pyx"],
        include_dirs=[include_dir, numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O2"],
        libraries=["dl"],
    )
    for name in MODULES
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": 3, "binding": True, "embedsignature": True},
        nthreads=os.cpu_count() or 1,
    )
)
