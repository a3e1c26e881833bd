"""Shardings with unreduced axes (jax's ``P(..., unreduced={...})``, XLA's ``{unreduced}``
and ``last_tile_dims={unreduced}``) in HloSharding, checked against jax's CPU client: the
shard shapes jax gives, the buffers each device of a jax program holds, and NumPy for the
array they add up to. Arrays on the PjRt backend with such shardings: read per device,
refused where a read or write would take partial values for the array's, reduced by a
program."""

import pickle

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import _jaxlib  # noqa: E402
from ifrtpy.errors import InvalidArgumentError, UnimplementedError  # noqa: E402
from ifrtpy.interop.jax import sharding_from_jax  # noqa: E402
from ifrtpy.shape import IndexDomain, Shape  # noqa: E402
from ifrtpy.sharding import HloSharding, check_reduced, same_unreduced  # noqa: E402
from ifrtpy.testing.example_backend import create_client  # noqa: E402

DEVICES = create_client(8).devices()
JAX_DEVICES = jax.devices("cpu")
HAS_REDUCTION_OPS = hasattr(jax.sharding, "UnreducedKind")  # jax 0.12: sum, max, min

#: (mesh shape, axis names, spec with unreduced axes, array shape)
CASES = [
    ((2, 4), ("x", "y"), P("x", None, unreduced={"y"}), (4, 8)),
    ((2, 4), ("x", "y"), P(None, "y", unreduced={"x"}), (4, 8)),
    ((2, 4), ("x", "y"), P(None, None, unreduced={"x", "y"}), (4, 8)),
    ((2, 2, 2), ("x", "y", "z"), P("x", None, unreduced={"y"}), (4, 6)),
    ((2, 2, 2), ("x", "y", "z"), P(None, None, unreduced={"z"}), (3, 5)),
    ((2, 2, 2), ("x", "y", "z"), P(("x", "z"), unreduced={"y"}), (8, 2)),
]


def explicit_mesh(shape, names):
    """A jax mesh over jax's CPU devices 0..n-1 in row-major order, explicit axes."""
    n = int(np.prod(shape))
    return Mesh(np.array(JAX_DEVICES[:n]).reshape(shape), names,
                axis_types=(AxisType.Explicit,) * len(names))


def without_unreduced(spec):
    return P(*spec.partitions)


def ifrt_sharding(jax_sharding, ndim):
    n = len(jax_sharding.mesh.devices.flat)
    return HloSharding(DEVICES[:n], jax_sharding._to_xla_hlo_sharding(ndim))


@pytest.mark.parametrize("mesh_shape,names,spec,shape", CASES)
def test_shapes_and_index_domains_are_those_of_the_spec_without_its_unreduced_axes(
        mesh_shape, names, spec, shape):
    mesh = explicit_mesh(mesh_shape, names)
    unreduced = NamedSharding(mesh, spec)
    reduced = NamedSharding(mesh, without_unreduced(spec))
    sharding = ifrt_sharding(unreduced, len(shape))
    assert sharding.has_unreduced_axes and sharding.reduction == "sum"
    assert sharding.unreduced_group_size == int(np.prod([mesh.shape[a] for a in spec.unreduced]))
    assert not sharding.is_fully_replicated and not unreduced.is_fully_replicated
    assert tuple(sharding.shard_shape(shape).dims) == unreduced.shard_shape(shape)
    # jax refuses index maps of unreduced shardings; an unreduced axis is a replicated one
    # for the boxes the devices hold.
    with pytest.raises(NotImplementedError):
        unreduced.devices_indices_map(shape)
    expected = [IndexDomain([s.start or 0 for s in index],
                            [(s.stop if s.stop is not None else d) - (s.start or 0)
                             for s, d in zip(index, shape)])
                for index in (reduced.devices_indices_map(shape)[d]
                              for d in mesh.devices.flat)]
    assert sharding.index_domains(shape) == expected
    assert [s for s, _ in sharding.disassemble(shape)] == [e.shape for e in expected]


@pytest.mark.parametrize("mesh_shape,names,spec,shape", CASES)
def test_value_protocol(mesh_shape, names, spec, shape):
    mesh = explicit_mesh(mesh_shape, names)
    sharding = ifrt_sharding(NamedSharding(mesh, spec), len(shape))
    same = ifrt_sharding(NamedSharding(mesh, spec), len(shape))
    reduced = ifrt_sharding(NamedSharding(mesh, without_unreduced(spec)), len(shape))
    assert sharding == same and hash(sharding) == hash(same)
    assert sharding != reduced and not sharding.has_same_partitioning(reduced)
    assert not reduced.has_unreduced_axes and reduced.reduction is None
    assert pickle.loads(pickle.dumps(sharding)).has_same_partitioning(sharding)
    text = str(sharding.xla_hlo_sharding)
    assert "unreduced" in text and text in sharding.debug_string()
    assert HloSharding(sharding.devices, text) == sharding  # the HLO text form round-trips
    assert sharding.with_device_assignment(list(sharding.devices)[::-1]).has_unreduced_axes


