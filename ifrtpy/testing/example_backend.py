"""A minimal ifrtpy backend: the worked example of docs/implementing-a-backend.md.

A few virtual devices; arrays held as NumPy arrays, one per addressable shard; programs
that are Python functions of NumPy arrays. Each class subclasses an abstract interface
and overrides only its abstract methods (the client also ``make_error_arrays``): the
rest is the interfaces' defaults. Everything it does not do raises UnimplementedError,
which the conformance suite turns into skips carrying the message. Register and use it
with::

    import ifrtpy
    ifrtpy.register_backend("example", "ifrtpy.testing.example_backend:create_client")
    client = ifrtpy.get_client("example", device_count=2)

ifrtpy's own tests use it as their fake backend: ``create_client(6,
addressable_device_count=4, memory_kinds=("device", "pinned_host", "unpinned_host"))``
has two devices of another process and the CPU plugin's memory kinds, and its devices
pickle (in the process, while their client lives), so shardings over them do too.
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np

from ifrtpy.array import Array, ArrayCopySemantics, HostBufferSemantics
from ifrtpy.array_plans import canonical_kind
from ifrtpy.client import Client, Compiler
from ifrtpy.device import Device, DeviceList, Memory, MemoryKind
from ifrtpy.dtypes import DType
from ifrtpy.errors import (
    FailedPreconditionError, InvalidArgumentError, NotFoundError, UnimplementedError,
)
from ifrtpy.executable import CompileOptions, ExecuteOptions, ExecuteResult, LoadedExecutable
from ifrtpy.future import Future
from ifrtpy.shape import IndexDomain, Shape
from ifrtpy.sharding import OpaqueSharding, SingleDeviceSharding, SingleDeviceShardSemantics
from ifrtpy.user_context import current_user_context

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
ALL_SHARDS = SingleDeviceShardSemantics.ALL_SHARDS


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


def _shard_domains(sharding, shape):
    """The slice of the array each addressable shard holds (a single-device or fully
    replicated sharding need not have index domains)."""
    if _whole_in_each_shard(sharding, shape):
        return [IndexDomain(shape)] * len(sharding.devices.addressable_device_list())
    return sharding.index_domains(shape, ADDRESSABLE)


class ExampleArray(Array):
    """One NumPy array per addressable shard, in ``sharding.devices`` order (never written
    once made), or an error (``shards`` is None)."""

    def __init__(self, client, dtype, shape, sharding, shards, error=None):
        self._client, self._dtype, self._shape, self._sharding = client, dtype, shape, sharding
        self._shards, self._error, self._deleted = shards, error, False
        self._user_context = current_user_context()  # the context of the call making it

    client = property(lambda self: self._client)
    user_context = property(lambda self: self._user_context)
    dtype = property(lambda self: self._dtype)
    shape = property(lambda self: self._shape)
    sharding = property(lambda self: self._sharding)

    def _live(self):
        if self._deleted:
            raise FailedPreconditionError(f"Array has been deleted: {self.debug_string()}")
        return self._shards

    def ready_future(self):
        if self._error is not None:
            return Future.failed(self._error)
        if self._deleted:
            return Future.failed(FailedPreconditionError("Array has been deleted"))
        return Future.ready(None)

    def delete(self):
        self._deleted, self._shards = True, None
        return Future.ready(None)

    def is_deleted(self):
        return self._deleted

    def _taken(self, semantics):
        """The shards as ``semantics`` says (DONATE_INPUT deletes this array)."""
        shards = self._shards if self._error is not None else self._live()
        if ArrayCopySemantics(semantics) == ArrayCopySemantics.DONATE_INPUT:
            self._deleted, self._shards = True, None
        elif ArrayCopySemantics(semantics) == ArrayCopySemantics.ALWAYS_COPY and shards is not None:
            shards = [shard.copy() for shard in shards]
        return shards

    def disassemble_into_single_device_arrays(self, copy_semantics=ArrayCopySemantics.REUSE_INPUT,
                                              single_device_shard_semantics=ADDRESSABLE):
        if (single_device_shard_semantics == ALL_SHARDS
                and not self._sharding.devices.is_fully_addressable):
            raise InvalidArgumentError("ALL_SHARDS: some of the array's devices are not "
                                       "addressable")
        pieces = self._sharding.disassemble(self._shape, ADDRESSABLE)  # (shape, sharding) each
        shards = self._taken(copy_semantics)
        return [ExampleArray(self._client, self._dtype, shape, sharding,
                             None if shards is None else [shards[i]], self._error)
                for i, (shape, sharding) in enumerate(pieces)]

    def copy_to_host_buffer(self, out=None, byte_strides=None):
        if not (_whole_in_each_shard(self._sharding, self._shape)
                and self._sharding.devices.addressable_device_list()):
            return self._gather_to_host_buffer(out, byte_strides)  # from each shard's own copy
        if self._error is not None:
            return Future.failed(self._error)
        data = self._live()[0]
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

    def execute(self, args, options=None, devices=None):
        options = ExecuteOptions() if options is None else options
        if self._deleted:
            raise FailedPreconditionError(f"the executable {self.name!r} was deleted")
        if devices is not None and self._devices is not None:
            raise InvalidArgumentError("devices are given to portable executables only; this "
                                       f"one runs on {self._devices.to_string()}")
        for i, arg in enumerate(args):
            if not isinstance(arg, ExampleArray) or arg.client is not self._client:
                raise InvalidArgumentError(f"argument {i} is not an array of this client")
        where = SingleDeviceSharding((devices or self._devices
                                      or self._client.addressable_devices())[0])
        results = self._function(*[np.asarray(arg) for arg in args])
        outputs = [self._client.make_array_from_host_buffer(np.asarray(r), where)
                   for r in results]
        return ExecuteResult(Future.ready(None) if options.fill_status else None, outputs)

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
        self._memory_kinds = [MemoryKind(kind) for kind in memory_kinds]
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

    def _check_sharding(self, sharding):
        """On this client's devices, in its memory kinds."""
        for device in sharding.devices:
            if device.client is not self:
                raise InvalidArgumentError(f"device {device} belongs to another client")
        if sharding.memory_kind and sharding.memory_kind not in self._memory_kinds:
            raise InvalidArgumentError(
                f"Invalid memory kind {sharding.memory_kind}; available memory kinds: "
                f"{', '.join(map(str, self._memory_kinds))}")

    def make_array_from_host_buffer(self, data, sharding,
                                    semantics=HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
                                    on_done=None, *, layout=None):
        if layout is not None:
            raise UnimplementedError("the example backend has no custom layouts")
        if isinstance(sharding, OpaqueSharding):
            raise InvalidArgumentError("an OpaqueSharding has no shard information")
        self._check_sharding(sharding)
        data = np.asarray(data)
        if data.dtype.kind in "OSUT":
            raise UnimplementedError("the example backend has no STRING arrays")
        dtype, shape = DType.from_numpy(data.dtype), Shape(data.shape)
        shards = [np.array(data[domain.slices()], copy=True, order="C")  # copied: on_done
                  for domain in _shard_domains(sharding, shape)]  # may run at once
        if on_done is not None:
            on_done()
        return ExampleArray(self, dtype, shape, sharding, shards)

    def make_error_arrays(self, error, specs):
        for spec in specs:
            self._check_sharding(spec.sharding)
        return [ExampleArray(self, spec.dtype, Shape(spec.shape), spec.sharding, None, error)
                for spec in specs]

    def assemble_array_from_single_device_arrays(
            self, shape, sharding, arrays, copy_semantics=ArrayCopySemantics.REUSE_INPUT,
            single_device_shard_semantics=ADDRESSABLE, dtype=None):
        self._check_sharding(sharding)
        if (single_device_shard_semantics == ALL_SHARDS
                and not sharding.devices.is_fully_addressable):
            raise InvalidArgumentError("ALL_SHARDS: some of the sharding's devices are not "
                                       "addressable")
        shape, arrays = Shape(shape), list(arrays)
        devices = sharding.devices.addressable_device_list()  # one array each, in this order
        if len(arrays) != len(devices):
            raise InvalidArgumentError(f"the sharding has {len(devices)} addressable devices, "
                                       f"got {len(arrays)} arrays")
        shard_shapes = (None if isinstance(sharding, OpaqueSharding)  # shapes unknown
                        else [s for s, _ in sharding.disassemble(shape, ADDRESSABLE)])
        if dtype is None and not arrays:
            raise InvalidArgumentError("assembling no arrays needs a dtype")
        dtype = arrays[0].dtype if dtype is None else dtype
        for i, (array, device) in enumerate(zip(arrays, devices)):
            if not isinstance(array, ExampleArray) or array.client is not self:
                raise InvalidArgumentError(f"array {i} is not an array of this client")
            if list(array.sharding.devices) != [device]:
                raise InvalidArgumentError(f"array {i} is on {array.sharding.devices.to_string()}, "
                                           f"shard {i} of the sharding on {device}")
            if shard_shapes is not None and array.shape != shard_shapes[i]:
                raise InvalidArgumentError(f"array {i} has shape {array.shape}, shard {i} of "
                                           f"{shape} is {shard_shapes[i]}")
            if array.dtype != dtype:
                raise InvalidArgumentError(f"array {i} has dtype {array.dtype}, expected {dtype}")
            if array._error is None:
                array._live()  # a deleted array fails here, before any array is taken
        errors = [array._error for array in arrays if array._error is not None]
        shards = [array._taken(copy_semantics) for array in arrays]
        if errors:
            return ExampleArray(self, dtype, shape, sharding, None, errors[0])
        return ExampleArray(self, dtype, shape, sharding, [shard for (shard,) in shards])

    def copy_arrays(self, arrays, devices=None, memory_kind=None,
                    semantics=ArrayCopySemantics.ALWAYS_COPY):
        arrays = list(arrays)
        for i, array in enumerate(arrays):
            if not isinstance(array, ExampleArray) or array.client is not self:
                raise InvalidArgumentError(f"array {i} is not an array of this client")
            if array.sharding.devices != arrays[0].sharding.devices:
                raise InvalidArgumentError("copy_arrays needs every input on the same devices: "
                                           f"array {i} is on {array.sharding.devices.to_string()}")
            if canonical_kind(array.sharding) != canonical_kind(arrays[0].sharding):
                raise InvalidArgumentError("copy_arrays needs every input in the same memory "
                                           f"kind: array {i} is in {canonical_kind(array.sharding)}")
            if array._error is None:
                array._live()
        if devices is not None:
            devices = DeviceList(devices)
        targets = [a.sharding.with_device_assignment(devices, memory_kind) for a in arrays]
        for array, sharding in zip(arrays, targets):
            self._check_sharding(sharding)
            if sharding.devices.addressable_mask() != array.sharding.devices.addressable_mask():
                raise UnimplementedError("the example backend copies shards between "
                                         "addressable devices only")
        return [ExampleArray(self, a.dtype, a.shape, sharding, a._taken(semantics), a._error)
                for a, sharding in zip(arrays, targets)]
