"""ifrtpy.proxy.arrays: a remap whose output sharding names no index domains gets those of
the shards it moves (what jax's reorder of shards between device orders relies on)."""

import numpy as np
import pytest

pytest.importorskip("google.protobuf")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy.array import ArraySpec  # noqa: E402
from ifrtpy.errors import InvalidArgumentError  # noqa: E402
from ifrtpy.proxy.arrays import _with_index_domains  # noqa: E402
from ifrtpy.remap import Interval, Mapping, RemapPlan  # noqa: E402
from ifrtpy.sharding import ConcreteEvenSharding, ConcreteSharding  # noqa: E402


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=4)


def _reorder(client, x, out_sharding):
    """An array of ``x`` split in 4 rows over devices 0-3, and the plan that keeps each
    shard on its device and lists the devices as 3, 2, 1, 0."""
    devices = client.devices()
    sharding = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))
    array = client.make_array_from_host_buffer(x, sharding)
    spec = ArraySpec(array.dtype, array.shape, sharding)
    out = ArraySpec(array.dtype, array.shape, out_sharding(ifrt.DeviceList(devices[::-1])))
    moves = [Mapping(0, 0, [Interval(k, k + 1)], [Interval(3 - k, 4 - k)]) for k in range(4)]
    return array, RemapPlan([spec], [out], moves)


def test_a_remap_to_a_sharding_without_domains_gets_the_moved_shards_domains(client):
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    array, plan = _reorder(client, x, lambda d: ConcreteEvenSharding(d, (4, 2), (1, 2)))
    with pytest.raises(InvalidArgumentError):  # as the client sends it: no domains
        plan.output_specs[0].sharding.index_domains(array.shape)
    known = _with_index_domains(plan, [array]).output_specs[0].sharding
    assert isinstance(known, ConcreteSharding)
    domains = known.index_domains(array.shape)
    assert [d.origin.elements[0] for d in domains] == [3, 2, 1, 0]  # device 3 holds row 3
    [out] = client.remap_arrays(_with_index_domains(plan, [array]), [array],
                                ifrt.ArrayCopySemantics.REUSE_INPUT)
    np.testing.assert_array_equal(np.asarray(out), x)


def test_a_remap_that_names_its_domains_is_left_as_it_is(client):
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    array, plan = _reorder(client, x, lambda d: ConcreteEvenSharding(
        d, (4, 2), (4, 2), is_fully_replicated=True))
    assert _with_index_domains(plan, [array]) is plan
