"""Device, Memory, MemoryKind and DeviceList over a client of the example backend: 6 devices,
4 addressable."""

import pickle

import pytest

from ifrtpy.errors import InvalidArgumentError

from ifrtpy.device import Device, DeviceList, Memory, MemoryKind, canonicalize_memory_kind
from ifrtpy.testing.example_backend import create_client


@pytest.fixture(scope="module")
def client():
    return create_client(6, addressable_device_count=4,
                         memory_kinds=("device", "pinned_host", "unpinned_host"))


def devs(client, *ids) -> DeviceList:
    return DeviceList(client.lookup_device(i) for i in ids)


def test_abstract_classes_refuse_instantiation():
    with pytest.raises(TypeError):
        Device()
    with pytest.raises(TypeError):
        Memory()


def test_example_device_contract(client):
    device = client.lookup_device(1)
    assert isinstance(device, Device)
    assert device.id == 1 and device.kind == "example" and device.client is client
    assert device.is_addressable and not client.lookup_device(5).is_addressable
    assert [m.kind for m in device.memories()] == [
        MemoryKind("device"), MemoryKind("pinned_host"), MemoryKind("unpinned_host")]
    assert device.default_memory().kind == MemoryKind("device")
    assert all(isinstance(m, Memory) and m.devices() == (device,) for m in device.memories())
    assert device.attributes == {}
    assert str(device) == "example_device_1" == repr(device)


class TestMemoryKind:
    def test_default(self):
        assert MemoryKind() == MemoryKind(None)
        assert MemoryKind().value is None and not MemoryKind()
        assert str(MemoryKind()) == "(default)"

    def test_equality_and_hash(self):
        assert MemoryKind("device") == MemoryKind("device")
        assert MemoryKind("device") != MemoryKind("pinned_host")
        assert MemoryKind("device") != MemoryKind()
        assert MemoryKind(MemoryKind("device")) == MemoryKind("device")
        assert len({MemoryKind("device"), MemoryKind("device"), MemoryKind()}) == 2

    def test_canonicalize(self, client):
        device = client.lookup_device(0)
        assert MemoryKind().canonicalize(device) == MemoryKind("device")
        assert MemoryKind("pinned_host").canonicalize(device) == MemoryKind("pinned_host")
        assert canonicalize_memory_kind(None, device) == MemoryKind("device")
        assert canonicalize_memory_kind("unpinned_host", device) == MemoryKind("unpinned_host")

    def test_value_protocol(self):
        for kind in (MemoryKind(), MemoryKind("pinned_host")):
            assert eval(repr(kind)) == kind
            assert pickle.loads(pickle.dumps(kind)) == kind

    def test_rejects_non_strings(self):
        with pytest.raises(InvalidArgumentError, match=r"memory kind must be a str or None, got 3 \(int\)"):
            MemoryKind(3)


class TestDeviceList:
    def test_sequence(self, client):
        devices = devs(client, 0, 1, 2)
        assert len(devices) == 3
        assert list(devices) == [client.lookup_device(i) for i in range(3)]
        assert devices[1] is client.lookup_device(1)
        assert devices[1:] == devs(client, 1, 2)
        assert client.lookup_device(2) in devices
        assert devices.devices == tuple(devices)

    def test_ordered_and_may_repeat(self, client):
        assert devs(client, 0, 1) != devs(client, 1, 0)
        repeated = devs(client, 0, 0, 1)
        assert len(repeated) == 3 and repeated == devs(client, 0, 0, 1)

    def test_hash_is_consistent_with_equality(self, client):
        same = DeviceList([client.lookup_device(0), client.lookup_device(1)])
        assert hash(devs(client, 0, 1)) == hash(same)
        assert len({devs(client, 0, 1), devs(client, 0, 1), devs(client, 1, 0)}) == 2

    def test_addressable_device_list(self, client):
        everything = DeviceList(client.devices())
        addressable = everything.addressable_device_list()
        assert addressable == devs(client, 0, 1, 2, 3)
        assert everything.addressable_device_list() is addressable  # cached
        assert not everything.is_fully_addressable
        assert addressable.is_fully_addressable
        assert addressable.addressable_device_list() is addressable
        assert devs(client, 4, 5).addressable_device_list() == DeviceList()
        assert everything.addressable_mask() == (True,) * 4 + (False,) * 2

    def test_empty(self):
        empty = DeviceList()
        assert len(empty) == 0 and empty.is_fully_addressable and empty == DeviceList([])

    def test_pickle_and_strings(self, client):
        devices = devs(client, 3, 1)
        assert pickle.loads(pickle.dumps(devices)) == devices
        assert devices.to_string() == "[example_device_3,example_device_1]"
        assert "example_device_3" in repr(devices)
