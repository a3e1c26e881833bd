"""IFRT's remap conformance cases (``remap_impl_test_lib.cc``), through
``client.remap_arrays``, written against the interfaces only.

The helpers are IFRT's: ``create_array_spec(device_indices, shard_shape=[2,3], s32)``
describes ``[2n, 3]`` split evenly over those addressable devices with a
ConcreteEvenSharding; ``create_array(base_values, device_indices)`` puts an iota from
``base_values[i]`` in shard ``i`` and assembles them with DONATE_INPUT. A backend without
``remap_arrays`` (the interface's default raises UnimplementedError) skips every case
with that message: skips it declares.
"""

from __future__ import annotations

import numpy as np
import pytest

from ifrtpy.array import ArrayCopySemantics, ArraySpec
from ifrtpy.device import DeviceList
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.remap import Interval, Mapping, RemapPlan
from ifrtpy.shape import Shape
from ifrtpy.sharding import ConcreteEvenSharding, SingleDeviceSharding

REUSE = ArrayCopySemantics.REUSE_INPUT
DONATE = ArrayCopySemantics.DONATE_INPUT
S32 = DType(DType.Kind.S32)
F32 = DType(DType.Kind.F32)


def _device(client, index):
    devices = client.addressable_devices()
    if index >= len(devices):
        pytest.skip(f"needs {index + 1} addressable devices, the client has {len(devices)}")
    return devices[index]


def _global_shape(n, shard_shape):
    return Shape((shard_shape[0] * n, *shard_shape[1:]))


def create_array_spec(client, device_indices, shard_shape=(2, 3), dtype=S32) -> ArraySpec:
    devices = DeviceList(_device(client, i) for i in device_indices)
    shape = _global_shape(len(device_indices), shard_shape)
    return ArraySpec(dtype, shape, ConcreteEvenSharding(devices, shape, shard_shape))


def create_array(client, base_values, device_indices, shard_shape=(2, 3), dtype=np.int32):
    shards, devices = [], []
    for base, index in zip(base_values, device_indices):
        data = np.arange(base, base + int(np.prod(shard_shape))).astype(dtype).reshape(shard_shape)
        device = _device(client, index)
        devices.append(device)
        shards.append(client.make_array_from_host_buffer(data, SingleDeviceSharding(device)))
    shape = _global_shape(len(base_values), shard_shape)
    sharding = ConcreteEvenSharding(DeviceList(devices), shape, shard_shape)
    return client.assemble_array_from_single_device_arrays(
        shape, sharding, shards, DONATE, dtype=DType.from_numpy(dtype))


def assert_array_content(client, array, base_values, device_indices, shard_shape=(2, 3),
                         dtype=np.int32):
    expected_shape = _global_shape(len(base_values), shard_shape)
    assert array.dtype == DType.from_numpy(dtype)
    assert array.shape == expected_shape
    assert isinstance(array.sharding, ConcreteEvenSharding)
    assert array.sharding.shape == expected_shape
    assert array.sharding.shard_shape(expected_shape) == Shape(shard_shape)
    shards = array.disassemble_into_single_device_arrays(REUSE)
    assert len(shards) == len(base_values)
    for shard, base, index in zip(shards, base_values, device_indices):
        assert shard.dtype == DType.from_numpy(dtype)
        assert shard.shape == Shape(shard_shape)
        assert list(shard.sharding.devices) == [_device(client, index)]
        expected = np.arange(base, base + int(np.prod(shard_shape))).astype(dtype)
        host = shard.copy_to_host_buffer().result(timeout=10)
        np.testing.assert_array_equal(host.reshape(-1), expected)


def _plan(inputs, outputs, mappings) -> RemapPlan:
    plan = RemapPlan(inputs, outputs, mappings)
    plan.validate()
    return plan


def _m(in_array, out_array, from_, to) -> Mapping:
    return Mapping(in_array, out_array, [Interval(*i) for i in from_], [Interval(*i) for i in to])


def test_extract_single_shard(client):
    plan = _plan([create_array_spec(client, [0, 1])], [create_array_spec(client, [1])],
                 [_m(0, 0, [(1, 2, 1)], [(0, 1, 1)])])
    array = create_array(client, [0, 6], [0, 1])
    (out,) = client.remap_arrays(plan, [array], REUSE)
    assert_array_content(client, out, [6], [1])
    assert not array.is_deleted()
    (out,) = client.remap_arrays(plan, [array], DONATE)
    assert_array_content(client, out, [6], [1])
    assert array.is_deleted()


def _interleave_plan(client) -> RemapPlan:
    return _plan([create_array_spec(client, [0, 1]), create_array_spec(client, [2, 3])],
                 [create_array_spec(client, [0, 2, 1, 3])],
                 [_m(0, 0, [(0, 2, 1)], [(0, 4, 2)]), _m(1, 0, [(0, 2, 1)], [(1, 4, 2)])])


def test_interleave_arrays_donate(client):
    plan = _interleave_plan(client)
    arrays = [create_array(client, [0, 6], [0, 1]), create_array(client, [100, 106], [2, 3])]
    (out,) = client.remap_arrays(plan, arrays, DONATE)
    assert_array_content(client, out, [0, 100, 6, 106], [0, 2, 1, 3])
    assert all(a.is_deleted() for a in arrays)


