"""Zero-copy exchange of PjRt arrays with other libraries: DLPack export and import, and
NumPy views. The C side (pins, capsules, views of foreign memory) is
:mod:`ifrtpy._pjrt._dlpack`; this module decides what is viewed, what is copied, and on
which device a DLPack tensor lands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ifrtpy import _pjrt
from ifrtpy._pjrt import _dlpack
from ifrtpy.errors import InvalidArgumentError, UnimplementedError

# DLDeviceType values (DLPack specification).
KDLCPU, KDLCUDA, KDLCUDAHOST, KDLROCM, KDLROCMHOST, KDLCUDAMANAGED = 1, 2, 3, 10, 11, 13

#: Memory kinds a host can read directly, whatever the platform.
HOST_MEMORY_KINDS = frozenset({"pinned_host", "unpinned_host"})
_ACCELERATOR_TYPES = {"cuda": (KDLCUDA, KDLCUDAHOST), "rocm": (KDLROCM, KDLROCMHOST)}
# The CPU plugin aliases host memory at a 64-byte boundary only (it refuses other memory);
# XLA's GPU code assumes parameters aligned to 16 bytes.
_ALIGNMENT = {"cpu": 64}
_DEFAULT_ALIGNMENT = 16

def dlpack_device(client: Any, buffer: Any) -> tuple[int, int]:
    """``(DLDeviceType, device id)`` of ``buffer``: kDLCPU 0 for host memory, the
    accelerator's type and the device's local hardware id for device memory."""
    memory = buffer.memory
    cache = client._dlpack_devices
    device = cache.get(memory.id)
    if device is None:
        device = cache[memory.id] = _dlpack_device(client, buffer, memory)
    return device


def _dlpack_device(client: Any, buffer: Any, memory: Any) -> tuple[int, int]:
    platform = client.platform_name
    if platform == "cpu" or memory.kind == "unpinned_host":
        return KDLCPU, 0
    types = _ACCELERATOR_TYPES.get(platform)
    if types is None:
        raise UnimplementedError(f"no DLPack device type is known for platform {platform!r}")
    if memory.kind == "pinned_host":
        return types[1], 0
    return types[0], buffer.device.local_hardware_id


def export_dlpack(buffer: Any, array: Any, stream: Any, max_version: Any, dl_device: Any,
                  copy: bool | None) -> Any:
    """``array.__dlpack__`` for its one ``buffer`` (see PjrtArray.__dlpack__)."""
    device = dlpack_device(array._client, buffer)
    if stream is not None and device[0] == KDLCPU and stream != -1:
        raise BufferError(f"a CPU array takes no stream, got stream={stream!r}")
    versioned = max_version is not None and int(max_version[0]) >= 1
    if dl_device is not None and tuple(dl_device) != device:
        if copy is False:
            raise BufferError(f"the array is on DLPack device {device}; {tuple(dl_device)} needs a copy")
        if tuple(dl_device) != (KDLCPU, 0):
            raise BufferError(f"an array on DLPack device {device} is copied only to (kDLCPU, 0)")
        host = array.copy_to_host_buffer().result()
        return host.__dlpack__(max_version=max_version) if versioned else host.__dlpack__()
    if copy:
        buffer = buffer.copy_to_memory(buffer.memory)
    return _dlpack.export(buffer, device[0], device[1], versioned, True, bool(copy))


# -- import --------------------------------------------------------------------------------

def from_dlpack(client: Any, x: Any, device: Any = None, copy: bool | None = None) -> Any:
    """``client.from_dlpack``: a single-device array holding ``x`` (a DLPack producer, or a
    capsule), zero-copy where the plugin can alias its memory, else with one copy."""
    from ifrtpy.backends.pjrt.array import PjrtArray, _dtype_of
    from ifrtpy.sharding import SingleDeviceSharding
    from ifrtpy.shape import Shape

    if copy not in (None, True, False):
        raise InvalidArgumentError(f"copy must be None, True or False, got {copy!r}")
    source = _source_device(x)
    target = _target_device(client, source, device)
    memory = target.default_memory()
    on_host = source[0] in _host_types()
    if not on_host and not _same_device(client, source, target):
        raise InvalidArgumentError(
            f"the tensor is on DLPack device {source}, which is not {target} of this client; "
            "move it there first")
    # Host memory is aliased only by a plugin whose memories are host memory; device
    # memory only on its own device (checked above).
    view = copy is not True and (client._host_platform or not on_host)
    element_type = -1
    if isinstance(x, np.ndarray) and x.dtype.num >= 256:  # a user-defined (ml_dtypes) type
        # NumPy exports no extension type (bfloat16, float8): its bytes, typed here
        element_type = _dtype_of(x.dtype).pjrt_buffer_type
        x = x.view(f"u{x.dtype.itemsize}")
    stream = _stream_for(client, target, source)
    capsule = _capsule_of(x, stream)
    buffer, host = _dlpack.import_capsule(
        client._handle, capsule, memory._handle, target._handle, view,
        _ALIGNMENT.get(client.platform_name, _DEFAULT_ALIGNMENT), stream or 0,
        element_type)
    sharding = SingleDeviceSharding(target)
    if buffer is not None:
        dtype = _dtype_of(buffer.dtype)
        return PjrtArray(client, dtype, Shape(buffer.dims), sharding, (buffer,))
    if copy is False and host.size:  # an empty tensor has no memory to copy
        raise ValueError(
            "from_dlpack(copy=False): the tensor cannot be aliased (it must be dense, row-major "
            f"and {_ALIGNMENT.get(client.platform_name, _DEFAULT_ALIGNMENT)}-byte aligned); "
            "a copy is needed")
    return client.make_array_from_host_buffer(host, sharding)


def _host_types() -> tuple[int, ...]:
    return (KDLCPU, KDLCUDAHOST, KDLROCMHOST, KDLCUDAMANAGED)


def _source_device(x: Any) -> tuple[int, int]:
    """The DLPack device of a producer, or of a bare capsule (InvalidArgumentError for
    anything else)."""
    if hasattr(x, "__dlpack_device__"):
        kind, index = x.__dlpack_device__()
        return int(kind), int(index)
    kind, index = _dlpack.capsule_info(x)[:2]
    return int(kind), int(index)


def _target_device(client: Any, source: tuple[int, int], device: Any) -> Any:
    """The device of ``client`` a tensor on DLPack device ``source`` lands on: ``device``
    if given, else the accelerator with that local hardware id, else device 0."""
    if device is not None:
        if getattr(device, "client", None) is not client:
            raise InvalidArgumentError(f"device {device!r} is not a device of this client")
        return device
    devices = client.addressable_devices()
    if source[0] not in _host_types():
        for d in devices:
            if _same_device(client, source, d):
                return d
        raise InvalidArgumentError(
            f"no device of this {client.platform_name} client matches DLPack device {source}")
    return devices[0]


def _same_device(client: Any, source: tuple[int, int], device: Any) -> bool:
    types = _ACCELERATOR_TYPES.get(client.platform_name)
    return types is not None and source == (types[0], device.local_hardware_id)


def _stream_for(client: Any, target: Any, source: tuple[int, int]) -> int | None:
    """The stream argument for a producer on DLPack device ``source``: None for host
    memory; for device memory, the stream the plugin hands out for external buffers of
    ``target`` (its stream extension), which the view's ready event then follows. The
    plugin can only map its own streams, so without that extension nothing orders the
    producer's work before the view: refused."""
    if source[0] in _host_types():
        return None
    stream = _dlpack.external_ready_stream(client._handle, target._handle)
    if not stream:
        raise UnimplementedError(
            f"{client.platform_name} offers no stream for external buffers (PJRT's stream "
            f"extension): a tensor in device memory (DLPack device {source}) cannot be imported")
    return stream


