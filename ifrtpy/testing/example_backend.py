"""A minimal ifrtpy backend: the worked example of docs/implementing-a-backend.md.

A few virtual devices; arrays held as NumPy arrays, one per addressable shard; programs
that are Python functions of NumPy arrays. Each class subclasses an abstract interface
(the array ``StoredArray``) and overrides only its abstract methods (the client also
``make_error_arrays``): the rest is the interfaces' defaults, and every check is a plan of
:mod:`ifrtpy.array_plans`. Everything it does not do raises UnimplementedError,
which the conformance suite turns into skips carrying the message. Register and use it
with::

    import ifrtpy
    ifrtpy.register_backend("example", "ifrtpy.testing.example_backend:create_client")
    client = ifrtpy.get_client("example", device_count=2)

and run the conformance suite on it (:data:`EXPECTED_SKIPS` is its declaration, which
the run finds by the factory's module; ``--ifrtpy-core-only`` for the core cases)::

    pytest -p ifrtpy.testing.conformance.plugin --pyargs ifrtpy.testing.conformance \\
        --ifrtpy-backend=ifrtpy.testing.example_backend:create_client

ifrtpy's own tests use it as their fake backend: ``create_client(6,
addressable_device_count=4, memory_kinds=("device", "pinned_host", "unpinned_host"))``
has two devices of another process and the CPU plugin's memory kinds, and its devices
pickle (in the process, while their client lives), so shardings over them do too.
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np

from ifrtpy.array import ArrayCopySemantics, HostBufferSemantics, StoredArray, deleted_error
from ifrtpy.array_plans import (
    addressable_domains, check_placement, plan_assemble, plan_copy, plan_disassemble,
    plan_error_arrays,
)
from ifrtpy.client import Client, Compiler
from ifrtpy.device import Device, Memory, MemoryKind
from ifrtpy.dtypes import DType
from ifrtpy.errors import (
    InvalidArgumentError, NotFoundError, UnimplementedError,
)
from ifrtpy.executable import CompileOptions, ExecuteContract, ExecuteResult, LoadedExecutable
from ifrtpy.future import Future
from ifrtpy.shape import Shape
from ifrtpy.sharding import OpaqueSharding, SingleDeviceSharding, SingleDeviceShardSemantics
from ifrtpy.user_context import current_user_context

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS

# -- what it does not do: its declaration to the conformance suite ---------------------------

_NO_STABLEHLO = "the example backend does not compile str programs"
_TWO_DEVICES = "addressable devices, the client has 2"

#: Case -> a text of its skip message, for the client ``create_client()`` makes (2
#: devices, one memory kind each): what the conformance suite reads where a run names
#: ``ifrtpy.testing.example_backend:create_client`` (:mod:`ifrtpy.testing.conformance`).
#: A client made with more devices or memory kinds runs more cases: declare its own.
EXPECTED_SKIPS = {
    # Its programs are Python functions: every executable case compiles StableHLO (the
    # two parametrizations of each; arrays has a test_delete of its own).
    **{f"{case}[{how}]": _NO_STABLEHLO for how in ("direct", "serialize") for case in (
        "test_properties", "test_output_memory_kinds", "test_parameter_and_output_layouts",
        "test_compile_with_a_column_major_result_layout", "test_get_hlo_modules",
        "test_program_text", "test_analysis", "test_fingerprint_survives_serialization",
        "test_get_donatable_input_indices", "test_compile_and_execute",
        "test_compile_and_execute_user_context", "test_compile_and_execute_portable",
        "test_cancel_execution", "test_do_not_fill_status", "test_no_input_output",
        "test_donation", "test_execute_add_sub_on_two_devices", "test_delete",
        "test_execute_after_delete_fails")},
    # Operations it does not implement.
    "test_make_array_from_host_buffer_with_custom_layout": "has no custom layouts",
    "test_make_array_from_host_buffer_with_a_column_major_layout": "has no custom layouts",
    "test_make_arrays_from_host_buffer_shards_with_layout": "has no custom layouts",
    "test_make_array_from_host_buffer_and_copy_to_host_buffer_with_string": "no STRING arrays",
    "test_make_arrays_from_host_buffer_shards_and_copy_to_host_buffer_with_string":
        "no STRING arrays",
    "test_bitcast_arrays": "does not implement bitcast_arrays",
    "test_bitcast_arrays_refuses_a_different_byte_count": "does not implement bitcast_arrays",
    "test_reshard_keeps_every_value": "does not implement reshard_arrays",
    "test_bad_reshard_raises_and_leaves_inputs_intact": "does not implement reshard_arrays",
    "test_shardings_taken_as_given_are_checked_where_an_array_is_made[reshard]":
        "does not implement reshard_arrays",
    "test_an_error_array_poisons_what_is_made_from_it[reshard]":
        "does not implement reshard_arrays",
    "test_declared_inexact_dtypes_are_what_the_devices_hold": "declares every dtype exact",
    # What its default client is too small for.
    "test_make_arrays_from_host_buffer_shards_with_different_devices": _TWO_DEVICES,
    "test_copy_arrays_with_partial_reuse": _TWO_DEVICES,
    "test_donation_deletes_exactly_the_donated_inputs": _TWO_DEVICES,
    "test_interleave_arrays_donate": _TWO_DEVICES,
    "test_interleave_arrays_reuse": _TWO_DEVICES,
    "test_deinterleave_arrays": _TWO_DEVICES,
    "test_batch_mapping_identity": _TWO_DEVICES,
    "test_batch_mapping_deinterleave": _TWO_DEVICES,
    "test_make_arrays_from_host_buffer_shards_with_different_memory_kinds":
        "needs 2 memory kinds",
    "test_copy_mixed_source_memory_kind": "needs 2 memory kinds",
}


def create_client(device_count: int = 2, addressable_device_count: int | None = None,
                  memory_kinds: tuple[str, ...] = ("device",)) -> ExampleClient:
    """``device_count`` devices, the first ``addressable_device_count`` of them (default:
    all) addressable; each has one memory of each of ``memory_kinds``, the first its
    default."""
    return ExampleClient(device_count, addressable_device_count, memory_kinds)


class ExampleMemory(Memory):
    def __init__(self, memory_id, kind, device):
        self._id, self._kind, self._device = memory_id, MemoryKind(kind), device

    id = property(lambda self: self._id)
    kind = property(lambda self: self._kind)

    def devices(self):
        return (self._device,)

    def to_string(self):
        return f"example_memory_{self._id}"


class ExampleDevice(Device):
    def __init__(self, client, device_id, addressable, memory_kinds):
        self._client, self._id, self._addressable = client, device_id, addressable
        self._memories = [ExampleMemory(device_id * len(memory_kinds) + i, kind, self)
                          for i, kind in enumerate(memory_kinds)]

    client = property(lambda self: self._client)
    id = property(lambda self: self._id)
    kind = property(lambda self: "example")
    is_addressable = property(lambda self: self._addressable)
    process_index = property(lambda self: 0 if self._addressable else 1)  # "another process"

    def memories(self):
        return list(self._memories)

    def default_memory(self):
        return self._memories[0]

    def to_string(self):
        return f"example_device_{self._id}"

    def __reduce__(self):
        # Not required of a backend: lets shardings and specs over these devices pickle.
        return (_unpickle_device, (self._client._serial, self._id))


_CLIENTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # serial -> client
_SERIALS = itertools.count()


def _unpickle_device(client_serial, device_id):
    """The very device that was pickled, while its client lives in this process."""
    client = _CLIENTS.get(client_serial)
    if client is None:
        raise NotFoundError(f"the example client of device {device_id} is gone")
    return client.lookup_device(device_id)


def _whole_in_each_shard(sharding, shape):
    """Whether each shard holds the whole array (as a rank-0 array's shards do)."""
    return len(sharding.devices) == 1 or sharding.is_fully_replicated or len(shape) == 0


class ExampleArray(StoredArray):
    """One NumPy array per addressable shard, in ``sharding.devices`` order (never written
    once made), or an error (``shards`` is None). ``StoredArray`` reads ``client``,
    ``dtype``, ``shape``, ``sharding``, ``error`` and ``user_context`` from the fields."""

    def __init__(self, client, dtype, shape, sharding, shards, error=None):
        self._client, self._dtype, self._shape, self._sharding = client, dtype, shape, sharding
        self._shards, self._error, self._deleted = shards, error, False
        self._user_context = current_user_context()  # the context of the call making it

    def ready_future(self):
        if self._error is not None:
            return Future.failed(self._error)
        if self._deleted:
            return Future.failed(deleted_error(self))
        return Future.ready(None)

    def delete(self):
        self._deleted, self._shards = True, None
        return Future.ready(None)

    def is_deleted(self):
        return self._deleted

    def _data(self):  # what StoredArray._take gives away, copies or drops
        if self._deleted and self._error is None:
            raise deleted_error(self)
        return self._shards

    def _copy_of(self, shards):
        return [shard.copy() for shard in shards]

    def _drop_data(self):
        self._deleted, self._shards = True, None

    def disassemble_into_single_device_arrays(self, copy_semantics=ArrayCopySemantics.REUSE_INPUT,
                                              single_device_shard_semantics=ADDRESSABLE):
        plan = plan_disassemble(self, copy_semantics, single_device_shard_semantics)
        shards = self._take(plan.copy_semantics)
        return [ExampleArray(self._client, self._dtype, shape, sharding,
                             None if shards is None else [shards[i]], self._error)
                for i, (shape, sharding) in enumerate(plan.pieces)]

    def copy_to_host_buffer(self, out=None, byte_strides=None):
        if not (_whole_in_each_shard(self._sharding, self._shape)
                and self._sharding.devices.addressable_device_list()):
            return self._gather_to_host_buffer(out, byte_strides)  # from each shard's own copy
        if self._error is not None:
            return Future.failed(self._error)
        data = self._data()[0]
        out = self._host_buffer(out, byte_strides)  # validates out, or allocates it
        np.copyto(out, data)
        return Future.ready(out)


class ExampleExecutable(LoadedExecutable):
    """A Python function, run when executed: NumPy arrays of its arguments' values in, its
    results out as single-device arrays on the first device it runs on. What it returns is
    known only when it runs, and errors raise from ``execute`` (a real backend returns
    outputs whose ready futures fail)."""

    def __init__(self, client, function, devices):
        self._client, self._function, self._devices = client, function, devices
        self._deleted = False
        # Its parameter types are known only when it runs: arrays of the client, live.
        self._execute_contract = ExecuteContract(self.name, client, ExampleArray, None)
        self._user_context = current_user_context()

    client = property(lambda self: self._client)
    user_context = property(lambda self: self._user_context)
    name = property(lambda self: getattr(self._function, "__name__", "program"))

    def devices(self):
        return self._devices  # None: portable, it runs where execute's ``devices`` say

    def addressable_devices(self):
        return [d for d in self._devices or () if d.is_addressable]

    def parameter_shardings(self):
        return None  # a Python function takes arrays of any sharding

    def output_shardings(self):
        return None

    def output_dtypes(self):
        raise UnimplementedError("the outputs of a Python function are known when it runs")

    def output_shapes(self):
        raise UnimplementedError("the outputs of a Python function are known when it runs")

    def output_memory_kinds(self):
        raise UnimplementedError("the outputs of a Python function are known when it runs")

    def _launch(self, call):
        # execute checked the call (ifrtpy.executable.ExecuteContract): arrays of this
        # client, live, and the device a portable executable runs on.
        where = SingleDeviceSharding((call.device or self._devices
                                      or self._client.addressable_devices())[0])
        results = self._function(*[np.asarray(arg) for arg in call.args])
        outputs = [self._client.make_array_from_host_buffer(np.asarray(r), where)
                   for r in results]
        return ExecuteResult(Future.ready(None) if call.options.fill_status else None, outputs)

    def delete(self):
        self._deleted = True
        return Future.ready(None)

    def is_deleted(self):
        return self._deleted


class ExampleCompiler(Compiler):
    """Programs are Python functions from NumPy arrays to a list of NumPy arrays."""

    def __init__(self, client):
        self._client = client

    def compile(self, program, options=None):
        if not callable(program):
            raise UnimplementedError(f"the example backend does not compile "
                                     f"{type(program).__name__} programs: its programs are "
                                     "Python functions of NumPy arrays")
        options = CompileOptions() if options is None else options
        return ExampleExecutable(self._client, program, options.resolve_devices(self._client))

    def deserialize_loaded_executable(self, data, options=None):
        raise UnimplementedError("the example backend does not load executables")


class ExampleClient(Client):
    def __init__(self, device_count: int = 2, addressable_device_count: int | None = None,
                 memory_kinds: tuple[str, ...] = ("device",)):
        if addressable_device_count is None:
            addressable_device_count = device_count
        if not memory_kinds:
            raise InvalidArgumentError("example devices need at least one memory kind")
        self._devices = [ExampleDevice(self, i, i < addressable_device_count, memory_kinds)
                         for i in range(device_count)]
        self._compiler = ExampleCompiler(self)
        self._serial = next(_SERIALS)
        _CLIENTS[self._serial] = self

    runtime_type = property(lambda self: "example")
    platform_name = property(lambda self: "example")
    platform_version = property(lambda self: "0")
    platform_id = property(lambda self: 0)

    def process_index(self):
        return 0

    def devices(self):
        return list(self._devices)

    def default_compiler(self):
        return self._compiler

    def make_array_from_host_buffer(self, data, sharding,
                                    semantics=HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
                                    on_done=None, *, layout=None):
        if layout is not None:
            raise UnimplementedError("the example backend has no custom layouts")
        if isinstance(sharding, OpaqueSharding):
            raise InvalidArgumentError("an OpaqueSharding has no shard information")
        check_placement(self, sharding)  # on this client's devices, in their memory kinds
        data = np.asarray(data)
        if data.dtype.kind in "OSUT":
            raise UnimplementedError("the example backend has no STRING arrays")
        dtype, shape = DType.from_numpy(data.dtype), Shape(data.shape)
        shards = [np.array(data[domain.slices()], copy=True, order="C")  # copied: on_done
                  for domain in addressable_domains(sharding, shape)]  # may run at once
        if on_done is not None:
            on_done()
        return ExampleArray(self, dtype, shape, sharding, shards)

    # The checks of the operations below are the plans of ifrtpy.array_plans, which every
    # backend shares; each backend moves its own data.

    def make_error_arrays(self, error, specs):
        return [ExampleArray(self, spec.dtype, Shape(spec.shape), spec.sharding, None, error)
                for spec in plan_error_arrays(self, error, specs)]

    def assemble_array_from_single_device_arrays(
            self, shape, sharding, arrays, copy_semantics=ArrayCopySemantics.REUSE_INPUT,
            single_device_shard_semantics=ADDRESSABLE, dtype=None):
        plan = plan_assemble(self, shape, sharding, arrays, copy_semantics,
                             single_device_shard_semantics, dtype, ExampleArray)
        shards = [array._take(plan.copy_semantics) for array in plan.arrays]
        if plan.error is not None:  # the result fails as its first failing input does
            return ExampleArray(self, plan.dtype, plan.shape, plan.sharding, None, plan.error)
        return ExampleArray(self, plan.dtype, plan.shape, plan.sharding,
                            [shard for (shard,) in shards])

    def copy_arrays(self, arrays, devices=None, memory_kind=None,
                    semantics=ArrayCopySemantics.ALWAYS_COPY):
        plan = plan_copy(self, arrays, devices, memory_kind, semantics, ExampleArray)
        return [ExampleArray(self, a.dtype, a.shape, target, a._take(plan.semantics), a.error)
                for a, target in zip(plan.arrays, plan.targets)]