def test_interleave_arrays_reuse(client):
    plan = _interleave_plan(client)
    arrays = [create_array(client, [0, 6], [0, 1]), create_array(client, [100, 106], [2, 3])]
    with pytest.raises(InvalidArgumentError, match="kDonateInput is required if multiple "
                                                   "inputs are mapped to one output"):
        client.remap_arrays(plan, arrays, REUSE)
    assert not any(a.is_deleted() for a in arrays)


def test_deinterleave_arrays(client):
    plan = _plan([create_array_spec(client, [0, 2, 1, 3])],
                 [create_array_spec(client, [0, 1]), create_array_spec(client, [2, 3])],
                 [_m(0, 0, [(0, 4, 2)], [(0, 2, 1)]), _m(0, 1, [(1, 4, 2)], [(0, 2, 1)])])
    array = create_array(client, [0, 100, 6, 106], [0, 2, 1, 3])
    for semantics in (REUSE, DONATE):
        outs = client.remap_arrays(plan, [array], semantics)
        assert len(outs) == 2
        assert_array_content(client, outs[0], [0, 6], [0, 1])
        assert_array_content(client, outs[1], [100, 106], [2, 3])
    assert array.is_deleted()


def test_batch_mapping_identity(client):
    first = create_array_spec(client, [0, 1, 2, 3], (2, 3))
    second = create_array_spec(client, [0, 1], (3, 5))
    plan = _plan([first, second], [first, second],
                 [_m(0, 0, [(0, 4, 1)], [(0, 4, 1)]), _m(1, 1, [(0, 2, 1)], [(0, 2, 1)])])
    inputs = [create_array(client, [10, 20, 30, 40], [0, 1, 2, 3], (2, 3)),
              create_array(client, [50, 60], [0, 1], (3, 5))]
    for semantics in (REUSE, DONATE):
        outs = client.remap_arrays(plan, inputs, semantics)
        assert len(outs) == 2
        assert_array_content(client, outs[0], [10, 20, 30, 40], [0, 1, 2, 3], (2, 3))
        assert_array_content(client, outs[1], [50, 60], [0, 1], (3, 5))


def test_batch_mapping_deinterleave(client):
    first_in = create_array_spec(client, [0, 1, 2, 3], (2, 3), F32)
    first_out = [create_array_spec(client, [0, 1], (2, 3), F32),
                 create_array_spec(client, [2, 3], (2, 3), F32)]
    second_in = create_array_spec(client, [0, 1], (3, 5))
    second_out = [create_array_spec(client, [0], (3, 5)), create_array_spec(client, [1], (3, 5))]
    plan = _plan([first_in, second_in], first_out + second_out, [
        _m(0, 0, [(0, 2, 1)], [(0, 2, 1)]), _m(0, 1, [(2, 4, 1)], [(0, 2, 1)]),
        _m(1, 2, [(0, 1, 1)], [(0, 1, 1)]), _m(1, 3, [(1, 2, 1)], [(0, 1, 1)]),
    ])
    inputs = [create_array(client, [10, 20, 30, 40], [0, 1, 2, 3], (2, 3), np.float32),
              create_array(client, [50, 60], [0, 1], (3, 5))]
    for semantics in (REUSE, DONATE):
        outs = client.remap_arrays(plan, inputs, semantics)
        assert len(outs) == 4
        assert_array_content(client, outs[0], [10, 20], [0, 1], (2, 3), np.float32)
        assert_array_content(client, outs[1], [30, 40], [2, 3], (2, 3), np.float32)
        assert_array_content(client, outs[2], [50], [0], (3, 5))
        assert_array_content(client, outs[3], [60], [1], (3, 5))


def test_detect_bad_input(client):
    spec = create_array_spec(client, [0])
    plan = _plan([spec], [spec], [_m(0, 0, [(0, 1, 1)], [(0, 1, 1)])])
    cases = [
        ([create_array(client, [0], [0]), create_array(client, [0], [0])],
         "RemapArrays expects 1 input arrays, but got 2"),
        ([create_array(client, [0], [0], dtype=np.float32)],
         "RemapArrays expects input #0 to have dtype"),
        ([create_array(client, [0], [0], shard_shape=(20, 30))],
         "RemapArrays expects input #0 to have shape"),
        ([create_array(client, [0], [1])], "RemapArrays expects input #0 to be on"),
    ]
    for arrays, message in cases:
        with pytest.raises(InvalidArgumentError) as info:
            client.remap_arrays(plan, arrays, REUSE)
        assert message in str(info.value)
        assert not any(a.is_deleted() for a in arrays)


def test_always_copy_is_refused(client):
    spec = create_array_spec(client, [0])
    plan = _plan([spec], [spec], [_m(0, 0, [(0, 1, 1)], [(0, 1, 1)])])
    array = create_array(client, [0], [0])
    with pytest.raises(InvalidArgumentError):
        client.remap_arrays(plan, [array], ArrayCopySemantics.ALWAYS_COPY)
    assert not array.is_deleted()


__all__ = sorted(name for name in dir() if name.startswith("test_"))
