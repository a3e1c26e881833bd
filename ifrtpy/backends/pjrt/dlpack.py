"""DLPack for PjRt arrays: which DLPack device a buffer is on, capsules of buffers, and
where a foreign tensor lands and how it is reached (its device, stream and capsule). The C
side (pins, capsules, views of foreign memory) is :mod:`ifrtpy._pjrt._dlpack`; arrays are
made from tensors by :mod:`.dlpack_import`.
"""

from __future__ import annotations

from typing import Any


from ifrtpy._pjrt import _dlpack
from ifrtpy.backends.pjrt.copies import copy_to_memory
from ifrtpy.errors import InvalidArgumentError, UnimplementedError

# DLDeviceType values (DLPack specification).
KDLCPU, KDLCUDA, KDLCUDAHOST, KDLROCM, KDLROCMHOST, KDLCUDAMANAGED = 1, 2, 3, 10, 11, 13

#: Memory kinds a host can read directly, whatever the platform.
HOST_MEMORY_KINDS = frozenset({"pinned_host", "unpinned_host"})
_ACCELERATOR_TYPES = {"cuda": (KDLCUDA, KDLCUDAHOST), "rocm": (KDLROCM, KDLROCMHOST)}
# The CPU plugin aliases host memory at a 64-byte boundary only (it refuses other memory);
# XLA's GPU code assumes parameters aligned to 16 bytes.
_ALIGNMENT = {"cpu": 64}


def alignment(client: Any) -> int:
    """The byte boundary at which ``client``'s plugin aliases host memory."""
    return _ALIGNMENT.get(client.platform_name, 16)

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
    if not array._client._host_views and copy is not False and device == (KDLCPU, 0):
        # the plugin cannot hand out its memory: a copy in host memory, as copy=None allows
        host = array.copy_to_host_buffer().result()
        return host.__dlpack__(max_version=max_version) if versioned else host.__dlpack__()
    if copy:
        buffer = copy_to_memory(buffer, buffer.memory)
    return _dlpack.export(buffer, device[0], device[1], versioned, True, bool(copy))


# -- where a foreign tensor is, and how to take it ---------------------------------------

#: DLPack device types whose memory the host reads directly.
HOST_TYPES = (KDLCPU, KDLCUDAHOST, KDLROCMHOST, KDLCUDAMANAGED)


def source_device(x: Any) -> tuple[int, int]:
    """The DLPack device of a producer, or of a bare capsule (InvalidArgumentError for
    anything else)."""
    if hasattr(x, "__dlpack_device__"):
        kind, index = x.__dlpack_device__()
        return int(kind), int(index)
    kind, index = _dlpack.capsule_info(x)[:2]
    return int(kind), int(index)


def target_device(client: Any, source: tuple[int, int], device: Any) -> Any:
    """The device of ``client`` a tensor on DLPack device ``source`` lands on: ``device``
    if given, else the accelerator with that local hardware id, else device 0."""
    if device is not None:
        if getattr(device, "client", None) is not client:
            raise InvalidArgumentError(f"device {device!r} is not a device of this client")
        return device
    devices = client.addressable_devices()
    if source[0] not in HOST_TYPES:
        for d in devices:
            if same_device(client, source, d):
                return d
        raise InvalidArgumentError(
            f"no device of this {client.platform_name} client matches DLPack device {source}")
    return devices[0]


def same_device(client: Any, source: tuple[int, int], device: Any) -> bool:
    types = _ACCELERATOR_TYPES.get(client.platform_name)
    return types is not None and source == (types[0], device.local_hardware_id)


def stream_for(client: Any, target: Any, source: tuple[int, int]) -> int | None:
    """The stream argument for a producer on DLPack device ``source``: None for host
    memory; for device memory, the stream the plugin hands out for external buffers of
    ``target`` (its stream extension), which the view's ready event then follows. The
    plugin can only map its own streams, so without that extension nothing orders the
    producer's work before the view: refused."""
    if source[0] in HOST_TYPES:
        return None
    stream = _dlpack.external_ready_stream(client._handle, target._handle)
    if not stream:
        raise UnimplementedError(
            f"{client.platform_name} offers no stream for external buffers (PJRT's stream "
            f"extension): a tensor in device memory (DLPack device {source}) cannot be imported")
    return stream


def capsule_of(x: Any, stream: int | None) -> Any:
    if not hasattr(x, "__dlpack__"):
        return x  # a capsule, checked by the Cython layer
    try:
        return x.__dlpack__(stream=stream, max_version=(1, 1))
    except TypeError:  # a producer of the DLPack 0.x protocol
        return x.__dlpack__() if stream is None else x.__dlpack__(stream=stream)
