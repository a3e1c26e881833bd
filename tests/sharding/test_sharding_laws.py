"""Hypothesis laws for the sharding math, each checked against an independent NumPy (or
jax) computation over random meshes, specs, sharding params, tile assignments and shapes."""

import functools
import math
import pickle

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ifrtpy.device import DeviceList, MemoryKind
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.sharding import Mesh, NamedSharding, PartitionSpec
from ifrtpy.shape import BoundedDynamicShapeTag, DynamicShape, Index, IndexDomain, Shape
from ifrtpy.sharding import (
    ConcreteEvenSharding, ConcreteSharding, ShardingParam, ShardingParamSharding,
    SingleDeviceShardSemantics, SingleDeviceSharding,
)
from ifrtpy.testing.example_backend import create_client

ALL = SingleDeviceShardSemantics.ALL_SHARDS
ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
MAX_DEVICES = 8
AXIS_NAMES = ("x", "y", "z")


@functools.cache
def example_client(num_devices, num_addressable):
    """One client of the example backend per pair of counts (shardings drawn apart can share
    devices): ``num_devices`` devices, the first ``num_addressable`` addressable."""
    return create_client(num_devices, addressable_device_count=num_addressable,
                         memory_kinds=("device", "pinned_host", "unpinned_host"))


# -- strategies --------------------------------------------------------------------------------

@st.composite
def mesh_cases(draw, max_rank=3):
    """(mesh axis sizes, device permutation, spec, array shape, number of addressable devices)."""
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=0, max_size=3)
                 .filter(lambda s: math.prod(s) <= MAX_DEVICES))
    n = math.prod(sizes)
    rank = draw(st.integers(0, max_rank))
    # Each mesh axis goes to one array dim or stays unused (-1); order within a dim is random.
    owner = [draw(st.integers(-1, rank - 1)) for _ in sizes]
    order = draw(st.permutations(range(len(sizes))))
    entries = []
    for dim in range(rank):
        axes = tuple(AXIS_NAMES[a] for a in order if owner[a] == dim)
        entries.append(None if not axes else axes[0] if len(axes) == 1 and draw(st.booleans())
                       else axes)
    while entries and entries[-1] is None and draw(st.booleans()):
        entries.pop()  # a shorter spec means trailing None
    dim_shards = [math.prod(s for s, o in zip(sizes, owner) if o == d) for d in range(rank)]
    shape = [s * draw(st.integers(0, 3)) for s in dim_shards]
    perm = draw(st.permutations(range(n)))
    addressable = draw(st.integers(1, n))
    return tuple(sizes), list(perm), PartitionSpec(*entries), tuple(shape), addressable


def fake_mesh(sizes, perm, addressable):
    client = example_client(len(perm), addressable)
    devices = np.empty(len(perm), dtype=object)
    devices[:] = [client.lookup_device(i) for i in perm]
    return Mesh(devices.reshape(sizes), AXIS_NAMES[:len(sizes)])


def named(case, memory_kind=None):
    sizes, perm, spec, shape, addressable = case
    return NamedSharding(fake_mesh(sizes, perm, addressable), spec, memory_kind), shape


@st.composite
def sharding_params(draw):
    """A valid ShardingParam over at most 8 devices (random axes, permutation, dim_shards)."""
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=3)
                 .filter(lambda s: math.prod(s) <= MAX_DEVICES))
    perm = draw(st.permutations(range(len(sizes))))
    n = math.prod(sizes)
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    dims = draw(st.lists(st.sampled_from(divisors), min_size=0, max_size=3)
                .filter(lambda ds: n % math.prod(ds) == 0))
    param = ShardingParam(dims, perm, sizes)
    try:
        param.verify()
    except InvalidArgumentError:
        assume(False)
    return param


# -- independent references ---------------------------------------------------------------------

def reference_device_order(param: ShardingParam) -> list[int]:
    """IFRT's PopulateDevices, literally: recursion from the major end of the permutation."""
    cum = [math.prod(param.axis_sizes[:i]) for i in range(len(param.axis_sizes))]
    out = []

    def populate(perm, base):
        axis = perm[-1]
        for i in range(param.axis_sizes[axis]):
            if len(perm) == 1:
                out.append(base + i * cum[axis])
            else:
                populate(perm[:-1], base + i * cum[axis])

    populate(list(param.permutation), 0)
    return out


