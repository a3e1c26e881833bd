"""Copies of single PJRT buffers, and which zero-copy forms the plugin offers: by the
plugin's own calls where it has them, else another way (a plugin may leave optional
functions out of its table: ``PluginHandle.missing_functions``).

* :func:`copy_to_memory`: ``PJRT_Buffer_CopyToMemory``; without it
  ``PJRT_Buffer_CopyToDevice`` into a device's default memory; else through the host.
* :func:`host_views` / :func:`device_views`: whether NumPy views and DLPack exports of a
  buffer (``PJRT_Buffer_UnsafePointer`` and the external reference counts), and views of
  foreign memory (``PJRT_Client_CreateViewOfDeviceBuffer``), can be made: where not, the
  arrays copy.
"""

from __future__ import annotations

from typing import Any

from ifrtpy import _pjrt
from ifrtpy.errors import UnimplementedError

__all__ = ["copy_to_memory", "host_views", "device_views"]

_VIEW_CALLS = frozenset({"PJRT_Buffer_UnsafePointer", "PJRT_Buffer_IncreaseExternalReferenceCount",
                         "PJRT_Buffer_DecreaseExternalReferenceCount"})


def host_views(plugin: _pjrt.PluginHandle) -> bool:
    """Whether ``plugin`` has the calls a NumPy view or a DLPack export of a buffer needs."""
    return _VIEW_CALLS.isdisjoint(plugin.missing_functions)


def device_views(plugin: _pjrt.PluginHandle) -> bool:
    """Whether ``plugin`` makes buffers over memory it does not own (DLPack imports)."""
    return "PJRT_Client_CreateViewOfDeviceBuffer" not in plugin.missing_functions


def copy_to_memory(buffer: Any, memory: Any) -> Any:
    """A new BufferHandle holding ``buffer``'s data in ``memory`` (a MemoryHandle of its
    client), in the same device layout where the plugin says which that is."""
    missing = buffer.client.plugin.missing_functions
    if "PJRT_Buffer_CopyToMemory" not in missing:
        return buffer.copy_to_memory(memory)
    if "PJRT_Buffer_CopyToDevice" not in missing:
        for device in memory.devices:
            if device.default_memory is memory:
                return buffer.copy_to_device(device)
    data = buffer.to_numpy()
    try:
        layout = buffer.memory_layout
    except UnimplementedError:  # no PJRT_Buffer_GetMemoryLayout, or a strided layout
        layout = None
    if layout == (tuple(range(data.ndim - 1, -1, -1)), ()):
        layout = None  # row-major: the plugin's default, asked for by none
    return _pjrt.buffer_from_host_buffer(buffer.client, data, memory=memory, layout=layout)[0]
