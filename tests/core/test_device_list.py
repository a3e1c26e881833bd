"""Device, Memory, MemoryKind and DeviceList over the fake 6-device, 4-addressable client."""

import pickle

import pytest

from ifrtpy.errors import InvalidArgumentError

from fake_devices import fake_client
from ifrtpy.device import Device, DeviceList, Memory, MemoryKind, canonicalize_memory_kind


@pytest.fixture
def client():
    return fake_client(6, 4)


def test_abstract_classes_refuse_instantiation():
    with pytest.raises(TypeError):
        Device()
    with pytest.raises(TypeError):
        Memory()


def test_fake_device_contract(client):
    device = client.device(1)
    assert isinstance(device, Device)
    assert device.id == 1 and device.kind == "fake" and device.client is client
    assert device.is_addressable and not client.device(5).is_addressable
    assert [m.kind for m in device.memories()] == [
        MemoryKind("device"), MemoryKind("pinned_host"), MemoryKind("unpinned_host")]
    assert device.default_memory().kind == MemoryKind("device")
    assert all(isinstance(m, Memory) and m.devices() == (device,) for m in device.memories())
    assert device.attributes == {}
    assert str(device) == "FakeDevice(1)" == repr(device)


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
        device = client.device(0)
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
        devices = client.devices([0, 1, 2])
        assert len(devices) == 3
        assert list(devices) == [client.device(i) for i in range(3)]
        assert devices[1] is client.device(1)
        assert devices[1:] == client.devices([1, 2])
        assert client.device(2) in devices
        assert devices.devices == tuple(devices)

    def test_ordered_and_may_repeat(self, client):
        assert client.devices([0, 1]) != client.devices([1, 0])
        repeated = client.devices([0, 0, 1])
        assert len(repeated) == 3 and repeated == client.devices([0, 0, 1])

    def test_hash_is_consistent_with_equality(self, client):
        same = DeviceList([client.device(0), client.device(1)])
        assert hash(client.devices([0, 1])) == hash(same)
        assert len({client.devices([0, 1]), client.devices([0, 1]), client.devices([1, 0])}) == 2

    def test_addressable_device_list(self, client):
        everything = client.devices()
        addressable = everything.addressable_device_list()
        assert addressable == client.devices([0, 1, 2, 3])
        assert everything.addressable_device_list() is addressable  # cached
        assert not everything.is_fully_addressable
        assert addressable.is_fully_addressable
        assert addressable.addressable_device_list() is addressable
        assert client.devices([4, 5]).addressable_device_list() == DeviceList()
        assert everything.addressable_mask() == (True,) * 4 + (False,) * 2

    def test_empty(self):
        empty = DeviceList()
        assert len(empty) == 0 and empty.is_fully_addressable and empty == DeviceList([])

    def test_pickle_and_strings(self, client):
        devices = client.devices([3, 1])
        assert pickle.loads(pickle.dumps(devices)) == devices
        assert devices.to_string() == "[FakeDevice(3),FakeDevice(1)]"
        assert "FakeDevice(3)" in repr(devices)
