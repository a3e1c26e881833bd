"""The package's layers, read from its own imports (README.md, "Layout").

Every import in ``ifrtpy/`` counts: module level and inside functions, in ``.py`` and in
the Python imports of ``.pyx`` files, each with the ``__init__`` of the packages above the
module it names (which Python runs first); imports under ``if TYPE_CHECKING:`` do not (they
never run). The rules:

* no import cycle between modules;
* each module imports only modules of its own layer or of layers below it;
* no backend imports another backend (code two backends share lives in ``ifrtpy.backends``
  itself, or lower);
* no private name (``_x``) is taken from a module of another package, but from the C
  layer ``ifrtpy._pjrt``, the jaxlib version switch ``ifrtpy._jaxlib`` and the host-memory
  helpers ``ifrtpy._host_memory``, which exist to be used by the layers above them.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "ifrtpy"

#: Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", ("errors", "config", "_log", "_jaxlib", "_host_memory")),
    ("values", ("dtypes", "shape", "device", "layout", "future", "sharding", "user_context",
                "cancellation", "_execute_result")),
    # The C layer mirrors the PJRT C API: it takes errors and the dtype tables, nothing
    # that decides (plugins, option checks, sealing and FFI registration live in the PjRt
    # backend or below it: backends.pjrt.seal, backends.pjrt.ffi; test below).
    ("C layer", ("_pjrt",)),
    ("interfaces", ("array", "array_plans", "array_text", "executable", "executable_options",
                    "execute_checks", "client", "remap", "bitcast")),
    ("services", ("program", "builder", "_xla", "plugins", "compilation_cache",
                  "distributed", "ffi")),
    ("backends", ("backends",)),
    ("above backends", ("interop", "_device_put", "visualize")),
    # The public face: the package root and its tools.
    ("top", ("", "testing", "cli", "proxy", "__main__")),
]

#: Packages whose private names the layers above may use.
OPEN_PRIVATES = ("ifrtpy._pjrt", "ifrtpy._jaxlib", "ifrtpy._xla", "ifrtpy._host_memory")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    files = [p for p in ROOT.rglob("*") if p.suffix in (".py", ".pyx")]
    return {_module_name(p): p for p in files if "__pycache__" not in p.parts}


MODULES = _modules()


def _package(module: str) -> str:
    """The package a module is in (a package's ``__init__`` is in the package itself)."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _resolve(module: str, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = _package(module).split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _pyx_imports(source: str) -> list[tuple[str, list[str]]]:
    """(module, names) of the Python imports of Cython source (``cimport`` is C-level)."""
    found = []
    for m in re.finditer(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)",
                         source, re.M):
        names = re.sub(r"#[^\n]*", "", m.group(2)).strip("() \n")
        found.append((m.group(1), [n.split(" as ")[0].strip() for n in names.split(",")
                                   if n.strip()]))
    for m in re.finditer(r"^[ \t]*import[ \t]+([\w., \t]+)$", source, re.M):
        for name in m.group(1).split(","):
            found.append((name.split(" as ")[0].strip(), []))
    return found


def _py_imports(module: str, source: str) -> list[tuple[str, list[str]]]:
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node) if n is not node)
            skip.update(id(n) for n in ast.walk(node.test))
            for other in node.orelse:  # the else branch runs
                skip.difference_update(id(n) for n in ast.walk(other))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((_resolve(module, node.level, node.module),
                          [alias.name for alias in node.names]))
    return found


def _imports() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """The edges (module -> modules of ifrtpy it imports) and, for every private name
    taken, (importer, the name in full, the package it belongs to)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    privates = []
    for module, path in MODULES.items():
        source = path.read_text()
        imports = _pyx_imports(source) if path.suffix == ".pyx" else _py_imports(module, source)
        for target, names in imports:
            if target != "ifrtpy" and not target.startswith("ifrtpy."):
                continue
            for name in names or [None]:
                sub = f"{target}.{name}" if name else None
                if sub in MODULES:  # a module of package ``target``
                    edges[module].add(sub)
                    if name.startswith("_"):
                        privates.append((module, sub, target))
                else:
                    owner = target if target in MODULES else target.rpartition(".")[0]
                    edges[module].add(owner)
                    if name and name.startswith("_") and not name.startswith("__"):
                        privates.append((module, f"{target}.{name}", _package(owner)))
    for module, targets in edges.items():  # importing a module runs its packages' __init__
        targets.update(p for t in list(targets) for p in _packages_above(t)
                       if not (module + ".").startswith(p + "."))
        targets.discard("")
    return edges, privates


def _packages_above(module: str) -> list[str]:
    """The packages importing ``module`` imports first (but the root package, which every
    import runs)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


