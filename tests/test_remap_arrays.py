"""ifrtpy.remap.remap_arrays on the PjRt backend (8 CPU devices): a port of IFRT's
remap_impl_test_lib.cc, plus a law over random valid plans checked against the data."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("ifrtpy.backends.pjrt")

from ifrtpy.array import ArrayCopySemantics, ArraySpec  # noqa: E402
from ifrtpy.client import get_client  # noqa: E402
from ifrtpy.device import DeviceList  # noqa: E402
from ifrtpy.dtypes import DType  # noqa: E402
from ifrtpy.errors import InvalidArgumentError  # noqa: E402
from ifrtpy.remap import Interval, Mapping, RemapPlan, remap_arrays  # noqa: E402
from ifrtpy.shape import Shape  # noqa: E402
from ifrtpy.sharding import ConcreteEvenSharding, SingleDeviceSharding  # noqa: E402

from test_remap_plan import valid_plans  # noqa: E402

REUSE = ArrayCopySemantics.REUSE_INPUT
DONATE = ArrayCopySemantics.DONATE_INPUT
S32 = DType(DType.Kind.S32)
F32 = DType(DType.Kind.F32)


@pytest.fixture(scope="module")
def client():
    return get_client("pjrt", device_count=8)


def global_shape(n, shard_shape):
    return Shape((shard_shape[0] * n, *shard_shape[1:]))


def create_array_spec(client, device_indices, shard_shape=(2, 3), dtype=S32):
    """An array whose first dimension is split evenly over ``device_indices``."""
    devices = DeviceList(client.addressable_devices()[i] for i in device_indices)
    shape = global_shape(len(device_indices), shard_shape)
    return ArraySpec(dtype, shape, ConcreteEvenSharding(devices, shape, shard_shape))


def create_array(client, base_values, device_indices, shard_shape=(2, 3), dtype=np.int32):
    """Shard i holds an iota from ``base_values[i]`` on device ``device_indices[i]``."""
    shards, devices = [], []
    for base, index in zip(base_values, device_indices):
        data = np.arange(base, base + int(np.prod(shard_shape))).astype(dtype).reshape(shard_shape)
        device = client.addressable_devices()[index]
        devices.append(device)
        shards.append(client.make_array_from_host_buffer(data, SingleDeviceSharding(device)))
    shape = global_shape(len(base_values), shard_shape)
    sharding = ConcreteEvenSharding(DeviceList(devices), shape, shard_shape)
    return client.assemble_array_from_single_device_arrays(
        shape, sharding, shards, DONATE, dtype=DType.from_numpy(dtype))


def assert_array_content(client, array, base_values, device_indices, shard_shape=(2, 3),
                         dtype=np.int32):
    expected_shape = global_shape(len(base_values), shard_shape)
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
        assert isinstance(shard.sharding, SingleDeviceSharding)
        assert list(shard.sharding.devices) == [client.addressable_devices()[index]]
        expected = np.arange(base, base + int(np.prod(shard_shape))).astype(dtype)
        np.testing.assert_array_equal(np.asarray(shard).reshape(-1), expected)


def plan_of(inputs, outputs, mappings):
    plan = RemapPlan(inputs, outputs, mappings)
    plan.validate()
    return plan


def m(in_array, out_array, from_, to):
    return Mapping(in_array, out_array, [Interval(*i) for i in from_], [Interval(*i) for i in to])


def interleave_plan(client):
    return plan_of([create_array_spec(client, [0, 1]), create_array_spec(client, [2, 3])],
                   [create_array_spec(client, [0, 2, 1, 3])],
                   [m(0, 0, [(0, 2, 1)], [(0, 4, 2)]), m(1, 0, [(0, 2, 1)], [(1, 4, 2)])])


def test_wrong_memory_kind_is_bad_input(client):
    spec = create_array_spec(client, [0])
    plan = plan_of([spec], [spec], [m(0, 0, [(0, 1, 1)], [(0, 1, 1)])])
    device = client.addressable_devices()[0]
    pinned = client.make_array_from_host_buffer(
        np.zeros((2, 3), np.int32), SingleDeviceSharding(device, "pinned_host"))
    with pytest.raises(InvalidArgumentError, match="RemapArrays expects input #0 to be on"):
        remap_arrays(client, plan, [pinned], DONATE)


def test_deleted_input_is_refused_before_any_input_is_donated(client):
    plan = interleave_plan(client)
    arrays = [create_array(client, [0, 6], [0, 1]), create_array(client, [100, 106], [2, 3])]
    arrays[1].delete()
    with pytest.raises(InvalidArgumentError, match="RemapArrays expects input #1 to be live"):
        remap_arrays(client, plan, arrays, DONATE)
    assert not arrays[0].is_deleted()


@settings(max_examples=15)
@given(st.data())
def test_random_plans_move_the_right_data(client, data):
    def make_spec(ids, shape, shard_shape, dtype):
        return create_array_spec(client, ids, shard_shape, dtype)

    plan, moves = data.draw(valid_plans(make_spec=make_spec, num_devices=8))
    index = {d: i for i, d in enumerate(client.addressable_devices())}

    def make_inputs():
        arrays = []
        for a, spec in enumerate(plan.input_specs):
            n = len(spec.sharding.devices)
            arrays.append(create_array(client, [1000 * a + 10 * k for k in range(n)],
                                       [index[d] for d in spec.sharding.devices],
                                       dtype=spec.dtype.to_numpy()))
        return arrays

    semantics_to_try = [DONATE]
    if all(len({a for a, _ in out}) == 1 for out in moves):
        semantics_to_try.insert(0, REUSE)
    for semantics in semantics_to_try:
        inputs = make_inputs()
        outs = remap_arrays(client, plan, inputs, semantics)
        assert all(a.is_deleted() for a in inputs) == (semantics is DONATE)
        for out, spec, out_moves in zip(outs, plan.output_specs, moves):
            assert out.sharding == spec.sharding and out.dtype == spec.dtype
            assert_array_content(client, out, [1000 * a + 10 * k for a, k in out_moves],
                                 [index[d] for d in spec.sharding.devices],
                                 dtype=spec.dtype.to_numpy())
