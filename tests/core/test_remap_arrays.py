"""ifrtpy.remap.remap_arrays on the PjRt backend (8 CPU devices), beyond IFRT's
remap_impl_test_lib cases (which run in the conformance suite, whose helpers these
reuse): a wrong memory kind, a deleted input, and a law over random valid plans checked
against the data."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("ifrtpy.backends.pjrt")

from ifrtpy.array import ArrayCopySemantics  # noqa: E402
from ifrtpy import get_client  # noqa: E402
from ifrtpy.dtypes import DType  # noqa: E402
from ifrtpy.errors import InvalidArgumentError  # noqa: E402
from ifrtpy.remap import remap_arrays  # noqa: E402
from ifrtpy.sharding import SingleDeviceSharding  # noqa: E402

from ifrtpy.testing.conformance.remaps import (  # noqa: E402
    _interleave_plan as interleave_plan, _m as m, _plan as plan_of, assert_array_content,
    create_array, create_array_spec,
)
from test_remap_plan import valid_plans  # noqa: E402

REUSE = ArrayCopySemantics.REUSE_INPUT
DONATE = ArrayCopySemantics.DONATE_INPUT
S32 = DType(DType.Kind.S32)
F32 = DType(DType.Kind.F32)


@pytest.fixture(scope="module")
def client():
    return get_client("pjrt", device_count=8)


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