EDGES, PRIVATES = _imports()


def layer_of(module: str) -> int:
    rest = module.removeprefix("ifrtpy").removeprefix(".")
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (rest == prefix or rest.startswith(prefix + ".") or prefix == "") and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None
    return best


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(EDGES.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return found


def _backend(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "backends" and f"ifrtpy.backends.{parts[2]}" in MODULES \
            and MODULES[f"ifrtpy.backends.{parts[2]}"].name == "__init__.py":
        return parts[2]
    return None


def test_every_name_in_the_tables_is_a_module():
    named = [prefix for _, prefixes in LAYERS for prefix in prefixes if prefix]
    named += [p.removeprefix("ifrtpy.") for p in OPEN_PRIVATES]
    missing = [n for n in named if f"ifrtpy.{n}" not in MODULES]
    assert not missing, "names in the layer tables that are no module of ifrtpy: " + ", ".join(missing)


def test_the_tree_is_read():
    assert {"ifrtpy", "ifrtpy.errors", "ifrtpy.client"} <= set(MODULES)
    assert "ifrtpy.errors" in EDGES["ifrtpy.client"] or any(
        e.startswith("ifrtpy.errors") for e in EDGES["ifrtpy.client"])


def test_no_import_cycles():
    cycles = _cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_layers_import_downwards():
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
              for m, targets in sorted(EDGES.items()) for t in sorted(targets)
              if layer_of(t) > layer_of(m)]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_backends_do_not_import_each_other():
    crossing = [f"{m} imports {t}" for m, targets in sorted(EDGES.items()) for t in sorted(targets)
                if _backend(m) and _backend(t) and _backend(m) != _backend(t)]
    assert not crossing, "a backend imports another:\n" + "\n".join(crossing)


def test_no_private_names_across_packages():
    crossing = [f"{m} takes {name}" for m, name, package in PRIVATES
                if not (name + ".").startswith(tuple(p + "." for p in OPEN_PRIVATES))
                and _package(m) != package]
    assert not crossing, "private names across packages:\n" + "\n".join(sorted(set(crossing)))


def test_the_proxy_server_imports_no_backend():
    """The server sits on the public ``Client`` interface only (DESIGN decision 15): no
    module of ``ifrtpy.proxy`` imports a backend's modules or the C layer (the default
    client is made through ``ifrtpy.backends.get_client``, by name)."""
    taken = sorted(f"{m} imports {t}" for m, targets in EDGES.items()
                   if m == "ifrtpy.proxy" or m.startswith("ifrtpy.proxy.")
                   for t in targets if _backend(t) or t.startswith("ifrtpy._pjrt"))
    assert not taken, "the proxy server takes a backend's internals:\n" + "\n".join(taken)


#: All the C layer imports of ifrtpy outside itself.
C_LAYER_IMPORTS = {"ifrtpy.errors", "ifrtpy.dtypes"}


def test_the_c_layer_imports_only_errors_and_dtypes():
    taken = {t for m, targets in EDGES.items() if m.startswith("ifrtpy._pjrt")
             for t in targets if not t.startswith("ifrtpy._pjrt")}
    assert taken <= C_LAYER_IMPORTS, (
        "the C layer imports " + ", ".join(sorted(taken - C_LAYER_IMPORTS)) + ": what decides "
        "(sealing, option checks, caps, registration) belongs in the PjRt backend")


@pytest.mark.parametrize("importer, imported, allowed", [
    ("ifrtpy.client", "ifrtpy.backends.pjrt", False),
    ("ifrtpy.backends.pjrt.array", "ifrtpy.array", True),
    ("ifrtpy.sharding", "ifrtpy.interop", False),
    ("ifrtpy._pjrt._client", "ifrtpy.plugins.options", False),
    ("ifrtpy._pjrt._executable", "ifrtpy.errors", True),
    ("ifrtpy._pjrt._executable", "ifrtpy.backends.pjrt.seal", False),
    ("ifrtpy.backends.pjrt.seal", "ifrtpy._pjrt", True),
    ("ifrtpy.ffi", "ifrtpy.backends.pjrt.ffi", False),
    ("ifrtpy.backends.pjrt.ffi", "ifrtpy.ffi", True),
])
def test_layer_order_is_what_the_rules_say(importer, imported, allowed):
    assert (layer_of(imported) <= layer_of(importer)) is allowed
