"""Port of PjRt-IFRT's xla_sharding_test.cc (6 devices of the example backend, 4
addressable), plus equivalence of ShardingParamSharding and HloSharding index domains."""

import itertools
import pickle

import numpy as np
import pytest

xc = pytest.importorskip("jaxlib.xla_client")

from ifrtpy.device import DeviceList, MemoryKind  # noqa: E402
from ifrtpy.errors import InvalidArgumentError  # noqa: E402
from ifrtpy.sharding import HloSharding  # noqa: E402
from ifrtpy.shape import BoundedDynamicShapeTag, DynamicShape, IndexDomain, Shape  # noqa: E402
from ifrtpy.sharding import (  # noqa: E402
    ShardingParam, ShardingParamSharding, SingleDeviceShardSemantics, SingleDeviceSharding,
)
from ifrtpy.testing.example_backend import create_client  # noqa: E402

ALL = SingleDeviceShardSemantics.ALL_SHARDS
ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
CLIENT = create_client(6, addressable_device_count=4,
                       memory_kinds=("device", "pinned_host", "unpinned_host"))
XH = xc.HloSharding
REPLICATED = xc.OpSharding.Type.REPLICATED


def devs(*ids):
    return DeviceList(CLIENT.lookup_device(i) for i in ids)


def hlo(xla, ids=range(6), memory_kind=None):
    return HloSharding(devs(*ids), xla, memory_kind)


def tile(dims, devices=None, last_tile_dims=(), replicate_last=False):
    """An explicit (non-iota) tile assignment, built through OpSharding."""
    op = xc.OpSharding()
    op.type = xc.OpSharding.Type.OTHER
    op.tile_assignment_dimensions = list(dims)
    op.tile_assignment_devices = list(range(int(np.prod(dims))) if devices is None else devices)
    op.replicate_on_last_tile_dim = replicate_last
    op.last_tile_dims = list(last_tile_dims)
    return op


