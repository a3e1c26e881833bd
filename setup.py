"""Build of ifrtpy's Cython layer (ifrtpy._pjrt).

The PJRT C API header is not part of this tree: it is taken from the ``xla-cpu-pjrt``
package (a build requirement), or from the directory named by ``IFRTPY_PJRT_INCLUDE_DIR``.
Nothing is linked against a PJRT library; plugins are loaded at run time with dlopen.
"""

import importlib.util
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = ["_base", "_client", "_buffer", "_executable"]


def pjrt_include_dir() -> str:
    env = os.environ.get("IFRTPY_PJRT_INCLUDE_DIR")
    candidates = [env] if env else []
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is not None and spec.submodule_search_locations:
        candidates += [os.path.join(p, "include") for p in spec.submodule_search_locations]
    for directory in candidates:
        if os.path.isfile(os.path.join(directory, "pjrt_c_api.h")):
            return directory
    raise SystemExit(
        "pjrt_c_api.h not found: install the build requirement xla-cpu-pjrt, or set "
        "IFRTPY_PJRT_INCLUDE_DIR to a directory holding the header"
    )


extensions = [
    Extension(
        f"ifrtpy._pjrt.{name}",
        [f"ifrtpy/_pjrt/{name}.pyx"],
        include_dirs=[pjrt_include_dir(), numpy.get_include()],
        extra_compile_args=["-O2"],
        libraries=["dl"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
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
