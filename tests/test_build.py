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
