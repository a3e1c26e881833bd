"""The conformance suite as a pytest plugin: ``--ifrtpy-backend`` and a ``client`` fixture.

Load it with ``-p ifrtpy.testing.conformance.plugin`` (before pytest parses the command
line, so that the options are known), then collect the suite by module or path::

    pytest -p ifrtpy.testing.conformance.plugin --pyargs ifrtpy.testing.conformance \\
        --ifrtpy-backend=reference --ifrtpy-device-count=8

Options: ``--ifrtpy-core-only`` (the core cases only, ``CORE_CASES``),
``--ifrtpy-backend NAME`` (a name :func:`ifrtpy.get_client` knows, or a
``module:function`` factory, registered on the fly), ``--ifrtpy-device-count N`` (the
factory's ``device_count``), ``--ifrtpy-option KEY=VALUE`` (repeatable; VALUE is read as
a Python literal where it is one, else kept as a string), ``--ifrtpy-expected-skips
MODULE:NAME`` (the backend's declared skips, a mapping importable as ``MODULE.NAME``) or
``--ifrtpy-declaration MODULE`` (a module holding the backend's whole declaration:
``EXPECTED_SKIPS``, ``REJECTED_DRAWS``, ``MULTI_DEVICE_ARRAYS``). Without either, the
declaration the backend ships is used
(:func:`~ifrtpy.testing.conformance.declarations.declaration_of`: the built-in backends
and the example backend ship theirs); a backend that ships none declares nothing, and
every skip fails. The plugin collects the case modules of this package
(their names do not start with ``test_``) and judges each case against the declared
skips (:mod:`~ifrtpy.testing.conformance.outcomes`); importing it registers the
ci/dev/debug hypothesis profiles (``--hypothesis-profile=dev``).
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

from ifrtpy.testing.conformance import (  # first: it says what is missing of pytest, hypothesis
    CASE_MODULES, all_case_names, core_case_names, is_core, outcomes,
)
from ifrtpy.testing import strategies as _strategies  # noqa: F401  (registers the profiles)
from ifrtpy.testing.conformance.declarations import Declaration, declaration_of

_HERE = pathlib.Path(__file__).resolve().parent
_DECLARATION = pytest.StashKey[Declaration]()


def pytest_addoption(parser):
    group = parser.getgroup("ifrtpy", "ifrtpy conformance suite")
    group.addoption("--ifrtpy-backend", default=None, metavar="NAME",
                    help="the backend the conformance suite runs against (a name get_client "
                         "knows, or module:function of a client factory)")
    group.addoption("--ifrtpy-device-count", type=int, default=None, metavar="N",
                    help="device_count passed to the backend's factory")
    group.addoption("--ifrtpy-option", action="append", default=[], metavar="KEY=VALUE",
                    help="another keyword argument for the backend's factory (repeatable)")
    group.addoption("--ifrtpy-expected-skips", default=None, metavar="MODULE:NAME",
                    help="the backend's declared skips: a mapping from case name to a text "
                         "its skip message holds (every other skip fails; default: the "
                         "declaration the backend ships)")
    group.addoption("--ifrtpy-core-only", action="store_true", default=False,
                    help="run the core cases only (ifrtpy.testing.conformance.CORE_CASES)")
    group.addoption("--ifrtpy-declaration", default=None, metavar="MODULE",
                    help="a module holding the backend's declaration (EXPECTED_SKIPS, "
                         "REJECTED_DRAWS, MULTI_DEVICE_ARRAYS; default: the one the backend "
                         "ships)")


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def client_factory_arguments(config) -> tuple[str, dict]:
    """The backend name and factory keyword arguments given on the command line."""
    backend = config.getoption("--ifrtpy-backend")
    if not backend:
        raise pytest.UsageError(
            "the ifrtpy conformance suite needs a backend: run pytest -p "
            "ifrtpy.testing.conformance.plugin --pyargs ifrtpy.testing.conformance "
            "--ifrtpy-backend=NAME (NAME: reference, pjrt, or module:function of a client "
            "factory), or import the cases into a test module that provides a `client` fixture")
    kwargs = {}
    count = config.getoption("--ifrtpy-device-count")
    if count is not None:
        kwargs["device_count"] = count
    for option in config.getoption("--ifrtpy-option"):
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise pytest.UsageError(f"--ifrtpy-option needs KEY=VALUE, got {option!r}")
        kwargs[key.strip()] = _literal(value.strip())
    return backend, kwargs


@pytest.fixture(scope="session")
def client(pytestconfig):
    """A client of the backend named by ``--ifrtpy-backend``."""
    import ifrtpy

    backend, kwargs = client_factory_arguments(pytestconfig)
    if ":" in backend:
        ifrtpy.register_backend(backend, backend, replace=True)
    return ifrtpy.get_client(backend, **kwargs)


def pytest_collection_modifyitems(config, items):
    """With ``--ifrtpy-core-only``, deselect the cases of this package that are not core
    ones. Without ``--ifrtpy-backend``, stop before running when a collected case would
    take its client from this plugin: one usage error, not one error per case."""
    if config.getoption("--ifrtpy-core-only"):
        kept, dropped = [], []
        for item in items:
            path = pathlib.Path(str(item.path)).resolve()
            ours = path.parent == _HERE and path.stem in CASE_MODULES
            name = getattr(item, "originalname", item.name)
            (dropped if ours and not is_core(path.stem, name) else kept).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    if config.getoption("--ifrtpy-backend"):
        return
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.get("client") if info is not None else None
        if defs and getattr(defs[-1].func, "__module__", None) == __name__:
            client_factory_arguments(config)  # raises the UsageError saying what to pass


def pytest_collect_file(file_path, parent):
    """Collect this package's case modules (they are not named test_*.py)."""
    path = pathlib.Path(file_path)
    if path.suffix == ".py" and path.stem in CASE_MODULES and path.resolve().parent == _HERE:
        return pytest.Module.from_parent(parent, path=path)
    return None


