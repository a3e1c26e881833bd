"""A minimal ifrtpy backend: the worked example of docs/implementing-a-backend.md.

Single-device arrays held as NumPy arrays on a few virtual devices with one memory each;
no programs. Everything it does not do raises UnimplementedError, which the conformance
suite turns into skips carrying the message. Register and use it with::

    import ifrtpy
    ifrtpy.register_backend("example", "ifrtpy.testing.example_backend:create_client")
    client = ifrtpy.get_client("example", device_count=2)
"""

from __future__ import annotations

import numpy as np

from ifrtpy.array import Array, ArrayCopySemantics, HostBufferSemantics
from ifrtpy.client import Client, Compiler
from ifrtpy.device import Device, DeviceList, Memory, MemoryKind
from ifrtpy.dtypes import DType
from ifrtpy.errors import (
    FailedPreconditionError, InvalidArgumentError, UnimplementedError,
)
from ifrtpy.future import Future
from ifrtpy.shape import Shape
from ifrtpy.sharding import OpaqueSharding

DEVICE = MemoryKind("device")


def create_client(device_count: int = 2) -> ExampleClient:
    return ExampleClient(device_count)


class ExampleMemory(Memory):
    def __init__(self, device):
        self._device = device

    id = property(lambda self: self._device.id)
    kind = property(lambda self: DEVICE)

    def devices(self):
        return [self._device]

    def to_string(self):
        return f"example_memory_{self._device.id}"


class ExampleDevice(Device):
    def __init__(self, client, device_id):
        self._client, self._id = client, device_id
        self._memory = ExampleMemory(self)

    client = property(lambda self: self._client)
    id = property(lambda self: self._id)
    kind = property(lambda self: "example")
    is_addressable = property(lambda self: True)
    process_index = property(lambda self: 0)

    def memories(self):
        return [self._memory]

    def default_memory(self):
        return self._memory

    def to_string(self):
        return f"example_device_{self._id}"


class ExampleArray(Array):
    """A single-device array: one NumPy array (never written once made), or an error."""

    def __init__(self, client, dtype, shape, sharding, data, error=None):
        self._client, self._dtype, self._shape, self._sharding = client, dtype, shape, sharding
        self._data, self._error, self._deleted = data, error, False

    client = property(lambda self: self._client)
    dtype = property(lambda self: self._dtype)
    shape = property(lambda self: self._shape)
    sharding = property(lambda self: self._sharding)

    def _live(self):
        if self._deleted:
            raise FailedPreconditionError(f"Array has been deleted: {self.debug_string()}")
        return self._data

    def ready_future(self):
        if self._error is not None:
            return Future.failed(self._error)
        if self._deleted:
            return Future.failed(FailedPreconditionError("Array has been deleted"))
        return Future.ready(None)

    def delete(self):
        self._deleted, self._data = True, None
        return Future.ready(None)

    def is_deleted(self):
        return self._deleted

    def _taken(self, semantics):
        """The data as ``semantics`` says (DONATE_INPUT deletes this array)."""
        data = self._data if self._error is not None else self._live()
        if ArrayCopySemantics(semantics) == ArrayCopySemantics.DONATE_INPUT:
            self._deleted, self._data = True, None
        elif ArrayCopySemantics(semantics) == ArrayCopySemantics.ALWAYS_COPY and data is not None:
            data = data.copy()
        return data

    def disassemble_into_single_device_arrays(self, copy_semantics=ArrayCopySemantics.REUSE_INPUT,
                                              single_device_shard_semantics=None):
        data = self._taken(copy_semantics)
        return [ExampleArray(self._client, self._dtype, self._shape, self._sharding, data,
                             self._error)]

    def copy_to_host_buffer(self, out=None, byte_strides=None):
        if self._error is not None:
            return Future.failed(self._error)
        data = self._live()
        out = self._host_buffer(out, byte_strides)  # validates out, or allocates it
        np.copyto(out, data)
        return Future.ready(out)


