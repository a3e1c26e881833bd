from typing_extensions import Self

from ifrtpy._pjrt._buffer import BufferHandle
from ifrtpy.backends._array_fields import ArrayFields
from ifrtpy.layout import Layout

class ArrayCore(ArrayFields):
    _buffers: tuple[BufferHandle, ...]
    _layout: Layout | None
    def is_deleted(self) -> bool: ...
    def block_until_ready(self) -> Self: ...

def free_directly(cls: type[ArrayCore]) -> None: ...
