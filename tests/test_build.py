"""The build (setup.py): an install over a built checkout compiles nothing it has built (the
README's test command after its set-up command), and what changed compiles again. The
rule is checked on setuptools' build_ext with a compiler that records its calls."""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest
from setuptools import Distribution, Extension
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def command(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("ifrtpy_setup", ROOT / "setup.py")
    setup_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_module)  # not as __main__: builds nothing
    cmd = setup_module.BuildExt(Distribution({"name": "example"}))
    cmd.initialize_options()
    cmd.build_lib, cmd.build_temp = str(tmp_path / "lib"), str(tmp_path / "temp")
    cmd.finalize_options()
    cmd.tree = str(tmp_path / "tree")
    cmd.editable_mode = True  # what pip's editable install sets
    cmd.compiled = []
    monkeypatch.setattr(build_ext, "build_extension", lambda self, ext: self.compiled.append(ext.name))
    monkeypatch.delenv("IFRTPY_REBUILD", raising=False)
    return cmd


def _tree(cmd, built_after_source: bool | None):
    """pkg/mod.c in the tree, and its module built after it, before it, or not at all."""
    source = pathlib.Path(cmd.tree, "pkg", "mod.c")
    source.parent.mkdir(parents=True)
    source.write_text("/* C */")
    if built_after_source is not None:
        module = pathlib.Path(cmd.tree, cmd.get_ext_filename("pkg.mod"))
        module.write_bytes(b"built")
        os.utime(source, (1000, 1000 if built_after_source else 3000))
        os.utime(module, (2000, 2000))
    return Extension("pkg.mod", ["pkg/mod.c"])


def test_a_module_built_after_its_source_is_reused_not_compiled(command):
    command.build_extension(_tree(command, built_after_source=True))
    assert command.compiled == []
    assert pathlib.Path(command.get_ext_fullpath("pkg.mod")).read_bytes() == b"built"


@pytest.mark.parametrize("built_after_source", [False, None], ids=["source changed", "not built"])
def test_a_changed_or_unbuilt_module_compiles(command, built_after_source):
    command.build_extension(_tree(command, built_after_source))
    assert command.compiled == ["pkg.mod"]


def test_ifrtpy_rebuild_compiles_everything(command, monkeypatch):
    monkeypatch.setenv("IFRTPY_REBUILD", "1")
    command.build_extension(_tree(command, built_after_source=True))
    assert command.compiled == ["pkg.mod"]


def test_the_modules_compile_on_every_core(command):
    assert command.parallel == (os.cpu_count() or 1)


def test_a_wheel_compiles_every_module(command):
    """A wheel is built against its own build environment, never from the tree's modules
    (they may have been built against another NumPy or PJRT header)."""
    command.editable_mode = False
    command.build_extension(_tree(command, built_after_source=True))
    assert command.compiled == ["pkg.mod"]


# -- the generated C: judged by its sources in the tree ------------------------------------------

@pytest.fixture
def setup_module():
    spec = importlib.util.spec_from_file_location("ifrtpy_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCES = {  # a module of the tree and what it cimports and includes, directly or not
    "ifrtpy/mod.pyx": 'from ifrtpy.dep cimport x\nfrom libc.stdint cimport int64_t\n'
                      'cimport numpy as cnp\ninclude "table.pxi"\n',
    "ifrtpy/mod.pxd": "cdef int y\n",
    "ifrtpy/dep.pxd": "from ifrtpy.deeper cimport z\ncdef int x\n",
    "ifrtpy/deeper.pxd": "cdef int z\n",
    "ifrtpy/table.pxi": "cdef int w = 0\n",
    # the build environment's own: installed anew by pip for every install
    "env/Cython/Includes/libc/stdint.pxd": "", "env/numpy/__init__.pxd": "",
}


def _sources(tree):
    """SOURCES written at time 1000, and mod.c generated from them at 2000."""
    for name, text in SOURCES.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.utime(path, (1000, 1000))
    (tree / "ifrtpy" / "mod.c").write_text("/* C */")
    os.utime(tree / "ifrtpy" / "mod.c", (2000, 2000))
    return str(tree / "ifrtpy" / "mod.pyx")


def test_the_c_sources_of_a_module_are_its_own_files_in_the_tree(setup_module, tmp_path):
    pyx = _sources(tmp_path)
    assert setup_module.tree_sources(pyx, str(tmp_path)) == {
        str(tmp_path / "ifrtpy" / name)
        for name in ("mod.pyx", "mod.pxd", "dep.pxd", "deeper.pxd", "table.pxi")}


def test_generated_c_newer_than_its_sources_is_current_whatever_the_environment(setup_module,
                                                                               tmp_path):
    """What pip's isolated build environment does at every install: its Cython's and
    NumPy's .pxd files are newer than the C (Cython itself would generate it again)."""
    pyx = _sources(tmp_path)
    for name in ("env/Cython/Includes/libc/stdint.pxd", "env/numpy/__init__.pxd"):
        os.utime(tmp_path / name, (3000, 3000))
    assert setup_module.c_is_current(pyx, str(tmp_path))


@pytest.mark.parametrize("changed", ["mod.pyx", "mod.pxd", "dep.pxd", "deeper.pxd", "table.pxi",
                                     "mod.c"])
def test_generated_c_older_than_one_of_its_sources_or_missing_is_generated_again(
        setup_module, tmp_path, changed):
    pyx = _sources(tmp_path)
    if changed == "mod.c":
        os.remove(tmp_path / "ifrtpy" / "mod.c")
    else:
        os.utime(tmp_path / "ifrtpy" / changed, (3000, 3000))
    assert not setup_module.c_is_current(pyx, str(tmp_path))


def test_every_cython_file_of_the_package_is_a_source_of_a_module(setup_module):
    """No .pxd or .pxi escapes the judgement (say, by a cimport of a form it does not read)."""
    judged = set().union(*(setup_module.tree_sources(str(ROOT / (name.replace(".", "/") + ".pyx")))
                           for name in setup_module.MODULES))
    files = {str(path) for pattern in ("*.pyx", "*.pxd", "*.pxi")
             for path in (ROOT / "ifrtpy").rglob(pattern)}
    assert files - judged == set()