class ExampleCompiler(Compiler):
    def compile(self, program, options=None):
        raise UnimplementedError("the example backend does not compile programs")

    def deserialize_loaded_executable(self, data, options=None):
        raise UnimplementedError("the example backend does not load executables")


class ExampleClient(Client):
    def __init__(self, device_count: int = 2):
        self._devices = [ExampleDevice(self, i) for i in range(device_count)]
        self._compiler = ExampleCompiler()

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
        """Single-device shardings on this client's devices, in the one memory kind."""
        if len(sharding.devices) != 1:
            raise UnimplementedError("the example backend holds single-device arrays only")
        if isinstance(sharding, OpaqueSharding):
            raise InvalidArgumentError("an OpaqueSharding has no shard information")
        if sharding.devices[0].client is not self:
            raise InvalidArgumentError(f"device {sharding.devices[0]} belongs to another client")
        if sharding.memory_kind not in (MemoryKind(), DEVICE):
            raise InvalidArgumentError(f"Invalid memory kind {sharding.memory_kind}; "
                                       "available memory kinds: device")

    def make_array_from_host_buffer(self, data, sharding,
                                    semantics=HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
                                    on_done=None, *, layout=None):
        if layout is not None:
            raise UnimplementedError("the example backend has no custom layouts")
        self._check_sharding(sharding)
        data = np.array(data, copy=True, order="C")  # copied: on_done may run at once
        array = ExampleArray(self, DType.from_numpy(data.dtype), Shape(data.shape), sharding, data)
        if on_done is not None:
            on_done()
        return array

    def make_error_arrays(self, error, specs):
        for spec in specs:
            self._check_sharding(spec.sharding)
        return [ExampleArray(self, spec.dtype, Shape(spec.shape), spec.sharding, None, error)
                for spec in specs]

    def assemble_array_from_single_device_arrays(
            self, shape, sharding, arrays, copy_semantics=ArrayCopySemantics.REUSE_INPUT,
            single_device_shard_semantics=None, dtype=None):
        self._check_sharding(sharding)
        arrays = list(arrays)
        if len(arrays) != 1:
            raise InvalidArgumentError(f"a single-device sharding needs 1 array, got {len(arrays)}")
        (array,) = arrays
        if not isinstance(array, ExampleArray) or array.client is not self:
            raise InvalidArgumentError("array 0 is not an array of this client")
        if Shape(shape) != array.shape or array.sharding.devices != sharding.devices:
            raise InvalidArgumentError(f"array 0 is {array!r}, expected shape {shape} on "
                                       f"{sharding.devices.to_string()}")
        if dtype is not None and dtype != array.dtype:
            raise InvalidArgumentError(f"array 0 has dtype {array.dtype}, expected {dtype}")
        data = array._taken(copy_semantics)
        return ExampleArray(self, array.dtype, array.shape, sharding, data, array._error)

    def copy_arrays(self, arrays, devices=None, memory_kind=None,
                    semantics=ArrayCopySemantics.ALWAYS_COPY):
        arrays = list(arrays)
        for i, array in enumerate(arrays):
            if not isinstance(array, ExampleArray) or array.client is not self:
                raise InvalidArgumentError(f"array {i} is not an array of this client")
            if array.sharding.devices != arrays[0].sharding.devices:
                raise InvalidArgumentError("copy_arrays needs every input on the same devices: "
                                           f"array {i} is on {array.sharding.devices.to_string()}")
            if array._error is None:
                array._live()
        if devices is not None:
            devices = DeviceList(devices)
        targets = [a.sharding.with_device_assignment(devices, memory_kind) for a in arrays]
        for sharding in targets:
            self._check_sharding(sharding)
        return [ExampleArray(self, a.dtype, a.shape, sharding, a._taken(semantics), a._error)
                for a, sharding in zip(arrays, targets)]