def _capsule_of(x: Any, stream: int | None) -> Any:
    if not hasattr(x, "__dlpack__"):
        return x  # a capsule, checked by the Cython layer
    try:
        return x.__dlpack__(stream=stream, max_version=(1, 1))
    except TypeError:  # a producer of the DLPack 0.x protocol
        return x.__dlpack__() if stream is None else x.__dlpack__(stream=stream)


def is_pjrt_host_client(client: Any) -> bool:
    """Whether ``client`` is a PjRt client whose memories are all host RAM (the CPU plugin)."""
    return getattr(client, "_host_platform", False)


def assemble_from_dlpack(client: Any, shape: Any, np_dtype: np.dtype, sharding: Any,
                         devices: list, capsules: list) -> Any:
    """One array of ``sharding`` (``devices``: its addressable devices, in order) from one
    host-memory DLPack capsule per device: aliased where the plugin can, else copied."""
    from ifrtpy.backends.pjrt.array import PjrtArray, _dtype_of
    from ifrtpy.shape import Shape

    handle = client._handle
    alignment = _ALIGNMENT.get(client.platform_name, _DEFAULT_ALIGNMENT)
    kind = sharding.memory_kind
    buffers = []
    for device, capsule in zip(devices, capsules):
        source = _source_device(capsule)
        if source[0] not in _host_types():
            raise InvalidArgumentError(f"a tensor on DLPack device {source} is not host memory")
        memory = device.memory(kind)
        buffer, host = _dlpack.import_capsule(handle, capsule, memory._handle, device._handle,
                                              True, alignment, 0)
        if buffer is None:
            buffer = _pjrt.buffer_from_host_buffer(handle, host, None, memory._handle, 0)[0]
        buffers.append(buffer)
    return PjrtArray(client, _dtype_of(np_dtype), Shape(shape), sharding, tuple(buffers))


def is_pjrt_array(array: Any) -> bool:
    from ifrtpy.backends.pjrt.array import PjrtArray
    return isinstance(array, PjrtArray)


def legacy_capsules(array: Any) -> list:
    """A legacy DLPack capsule of each addressable shard of ``array`` (a PjrtArray), in
    device order: what jaxlib imports."""
    if array._error is not None:
        raise array._error
    client = array._client
    out = []
    for buffer in array._live_buffers():
        kind, index = dlpack_device(client, buffer)
        out.append(_dlpack.export(buffer, kind, index, False))
    return out
