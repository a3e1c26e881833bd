"""IFRT's client conformance cases (``client_impl_test_lib.cc``), and the device, memory
and registry contracts of ``ifrtpy.device`` / ``ifrtpy.client``, written against the
interfaces only.

Import the tests into a backend's test module and provide a ``client`` fixture (see
:mod:`ifrtpy.testing.conformance`). ``DefaultDeviceAssignment`` runs where the client has
a ``default_device_assignment(num_replicas, num_partitions)`` (not part of ifrtpy's
Client interface yet) and skips otherwise.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.array import ArraySpec
from ifrtpy.client import Compiler
from ifrtpy.device import Device, DeviceList, Memory, MemoryKind
from ifrtpy.errors import InvalidArgumentError, NotFoundError
from ifrtpy.shape import Shape
from ifrtpy.sharding import SingleDeviceSharding

TIMEOUT_S = 10.0


# -- client_impl_test_lib ---------------------------------------------------------------------

def test_runtime_type_and_platform(client):
    assert isinstance(client.runtime_type, str) and client.runtime_type
    assert isinstance(client.platform_name, str) and client.platform_name
    assert isinstance(client.platform_version, str) and client.platform_version
    assert isinstance(client.platform_id, int)
    assert client.platform_name in repr(client) or type(client).__name__ in repr(client)


def test_devices(client):
    """The counts are those of the device lists (every addressable device among the
    devices, at least one of them); each device is found by its id; this process is the
    one of its addressable devices."""
    devices, addressable = client.devices(), client.addressable_devices()
    assert client.device_count() == len(devices)
    assert client.addressable_device_count() == len(addressable) >= 1
    assert len(addressable) == sum(1 for d in devices if d.is_addressable)
    for device in devices:
        assert client.lookup_device(device.id) is device
    assert {d.process_index for d in addressable} == {client.process_index()}


def test_get_all_devices(client):
    get_all = getattr(client, "get_all_devices", client.devices)
    devices = get_all()
    assert len(devices) >= client.device_count()
    for device in devices:
        assert client.lookup_device(device.id) is device
    ids = [d.id for d in devices]
    assert len(set(ids)) == len(ids), f"duplicate device ids: {ids}"


def test_default_compiler(client):
    compiler = client.default_compiler()
    assert compiler is not None
    assert isinstance(compiler, Compiler)
    assert client.compiler is compiler or isinstance(client.compiler, Compiler)


@pytest.mark.parametrize("replicas_partitions", [("n", 1), (1, "n")], ids=["n_by_1", "1_by_n"])
def test_default_device_assignment(client, replicas_partitions):
    n = client.addressable_device_count()
    replicas, partitions = (n if v == "n" else v for v in replicas_partitions)
    assignment = np.asarray(client.default_device_assignment(replicas, partitions))
    assert assignment.shape == (replicas, partitions)
    for device_id in assignment.reshape(-1):
        client.lookup_device(int(device_id))
    assert len(set(assignment.reshape(-1).tolist())) == n


# -- devices and memories ---------------------------------------------------------------------

def test_devices_are_sorted_and_addressable_ones_are_a_subset(client):
    devices, addressable = client.devices(), client.addressable_devices()
    assert [d.id for d in devices] == sorted(d.id for d in devices)
    assert [d.id for d in addressable] == sorted(d.id for d in addressable)
    assert all(any(d is e for e in devices) for d in addressable)
    for device in devices:
        assert isinstance(device, Device)
        assert device.client is client
        assert device.is_addressable == any(device is d for d in addressable)
        if device.is_addressable:
            assert device.process_index == client.process_index()
        assert isinstance(device.kind, str) and device.kind
        assert isinstance(device.to_string(), str) and device.to_string()
        assert isinstance(device.debug_string(), str)
        assert dict(device.attributes) is not None


def test_lookup_of_unknown_device_raises_not_found(client):
    missing = max(d.id for d in client.devices()) + 1000
    with pytest.raises(NotFoundError):
        client.lookup_device(missing)


@pytest.mark.parametrize("device_id", [True, 1.0, "1"], ids=["bool", "float", "str"])
def test_lookup_of_a_non_int_device_id_raises_invalid_argument(client, device_id):
    """Only ints are device ids: a bool, a float or a string equal to one is refused, not
    taken for the device with that id."""
    with pytest.raises(InvalidArgumentError, match="device_id"):
        client.lookup_device(device_id)


def test_memories_of_addressable_devices(client):
    memory_ids = {}
    for device in client.addressable_devices():
        memories = list(device.memories())
        assert memories, f"{device} has no memories"
        default = device.default_memory()
        assert any(m is default for m in memories)
        kinds = [m.kind for m in memories]
        assert len(set(kinds)) == len(kinds), f"{device} repeats a memory kind: {kinds}"
        for memory in memories:
            assert isinstance(memory, Memory)
            assert isinstance(memory.kind, MemoryKind) and memory.kind, memory
            assert any(d is device for d in memory.devices())
            assert isinstance(memory.id, int)
            other = memory_ids.setdefault(memory.id, memory)
            assert other is memory, f"memory id {memory.id} names two memories"
            assert memory.to_string() and memory.debug_string()
        assert MemoryKind().canonicalize(device) == default.kind


def test_make_device_list(client):
    devices = client.addressable_devices()
    dl = client.make_device_list(devices[::-1])
    assert isinstance(dl, DeviceList)
    assert list(dl) == devices[::-1]
    assert dl == DeviceList(devices[::-1])
    assert hash(dl) == hash(DeviceList(devices[::-1]))
    assert dl.is_fully_addressable


def test_attributes_are_a_mapping(client):
    attributes = client.attributes()
    assert all(isinstance(k, str) for k in attributes)


# -- values through the client ----------------------------------------------------------------

def test_get_ready_future_of_nothing(client):
    assert client.get_ready_future([]).result(timeout=TIMEOUT_S) is None


def test_make_tuple_keeps_its_values(client):
    device = client.addressable_devices()[0]
    array = client.make_array_from_host_buffer(np.zeros((2, 3), np.float32),
                                               SingleDeviceSharding(device))
    t = client.make_tuple([array])
    assert t.client is client
    assert t.unpack()[0] is array
    client.get_ready_future([t, array]).result(timeout=TIMEOUT_S)


def test_opaque_sharding_is_refused_for_host_buffers(client):
    device = client.addressable_devices()[0]
    with pytest.raises(InvalidArgumentError):
        client.make_array_from_host_buffer(np.zeros((2, 3), np.float32),
                                           ifrt.OpaqueSharding([device]))


def test_invalid_memory_kind_is_refused(client):
    device = client.addressable_devices()[0]
    with pytest.raises(InvalidArgumentError):
        client.make_array_from_host_buffer(
            np.zeros((2, 3), np.float32),
            SingleDeviceSharding(device, "no_such_memory_kind_for_ifrtpy"))


def test_arrays_are_not_copyable(client):
    device = client.addressable_devices()[0]
    array = client.make_array_from_host_buffer(np.zeros(3, np.int32),
                                               SingleDeviceSharding(device))
    with pytest.raises(TypeError):
        copy.copy(array)
    with pytest.raises(TypeError):
        copy.deepcopy(array)


def test_error_array_specs_are_kept(client):
    device = client.addressable_devices()[0]
    spec = ArraySpec(np.int16, Shape([3]), SingleDeviceSharding(device))
    (array,) = client.make_error_arrays(InvalidArgumentError("injected error"), [spec])
    assert (array.dtype, array.shape, array.sharding) == (spec.dtype, spec.shape, spec.sharding)
    assert "injected error" in str(array.ready_future().exception(timeout=TIMEOUT_S))


__all__ = sorted(name for name in dir() if name.startswith("test_"))