def _declared(config) -> Declaration:
    """The declaration the command line names, else the one the backend ships, else an
    empty one."""
    path = config.getoption("--ifrtpy-expected-skips", default=None)
    module = config.getoption("--ifrtpy-declaration", default=None)
    if path and module:
        raise pytest.UsageError("give --ifrtpy-expected-skips or --ifrtpy-declaration, not both")
    if path:
        module_name, sep, name = path.partition(":")
        if not sep or not module_name or not name:
            raise pytest.UsageError(f"--ifrtpy-expected-skips needs MODULE:NAME, got {path!r}")
        try:
            return Declaration(expected_skips=getattr(importlib.import_module(module_name), name))
        except (ImportError, AttributeError) as e:
            raise pytest.UsageError(f"--ifrtpy-expected-skips={path}: {e}") from e
    if module:
        try:
            return Declaration.from_module(module)
        except (ImportError, ValueError) as e:
            raise pytest.UsageError(f"--ifrtpy-declaration={module}: {e}") from e
    backend = config.getoption("--ifrtpy-backend", default=None)
    return (declaration_of(backend) if backend else None) or Declaration()


def _check_backend(config) -> None:
    """Stop before collecting, on one line, where ``--ifrtpy-backend`` names no client
    factory: a ``module:function`` whose module does not import or lacks the function, or
    a name :func:`ifrtpy.get_client` does not know (not one error per case)."""
    backend = config.getoption("--ifrtpy-backend", default=None)
    if not backend:
        return
    module, sep, function = backend.partition(":")
    if sep:
        try:
            factory = getattr(importlib.import_module(module), function)
        except Exception as e:  # noqa: BLE001  (whatever the module raises as it imports)
            raise pytest.UsageError(f"--ifrtpy-backend={backend}: the client factory cannot be "
                                    f"imported: {type(e).__name__}: {e}") from None
        if not callable(factory):
            raise pytest.UsageError(f"--ifrtpy-backend={backend}: {function} is a "
                                    f"{type(factory).__name__}, not a client factory")
        return
    import ifrtpy

    if backend not in ifrtpy.registered_backends():
        raise pytest.UsageError(
            f"--ifrtpy-backend={backend}: get_client knows no backend of that name (it knows "
            f"{', '.join(ifrtpy.registered_backends())}); give module:function of a client "
            "factory for another")


def pytest_configure(config):
    """Check the backend (:func:`_check_backend`), read the declaration (:func:`_declared`)
    and check it against the cases."""
    _check_backend(config)
    declaration = _declared(config)
    try:
        config.stash[_DECLARATION] = outcomes.check_declaration(declaration, all_case_names(),
                                                                core_case_names())
    except ValueError as e:
        given = [f"{o}={config.getoption(o)}" for o in ("--ifrtpy-expected-skips",
                 "--ifrtpy-declaration", "--ifrtpy-backend") if config.getoption(o, None)]
        raise pytest.UsageError(f"{given[0] if given else 'the declaration'}: {e}") from e


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run a case of this package through
    :func:`~ifrtpy.testing.conformance.outcomes.judge`, against the declared skips."""
    path = pathlib.Path(str(pyfuncitem.path)).resolve()
    if path.parent != _HERE or path.stem not in CASE_MODULES:
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    case = pyfuncitem.originalname
    outcomes.judge(lambda: pyfuncitem.obj(**args), pyfuncitem.name, case,
                   is_core(path.stem, case), pyfuncitem.config.stash[_DECLARATION],
                   args.get("client"))
    return True


def pytest_report_header(config):
    backend = config.getoption("--ifrtpy-backend", default=None)
    if backend:
        _, kwargs = client_factory_arguments(config)
        return f"ifrtpy conformance: backend {backend!r} {kwargs}"
    return None