def slow_index_domains(sharding: HloSharding, shape):
    """Reference: walk the tile assignment array with NumPy (XLA's TileOffsetForDevice)."""
    xla = sharding.xla_hlo_sharding
    n = len(sharding.devices)
    if xla.is_replicated() or xla.is_maximal():
        return [IndexDomain(Shape(shape))] * n
    dims = xla.tile_assignment_dimensions()
    ta = np.asarray(xla.tile_assignment_devices()).reshape(dims)
    rank = len(shape)
    result = [None] * n
    for pos in itertools.product(*map(range, dims)):
        tile_size = [-(-d // t) for d, t in zip(shape, dims)]
        origin = [min(p * s, d) for p, s, d in zip(pos[:rank], tile_size, shape)]
        limit = [min(o + s, d) for o, s, d in zip(origin, tile_size, shape)]
        result[ta[pos]] = IndexDomain(origin, [hi - lo for lo, hi in zip(origin, limit)])
    return result


def check_domains(sharding, shape, expected):
    for args in [(), (ALL,)]:
        assert sharding.index_domains(shape, *args) == expected
    assert sharding.index_domains(shape, ADDRESSABLE) == expected[:4]
    assert sharding.index_domains(shape) == slow_index_domains(sharding, shape)


def check_disassemble(sharding, shape, shard_shapes):
    for args in [(), (ALL,)]:
        result = sharding.disassemble(shape, *args)
        assert [s for s, _ in result] == shard_shapes
        assert [sh for _, sh in result] == \
            [SingleDeviceSharding(CLIENT.lookup_device(i)) for i in range(6)]
    assert sharding.disassemble(shape, ADDRESSABLE) == \
        [(s, SingleDeviceSharding(CLIENT.lookup_device(i)))
         for i, s in enumerate(shard_shapes[:4])]


def test_create_with_bad_device_list():
    with pytest.raises(InvalidArgumentError, match="non-empty device list"):
        HloSharding(devs(), XH.replicate())


def test_refuses_tuple_shardings():
    with pytest.raises(InvalidArgumentError, match="does not support"):
        hlo(XH.tuple_sharding(xc.Shape.tuple_shape([]), []))


@pytest.mark.parametrize("xla, ids, expected", [
    (XH.replicate(), range(6), True),
    (XH.iota_tile([1, 1]), [0], True),  # single tile
    (tile([1, 6], replicate_last=True), range(6), True),  # all replicas on the last dim
    (tile([2, 3], replicate_last=True), range(6), False),
    (XH.iota_tile([1, 6]), range(6), False),
    (XH.from_string("{maximal device=0}"), [0], True),
    (XH.from_string("{maximal device=0}"), range(6), False),
    (XH.manual(), range(6), False),
    (XH.unknown(), range(6), False),
])
def test_is_fully_replicated(xla, ids, expected):
    assert hlo(xla, ids).is_fully_replicated is expected


def test_accepts_op_sharding_and_text():
    assert hlo(XH.iota_tile([2, 3])) == hlo(XH.iota_tile([2, 3]).to_proto()) == \
        hlo("{devices=[2,3]<=[6]}")
    assert hlo(XH.iota_tile([2, 3])).op_sharding.tile_assignment_dimensions == [2, 3]


def test_get_shard_shape():
    sharding = hlo(XH.iota_tile([2, 3]))
    assert sharding.shard_shape(Shape([6, 6])) == Shape([3, 2])
    with pytest.raises(InvalidArgumentError, match="Numbers of dimensions don't match. From "
                       "Shape 3 vs from HloSharding 2"):
        sharding.shard_shape(Shape([6, 6, 6]))
    assert sharding.shard_shape(Shape([5, 7])) == Shape([3, 3])  # uneven: ceil
    assert hlo(XH.manual()).shard_shape(Shape([5, 7])) == Shape([5, 7])


def test_has_same_partitioning():
    sharding0 = hlo(XH.iota_tile([2, 3]))
    assert sharding0.has_same_partitioning(sharding0)
    assert sharding0.has_same_partitioning(hlo(XH.iota_tile([2, 3]), [3, 4, 5, 0, 1, 2]))
    assert not sharding0.has_same_partitioning(hlo(XH.iota_tile([3, 1]), [3, 4, 5]))
    assert not sharding0.has_same_partitioning(hlo(XH.iota_tile([3, 2]), [3, 4, 5, 0, 1, 2]))
    assert not hlo(XH.replicate()).has_same_partitioning(hlo(XH.replicate(), [0, 1, 2]))


def test_with_device_assignment():
    sharding0 = hlo(XH.iota_tile([2, 3]))
    assert sharding0.with_device_assignment(devs(3, 4, 5, 0, 1, 2)) == \
        hlo(XH.iota_tile([2, 3]), [3, 4, 5, 0, 1, 2])
    with pytest.raises(InvalidArgumentError, match="HloSharding should have the same number of "
                       "devices as the current sharding, but was asked to have 3 devices"):
        sharding0.with_device_assignment(devs(0, 1, 2))


def test_index_domains_with_replication():
    shape = Shape([10, 20])
    check_domains(hlo(XH.replicate()), shape, [IndexDomain(shape)] * 6)


def test_disassemble_with_replication():
    check_disassemble(hlo(XH.replicate()), Shape([10, 20]), [Shape([10, 20])] * 6)


def test_index_domains_with_tile():
    expected = [IndexDomain([2 * i, 0], [2, 20]) for i in range(6)]
    check_domains(hlo(tile([6, 1])), Shape([12, 20]), expected)


def test_disassemble_with_tile():
    check_disassemble(hlo(tile([6, 1])), Shape([12, 20]), [Shape([2, 20])] * 6)


def test_index_domains_with_uneven_tile():
    expected = [IndexDomain([2 * i, 0], [2, 20]) for i in range(5)]
    expected.append(IndexDomain([10, 0], [1, 20]))
    check_domains(hlo(tile([6, 1])), Shape([11, 20]), expected)


def test_disassemble_with_uneven_tile():
    check_disassemble(hlo(tile([6, 1])), Shape([11, 20]), [Shape([2, 20])] * 5 + [Shape([1, 20])])


def test_uneven_tiles_can_be_empty():
    # 4 tiles of ceil(5/4) = 2 over 5 rows: 2, 2, 1, 0.
    sharding = hlo(tile([4]), [0, 1, 2, 3])
    assert [d.shape[0] for d in sharding.index_domains(Shape([5]))] == [2, 2, 1, 0]
    assert [tuple(d.origin) for d in sharding.index_domains(Shape([5]))] == [(0,), (2,), (4,), (5,)]


PARTIAL = [tile([2, 1, 3], replicate_last=True), tile([2, 1, 3], last_tile_dims=[REPLICATED]),
           XH.from_string("{devices=[2,1,3]<=[6] last_tile_dims={maximal}}")]


@pytest.mark.parametrize("xla", PARTIAL, ids=["partial_tile", "subgroup_replicated",
                                               "subgroup_maximal"])
def test_index_domains_with_partial_tile(xla):
    expected = [IndexDomain([0, 0], [5, 20])] * 3 + [IndexDomain([5, 0], [5, 20])] * 3
    check_domains(hlo(xla), Shape([10, 20]), expected)


@pytest.mark.parametrize("xla", PARTIAL, ids=["partial_tile", "subgroup_replicated",
                                               "subgroup_maximal"])
def test_disassemble_with_partial_tile(xla):
    check_disassemble(hlo(xla), Shape([10, 20]), [Shape([5, 20])] * 6)


def test_index_domains_with_tile_transpose():
    sharding = hlo(XH.from_string("{devices=[2,2]<=[2,2]T(1,0)}"), range(4))
    shape = Shape([4, 4])
    assert sharding.index_domains(shape) == slow_index_domains(sharding, shape)
    assert [tuple(d.origin) for d in sharding.index_domains(shape)] == \
        [(0, 0), (2, 0), (0, 2), (2, 2)]


def test_index_domains_and_disassemble_with_manual():
    sharding = hlo(XH.manual())
    with pytest.raises(InvalidArgumentError, match="Manual sharding does not support IndexDomains"):
        sharding.index_domains(Shape([10, 20]))
    check_disassemble(sharding, Shape([10, 20]), [Shape([10, 20])] * 6)


def test_index_domains_with_maximal():
    sharding = hlo(XH.from_string("{maximal device=2}"))
    assert sharding.index_domains(Shape([3])) == [IndexDomain(Shape([3]))] * 6
    check_disassemble(sharding, Shape([3]), [Shape([3])] * 6)


def test_disassemble_fails_with_invalid_device_count():
    with pytest.raises(InvalidArgumentError,
                       match="sharding's tile count and device count does not match"):
        hlo(tile([2, 1]), [0]).disassemble(Shape([10, 20]))
    with pytest.raises(InvalidArgumentError,
                       match="tile_assignment_devices and device count does not match"):
        hlo(tile([2, 1]), [0]).index_domains(Shape([10, 20]))


def test_disassemble_fails_with_mismatching_shape_dims_size():
    with pytest.raises(InvalidArgumentError,
                       match="shape must have 2 dimensions, but has 1 dimensions"):
        hlo(tile([2, 1]), [0, 1]).disassemble(Shape([10]))


def test_disassemble_fails_with_dynamic_shape():
    dynamic = DynamicShape(Shape([10]), BoundedDynamicShapeTag([True]))
    with pytest.raises(InvalidArgumentError, match="can only disassemble static shape"):
        hlo(tile([2]), [0, 1]).disassemble(dynamic)


def test_out_of_range_device_id():
    with pytest.raises(InvalidArgumentError, match=r"Out of range device id in device_assignment: "
                       r"3; valid range: \[0, 2\)"):
        hlo(tile([2], [0, 3]), [0, 1]).index_domains(Shape([4]))


def test_hash_and_pickle():
    shardings = [
        hlo(XH.replicate()),
        hlo(XH.replicate(), [0]),
        hlo(XH.replicate(), [0], MemoryKind("pinned_host")),
        hlo(XH.from_string("{maximal device=0}")),
        hlo(tile([2, 3], replicate_last=True)),
    ]
    assert len(set(shardings)) == len(shardings)
    for sharding in shardings:
        copy = pickle.loads(pickle.dumps(sharding))
        assert copy == sharding and hash(copy) == hash(sharding)


# -- ShardingParamSharding and HloSharding agree -----------------------------------------------

def to_hlo_sharding(param: ShardingParam, devices) -> HloSharding:
    """IFRT's ShardingParam -> HloSharding: tiles in order, replication as the last dim."""
    replication = param.num_devices // param.num_shards
    dims = list(param.dim_shards) + ([replication] if replication > 1 else [])
    return HloSharding(devices, tile(dims, param.to_device_list(), replicate_last=replication > 1))


def to_iota_hlo_sharding(param: ShardingParam, devices) -> HloSharding:
    """The same, as an iota tile assignment (reshape by reversed axis sizes, transpose)."""
    replication = param.num_devices // param.num_shards
    dims = list(param.dim_shards) + ([replication] if replication > 1 else [])
    k = len(param.axis_sizes)
    perm = [k - 1 - a for a in reversed(param.permutation)]
    return HloSharding(devices, XH.iota_tile(dims, list(param.axis_sizes)[::-1], perm,
                                             [REPLICATED] if replication > 1 else []))


@pytest.mark.parametrize("text, shape", [
    ("2x3 to [1,0] on 3x2", [6, 6]),
    ("2x3 to [0,1] on 2x3", [6, 6]),
    ("2x1 to [0,1] on 2x3", [6, 6]),
    ("2x1 to [0,1] on 3x2", [4, 4]),
    ("2x1x3 to [1,0] on 2x3", [2, 2, 3]),
    ("1x1 to [1,0] on 3x2", [5, 7]),
    ("3x1 to [2,0,1] on 1x2x3", [9, 1]),
])
def test_sharding_param_matches_hlo_sharding(text, shape):
    param = ShardingParam.parse(text)
    devices = devs(*range(param.num_devices))
    expected = ShardingParamSharding(param, devices)
    for convert in (to_hlo_sharding, to_iota_hlo_sharding):
        converted = convert(param, devices)
        for semantics in (ALL, ADDRESSABLE):
            assert converted.index_domains(shape, semantics) == \
                expected.index_domains(shape, semantics)
            assert converted.disassemble(shape, semantics) == expected.disassemble(shape, semantics)
        assert converted.is_fully_replicated == expected.is_fully_replicated


def _op(**fields):
    """An OpSharding of any field values (jaxlib's own class takes only known types)."""
    pytest.importorskip("google.protobuf")
    from ifrtpy.proxy._protocol import messages

    op = xc.OpSharding()
    op.ParseFromString(messages().OpSharding(**fields).SerializeToString())
    return op


OTHER, MAXIMAL = 3, 1


@pytest.mark.parametrize("fields, field", [
    # each aborted jaxlib's reader, read out of bounds or allocated without bound
    (dict(type=OTHER, tile_assignment_dimensions=[2], iota_reshape_dims=[2],
          iota_transpose_perm=[5]), "iota_transpose_perm"),
    (dict(type=OTHER, tile_assignment_dimensions=[2], iota_reshape_dims=[2],
          iota_transpose_perm=[-1]), "iota_transpose_perm"),
    (dict(type=OTHER, tile_assignment_dimensions=[4], iota_reshape_dims=[2, 2],
          iota_transpose_perm=[0, 0]), "iota_transpose_perm"),
    (dict(type=OTHER, tile_assignment_dimensions=[4], iota_reshape_dims=[3],
          iota_transpose_perm=[0]), "iota_reshape_dims"),
    (dict(type=OTHER, tile_assignment_dimensions=[1 << 40, 1 << 40],
          iota_reshape_dims=[1 << 40, 1 << 40], iota_transpose_perm=[0, 1]),
     "tile_assignment_dimensions"),
    (dict(type=OTHER, tile_assignment_dimensions=[-2], tile_assignment_devices=[0, 1]),
     "tile_assignment_dimensions"),
    (dict(type=OTHER, tile_assignment_dimensions=[2, 2], tile_assignment_devices=[0, 1, 2]),
     "tile_assignment_devices"),
    (dict(type=OTHER, tile_assignment_dimensions=[2, 2], tile_assignment_devices=[0, 1, 2, 3],
          last_tile_dims=[99]), "last_tile_dims"),
    (dict(type=OTHER, tile_assignment_dimensions=[2], tile_assignment_devices=[0, 1],
          last_tile_dims=[0, 0, 0]), "last_tile_dims"),
    (dict(type=MAXIMAL), "maximal"),
    (dict(type=77), "type"),
])
def test_an_op_sharding_jaxlib_cannot_read_is_refused_naming_its_field(fields, field):
    with pytest.raises(InvalidArgumentError, match=field):
        hlo(_op(**fields))


def test_a_tile_count_over_a_bound_is_refused_before_jaxlib_reads_it():
    from ifrtpy.sharding.hlo import check_op_sharding

    op = _op(type=OTHER, tile_assignment_dimensions=[1 << 20, 1 << 10],
             iota_reshape_dims=[1 << 30], iota_transpose_perm=[0])
    check_op_sharding(op)  # a valid sharding, of 2**30 tiles
    with pytest.raises(InvalidArgumentError, match="1073741824 tiles; at most 6"):
        check_op_sharding(op, max_tiles=6)
