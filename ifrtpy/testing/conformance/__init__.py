"""IFRT's conformance test libraries, ported to pytest (``xla/python/ifrt/*_impl_test_lib.cc``),
plus the NumPy laws every backend must keep. A backend that passes them is a correct
ifrtpy backend.

Each case module defines plain ``test_*`` functions that take a ``client`` fixture and
use only the ifrtpy interfaces:

* :mod:`~ifrtpy.testing.conformance.arrays`: ``array_impl_test_lib`` and
  ``tuple_impl_test_lib``;
* :mod:`~ifrtpy.testing.conformance.clients`: ``client_impl_test_lib``, and the device
  and memory contracts;
* :mod:`~ifrtpy.testing.conformance.executables`: ``executable_impl_test_lib``;
* :mod:`~ifrtpy.testing.conformance.remaps`: ``remap_impl_test_lib``;
* :mod:`~ifrtpy.testing.conformance.laws`: hypothesis laws of arrays against NumPy.

Three ways to run them (IFRT's ``RegisterClientFactory`` model: you supply the client):

1. From your own test module, providing the ``client`` fixture. :func:`case_classes`
   gives one test class per case module (so equal case names do not collide)::

       import pytest
       import ifrtpy as ifrt
       from ifrtpy.testing.conformance import case_classes

       globals().update(case_classes("arrays", "clients", "executables", "remaps", "laws"))

       @pytest.fixture(scope="module")
       def client():
           return ifrt.get_client("mybackend")

   ``from ifrtpy.testing.conformance.arrays import *`` works too, one module at a time.

2. As a pytest plugin with command-line options::

       pytest -p ifrtpy.testing.conformance.plugin --pyargs ifrtpy.testing.conformance \\
           --ifrtpy-backend=reference --ifrtpy-device-count=8

   (``--ifrtpy-option key=value`` passes more factory arguments; the ``-p`` loads the
   options before pytest parses the command line).

3. By path, from a checkout: ``pytest ifrtpy/testing/conformance --ifrtpy-backend=...``
   (the package's ``conftest.py`` loads the plugin).

Cases that need what a backend lacks (non-addressable devices, a second memory kind,
more devices) skip with the reason, and an ``UnimplementedError`` raised by the backend
turns a case into a skip carrying the backend's message (:func:`unimplemented_is_skip`):
never a silent pass. Deselect cases a backend knowingly fails with pytest's
``-k``/``--deselect`` (IFRT's ``SetTestFilterIfNotUserSpecified``).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

#: The case modules, in the order :func:`case_classes` and the plugin run them.
CASE_MODULES = ("arrays", "clients", "executables", "remaps", "laws")

#: Cases every backend must pass (or skip with its UnimplementedError): the ones that
#: need only host round trips, single-device arrays, deletion and tuples.
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
        "test_nullary_tuple",
        "test_tuple_of_arrays",
        "test_delete_of_element_deletes_tuple",
        "test_nested_tuples",
    ),
    "clients": None,  # all of them
    "laws": (
        "test_host_array_host_is_identity",
        "test_each_shard_is_the_numpy_slice_of_its_index_domain",
        "test_copy_arrays_to_other_devices_keeps_every_value",
    ),
}


def unimplemented_is_skip(test: Callable) -> Callable:
    """Wrap a test so that an ``UnimplementedError`` it raises becomes a skip carrying
    the error's message ("UNIMPLEMENTED: ..."). Idempotent."""
    if getattr(test, "_ifrtpy_unimplemented_is_skip", False):
        return test

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        import pytest

        from ifrtpy.errors import UnimplementedError
        try:
            return test(*args, **kwargs)
        except UnimplementedError as e:
            pytest.skip(f"UNIMPLEMENTED: {e}")

    wrapper._ifrtpy_unimplemented_is_skip = True
    return wrapper


def _wrap_module_cases(namespace: dict) -> None:
    """Apply :func:`unimplemented_is_skip` to every ``test_*`` function of a case module
    (hypothesis tests apply it to their inner test themselves)."""
    for name, value in list(namespace.items()):
        if (name.startswith("test_") and callable(value)
                and not getattr(value, "is_hypothesis_test", False)):
            namespace[name] = unimplemented_is_skip(value)


def cases(module: str, only: Any = None) -> dict[str, Callable]:
    """The ``test_*`` functions of case module ``module`` (e.g. ``"arrays"``), each
    turning UnimplementedError into a skip; ``only`` keeps those names. A module that
    does not exist (yet) gives ``{}``."""
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
    out = {}
    for name in names:
        if only is not None and name not in only:
            continue
        test = getattr(mod, name)
        if callable(test) and name.startswith("test_"):
            out[name] = test if getattr(test, "is_hypothesis_test", False) \
                else unimplemented_is_skip(test)
    return out


def case_classes(*modules: str, core_only: bool = False) -> dict[str, type]:
    """One pytest class per case module (``TestArrays``, ``TestClients``, ...) holding its
    cases as static methods; put them in a test module's globals next to a ``client``
    fixture. ``core_only`` keeps the :data:`CORE_CASES`. Default: every module."""
    out = {}
    for module in modules or CASE_MODULES:
        if core_only and module not in CORE_CASES:
            continue
        only = CORE_CASES.get(module) if core_only else None
        tests = cases(module, only)
        if tests:
            name = "Test" + module.title().replace("_", "")
            out[name] = type(name, (), {n: staticmethod(t) for n, t in tests.items()})
    return out
