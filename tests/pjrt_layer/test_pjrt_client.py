"""ifrtpy._pjrt clients, devices and memories on the CPU plugin."""

import pytest

from ifrtpy import _pjrt, errors
from ifrtpy.plugins.builds import default_cpu_library
from pjrt_helpers import MEMORY_KINDS, assert_survives, client8, cpu_device_name, plugin  # noqa: F401


# ------------------------------------------------------------------ client

def test_client_has_the_requested_devices(client8):
    assert len(client8.devices) == 8
    assert [d.id for d in client8.devices] == list(range(8))
    assert client8.addressable_devices == client8.devices
    assert all(a is b for a, b in zip(client8.addressable_devices, client8.devices))


@pytest.mark.parametrize("count", [1, 3, 16])
def test_cpu_device_count_sets_device_count(plugin, count):
    client = _pjrt.create_client(plugin, {"cpu_device_count": count})
    assert len(client.devices) == count


@pytest.mark.parametrize("options", [None, {}])
def test_default_client_has_four_devices(plugin, options):
    assert len(_pjrt.create_client(plugin, options).devices) == 4


def test_client_platform_and_process(client8, plugin):
    assert client8.platform_name == "cpu"
    assert client8.platform_version == "cpu"
    assert client8.process_index == 0
    assert client8.plugin is plugin
    assert repr(client8) == "<ClientHandle cpu with 8 devices>"


def test_clients_are_independent(plugin):
    a = _pjrt.create_client(plugin, {"cpu_device_count": 2})
    b = _pjrt.create_client(plugin, {"cpu_device_count": 2})
    assert a is not b
    assert not set(map(id, a.devices)) & set(map(id, b.devices))


def test_lookup_device_returns_the_same_objects(client8):
    for device in client8.devices:
        assert client8.lookup_device(device.id) is device


@pytest.mark.parametrize("device_id", [8, 1000, -1])
def test_lookup_of_missing_device_raises(client8, device_id):
    with pytest.raises(errors.IfrtError) as info:
        client8.lookup_device(device_id)
    assert isinstance(info.value, errors.InvalidArgumentError)
    assert str(device_id) in str(info.value)


@pytest.mark.parametrize("cls", ["ClientHandle", "DeviceHandle", "MemoryHandle"])
def test_handles_cannot_be_constructed_directly(cls):
    with pytest.raises(TypeError):
        getattr(_pjrt, cls)()


# ------------------------------------------------------------------ devices

def test_device_properties(client8):
    for i, device in enumerate(client8.devices):
        assert device.id == i
        assert device.client is client8
        assert device.kind == "cpu"
        assert device.to_string == f"CpuDevice(id={i})"
        assert device.debug_string == cpu_device_name(client8, i)
        assert device.local_hardware_id == i
        assert device.is_addressable is True
        assert device.attributes == {}
        assert device.process_index == 0
        assert repr(device) == f"<DeviceHandle id={i} CpuDevice(id={i})>"


def test_each_device_has_three_memories_default_device(client8):
    for device in client8.devices:
        memories = device.memories
        assert tuple(m.kind for m in memories) == MEMORY_KINDS
        assert device.default_memory is memories[0]
        assert device.default_memory.kind == "device"
        # Stable objects on repeated access.
        assert all(a is b for a, b in zip(device.memories, memories))


def test_device_memory_stats_is_unimplemented(client8):
    with pytest.raises(errors.UnimplementedError) as info:
        client8.devices[0].memory_stats()
    assert isinstance(info.value, NotImplementedError)
    assert "GetAllocatorStats" in str(info.value)


# ------------------------------------------------------------------ memories

def test_memory_ids_are_global_three_per_device(client8):
    ids = [m.id for d in client8.devices for m in d.memories]
    assert ids == list(range(3 * len(client8.devices)))


def test_memory_strings(client8):
    prefixes = {"device": ("CPU_DEVICE", "CpuDeviceMemory"),
                "pinned_host": ("PINNED_HOST", "PinnedHostMemory"),
                "unpinned_host": ("UNPINNED_HOST", "UnpinnedHostMemorySpace")}
    for device in client8.devices:
        for memory in device.memories:
            short, long = prefixes[memory.kind]
            assert memory.to_string == f"{short}_{memory.id}"
            assert memory.debug_string == f"{long}(id={memory.id}, process_index=0, client=cpu)"
            assert repr(memory) == f"<MemoryHandle id={memory.id} kind={memory.kind!r}>"


def test_memory_devices_and_client(client8):
    for device in client8.devices:
        for memory in device.memories:
            assert memory.client is client8
            devices = memory.devices
            assert len(devices) == 1 and devices[0] is device


def test_memory_kind_id_is_per_kind(client8):
    kind_ids = {}
    for device in client8.devices:
        for memory in device.memories:
            kind_ids.setdefault(memory.kind, set()).add(memory.kind_id)
    assert all(len(ids) == 1 for ids in kind_ids.values()), kind_ids
    assert len({next(iter(ids)) for ids in kind_ids.values()}) == len(MEMORY_KINDS)


# ------------------------------------------------------------------ options

def test_options_are_handed_to_the_plugin_typed_as_given(plugin):
    # The layer checks no option's meaning: which values a plugin takes is the caller's
    # (ifrtpy.plugins.options; an XLA CPU plugin aborts on a cpu_device_count of another
    # type). An int goes as an int64, here the count the plugin reads.
    assert len(_pjrt.create_client(plugin, {"cpu_device_count": 3}).devices) == 3


@pytest.mark.parametrize("value", [{"a": 1}, {1, 2}, object(), b"bytes", [1, "x"], [1.5]],
                         ids=lambda v: type(v).__name__)
def test_unsupported_option_value_type_raises_invalid_argument(plugin, value):
    with pytest.raises(errors.InvalidArgumentError):
        _pjrt.create_client(plugin, {"some_option": value})


def test_option_names_must_be_str(plugin):
    with pytest.raises(errors.InvalidArgumentError):
        _pjrt.create_client(plugin, {1: 2})


def test_unknown_option_names_of_every_value_type_are_accepted(plugin):
    client = _pjrt.create_client(plugin, {
        "bogus": 1, "node_id": 0, "num_nodes": 1, "a_string": "x", "a_float": 1.5,
        "a_bool": True, "an_int_list": [1, 2, 3], "an_empty_list": [],
    })
    assert len(client.devices) == 4


def test_unknown_options_do_not_change_cpu_device_count(plugin):
    client = _pjrt.create_client(plugin, {"cpu_device_count": 2, "bogus": "x"})
    assert len(client.devices) == 2


@pytest.mark.parametrize("value", [2**63, -2**63 - 1, [1, 2**70]], ids=repr)
def test_out_of_int64_range_option_raises_invalid_argument(plugin, value):
    # create_client promises InvalidArgumentError for values the plugin cannot take.
    with pytest.raises(errors.InvalidArgumentError):
        _pjrt.create_client(plugin, {"some_option": value})


def test_int64_extreme_option_values_are_accepted(plugin):
    client = _pjrt.create_client(plugin, {"a": 2**63 - 1, "b": -2**63, "c": [2**63 - 1]})
    assert len(client.devices) == 4