@pytest.mark.parametrize("mesh_shape,names,spec,shape", CASES)
def test_unreduced_groups_are_the_mesh_lines_along_the_unreduced_axes(mesh_shape, names, spec,
                                                                      shape):
    mesh = explicit_mesh(mesh_shape, names)
    sharding = ifrt_sharding(NamedSharding(mesh, spec), len(shape))
    positions = np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape)
    axes = [names.index(a) for a in spec.unreduced]
    lines = np.moveaxis(positions, axes, range(len(names) - len(axes), len(names)))
    expected = {frozenset(DEVICES[int(p)] for p in line)
                for line in lines.reshape(-1, sharding.unreduced_group_size)}
    assert sharding.unreduced_groups() == expected
    reduced = ifrt_sharding(NamedSharding(mesh, without_unreduced(spec)), len(shape))
    assert reduced.unreduced_groups() == frozenset()
    # The same domains on each device are not the same values unless the groups agree.
    assert same_unreduced(sharding, sharding) and same_unreduced(reduced, reduced)
    assert not same_unreduced(sharding, reduced) and not same_unreduced(reduced, sharding)


def test_unreduced_over_other_axes_holds_other_values():
    mesh = explicit_mesh((2, 2, 2), ("x", "y", "z"))
    over_y, over_z = (ifrt_sharding(NamedSharding(mesh, P("x", None, unreduced={axis})), 2)
                      for axis in "yz")
    assert over_y.index_domains((4, 6)) == over_z.index_domains((4, 6))
    assert not same_unreduced(over_y, over_z)


def test_xla_text_forms():
    full = HloSharding(DEVICES, "{unreduced}")
    assert full.has_unreduced_axes and full.unreduced_group_size == 8
    assert full.shard_shape((3, 5)) == Shape((3, 5))
    assert full.index_domains((3, 5)) == [IndexDomain(Shape((3, 5)))] * 8
    mixed = HloSharding(DEVICES, "{devices=[2,1,2,2]<=[8] last_tile_dims={unreduced, replicated}}")
    assert mixed.unreduced_group_size == 2 and mixed.shard_shape((4, 6)) == Shape((2, 6))
    # One device (or groups of one) holds the whole value: nothing is unreduced.
    one = HloSharding(DEVICES[:1], "{unreduced}")
    assert one.is_fully_replicated and not one.has_unreduced_axes
    check_reduced(one, "a read")
    with pytest.raises(InvalidArgumentError, match=r"a read: .* each group of 8 of its 8 devices"):
        check_reduced(full, "a read")


def test_reduction_ops():
    text = "{devices=[2,1,4]<=[8] last_tile_dims={unreduced}}"
    assert HloSharding(DEVICES, text, reduction="sum").reduction == "sum"
    with pytest.raises(InvalidArgumentError, match="reduction must be one of 'sum', 'max', 'min'"):
        HloSharding(DEVICES, text, reduction="mean")
    with pytest.raises(InvalidArgumentError, match="needs unreduced axes"):
        HloSharding(DEVICES, "{replicated}", reduction="sum")
    if _jaxlib.reduction_op(HloSharding(DEVICES, text).xla_hlo_sharding) is None:
        # jaxlib 0.10 has no reductions but the sum: asking for another is refused, not
        # silently read as a sum.
        with pytest.raises(UnimplementedError, match="no reductions other than a sum"):
            HloSharding(DEVICES, text, reduction="max")
        return
    biggest = HloSharding(DEVICES, text, reduction="max")
    assert biggest.reduction == "max" and biggest != HloSharding(DEVICES, text)
    assert "reduction: max" in biggest.debug_string()
    assert pickle.loads(pickle.dumps(biggest)).reduction == "max"
    assert HloSharding(DEVICES, biggest.op_sharding).reduction == "max"  # the proto keeps it
    if HAS_REDUCTION_OPS:  # jax's own: P(..., unreduced_kind=UnreducedKind.min)
        mesh = explicit_mesh((2, 4), ("x", "y"))
        spec = P("x", None, unreduced={"y"}, unreduced_kind=jax.sharding.UnreducedKind.min)
        assert ifrt_sharding(NamedSharding(mesh, spec), 2).reduction == "min"