def reference_param_domains(param: ShardingParam, shape) -> list[IndexDomain]:
    tile = [d // s for d, s in zip(shape, param.dim_shards)]
    order = reference_device_order(param)
    replication = len(order) // math.prod(param.dim_shards)
    result = [None] * len(order)
    for position, device in enumerate(order):
        tile_index = np.unravel_index(position // replication, param.dim_shards) if shape else ()
        result[device] = IndexDomain([int(i) * t for i, t in zip(tile_index, tile)], tile)
    return result


def coverage(domains, shape) -> np.ndarray:
    count = np.zeros(shape, dtype=np.int64)
    for domain in domains:
        count[domain.slices()] += 1
    return count


def normalize(index, shape):
    return tuple(slice(*s.indices(d)) for s, d in zip(index, shape))


# -- laws ---------------------------------------------------------------------------------------

@given(mesh_cases())
def test_index_domains_tile_the_array(case):
    sharding, shape = named(case)
    sizes, _, spec, _, _ = case
    used = [a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)]
    replication = math.prod(sizes) // math.prod(sizes[AXIS_NAMES.index(a)] for a in used)
    domains = sharding.index_domains(shape)
    assert len(domains) == len(sharding.devices)
    np.testing.assert_array_equal(coverage(domains, shape), replication)
    assert sharding.is_fully_replicated == (replication == math.prod(sizes))


@given(mesh_cases())
def test_disassemble_shapes_are_numpy_slice_shapes(case):
    sharding, shape = named(case)
    x = np.empty(shape, dtype=np.int8)
    devices = sharding.devices
    for semantics in (ALL, ADDRESSABLE):
        domains = sharding.index_domains(shape, semantics)
        disassembled = sharding.disassemble(shape, semantics)
        kept = [d for d in devices if semantics is ALL or d.is_addressable]
        assert [s for s, _ in disassembled] == [x[d.slices()].shape for d in domains]
        assert [sh for _, sh in disassembled] == [SingleDeviceSharding(d) for d in kept]
    assert sharding.shard_shape(shape) == x[sharding.index_domains(shape)[0].slices()].shape


@given(mesh_cases(), st.randoms(use_true_random=False))
def test_with_device_assignment_keeps_partitioning(case, rng):
    sharding, shape = named(case)
    devices = list(sharding.devices)
    rng.shuffle(devices)
    moved = sharding.with_device_assignment(DeviceList(devices), "pinned_host")
    assert list(moved.devices) == devices
    assert moved.memory_kind == MemoryKind("pinned_host")
    assert moved.has_same_partitioning(sharding) and sharding.has_same_partitioning(moved)
    assert moved.index_domains(shape) == sharding.index_domains(shape)
    assert sharding.with_device_assignment() == sharding
    with pytest.raises(InvalidArgumentError, match=f"asked to have {len(devices) + 1} devices"):
        sharding.with_device_assignment(devices + devices[:1])


@given(mesh_cases(), st.permutations(range(MAX_DEVICES)),
       st.sampled_from([None, "device", "pinned_host", "unpinned_host"]))
def test_has_same_partitioning_ignores_devices_and_memory_kind(case, others, kind):
    sizes, perm, spec, shape, addressable = case
    sharding, _ = named(case)
    other_perm = sorted(range(len(perm)), key=others.index)  # any order of distinct devices
    other = NamedSharding(fake_mesh(sizes, other_perm, len(perm)), spec, kind)
    assert sharding.has_same_partitioning(other)
    assert (sharding == other) == (sharding.devices == other.devices
                                   and sharding.memory_kind == other.memory_kind)
    longer = NamedSharding(sharding.mesh, PartitionSpec(*spec, None))
    assert sharding.has_same_partitioning(longer) and hash(longer) == hash(sharding)


@given(sharding_params(), st.lists(st.integers(0, 2), min_size=3, max_size=3))
def test_sharding_param_matches_reference(param, multipliers):
    n = param.num_devices
    sharding = ShardingParamSharding(param, example_client(n, n).devices())
    shape = tuple(s * m for s, m in zip(param.dim_shards, multipliers))
    assert param.to_device_list() == reference_device_order(param)
    assert sharding.index_domains(shape) == reference_param_domains(param, shape)
    np.testing.assert_array_equal(coverage(sharding.index_domains(shape), shape),
                                  n // param.num_shards)


@st.composite
def hlo_cases(draw):
    n = draw(st.integers(1, MAX_DEVICES))
    rank = draw(st.integers(1, 3))
    factors = []
    remaining = n
    for _ in range(rank):
        d = draw(st.sampled_from([f for f in range(1, remaining + 1) if remaining % f == 0]))
        factors.append(d)
        remaining //= d
    replicate_last = remaining > 1
    dims = factors + ([remaining] if replicate_last else [])
    devices = draw(st.permutations(range(n)))
    shape = [draw(st.integers(0, 9)) for _ in range(rank)]
    return n, dims, list(devices), replicate_last, shape


@given(hlo_cases())
def test_hlo_sharding_domains_match_numpy(case):
    xc = pytest.importorskip("jaxlib.xla_client")
    from ifrtpy.sharding import HloSharding

    n, dims, devices, replicate_last, shape = case
    op = xc.OpSharding()
    op.type = xc.OpSharding.Type.OTHER
    op.tile_assignment_dimensions = dims
    op.tile_assignment_devices = devices
    op.replicate_on_last_tile_dim = replicate_last
    sharding = HloSharding(example_client(n, n).devices(), op)
    rank = len(shape)
    assignment = np.asarray(devices).reshape(dims)
    expected = {}
    for position in np.ndindex(*dims):
        lo = [min(p * -(-d // t), d) for p, d, t in zip(position, shape, dims)]
        hi = [min(l + -(-d // t), d) for l, d, t in zip(lo, shape, dims)]
        expected[int(assignment[position])] = IndexDomain(lo, np.subtract(hi, lo))
    domains = sharding.index_domains(shape)
    assert domains == [expected[i] for i in range(n)]
    replication = dims[-1] if replicate_last else 1
    np.testing.assert_array_equal(coverage(domains, shape), replication)
    x = np.empty(shape)
    assert [s for s, _ in sharding.disassemble(shape)] == [x[d.slices()].shape for d in domains]
    assert rank == len(sharding.shard_shape(shape))


@given(mesh_cases())
def test_named_sharding_matches_jax(case):
    jax = pytest.importorskip("jax")
    sizes, perm, spec, shape, _ = case
    if len(jax.devices()) < len(perm):
        pytest.skip(f"jax has {len(jax.devices())} devices, needs {len(perm)}")
    jax_devices = np.empty(len(perm), dtype=object)
    jax_devices[:] = [jax.devices()[i] for i in perm]
    jax_mesh = jax.sharding.Mesh(jax_devices.reshape(sizes), AXIS_NAMES[:len(sizes)])
    jax_map = jax.sharding.NamedSharding(jax_mesh, jax.sharding.PartitionSpec(*spec)) \
        .devices_indices_map(shape)
    sharding, _ = named(case)
    ours = [normalize(d.slices(), shape) for d in sharding.index_domains(shape)]
    theirs = [normalize(jax_map[d], shape) for d in jax_mesh.devices.flat]
    assert ours == theirs


@given(mesh_cases(), sharding_params())
def test_value_types_round_trip_through_pickle(case, param):
    sharding, shape = named(case, "unpinned_host")
    n = param.num_devices
    client = example_client(n, max(1, n // 2))
    dynamic = DynamicShape(Shape([3, 4]), BoundedDynamicShapeTag([True, False]))
    values = [
        Shape(shape), Index(shape), IndexDomain(shape), dynamic, dynamic.tag, param,
        sharding, sharding.mesh, sharding.spec, sharding.memory_kind, sharding.devices,
        sharding.lower(len(shape)), ShardingParamSharding(param, client.devices()),
        ConcreteSharding(client.devices(), Shape([n]), [Shape([1])] * n),
        ConcreteEvenSharding(client.devices(), Shape([n]), Shape([1])),
        SingleDeviceSharding(client.lookup_device(0), "pinned_host"),
    ]
    for value in values:
        copy = pickle.loads(pickle.dumps(value))
        assert copy == value and hash(copy) == hash(value) and type(copy) is type(value)


def test_named_sharding_errors():
    mesh = fake_mesh((2, 3), list(range(6)), 6)
    with pytest.raises(InvalidArgumentError, match="uses mesh axis 'x' more than once"):
        NamedSharding(mesh, PartitionSpec("x", ("y", "x")))
    with pytest.raises(InvalidArgumentError, match="names axis 'w', which is not in the mesh"):
        NamedSharding(mesh, PartitionSpec("w"))
    sharding = NamedSharding(mesh, PartitionSpec("x", "y"))
    with pytest.raises(InvalidArgumentError, match="has 2 entries, but the array has rank 1"):
        sharding.index_domains((4,))
    # jax's habit: the array axis, the spec entry, the mesh axes and the full shape
    uneven = (r"splits dimension 0 of an array of shape \[7,6\] over mesh axes 'x' \(2\) "
              r"\(spec entry 0: 'x'\) into 2 shards, but 7 is not a multiple of 2: pad")
    for call in (sharding.shard_shape, sharding.disassemble, sharding.index_domains):
        with pytest.raises(InvalidArgumentError, match=uneven):
            call((7, 6))
    with pytest.raises(InvalidArgumentError, match=r"Uneven shard is not supported. dim: 7, "
                       r"dim_shards: 2 \(dimension 0 of shape \[7,6\] is split into 2 shards"):
        sharding.lower(2).shard_shape((7, 6))
    with pytest.raises(InvalidArgumentError, match="2 dimensions .* but 1 axis names"):
        Mesh(mesh.devices, ("x",))
    with pytest.raises(InvalidArgumentError, match="distinct"):
        Mesh(mesh.devices, ("x", "x"))
    with pytest.raises(TypeError):
        PartitionSpec(3)


def test_named_sharding_lowering_examples():
    mesh = fake_mesh((2, 3), list(range(6)), 4)
    sharding = NamedSharding(mesh, PartitionSpec("y"))
    assert sharding.sharding_param == ShardingParam([3], [1, 0], [3, 2])
    assert sharding.lower(2).sharding_param == ShardingParam([3, 1], [1, 0], [3, 2])
    assert [tuple(d.origin) for d in sharding.index_domains((6, 4))] == \
        [(0, 0), (2, 0), (4, 0)] * 2
    assert len(sharding.index_domains((6, 4), ADDRESSABLE)) == 4
    assert NamedSharding(mesh, PartitionSpec()).is_fully_replicated
    assert repr(PartitionSpec("x", None, ("y", "z"))) == "PartitionSpec('x', None, ('y', 'z'))"
    assert mesh.shape == {"x": 2, "y": 3} and mesh.size == 6
    assert list(mesh.device_list) == list(mesh.devices.flat)


# -- naming a sharding after a mesh ---------------------------------------------------------------

def _placement(sharding, shape):
    return dict(zip(sharding.devices, sharding.index_domains(Shape(shape), ALL)))


@given(case=mesh_cases(), data=st.data())
def test_named_sharding_like_finds_the_spec_that_places_alike(case, data):
    """For a sharding that is a NamedSharding over the mesh (given here as its lowered
    ShardingParamSharding, or as a ConcreteSharding of its domains), the one found places
    every element alike; over a reshaped mesh of the same devices, either one that places
    alike or None, never one that places otherwise."""
    from ifrtpy.sharding.mesh import named_sharding_like

    sharding, shape = named(case)
    assume(0 not in shape)
    mesh = sharding.mesh
    lowered = sharding.lower(len(shape))
    found = named_sharding_like(lowered, mesh, shape)
    assert found is not None and found.mesh is mesh
    assert _placement(found, shape) == _placement(sharding, shape)
    grid = mesh.devices.reshape(-1)
    order = data.draw(st.permutations(range(grid.size)))
    flat = Mesh(grid[list(order)], ("w",))
    other = named_sharding_like(lowered, flat, shape)
    assert other is None or _placement(other, shape) == _placement(sharding, shape)


def test_named_sharding_like_refuses_what_no_spec_gives():
    from ifrtpy.sharding.mesh import named_sharding_like

    client = example_client(4, 4)
    devices = np.empty(4, dtype=object)
    devices[:] = [client.lookup_device(i) for i in range(4)]
    mesh = Mesh(devices.reshape(2, 2), ("x", "y"))
    half = Mesh(devices[:2], ("x",))
    split = NamedSharding(mesh, PartitionSpec("x", "y"))
    assert named_sharding_like(split, half, (4, 4)) is None           # other devices
    assert named_sharding_like(split, mesh, (3, 4)) is None           # uneven
    assert named_sharding_like(split, mesh, (0, 4)) is None           # empty
    # devices in an order no spec over this mesh gives
    swapped = ConcreteSharding(DeviceList(devices[[1, 0, 2, 3]]), Shape([4]), [Shape([1])] * 4,
                               [IndexDomain([i], [1]) for i in range(4)])
    assert named_sharding_like(swapped, mesh, (4,)) is None
    whole = named_sharding_like(SingleDeviceSharding(devices[0]), Mesh(devices[:1], ("x",)), (4,))
    assert whole is not None and whole.is_fully_replicated
