"""IFRT's conformance test libraries, ported to pytest (``xla/python/ifrt/*_impl_test_lib.cc``),
plus the NumPy laws every backend must keep. A backend that passes them is a correct
ifrtpy backend.

Each case module defines plain ``test_*`` functions that take a ``client`` fixture and
use only the ifrtpy interfaces:

* :mod:`~ifrtpy.testing.conformance.arrays`: ``array_impl_test_lib``;
* :mod:`~ifrtpy.testing.conformance.tuples`: ``tuple_impl_test_lib``;
* :mod:`~ifrtpy.testing.conformance.clients`: ``client_impl_test_lib``, and the device
  and memory contracts;
* :mod:`~ifrtpy.testing.conformance.executables`: ``executable_impl_test_lib``;
* :mod:`~ifrtpy.testing.conformance.remaps`: ``remap_impl_test_lib``;
* :mod:`~ifrtpy.testing.conformance.laws`: hypothesis laws of arrays against NumPy.

Two ways to run them (IFRT's ``RegisterClientFactory`` model: you supply the client):

1. From your own test module, providing the ``client`` fixture and declaring what the
   backend does not do. :func:`case_classes` gives one test class per case module (so
   equal case names do not collide)::

       import pytest
       import ifrtpy as ifrt
       from ifrtpy.testing.conformance import case_classes

       #: What this backend does not do: case -> a text its skip message holds.
       EXPECTED_SKIPS = {
           "test_bitcast_arrays": "does not implement bitcast_arrays",
       }

       globals().update(case_classes(expected_skips=EXPECTED_SKIPS))

       @pytest.fixture(scope="module")
       def client():
           return ifrt.get_client("mybackend")

2. As a pytest plugin with command-line options::

       pytest -p ifrtpy.testing.conformance.plugin --pyargs ifrtpy.testing.conformance \\
           --ifrtpy-backend=reference --ifrtpy-device-count=8 \\
           --ifrtpy-expected-skips=mypackage.conformance:EXPECTED_SKIPS

   (``--ifrtpy-option key=value`` passes more factory arguments; the ``-p`` loads the
   options before pytest parses the command line). From a checkout,
   ``pytest ifrtpy/testing/conformance --ifrtpy-backend=...`` works without the ``-p``
   (the package's ``conftest.py`` loads the plugin).

The run holds the backend to its declaration (:mod:`~ifrtpy.testing.conformance.outcomes`):
a core case (:data:`CORE_CASES`) that raises ``UnimplementedError`` fails; any other case
that skips (the backend's ``UnimplementedError``, or the suite's own "needs 4 addressable
devices") fails unless the backend declares it, and a declared case that passes fails
too. Each failure says what to change. Inside a hypothesis law, a draw the backend
raises ``UnimplementedError`` for fails a core law, and any other law unless the backend
declares the draws it rejects; what the laws draw (sharding kinds, arrays over several
devices) is declared, not probed.

A backend ships its declaration next to its code
(:mod:`~ifrtpy.testing.conformance.declarations`): a run that names the backend uses it
unless one is given, and :func:`declaration_of` hands it to :func:`case_classes`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable, Mapping, Union

try:  # what the suite runs on: said at once where one is missing, not a traceback
    import hypothesis  # noqa: F401
    import pytest  # noqa: F401
except ModuleNotFoundError as _missing:
    _root = (_missing.name or "pytest or hypothesis").split(".")[0]
    raise ModuleNotFoundError(
        f"the ifrtpy conformance suite needs {_root}, which is not installed: "
        'pip install pytest hypothesis (from a checkout: pip install -e ".[conformance]")',
        name=_root) from None

from ifrtpy.testing.conformance import outcomes  # noqa: E402
from ifrtpy.testing.conformance.declarations import (  # noqa: E402
    ONE_PROCESS_SKIPS, Declaration, declaration_of,
)

__all__ = ["CASE_MODULES", "CORE_CASES", "ONE_PROCESS_SKIPS", "Declaration", "case_classes",
           "all_case_names", "cases", "core_case_names", "declaration_of", "is_core"]

#: The case modules, in the order :func:`case_classes` and the plugin run them.
CASE_MODULES = ("arrays", "tuples", "clients", "executables", "remaps", "laws")

#: Cases every backend must pass: the ones that need only host round trips, single-device
#: arrays, deletion and tuples. An UnimplementedError in one of them fails the run.
CORE_CASES = {
    "arrays": (
        "test_make_array_from_host_buffer",
        "test_make_array_from_host_buffer_calls_on_done_with_host_buffer",
        "test_make_array_from_host_buffer_immutable_only_during_call",
        "test_make_array_from_host_buffer_immutable_until_transfer_completes",
        "test_make_array_from_host_buffer_zero_copy",
        "test_make_array_from_host_buffer_and_copy_to_host_buffer",
        "test_make_array_from_host_buffer_with_byte_strides_and_copy_to_host_buffer",
        "test_make_array_from_host_buffer_and_copy_to_host_buffer_with_byte_strides",
        "test_host_buffer_round_trip_all_memory_kinds",
        "test_make_error_arrays",
        "test_assemble_and_disassemble_single_device_array",
        "test_copy_mixed_source_devices",
        "test_make_and_copy_zero_sized_buffers",
        "test_poisoned_zero_sized_buffers",
        "test_copy_arrays_exhaustive",
        "test_get_ready_future",
        "test_batched_get_ready_future",
        "test_batched_get_ready_future_fails_with_an_input_error",
        "test_delete",
        "test_delete_is_idempotent",
        "test_is_deleted",
    ),
    "tuples": None,  # all of them
    "clients": None,  # all of them
    "laws": (
        "test_host_array_host_is_identity",
        "test_each_shard_is_the_numpy_slice_of_its_index_domain",
        "test_copy_arrays_to_other_devices_keeps_every_value",
    ),
}


def is_core(module: str, case: str) -> bool:
    """Whether case ``case`` of case module ``module`` is one of the :data:`CORE_CASES`."""
    if module not in CORE_CASES:
        return False
    names = CORE_CASES[module]
    return names is None or case in names


def all_case_names() -> list[str]:
    """The names of every case of every case module (what a declaration may name: it may
    name cases a run leaves out, e.g. one of the core cases only)."""
    return [name for module in CASE_MODULES for name in _case_functions(module)]


def core_case_names() -> list[str]:
    """The names of every core case (:data:`CORE_CASES`)."""
    return [name for module in CORE_CASES for name in _case_functions(module)
            if is_core(module, name)]


def _case_functions(module: str, only: Any = None) -> dict[str, Callable]:
    """The ``test_*`` functions of case module ``module`` (e.g. ``"arrays"``) as they are
    written; ``only`` keeps those names. A module that does not exist (yet) gives ``{}``."""
    try:
        mod = importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{module}":
            return {}
        raise
    names = getattr(mod, "__all__", None) or [n for n in dir(mod) if n.startswith("test_")]
    if only is not None:
        missing = sorted(set(only) - set(names))
        if missing:
            raise ValueError(f"{mod.__name__} has no cases {missing}")
    return {name: getattr(mod, name) for name in names
            if (only is None or name in only) and name.startswith("test_")
            and callable(getattr(mod, name))}


def _judged(test: Callable, module: str, case: str, declaration: Declaration) -> Callable:
    """``test`` run through :func:`~ifrtpy.testing.conformance.outcomes.judge`: the
    same fixtures, and pytest's ``request`` for the item's name."""
    signature = inspect.signature(test)
    takes_request = "request" in signature.parameters
    core = is_core(module, case)

    @functools.wraps(test)
    def judged(*args, request, **kwargs):
        if takes_request:
            kwargs["request"] = request
        outcomes.judge(functools.partial(test, *args, **kwargs), request.node.name, case, core,
                       declaration, kwargs.get("client"))

    if not takes_request:
        request = inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY)
        judged.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*signature.parameters.values(), request])
    return judged


Declared = Union[Declaration, Mapping[str, str], None]


def cases(module: str, only: Any = None, expected_skips: Declared = None) -> dict[str, Callable]:
    """The cases of case module ``module`` (e.g. ``"arrays"``), each judged against
    ``expected_skips`` (a mapping of expected skips or a :class:`Declaration`;
    :mod:`~ifrtpy.testing.conformance.outcomes`); ``only`` keeps those names. A module
    that does not exist (yet) gives ``{}``."""
    tests = _case_functions(module, only)
    declared = outcomes.check_declaration(expected_skips, all_case_names(), core_case_names())
    return {name: _judged(test, module, name, declared) for name, test in tests.items()}


def case_classes(*modules: str, core_only: bool = False,
                 expected_skips: Declared = None) -> dict[str, type]:
    """One pytest class per case module (``TestArrays``, ``TestClients``, ...) holding its
    cases as static methods; put them in a test module's globals next to a ``client``
    fixture. ``core_only`` keeps the :data:`CORE_CASES`. Default: every module.

    ``expected_skips`` declares what the backend does not do: case name (or pytest item
    name, ``"test_x[param]"``) -> a text its skip message holds. Every other skip fails,
    and so does a declared case that passes (:mod:`~ifrtpy.testing.conformance.outcomes`);
    a name that is not a case of the suite is a ValueError. It may also be a :class:`Declaration`
    (what a backend ships, :func:`declaration_of`), which also declares the draws its laws
    may reject and whether its arrays span several devices."""
    selected = {}
    for module in modules or CASE_MODULES:
        if core_only and module not in CORE_CASES:
            continue
        selected[module] = _case_functions(module, CORE_CASES.get(module) if core_only else None)
    declared = outcomes.check_declaration(expected_skips, all_case_names(), core_case_names())
    out = {}
    for module, raw in selected.items():
        tests = {name: _judged(test, module, name, declared) for name, test in raw.items()}
        if tests:
            name = "Test" + module.title().replace("_", "")
            out[name] = type(name, (), {n: staticmethod(t) for n, t in tests.items()})
    return out
