"""The conformance suite as a pytest plugin: ``--ifrtpy-backend`` and a ``client`` fixture.

Load it with ``-p ifrtpy.testing.conformance.plugin`` (before pytest parses the command
line, so that the options are known), then collect the suite by module or path::

    pytest -p ifrtpy.testing.conformance.plugin --pyargs ifrtpy.testing.conformance \\
        --ifrtpy-backend=reference --ifrtpy-device-count=8

Options: ``--ifrtpy-backend NAME`` (a name :func:`ifrtpy.get_client` knows, or a
``module:function`` factory, registered on the fly), ``--ifrtpy-device-count N`` (the
factory's ``device_count``), ``--ifrtpy-option KEY=VALUE`` (repeatable; VALUE is read as
a Python literal where it is one, else kept as a string). The plugin also collects the
case modules of this package (their names do not start with ``test_``), and importing it
registers the ci/dev/debug hypothesis profiles (``--hypothesis-profile=dev``).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from ifrtpy.testing import strategies as _strategies  # noqa: F401  (registers the profiles)
from ifrtpy.testing.conformance import CASE_MODULES

_HERE = pathlib.Path(__file__).resolve().parent


def pytest_addoption(parser):
    group = parser.getgroup("ifrtpy", "ifrtpy conformance suite")
    group.addoption("--ifrtpy-backend", default=None, metavar="NAME",
                    help="the backend the conformance suite runs against (a name get_client "
                         "knows, or module:function of a client factory)")
    group.addoption("--ifrtpy-device-count", type=int, default=None, metavar="N",
                    help="device_count passed to the backend's factory")
    group.addoption("--ifrtpy-option", action="append", default=[], metavar="KEY=VALUE",
                    help="another keyword argument for the backend's factory (repeatable)")


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A case of this package that fails with the backend's UnimplementedError is a skip
    carrying its message (as :func:`~ifrtpy.testing.conformance.unimplemented_is_skip`
    does for cases imported into test modules)."""
    report = yield
    if (call.when == "call" and report.failed and call.excinfo is not None
            and pathlib.Path(str(item.path)).resolve().parent == _HERE):
        from ifrtpy.errors import UnimplementedError

        if call.excinfo.errisinstance(UnimplementedError):
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0,
                               f"Skipped: UNIMPLEMENTED: {call.excinfo.value}")
    return report


def pytest_report_header(config):
    backend = config.getoption("--ifrtpy-backend", default=None)
    if backend:
        _, kwargs = client_factory_arguments(config)
        return f"ifrtpy conformance: backend {backend!r} {kwargs}"
    return None
