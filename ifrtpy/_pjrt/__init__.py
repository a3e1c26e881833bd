"""ifrtpy's Cython layer over the PJRT C API: thin, mechanical, C names kept.

Each module's docstring lists where it differs from the C API. Everything here is
backend plumbing; users go through :mod:`ifrtpy` and its backends. The layer decides
nothing: it refuses only what a plugin would abort on and can be told without parsing
(empty compile options, a pending event's error, ...), and hands other bytes to the
plugin as given. Serialized executables are the plugin's own bytes: the PjRt backend
seals them (``ifrtpy.backends.pjrt.seal``) and checks the seal before loading; compile
options are built and checked by the backend from ``ifrtpy.CompileOptions``.
"""

from ifrtpy._pjrt._base import PluginHandle, load_plugin, loaded_plugins
from ifrtpy._pjrt._client import ClientHandle, DeviceHandle, MemoryHandle, create_client
from ifrtpy._pjrt._buffer import BufferHandle, buffer_from_host_buffer
from ifrtpy._pjrt._event import EventHandle
from ifrtpy._pjrt._executable import ExecutableHandle, compile, deserialize_and_load

__all__ = [
    "PluginHandle", "load_plugin", "loaded_plugins",
    "ClientHandle", "DeviceHandle", "MemoryHandle", "create_client",
    "BufferHandle", "EventHandle", "buffer_from_host_buffer",
    "ExecutableHandle", "compile", "deserialize_and_load",
]
