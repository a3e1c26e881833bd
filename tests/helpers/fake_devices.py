"""A fake client for value-type tests: N devices, the first M addressable.

Each device has three memories, ``device`` (the default), ``pinned_host`` and
``unpinned_host``, like the PJRT CPU plugin. ``fake_client(n, m)`` is cached, so devices
pickle by (n, m, id) and unpickle to the same objects.
"""

from __future__ import annotations

from ifrtpy.device import Device, DeviceList, Memory, MemoryKind

MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")


class FakeMemory(Memory):
    def __init__(self, memory_id: int, kind: str, device: FakeDevice):
        self._id = memory_id
        self._kind = MemoryKind(kind)
        self._device = device

    @property
    def id(self) -> int:
        return self._id

    @property
    def kind(self) -> MemoryKind:
        return self._kind

    def devices(self):
        return (self._device,)

    def to_string(self) -> str:
        return f"FakeMemory(id={self._id}, kind={self._kind})"


class FakeDevice(Device):
    def __init__(self, client: FakeClient, device_id: int, addressable: bool):
        self._client = client
        self._id = device_id
        self._addressable = addressable
        self._memories = tuple(FakeMemory(device_id * len(MEMORY_KINDS) + i, kind, self)
                               for i, kind in enumerate(MEMORY_KINDS))

    @property
    def client(self):
        return self._client

    @property
    def id(self) -> int:
        return self._id

    @property
    def kind(self) -> str:
        return "fake"

    @property
    def is_addressable(self) -> bool:
        return self._addressable

    @property
    def process_index(self) -> int:
        return 0 if self._addressable else 1

    def memories(self):
        return self._memories

    def default_memory(self):
        return self._memories[0]

    def to_string(self) -> str:
        return f"FakeDevice({self._id})"

    def __reduce__(self):
        return (_lookup_device, (self._client.num_devices, self._client.num_addressable, self._id))


class FakeClient:
    """Holds the devices; ``devices(ids)`` makes a DeviceList of the given ids."""

    def __init__(self, num_devices: int, num_addressable: int):
        self.num_devices = num_devices
        self.num_addressable = num_addressable
        self._devices = tuple(FakeDevice(self, i, i < num_addressable) for i in range(num_devices))

    def device(self, device_id: int) -> FakeDevice:
        return self._devices[device_id]

    def devices(self, ids=None) -> DeviceList:
        if ids is None:
            return DeviceList(self._devices)
        return DeviceList(self._devices[i] for i in ids)


_CLIENTS: dict[tuple[int, int], FakeClient] = {}


def fake_client(num_devices: int = 6, num_addressable: int = 4) -> FakeClient:
    """The (cached) fake client with ``num_devices`` devices, the first ``num_addressable``
    of them addressable."""
    key = (num_devices, num_addressable)
    if key not in _CLIENTS:
        _CLIENTS[key] = FakeClient(num_devices, num_addressable)
    return _CLIENTS[key]


def _lookup_device(num_devices: int, num_addressable: int, device_id: int) -> FakeDevice:
    return fake_client(num_devices, num_addressable).device(device_id)