# -- arrays on the PjRt backend ------------------------------------------------------------

@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)


#: jax 0.12.1 lowers an unreduced value as an array with a leading axis per unreduced
#: mesh axis (f32[4,4,6] for f32[4,6] unreduced over "y"), not as an unreduced sharding:
#: ifrtpy refuses such a Lowered stage, so the programs below come from jax before 0.12.1.
LOWERS_UNREDUCED_AS_AN_AXIS = tuple(int(p) for p in jax.__version_info__[:3]) >= (0, 12, 1)
needs_unreduced_lowering = pytest.mark.skipif(
    LOWERS_UNREDUCED_AS_AN_AXIS, reason=f"jax {jax.__version__} lowers unreduced values as a "
    "leading axis, which ifrtpy refuses (tested below); jax 0.10 and 0.11 test these")


@pytest.fixture(scope="module")
def programs():
    """A matmul whose result is unreduced over "y" (each device of a "y" group holds the
    product of its slices), and a program taking such an array, doubling it and reducing
    it; with jax's CPU client's results for the same inputs."""
    mesh = explicit_mesh((2, 4), ("x", "y"))
    a = np.arange(32, dtype=np.float32).reshape(4, 8)
    b = np.linspace(-1, 1, 48, dtype=np.float32).reshape(8, 6)
    with jax.set_mesh(mesh):
        ja = jax.device_put(a, NamedSharding(mesh, P("x", "y")))
        jb = jax.device_put(b, NamedSharding(mesh, P("y", None)))
        matmul = jax.jit(lambda u, v: jnp.einsum("ij,jk->ik", u, v,
                                                 out_sharding=P("x", None, unreduced={"y"})))
        double = jax.jit(lambda w: jax.sharding.reshard(w + w, P("x", None)))
        unreduced = matmul(ja, jb)
        return dict(a=a, b=b, mesh=mesh, matmul=matmul.lower(ja, jb),
                    double=double.lower(unreduced), jax_out=unreduced,
                    jax_doubled=np.asarray(double(unreduced)))


@pytest.mark.skipif(not LOWERS_UNREDUCED_AS_AN_AXIS, reason="jax lowers unreduced shardings")
def test_a_jax_lowering_of_unreduced_values_as_an_axis_is_refused(programs):
    with pytest.raises(UnimplementedError, match=r"result 0 float32\[4,6\] unreduced over \('y',\)"):
        ifrt.HloProgram(programs["matmul"])
    with pytest.raises(UnimplementedError, match=r"leading axis.*parameter 0 float32"):
        ifrt.HloProgram(programs["double"])


def run(client, lowered, *args):
    exe = client.compile(ifrt.HloProgram(lowered),
                         ifrt.CompileOptions(devices=client.devices(), num_partitions=8))
    return exe.execute(list(args), ifrt.ExecuteOptions()).outputs


def put(client, x, spec):
    mesh = ifrt.Mesh(np.array(client.devices()).reshape(2, 4), ("x", "y"))
    return client.make_array_from_host_buffer(x, ifrt.NamedSharding(mesh, ifrt.PartitionSpec(*spec)))


@pytest.fixture(scope="module")
def unreduced_out(client, programs):
    out, = run(client, programs["matmul"], put(client, programs["a"], ("x", "y")),
               put(client, programs["b"], ("y", None)))
    return out


@needs_unreduced_lowering
def test_a_program_output_holds_jax_buffers_on_each_device(unreduced_out, programs):
    out, jax_out = unreduced_out, programs["jax_out"]
    assert out.sharding.has_unreduced_axes and not out.is_fully_replicated
    assert tuple(out.sharding.shard_shape(out.shape).dims) == jax_out.sharding.shard_shape((4, 6))
    pieces = [np.asarray(p) for p in out.disassemble_into_single_device_arrays()]
    expected = [np.asarray(s.data) for s in jax_out.addressable_shards]
    assert [p.shape for p in pieces] == [e.shape for e in expected] == [(2, 6)] * 8
    for piece, want in zip(pieces, expected):
        np.testing.assert_allclose(piece, want, rtol=1e-6, atol=1e-6)
    # Each group of devices holding one box adds up to NumPy's product on that box.
    product = programs["a"] @ programs["b"]
    sums: dict = {}
    for domain, piece in zip(out.sharding.index_domains(out.shape), pieces):
        sums[domain] = sums.get(domain, 0) + piece
    assert len(sums) == 2
    for domain, total in sums.items():
        np.testing.assert_allclose(total, product[domain.slices()], rtol=1e-5, atol=1e-5)


