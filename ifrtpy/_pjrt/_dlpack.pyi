from typing import Any

import numpy as np

from ifrtpy._pjrt._buffer import BufferHandle
from ifrtpy._pjrt._client import ClientHandle, DeviceHandle, MemoryHandle

def export(buffer: BufferHandle, device_type: int, device_id: int, versioned: bool,
           read_only: bool = True, copied: bool = False) -> Any: ...
def host_view(buffer: BufferHandle) -> np.ndarray | None: ...
def external_ready_stream(client: ClientHandle, device: DeviceHandle) -> int: ...
def capsule_info(capsule: Any) -> tuple[int, int, int, tuple[int, ...], bool]: ...
def import_capsule(client: ClientHandle, capsule: Any, memory: MemoryHandle,
                   device: DeviceHandle, view: bool, alignment: int, stream: int = 0,
                   element_type: int = -1) -> tuple[Any, Any]: ...  # (BufferHandle, None) or (None, ndarray)
