"""Build of ifrtpy's Cython modules: the layer over the C API (ifrtpy._pjrt), the PjRt
backend's hot paths, and ExecuteResult.

The PJRT C API header is not part of this tree: it is taken from the ``xla-cpu-pjrt``
package (a build requirement), or from the directory named by ``IFRTPY_PJRT_INCLUDE_DIR``.
Nothing is linked against a PJRT library; plugins are loaded at run time with dlopen.

The extensions compile on every core at once, and an install reuses what an earlier one
built: an editable install leaves each compiled module in the tree, and a module whose C
source is not newer than it is copied instead of compiled again (``pip install -e
".[test]"`` after ``pip install -e .`` compiles nothing). The C is generated again only
when it is older than one of its sources in the tree: its .pyx and the .pxd and .pxi of
ifrtpy it cimports or includes (:func:`c_is_current`). Cython's own judgement would also
count its bundled .pxd files (``posix/dlfcn.pxd``) and NumPy's, which pip's isolated build
environment installs anew for every install, so every install would compile everything.
Only editable and in-place builds reuse modules: a wheel compiles every module against its
own build environment (the tree's modules may have been built against another NumPy or
PJRT header). ``IFRTPY_REBUILD=1`` generates and compiles everything.
"""

import importlib.util
import os
import re
import shutil

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))

MODULES = [f"ifrtpy._pjrt.{name}" for name in ("_base", "_kv", "_client", "_event", "_buffer", "_ffi", "_host_callback", "_executable", "_dlpack")]
MODULES += ["ifrtpy._execute_result", "ifrtpy._host_memory", "ifrtpy.backends._array_fields", "ifrtpy.backends.pjrt._array_storage",
            "ifrtpy.backends.pjrt._execute_launch",
            "ifrtpy.backends.jax._fastpath"]


class BuildExt(build_ext):
    """setuptools' build_ext, on every core, reusing the modules built in the tree."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    #: The checkout, where an editable install leaves each compiled module.
    tree = HERE

    def build_extension(self, ext):
        built = self.get_ext_fullpath(ext.name)
        in_tree = os.path.join(self.tree, self.get_ext_filename(ext.name))
        sources = [os.path.join(self.tree, s) for s in ext.sources]
        editable = self.inplace or getattr(self, "editable_mode", False)
        if (not editable or self.force or os.environ.get("IFRTPY_REBUILD")
                or not os.path.exists(in_tree)
                or any(os.path.getmtime(s) > os.path.getmtime(in_tree) for s in sources)):
            return super().build_extension(ext)
        if os.path.abspath(built) != os.path.abspath(in_tree):
            os.makedirs(os.path.dirname(built), exist_ok=True)
            shutil.copy2(in_tree, built)


#: ``cimport a.b``, ``from a.b cimport ...`` and ``include "x.pxi"`` at a line's start.
_CIMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+cimport|cimport[ \t]+([\w.]+))", re.M)
_INCLUDE = re.compile(r"""^[ \t]*include[ \t]+["']([^"']+)["']""", re.M)


def tree_sources(pyx: str, tree: str = HERE, package: str = "ifrtpy") -> set[str]:
    """``pyx`` and the Cython files of ``package`` under ``tree`` that it cimports or
    includes, directly or through one another (a cimport of another package's, ``libc``'s
    or ``numpy``'s, is not the tree's)."""
    found, todo = set(), [os.path.abspath(pyx)]
    while todo:
        path = todo.pop()
        if path in found or not os.path.exists(path):
            continue
        found.add(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for match in _CIMPORT.finditer(text):
            module = match.group(1) or match.group(2)
            if module.split(".")[0] == package:
                todo.append(os.path.join(tree, *module.split(".")) + ".pxd")
        todo += [os.path.join(os.path.dirname(path), name) for name in _INCLUDE.findall(text)]
        if path.endswith(".pyx"):  # its own declarations
            todo.append(os.path.splitext(path)[0] + ".pxd")
    return found


def c_is_current(pyx: str, tree: str = HERE) -> bool:
    """Whether the C that Cython generated from ``pyx`` exists and is not older than any
    of its sources in the tree (:func:`tree_sources`): then it is compiled as it is."""
    c = os.path.splitext(pyx)[0] + ".c"
    return os.path.exists(c) and all(
        os.path.getmtime(source) <= os.path.getmtime(c) for source in tree_sources(pyx, tree))


def _load_header_module():
    spec = importlib.util.spec_from_file_location(
        "_header", os.path.join(os.path.dirname(os.path.abspath(__file__)), "ifrtpy", "_pjrt", "_header.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extensions():
    import numpy

    try:
        include_dir = _load_header_module().pjrt_include_dir()
    except FileNotFoundError as e:
        raise SystemExit(str(e))
    return [
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


if __name__ == "__main__":  # setuptools runs the file so; tests import BuildExt alone
    from Cython.Build import cythonize

    extensions = _extensions()
    current = [] if os.environ.get("IFRTPY_REBUILD") else [
        e for e in extensions if c_is_current(os.path.join(HERE, e.sources[0]))]
    for extension in current:  # its C as it is: Cython would judge it by its own files too
        extension.sources = [os.path.splitext(extension.sources[0])[0] + ".c"]
    stale = [e for e in extensions if e not in current]
    generated = cythonize(
        stale,
        compiler_directives={"language_level": 3, "binding": True, "embedsignature": True},
        nthreads=os.cpu_count() or 1,
        force=bool(os.environ.get("IFRTPY_REBUILD")),
    ) if stale else []
    setup(cmdclass={"build_ext": BuildExt}, ext_modules=current + generated)
