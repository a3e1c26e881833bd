"""ReferenceClient and ReferenceDevice: N virtual CPU devices, each with the CPU plugin's
three memories.

Array operations are those of :mod:`ifrtpy.backends.host_arrays`, compilation in
:mod:`ifrtpy.backends.reference.executable`.
"""

from __future__ import annotations

import zlib
from typing import Any, Mapping

from ifrtpy.array import ArrayCopySemantics, HostBufferSemantics
from ifrtpy.backends import host_arrays as _host
from ifrtpy.backends.memories import DeviceMemory
from ifrtpy.backends.reference.array import ReferenceArray
from ifrtpy.backends.reference import executable as _executable
from ifrtpy.client import Client
from ifrtpy.executable import ExecuteResult
from ifrtpy.device import Device
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.program import stablehlo_version
from ifrtpy.sharding import SingleDeviceShardSemantics

#: The memory kinds of every device, default first (as the CPU plugin has them).
MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")


def create_client(device_count: int = 8, addressable_device_count: int | None = None
                  ) -> ReferenceClient:
    """A ReferenceClient of ``device_count`` virtual CPU devices.

    The first ``addressable_device_count`` (default: all) are addressable by this
    process (process 0); the others belong to process 1 and hold no data here, which
    lets tests exercise the non-addressable paths of the interfaces.
    """
    if isinstance(device_count, bool) or not isinstance(device_count, int) or device_count < 1:
        raise InvalidArgumentError(f"device_count must be an int >= 1, got {device_count!r}")
    if addressable_device_count is None:
        addressable_device_count = device_count
    if (isinstance(addressable_device_count, bool) or not isinstance(addressable_device_count, int)
            or not 1 <= addressable_device_count <= device_count):
        raise InvalidArgumentError(
            f"addressable_device_count must be an int in [1, {device_count}], got "
            f"{addressable_device_count!r}")
    return ReferenceClient(device_count, addressable_device_count)


class ReferenceDevice(Device):
    """A virtual CPU device. Compares by identity; one object per device."""

    __slots__ = ("_client", "_id", "_process_index", "_memories")

    def __init__(self, client: ReferenceClient, device_id: int, process_index: int):
        self._client = client
        self._id = device_id
        self._process_index = process_index
        self._memories = tuple(DeviceMemory(device_id * len(MEMORY_KINDS) + k, kind, self)
                               for k, kind in enumerate(MEMORY_KINDS))

    @property
    def client(self) -> ReferenceClient:
        return self._client

    @property
    def id(self) -> int:
        return self._id

    @property
    def kind(self) -> str:
        return "cpu"

    @property
    def attributes(self) -> Mapping[str, Any]:
        return {"process_index": self._process_index}

    @property
    def is_addressable(self) -> bool:
        return self._process_index == self._client.process_index()

    @property
    def process_index(self) -> int:
        return self._process_index

    def memories(self) -> tuple[DeviceMemory, ...]:
        return self._memories

    def default_memory(self) -> DeviceMemory:
        return self._memories[0]

    def to_string(self) -> str:
        return f"REF_CPU_{self._id}"

    def debug_string(self) -> str:
        return f"ReferenceDevice(id={self._id}, process_index={self._process_index})"


class ReferenceClient(Client):
    """The reference backend's client. Thread-safe: its state is fixed at creation and
    arrays are immutable NumPy data."""

    def __init__(self, device_count: int, addressable_device_count: int):
        self._devices = [ReferenceDevice(self, i, 0 if i < addressable_device_count else 1)
                         for i in range(device_count)]
        self._addressable = self._devices[:addressable_device_count]
        self._compiler = _executable.ReferenceCompiler(self)

    # -- identity -------------------------------------------------------------------------

    @property
    def runtime_type(self) -> str:
        return "reference_ifrt"

    @property
    def platform_name(self) -> str:
        """``cpu``: the devices are CPU devices (so jax, through the IFRT Proxy, lowers
        its programs for the CPU, LAPACK custom calls and all); ``runtime_type`` tells
        this backend apart."""
        return "cpu"

    @property
    def platform_version(self) -> str:
        return "StableHLO interpreter " + ".".join(map(str, stablehlo_version()))

    @property
    def platform_id(self) -> int:
        return zlib.crc32(self.platform_name.encode())

    def process_index(self) -> int:
        return 0

    def attributes(self) -> Mapping[str, Any]:
        return {"supports_executable_serialization": True}

    # -- devices --------------------------------------------------------------------------

    def devices(self) -> list[ReferenceDevice]:
        return list(self._devices)

    def addressable_devices(self) -> list[ReferenceDevice]:
        return list(self._addressable)

    # -- arrays ---------------------------------------------------------------------------

    def make_array_from_host_buffer(self, data, sharding,
                                    semantics=HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
                                    on_done=None, *, layout=None):
        return _host.make_array_from_host_buffer(ReferenceArray, self, data, sharding, semantics,
                                                 on_done, layout)

    def assemble_array_from_single_device_arrays(
            self, shape, sharding, arrays, copy_semantics=ArrayCopySemantics.REUSE_INPUT,
            single_device_shard_semantics=SingleDeviceShardSemantics.ADDRESSABLE_SHARDS,
            dtype=None):
        return _host.assemble(ReferenceArray, self, shape, sharding, arrays, copy_semantics,
                              single_device_shard_semantics, dtype)

    def bitcast_arrays(self, arrays, specs, semantics=ArrayCopySemantics.ALWAYS_COPY):
        return _host.bitcast_arrays(ReferenceArray, self, arrays, specs, semantics)

    def copy_arrays(self, arrays, devices=None, memory_kind=None,
                    semantics=ArrayCopySemantics.ALWAYS_COPY):
        return _host.copy_arrays(ReferenceArray, self, arrays, devices, memory_kind, semantics)

    def reshard_arrays(self, arrays, specs, semantics=ArrayCopySemantics.ALWAYS_COPY):
        return _host.reshard_arrays(ReferenceArray, self, arrays, specs, semantics)

    def make_error_arrays(self, error, specs):
        return _host.make_error_arrays(ReferenceArray, self, error, specs)

    # -- programs -------------------------------------------------------------------------

    def default_compiler(self) -> _executable.ReferenceCompiler:
        return self._compiler

    def cancel_execution(self, result, error=None) -> bool:
        """False: the reference backend runs a program to its end within ``execute``, so
        every execution has finished before it can be cancelled."""
        if not isinstance(result, ExecuteResult):
            raise InvalidArgumentError(
                f"cancel_execution takes the ExecuteResult of an execution, got {type(result).__name__}")
        return False

    def __repr__(self) -> str:
        return (f"<ReferenceClient {len(self._devices)} devices "
                f"({len(self._addressable)} addressable)>")
