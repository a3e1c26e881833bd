"""ifrtpy's Cython layer over the PJRT C API: thin, mechanical, C names kept.

Each module's docstring lists where it differs from the C API. Everything here is
backend plumbing; users go through :mod:`ifrtpy` and its backends.
"""

from ifrtpy._pjrt._base import PluginHandle, load_plugin, loaded_plugins
from ifrtpy._pjrt._client import ClientHandle, DeviceHandle, MemoryHandle, create_client
from ifrtpy._pjrt._buffer import BufferHandle, buffer_from_host_buffer
from ifrtpy._pjrt._event import EventHandle
from ifrtpy._pjrt._executable import ExecutableHandle, compile, deserialize_and_load, plugin_identity

__all__ = [
    "PluginHandle", "load_plugin", "loaded_plugins",
    "ClientHandle", "DeviceHandle", "MemoryHandle", "create_client",
    "BufferHandle", "EventHandle", "buffer_from_host_buffer",
    "ExecutableHandle", "compile", "deserialize_and_load", "plugin_identity",
]
