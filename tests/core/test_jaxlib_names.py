"""ifrtpy._jaxlib: the one place private jaxlib names are looked up, by jaxlib version."""

import ast
import importlib
import pathlib
import re

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
    for name in _jaxlib._LOCATIONS:  # jax's names too (jax is installed with the tests)
        assert _jaxlib._lookup(name) is not None, name
    assert _jaxlib.version_text().startswith("%d.%d." % _jaxlib.version()[:2])
    assert issubclass(_jaxlib.runtime_error_type(), Exception)
    assert isinstance(_jaxlib.backends_are_initialized(), bool)


def test_a_package_that_is_not_installed_is_not_reported_as_a_moved_name(monkeypatch):
    _jaxlib._lookup.cache_clear()
    monkeypatch.setitem(_jaxlib._LOCATIONS, "GSPMDSharding",
                        [((0, 10), "ifrtpy_no_such_package._src.x:GSPMDSharding")])
    try:
        with pytest.raises(ModuleNotFoundError):
            _jaxlib.gspmd_sharding([], None, None)
    finally:
        _jaxlib._lookup.cache_clear()


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


def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    return ".".join(("ifrtpy",) + path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: pathlib.Path, module_name: str) -> list[tuple[int, str, bool]]:
    """(line, module, from_import_base) for each module a .py file imports, relative
    imports resolved, ``from a import b`` giving both ``a`` (True) and ``a.b`` (False)."""
    found = []
    package = module_name if path.name == "__init__.py" else module_name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, False) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.append((node.lineno, base, True))
            found += [(node.lineno, f"{base}.{alias.name}", False) for alias in node.names]
    return found


def _strings(path: pathlib.Path) -> list[tuple[int, str]]:
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def _is_private(name: str) -> bool:
    top = name.split(".")
    return (top[0] == "jaxlib" and len(top) > 1 and top[1] != "mlir") or top[:2] == ["jax", "_src"]


# Source text that imports a private name (as given to a child ``python -c``), or a
# "module:attribute" / module name string such as importlib.import_module takes.
_PRIVATE_TEXT = re.compile(
    r"(^|[;\n]\s*)(from|import)\s+(jaxlib\b(?!\.mlir\b)|jax\._src\b)"
    r"|^\s*(jaxlib\.(?!mlir\b)|jax\._src\b)[\w.]*(:\w*)?\s*$")


def test_no_module_but_ifrtpy_jaxlib_imports_private_jaxlib_names():
    """Private jaxlib names (anything but jaxlib.mlir) and jax's internals (jax._src) are
    reached only through ifrtpy/_jaxlib.py, the version switch: no import (at any depth,
    relative or by importlib) and no import line handed to a child process elsewhere."""
    root = pathlib.Path(ifrtpy.__file__).parent
    offenders = []
    for path in [*root.rglob("*.py"), *root.rglob("*.pyx"), *root.rglob("*.pxd")]:
        if path == root / "_jaxlib.py":
            continue
        where = path.relative_to(root)
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0].strip()
            if code.startswith(("from jaxlib", "import jaxlib")) and "jaxlib.mlir" not in code:
                offenders.append(f"{where}:{line_no}: {line.strip()}")
            if "_mlir_libs" in code or "jax._src" in code:
                offenders.append(f"{where}:{line_no}: {line.strip()}")
        if path.suffix != ".py":
            continue
        for line_no, name, from_base in _imports(path, _module_name(root, path)):
            if (_is_private(name) and not from_base) or (name == "jaxlib" and not from_base):
                offenders.append(f"{where}:{line_no}: imports {name}")
        for line_no, text in _strings(path):
            if _PRIVATE_TEXT.search(text):
                offenders.append(f"{where}:{line_no}: string {text[:80]!r}")
    assert sorted(set(offenders)) == []


def test_the_jax_backend_has_no_module_of_its_own_private_names():
    """ifrtpy.backends.jax._jaxlib was folded into ifrtpy._jaxlib: gone, and imported nowhere
    (the package, the tests and the benchmarks)."""
    removed = "ifrtpy.backends.jax._jaxlib"
    root = pathlib.Path(ifrtpy.__file__).parent
    assert not (root / "backends" / "jax" / "_jaxlib.py").exists()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(removed)
    offenders = [f"{path.relative_to(root)}:{line_no}: imports {name}"
                 for path in root.rglob("*.py")
                 for line_no, name, _ in _imports(path, _module_name(root, path)) if name == removed]
    this_file = pathlib.Path(__file__).resolve()
    tests = this_file.parents[1]
    others = [*tests.rglob("*.py")]
    if (tests.parent / "benchmarks").is_dir():
        others += (tests.parent / "benchmarks").rglob("*.py")
    pattern = re.compile(r"ifrtpy\.backends\.jax\._jaxlib\b"
                         r"|from\s+ifrtpy\.backends\.jax\s+import\b[^\n]*\b_jaxlib\b")
    for path in others:
        if path.resolve() == this_file:
            continue
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line.split("#")[0]):
                offenders.append(f"{path}:{line_no}: {line.strip()}")
    assert offenders == []
