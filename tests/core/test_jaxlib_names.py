"""ifrtpy._jaxlib: the one place private jaxlib names are looked up, by jaxlib version.

Private attributes: a ``x._name`` read outside the switch whose name ifrtpy itself does not
define (no module, class, function or assignment of ifrtpy's makes it) is another
package's; the few that are not jax's (the standard library's, pytest's) are listed by
owner."""

import ast
import functools
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
    for name, places in _jaxlib._LOCATIONS.items():  # jax's too (installed with the tests)
        if _jaxlib.version() >= places[-1][0]:
            assert _jaxlib._lookup(name) is not None, name
        else:  # a name of a newer jaxlib
            with pytest.raises(errors.UnimplementedError, match=f"has no {name}"):
                _jaxlib._lookup(name)
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


def test_the_switch_tells_a_patch_release_from_its_minor(monkeypatch):
    """Whole version tuples: jaxlib 0.12.1's kernels and jax's new single-device sharding
    constructor are not looked for in 0.12.0."""
    monkeypatch.setattr(_jaxlib, "version", lambda: (0, 12, 0))
    with pytest.raises(errors.UnimplementedError, match="jaxlib .* has no cpu_math"):
        _jaxlib._location("cpu_math")
    assert _jaxlib._location("make_single_device_sharding") == "jax.sharding:SingleDeviceSharding"
    monkeypatch.setattr(_jaxlib, "version", lambda: (0, 12, 1))
    assert _jaxlib._location("cpu_math") == "jaxlib.cpu._math:"
    assert _jaxlib._location("make_single_device_sharding").endswith(":make_single_device_sharding")


def test_jaxlib_s_cpu_kernels_include_its_math_module_where_it_has_one():
    kernels = _jaxlib.ffi_kernels("cpu")
    assert kernels  # LAPACK's at least, on every supported jaxlib
    assert ("cpu_lgamma_ffi" in kernels) == (_jaxlib.version() >= (0, 12, 1))


def _pair(monkeypatch, jax, jaxlib, requires=None):
    """jax_problem's view of an installed pair (package metadata only)."""
    versions = {"jax": jax, "jaxlib": jaxlib}
    monkeypatch.setattr(_jaxlib, "_installed", versions.get)
    monkeypatch.setattr(_jaxlib.importlib.metadata, "requires",
                        lambda name: [requires or f"jaxlib<={jax},>={jax}", "numpy>=2"])
    _jaxlib.jax_problem.cache_clear()
    try:
        return _jaxlib.jax_problem()
    finally:
        _jaxlib.jax_problem.cache_clear()


def test_a_jax_and_jaxlib_that_cannot_work_together_are_named_with_the_fix(monkeypatch):
    problem = _pair(monkeypatch, "0.12.1", "0.12.0.1")
    assert problem.fatal
    assert "jax 0.12.1 cannot work with jaxlib 0.12.0.1" in problem.message
    assert 'pip install "jax==0.12.1" "jaxlib<=0.12.1,>=0.12.1"' in problem.message
    assert _pair(monkeypatch, "0.11.0", None).fatal  # jaxlib missing
    assert _pair(monkeypatch, "0.9.0", "0.9.0").fatal  # older than supported
    assert _pair(monkeypatch, "0.11.2", "0.11.2") is None
    assert _pair(monkeypatch, "0.12.0.1", "0.12.0.1", "jaxlib<=0.12.0.1,>=0.12.0") is None
    assert _pair(monkeypatch, None, "0.12.1") is None  # jaxlib alone: ifrtpy needs no jax


def test_a_jax_newer_than_tested_is_named_with_the_tested_one(monkeypatch):
    problem = _pair(monkeypatch, "0.13.0", "0.13.0")
    tested = ".".join(map(str, _jaxlib.NEWEST_TESTED))
    assert not problem.fatal and "newer than any ifrtpy was tested with" in problem.message
    assert f'pip install "jax=={tested}" "jaxlib=={tested}"' in problem.message


