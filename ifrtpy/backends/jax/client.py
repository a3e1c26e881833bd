"""JaxClient and JaxDevice: jax's runtime client seen through ifrtpy's interfaces (its
memories are :class:`ifrtpy.backends.memories.DeviceMemory`).

Devices and memories are jax's own (same ids, process indices, addressability and memory
kinds); arrays are :mod:`ifrtpy.backends.jax.array`, made and moved by :mod:`.put` and
:mod:`.operations`; compilation is :mod:`ifrtpy.backends.jax.executable`.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ifrtpy.array import Array, ArrayCopySemantics, ArraySpec, HostBufferSemantics
from ifrtpy import _jaxlib, distributed
from ifrtpy.backends.jax import operations as _operations
from ifrtpy.backends.jax import put as _put
from ifrtpy.backends.jax import executable as _executable
from ifrtpy.backends.memories import DeviceMemory
from ifrtpy.client import Client
from ifrtpy.device import Device, DeviceList, MemoryKind
from ifrtpy.dtypes import DType
from ifrtpy.errors import Code, InvalidArgumentError, error_from_code
from ifrtpy.shape import Shape
from ifrtpy.sharding import Sharding, SingleDeviceShardSemantics


#: jax's error for a backend whose client failed to start (e.g. a multi-process CPU client
#: whose topology exchange timed out), with jaxlib's status code.
_BACKEND_FAILED = re.compile(r"Unable to initialize backend '[^']*': ([A-Z_]+): ")


def create_client(platform: str | None = None, device_count: int | None = None) -> JaxClient:
    """A client over jax's runtime for ``platform`` (None: the platform jax picks).

    ``device_count`` (CPU only) asks jax for that many CPU devices in this process; it can
    be honoured only before jax has created its runtime (InvalidArgumentError afterwards,
    unless jax already has that many). Needs jax (``pip install ifrtpy[jax]``).

    In a job (:func:`ifrtpy.distributed.initialize`), jax's runtime is handed the job as
    it starts (:func:`ifrtpy.distributed.attach_jax_runtime`), so the client lists the
    devices of every process; FailedPreconditionError when jax started before and cannot
    join the job.
    """
    if platform is not None and not isinstance(platform, str):
        raise InvalidArgumentError(f"platform must be a str or None, got {platform!r}")
    if device_count is not None:
        if isinstance(device_count, bool) or not isinstance(device_count, int) or device_count < 1:
            raise InvalidArgumentError(f"device_count must be an int >= 1, got {device_count!r}")
        if platform not in (None, "cpu"):
            raise InvalidArgumentError(
                f"device_count applies to the cpu platform only, got platform {platform!r}")
        platform = "cpu"
    _jaxlib.check_jax()
    distributed.attach_jax_runtime()
    if device_count is not None:
        import jax

        if not _jaxlib.backends_are_initialized():
            jax.config.update("jax_num_cpu_devices", device_count)  # type: ignore[no-untyped-call]
    try:
        runtime = _jaxlib.runtime_client(platform)
    except RuntimeError as e:
        failed = _BACKEND_FAILED.search(str(e))
        if failed and failed.group(1) in Code.__members__:  # it exists, but did not start
            raise error_from_code(Code[failed.group(1)],
                                  f"jax's runtime for platform {platform!r} did not start: {e}"
                                  ) from None
        raise InvalidArgumentError(f"jax has no backend for platform {platform!r}: {e}") from None
    if device_count is not None and runtime.local_device_count() != device_count:
        raise InvalidArgumentError(
            f"device_count={device_count}, but jax's CPU runtime already exists with "
            f"{runtime.local_device_count()} devices in this process (the count is fixed when "
            "jax starts: set it before jax is used, e.g. "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    return JaxClient(runtime)


class JaxDevice(Device):
    """A jax device (``jax_device``); one object per device, compared by identity."""

    __slots__ = ("_client", "_jax", "_memories", "_default")

    def __init__(self, client: JaxClient, jax_device: Any):
        self._client = client
        self._jax = jax_device
        try:
            kinds = [m.kind for m in jax_device.addressable_memories()]
            default = jax_device.default_memory().kind
        except Exception:  # a device of another process: jax lists no memories for it
            kinds, default = ["device"], "device"
        self._memories = tuple(DeviceMemory(jax_device.id * 16 + k, kind, self)
                               for k, kind in enumerate(kinds))
        self._default = next(m for m in self._memories if m.kind == MemoryKind(default))

    @property
    def jax_device(self) -> Any:
        """The ``jax.Device`` this device is."""
        return self._jax

    @property
    def client(self) -> JaxClient:
        return self._client

    @property
    def id(self) -> int:
        return int(self._jax.id)

    @property
    def kind(self) -> str:
        return str(self._jax.device_kind)

    @property
    def attributes(self) -> Mapping[str, Any]:
        return {"process_index": self.process_index}

    @property
    def is_addressable(self) -> bool:
        return self.process_index == self._client.process_index()

    @property
    def process_index(self) -> int:
        return int(self._jax.process_index)

    def memories(self) -> tuple[DeviceMemory, ...]:
        return self._memories

    def default_memory(self) -> DeviceMemory:
        return self._default

    def to_string(self) -> str:
        return str(self._jax)


class JaxClient(Client):
    """ifrtpy's Client over jax's runtime client (``runtime``). Thread-safe, as jax is."""

    def __init__(self, runtime: Any):
        self._runtime = runtime
        self._process_index = int(runtime.process_index())
        self._devices = sorted((JaxDevice(self, d) for d in runtime.devices()),
                               key=lambda d: d.id)
        self._addressable = [d for d in self._devices if d.is_addressable]
        self._compiler = _executable.JaxCompiler(self)

    @property
    def runtime(self) -> Any:
        """jax's runtime client (``jaxlib._jax.Client``)."""
        return self._runtime

    # -- identity -------------------------------------------------------------------------

    @property
    def runtime_type(self) -> str:
        return f"jax_{self._runtime.runtime_type}"

    @property
    def platform_name(self) -> str:
        return str(self._runtime.platform)

    @property
    def platform_version(self) -> str:
        return str(self._runtime.platform_version)

    @property
    def platform_id(self) -> int:
        return zlib.crc32(self.platform_name.encode())

    def process_index(self) -> int:
        return self._process_index

    def attributes(self) -> Mapping[str, Any]:
        return {"supports_executable_serialization": True}

    # -- devices --------------------------------------------------------------------------

    def devices(self) -> list[Device]:
        return list(self._devices)

    def addressable_devices(self) -> list[Device]:
        return list(self._addressable)

    # -- arrays ---------------------------------------------------------------------------

    def make_array_from_host_buffer(
        self, data: np.ndarray, sharding: Sharding,
        semantics: HostBufferSemantics = HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
        on_done: Callable[[], None] | None = None, *, layout: Any = None,
    ) -> Array:
        return _put.make_array_from_host_buffer(self, data, sharding, semantics, on_done,
                                                  layout)

    def assemble_array_from_single_device_arrays(
        self, shape: Shape, sharding: Sharding, arrays: Sequence[Array],
        copy_semantics: ArrayCopySemantics = ArrayCopySemantics.REUSE_INPUT,
        single_device_shard_semantics: SingleDeviceShardSemantics = (
            SingleDeviceShardSemantics.ADDRESSABLE_SHARDS),
        dtype: DType | None = None,
    ) -> Array:
        return _operations.assemble(self, shape, sharding, arrays, copy_semantics,
                               single_device_shard_semantics, dtype)

    def copy_arrays(
        self, arrays: Sequence[Array], devices: DeviceList | None = None,
        memory_kind: MemoryKind | None = None,
        semantics: ArrayCopySemantics = ArrayCopySemantics.ALWAYS_COPY,
    ) -> list[Array]:
        return list(_operations.copy_arrays(self, arrays, devices, memory_kind, semantics))

    def reshard_arrays(
        self, arrays: Sequence[Array], specs: Sequence[ArraySpec],
        semantics: ArrayCopySemantics = ArrayCopySemantics.ALWAYS_COPY,
    ) -> list[Array]:
        return list(_operations.reshard_arrays(self, arrays, specs, semantics))

    def make_error_arrays(self, error: BaseException, specs: Sequence[ArraySpec]) -> list[Array]:
        return list(_operations.make_error_arrays(self, error, specs))

    # -- programs -------------------------------------------------------------------------

    def default_compiler(self) -> _executable.JaxCompiler:
        return self._compiler
