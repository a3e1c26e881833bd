"""DeviceMemory: the Memory of a backend whose memories are just an id and a kind on one
device (the reference and jax backends'; the PjRt backend's wrap a PJRT memory)."""

from __future__ import annotations

from ifrtpy.device import Device, Memory, MemoryKind

__all__ = ["DeviceMemory"]


class DeviceMemory(Memory):
    """Memory ``memory_id`` of kind ``kind`` on ``device`` alone. Compares by identity: a
    device makes each of its memories once."""

    __slots__ = ("_id", "_kind", "_device")

    def __init__(self, memory_id: int, kind: str, device: Device):
        self._id = memory_id
        self._kind = MemoryKind(kind)
        self._device = device

    @property
    def id(self) -> int:
        return self._id

    @property
    def kind(self) -> MemoryKind:
        return self._kind

    def devices(self) -> list[Device]:
        return [self._device]

    def to_string(self) -> str:
        return f"{self._device.to_string()}:{self._kind.value}"

    def debug_string(self) -> str:
        return f"Memory(id={self._id}, kind={self._kind.value}, device={self._device.id})"