@needs_unreduced_lowering
def test_reads_and_writes_by_index_domain_are_refused(client, unreduced_out, programs):
    # jax refuses the read of its own array: 0.10 in Python (NotImplementedError), 0.12 in
    # its runtime (INVALID_ARGUMENT, "... does not support UniqueIndexDomains"), 0.12.1 in
    # Python again (RuntimeError: "... that is unreduced is not allowed").
    with pytest.raises((NotImplementedError, RuntimeError)) as refused:
        np.asarray(programs["jax_out"])
    assert (refused.type is NotImplementedError or "INVALID_ARGUMENT" in str(refused.value)
            or "unreduced is not allowed" in str(refused.value))
    with pytest.raises(InvalidArgumentError, match="copy_to_host_buffer: .* has unreduced axes"):
        np.asarray(unreduced_out)
    with pytest.raises(InvalidArgumentError, match="addressable_shards: .*disassemble"):
        unreduced_out.addressable_shards
    replicated = ifrt.HloSharding(client.devices(), "{replicated}")
    with pytest.raises(InvalidArgumentError, match="reshard_arrays of array 0: .*unreduced"):
        client.reshard_arrays([unreduced_out], [ifrt.ArraySpec(
            unreduced_out.dtype, unreduced_out.shape, replicated)])
    host = np.ones((4, 6), np.float32)
    with pytest.raises(InvalidArgumentError, match="has unreduced axes"):
        client.make_array_from_host_buffer(host, unreduced_out.sharding)
    source = client.make_array_from_host_buffer(host, replicated)
    with pytest.raises(InvalidArgumentError, match="reshard_arrays to spec 0: .*unreduced"):
        client.reshard_arrays([source], [ifrt.ArraySpec(source.dtype, source.shape,
                                                        unreduced_out.sharding)])


@needs_unreduced_lowering
def test_a_program_reduces_an_unreduced_argument(client, unreduced_out, programs):
    doubled, = run(client, programs["double"], unreduced_out)
    assert not doubled.sharding.has_unreduced_axes
    np.testing.assert_allclose(np.asarray(doubled), programs["jax_doubled"], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(doubled), 2 * programs["a"] @ programs["b"], rtol=1e-5)


@needs_unreduced_lowering
def test_an_argument_without_the_partial_values_a_parameter_takes_is_refused(client, programs):
    # The same boxes on each device as the unreduced parameter, but whole values: the
    # program would add them up over each group of 4 (4x the array).
    whole = put(client, programs["a"] @ programs["b"], ("x", None))
    exe = client.compile(ifrt.HloProgram(programs["double"]),
                         ifrt.CompileOptions(devices=client.devices(), num_partitions=8))
    with pytest.raises(InvalidArgumentError, match="partial values on one side only"):
        exe(whole)


@needs_unreduced_lowering
def test_copies_to_other_devices_keep_the_partial_values(client, unreduced_out):
    copy, = client.copy_arrays([unreduced_out], ifrt.DeviceList(client.devices()[::-1]))
    assert copy.sharding.has_unreduced_axes
    for mine, theirs in zip(copy.disassemble_into_single_device_arrays(),
                            unreduced_out.disassemble_into_single_device_arrays()):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))


def test_jax_arrays_with_unreduced_axes_cross_both_ways(client, programs):
    jax_out = programs["jax_out"]
    mine = ifrt.from_jax(jax_out, client)
    assert isinstance(mine.sharding, HloSharding) and mine.sharding.has_unreduced_axes
    expected = [np.asarray(s.data) for s in jax_out.addressable_shards]
    pieces = [np.asarray(p) for p in mine.disassemble_into_single_device_arrays()]
    for piece, want in zip(pieces, expected):
        np.testing.assert_array_equal(piece, want)
    with pytest.raises(InvalidArgumentError, match="has unreduced axes"):
        np.asarray(mine)
    back = ifrt.to_jax(mine)
    for shard, want in zip(back.addressable_shards, expected):
        np.testing.assert_array_equal(np.asarray(shard.data), want)
    # jax's reduced axes are replicated ones: a NamedSharding without them.
    mesh = programs["mesh"]
    reduced = sharding_from_jax(NamedSharding(mesh, P("x", None, reduced={"y"})), client)
    assert reduced == sharding_from_jax(NamedSharding(mesh, P("x", None)), client)
