"""The conformance suite as a pytest plugin: ``--ifrtpy-backend`` and a ``client`` fixture.

Load it with ``-p ifrtpy.testing.conformance.plugin`` (before pytest parses the command
line, so that the options are known), then collect the suite by module or path::

    pytest -p ifrtpy.testing.conformance.plugin --pyargs ifrtpy.testing.conformance \\
        --ifrtpy-backend=reference --ifrtpy-device-count=8

Options: ``--ifrtpy-backend NAME`` (a name :func:`ifrtpy.get_client` knows, or a
``module:function`` factory, registered on the fly), ``--ifrtpy-device-count N`` (the
factory's ``device_count``), ``--ifrtpy-option KEY=VALUE`` (repeatable; VALUE is read as
a Python literal where it is one, else kept as a string), ``--ifrtpy-expected-skips
MODULE:NAME`` (the backend's declared skips, a mapping importable as ``MODULE.NAME``;
without it every skip fails). The plugin collects the case modules of this package
(their names do not start with ``test_``) and judges each case against the declared
skips (:mod:`~ifrtpy.testing.conformance.outcomes`); importing it registers the
ci/dev/debug hypothesis profiles (``--hypothesis-profile=dev``).
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

from ifrtpy.testing import strategies as _strategies  # noqa: F401  (registers the profiles)
from ifrtpy.testing.conformance import CASE_MODULES, _case_functions, is_core, outcomes

_HERE = pathlib.Path(__file__).resolve().parent
_EXPECTED_SKIPS = pytest.StashKey[dict]()


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
                         "its skip message holds (every other skip fails)")


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
    """Without ``--ifrtpy-backend``, stop before running when a collected case would take
    its client from this plugin: one usage error, not one error per case."""
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


def pytest_configure(config):
    """Read the skips ``--ifrtpy-expected-skips MODULE:NAME`` declares (none without it)
    and check them against the cases."""
    path = config.getoption("--ifrtpy-expected-skips", default=None)
    declared = {}
    if path:
        module, sep, name = path.partition(":")
        if not sep or not module or not name:
            raise pytest.UsageError(f"--ifrtpy-expected-skips needs MODULE:NAME, got {path!r}")
        try:
            declared = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise pytest.UsageError(f"--ifrtpy-expected-skips={path}: {e}") from e
    names = [n for module in CASE_MODULES for n in _case_functions(module)]
    try:
        config.stash[_EXPECTED_SKIPS] = outcomes.check_declared(declared, names)
    except ValueError as e:
        raise pytest.UsageError(f"--ifrtpy-expected-skips={path}: {e}") from e


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
                   is_core(path.stem, case), pyfuncitem.config.stash[_EXPECTED_SKIPS])
    return True


def pytest_report_header(config):
    backend = config.getoption("--ifrtpy-backend", default=None)
    if backend:
        _, kwargs = client_factory_arguments(config)
        return f"ifrtpy conformance: backend {backend!r} {kwargs}"
    return None
