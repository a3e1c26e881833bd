"""ifrtpy._jaxlib: the one place private jaxlib names are looked up, by jaxlib version."""

import pathlib

import pytest

import ifrtpy
from ifrtpy import _jaxlib, errors


def test_installed_jaxlib_is_supported_and_every_name_resolves():
    assert _jaxlib.version()[:2] in _jaxlib.SUPPORTED
    xc = _jaxlib.xla_client()
    assert xc.CompileOptions().SerializeAsString()
    assert hasattr(_jaxlib.hlo_module_class(), "from_serialized_hlo_module_proto")
    from jaxlib.mlir import ir

    registry = ir.DialectRegistry()
    _jaxlib.register_jax_dialects(registry)


def test_a_version_older_than_supported_is_refused(monkeypatch):
    _jaxlib._lookup.cache_clear()
    monkeypatch.setattr(_jaxlib, "version", lambda: (0, 9, 0))
    try:
        with pytest.raises(errors.UnimplementedError, match="older than any ifrtpy supports"):
            _jaxlib.xla_client()
    finally:
        _jaxlib._lookup.cache_clear()


def test_a_moved_name_is_reported_with_the_version(monkeypatch):
    _jaxlib._lookup.cache_clear()
    monkeypatch.setitem(_jaxlib._LOCATIONS, "HloModule", [((0, 10), "jaxlib._moved_away:HloModule")])
    try:
        with pytest.raises(errors.UnimplementedError, match=r"jaxlib \d+\.\d+.* has no jaxlib._moved_away"):
            _jaxlib.hlo_module_class()
    finally:
        _jaxlib._lookup.cache_clear()


def test_no_module_but_ifrtpy_jaxlib_imports_private_jaxlib_names():
    root = pathlib.Path(ifrtpy.__file__).parent
    offenders = []
    for path in [*root.rglob("*.py"), *root.rglob("*.pyx")]:
        if path.name == "_jaxlib.py":
            continue
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0].strip()
            if code.startswith(("from jaxlib", "import jaxlib")) and "jaxlib.mlir" not in code \
                    and "jaxlib import version" not in code:
                offenders.append(f"{path.relative_to(root)}:{line_no}: {line.strip()}")
            if "_mlir_libs" in code:
                offenders.append(f"{path.relative_to(root)}:{line_no}: {line.strip()}")
    assert offenders == []