def test_the_bridge_refuses_a_broken_pair_and_warns_of_an_untested_one(monkeypatch):
    from ifrtpy.interop import jax as bridge

    monkeypatch.setattr(_jaxlib, "jax_problem", lambda: _jaxlib.JaxProblem("broken pair", True))
    with pytest.raises(errors.FailedPreconditionError, match="broken pair"):
        bridge.to_jax(None)
    with pytest.raises(errors.FailedPreconditionError, match="broken pair"):
        bridge.from_jax(None)
    monkeypatch.setattr(_jaxlib, "jax_problem", lambda: _jaxlib.JaxProblem("untested jax", False))
    _jaxlib._warn_untested.cache_clear()
    with pytest.warns(RuntimeWarning, match="untested jax"):
        _jaxlib.check_jax()
    _jaxlib._warn_untested.cache_clear()


def test_info_names_the_problem(monkeypatch, capsys):
    from ifrtpy.cli import info

    monkeypatch.setattr(_jaxlib, "jax_problem", lambda: _jaxlib.JaxProblem("broken pair: pip install x", True))
    info.print_versions(None)
    assert "ERROR: broken pair: pip install x" in capsys.readouterr().out


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


# -- private attributes of jax's objects ----------------------------------------------------

ROOT = pathlib.Path(ifrtpy.__file__).parent
SWITCH = ROOT / "_jaxlib.py"

#: Private names of other packages than jax and jaxlib that ifrtpy uses, by owner.
OTHER_PACKAGES_PRIVATE = {
    "_getframe": "sys", "_exit": "os", "_actions": "argparse", "_fixtureinfo": "pytest",
}


def _sources() -> list[pathlib.Path]:
    return sorted(p for p in ROOT.rglob("*") if p.suffix in (".py", ".pyx", ".pxd")
                  and p != SWITCH)


@functools.lru_cache(maxsize=None)
def _defined_by_ifrtpy() -> frozenset[str]:
    """Every name ifrtpy defines: modules, classes, functions, assignments, arguments,
    imports (``.py``), and ``.pyx``/``.pxd``/``.pyi`` names by their declarations."""
    names = {p.stem for p in ROOT.rglob("*")}
    for path in ROOT.rglob("*"):
        if path.suffix == ".py":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
                elif isinstance(node, ast.alias):
                    names.add((node.asname or node.name).split(".")[0])
                elif isinstance(node, ast.arg):
                    names.add(node.arg)
        elif path.suffix in (".pyx", ".pxd", ".pyi"):
            text = path.read_text()
            names.update(re.findall(r"\b(_\w+)\s*(?:=|:|\()", text))
            names.update(re.findall(r"\b(?:def|class|cdef|cpdef)\b[\w\s*]*?\b(_\w+)", text))
    return frozenset(names)


def _private_attributes(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, name) of each ``x._name`` read in ``path`` (not dunders)."""
    text = path.read_text()
    if path.suffix == ".py":
        return [(node.lineno, node.attr) for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__") and not isinstance(node.ctx, ast.Store)]
    return [(text.count("\n", 0, m.start()) + 1, m.group(1))
            for m in re.finditer(r"\.(_(?!_)\w+)", text)]


def test_no_module_but_the_switch_reads_a_private_attribute_of_another_package():
    ours = _defined_by_ifrtpy() | set(OTHER_PACKAGES_PRIVATE)
    found = [f"{p.relative_to(ROOT.parent)}:{line}: .{name}"
             for p in _sources() for line, name in _private_attributes(p) if name not in ours]
    assert not found, ("private attributes ifrtpy does not define (jax's?) read outside "
                       "ifrtpy/_jaxlib.py:\n" + "\n".join(found))


def test_the_attribute_check_knows_jax_s_private_names_from_ifrtpy_s():
    """Not vacuous: the switch's own reads of jax's privates are ones ifrtpy does not
    define, so the same read elsewhere would fail the test above."""
    switch_reads = {name for _, name in _private_attributes(SWITCH)}
    assert {"_device_assignment", "_to_xla_hlo_sharding",
            "_addressable_device_assignment"} <= switch_reads - _defined_by_ifrtpy()
