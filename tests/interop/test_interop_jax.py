"""The jax bridge as laws on 8 CPU devices: random meshes, device orders and partition
specs; index domains equal jax's ``devices_indices_map`` both ways; arrays round-trip
bit-exactly and shard by shard without a copy (equal addresses)."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

jax = pytest.importorskip("jax")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy.errors import InvalidArgumentError, UnimplementedError  # noqa: E402
from ifrtpy.interop import jax as ij  # noqa: E402
from ifrtpy.backends import jax_shardings  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402


@pytest.fixture(scope="module")
def client():
    return ij.default_client()


def _bytes(x) -> bytes:
    return np.ascontiguousarray(x).view(np.uint8).tobytes()


@st.composite
def jax_cases(draw):
    """(jax NamedSharding, global shape) over a random subset and order of 8 devices."""
    count = draw(st.sampled_from([1, 2, 4, 8]))
    order = draw(st.permutations(range(8)))[:count]
    sizes, left = [], count
    while left > 1 and len(sizes) < 2:
        size = draw(st.sampled_from([s for s in (2, 4, 8) if left % s == 0]))
        sizes.append(size)
        left //= size
    sizes.append(left)
    names = ("a", "b", "c")[:len(sizes)]
    devices = {d.id: d for d in jax.devices()}
    mesh = jax.sharding.Mesh(np.array([devices[i] for i in order]).reshape(sizes), names)
    ndim = draw(st.integers(1, 3))
    unused = list(names)
    spec, shape = [], []
    for _ in range(ndim):
        axes = draw(st.lists(st.sampled_from(unused), unique=True, max_size=2)) if unused else []
        unused = [a for a in unused if a not in axes]
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
        shards = math.prod(mesh.shape[a] for a in axes)
        shape.append(shards * draw(st.integers(1, 2)))
    memory_kind = draw(st.sampled_from([None, "device", "pinned_host", "unpinned_host"]))
    return NamedSharding(mesh, P(*spec), memory_kind=memory_kind), tuple(shape)


def _jax_domains(sharding, shape):
    """{device id: (origin, shape)} of a jax sharding."""
    out = {}
    for device, index in sharding.devices_indices_map(shape).items():
        ranges = [s.indices(n)[:2] for s, n in zip(index, shape)]
        out[device.id] = (tuple(a for a, _ in ranges), tuple(b - a for a, b in ranges))
    return out


def _ifrt_domains(sharding, shape):
    domains = sharding.index_domains(ifrt.Shape(shape))
    return {d.id: (tuple(dom.origin.elements), tuple(dom.shape.dims))
            for d, dom in zip(sharding.devices, domains)}


@given(case=jax_cases())
def test_sharding_conversions_keep_index_domains(client, case):
    js, shape = case
    s = ij.sharding_from_jax(js, client)
    assert isinstance(s, ifrt.NamedSharding)
    assert str(s.memory_kind.canonicalize(s.devices[0])) == str(js.memory_kind or "device")
    assert _ifrt_domains(s, shape) == _jax_domains(js, shape)
    back = ij.sharding_to_jax(s)
    assert _jax_domains(back, shape) == _jax_domains(js, shape)
    assert back.is_equivalent_to(js, len(shape))
    # GSPMD form: jax -> HloSharding -> jax
    from jax._src.sharding_impls import GSPMDSharding
    gs = GSPMDSharding(js._device_assignment, js._to_xla_hlo_sharding(len(shape)))
    h = ij.sharding_from_jax(gs, client, len(shape))
    assert isinstance(h, ifrt.HloSharding)
    assert _ifrt_domains(h, shape) == _jax_domains(js, shape)
    assert _jax_domains(ij.sharding_to_jax(h), shape) == _jax_domains(js, shape)


@given(case=jax_cases(), dtype=st.sampled_from([np.float32, np.int8, np.bool_, np.complex64]),
       data=st.data())
def test_arrays_round_trip_bit_exactly_without_copies(client, case, dtype, data):
    js, shape = case
    x = data.draw(ifrt.testing.strategies.host_arrays(np.dtype(dtype), shape))
    ja = jax.device_put(x, js)
    ia = ij.from_jax(ja, client)
    assert tuple(ia.shape.dims) == shape and ia.dtype == ifrt.DType.from_numpy(dtype)
    assert _bytes(np.asarray(ia)) == _bytes(x)
    assert _ifrt_domains(ia.sharding, shape) == _jax_domains(js, shape)
    jax_ptrs = {s.device.id: s.data.unsafe_buffer_pointer() for s in ja.addressable_shards}
    shards = ia.disassemble_into_single_device_arrays()
    assert {s.sharding.devices[0].id: s.unsafe_buffer_pointer() for s in shards} == jax_ptrs
    jb = ij.to_jax(ia)
    assert jb.sharding.is_equivalent_to(js, len(shape))
    assert _bytes(np.asarray(jb)) == _bytes(x)
    if js.memory_kind in (None, "device"):  # jax imports DLPack into device memory only
        assert {s.device.id: s.data.unsafe_buffer_pointer() for s in jb.addressable_shards} == jax_ptrs


def test_single_device_both_ways(client):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    jd = jax.devices()[5]
    ja = jax.device_put(x, jd)
    ia = ifrt.from_jax(ja, client)
    assert ia.sharding == ifrt.SingleDeviceSharding(client.lookup_device(5))
    assert ia.unsafe_buffer_pointer() == ja.unsafe_buffer_pointer()
    jb = ifrt.to_jax(ia)
    assert jb.devices() == {jd} and jb.unsafe_buffer_pointer() == ja.unsafe_buffer_pointer()
    np.testing.assert_array_equal(jb, x)
    assert ij.sharding_from_jax(jd, client) == ifrt.SingleDeviceSharding(client.lookup_device(5))


def test_jax_numpy_takes_an_ifrtpy_array_as_to_jax_gives_it(client):
    """jax's ``__jax_array__`` protocol: ``jnp.asarray(a)`` is ``ifrt.to_jax(a)``, its
    shards without a copy; ``jnp.array(a)`` copies, and jax arrays take one as an operand."""
    jnp = pytest.importorskip("jax.numpy")
    mesh = ifrt.Mesh(np.array(client.devices()[:4]).reshape(2, 2), ("x", "y"))
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    a = client.make_array_from_host_buffer(x, ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x")))
    got = jnp.asarray(a)
    assert isinstance(got, jax.Array) and got.sharding.is_equivalent_to(ij.sharding_to_jax(a.sharding), 2)
    assert ({s.sharding.devices[0].id: s.unsafe_buffer_pointer()
             for s in a.disassemble_into_single_device_arrays()}
            == {s.device.id: s.data.unsafe_buffer_pointer() for s in got.addressable_shards})
    copied = jnp.array(a)
    np.testing.assert_array_equal(copied, x)
    assert all(s.data.unsafe_buffer_pointer() != got.addressable_shards[0].data.unsafe_buffer_pointer()
               for s in copied.addressable_shards)
    np.testing.assert_array_equal(jnp.ones((4, 6), np.float32) + a, x + 1)
    np.testing.assert_array_equal(jax.jit(lambda v: v * 2)(jnp.asarray(a)), x * 2)


def test_ifrt_arrays_outlive_their_jax_source_and_back(client):
    x = np.arange(64, dtype=np.float64)
    ia = ij.from_jax(jax.device_put(x, jax.devices()[1]), client)  # the jax array is gone
    np.testing.assert_array_equal(np.asarray(ia), x)
    jb = ij.to_jax(client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(client.devices()[2])))
    np.testing.assert_array_equal(np.asarray(jb), x)  # the ifrtpy array is gone


def test_device_put_and_puts_accept_jax_values(client):
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    js = NamedSharding(mesh, P("x", "y"))
    x = np.arange(64, dtype=np.int32).reshape(8, 8)
    ja = jax.device_put(x, js)
    a = ifrt.device_put(ja, js)  # same sharding: taken without a copy
    assert isinstance(a.sharding, ifrt.NamedSharding) and a.client is client
    assert ({s.sharding.devices[0].id: s.unsafe_buffer_pointer() for s in a.disassemble_into_single_device_arrays()}
            == {s.device.id: s.data.unsafe_buffer_pointer() for s in ja.addressable_shards})
    b = ifrt.device_put(ja, NamedSharding(mesh, P("y")))  # another sharding: gathered
    assert _ifrt_domains(b.sharding, (8, 8)) == _jax_domains(NamedSharding(mesh, P("y")), (8, 8))
    np.testing.assert_array_equal(np.asarray(b), x)
    c = ifrt.device_put(x, jax.devices()[3])
    assert c.sharding.devices[0] is client.lookup_device(3)
    d = client.make_array_from_host_buffer(ja, js)
    np.testing.assert_array_equal(np.asarray(d), x)
    assert _ifrt_domains(d.sharding, (8, 8)) == _jax_domains(js, (8, 8))


def test_different_device_counts_name_the_missing_device():
    small = ifrt.get_client("pjrt", device_count=2)
    with pytest.raises(InvalidArgumentError, match="id 5"):
        ij.sharding_from_jax(jax.devices()[5], small)
    big = ifrt.get_client("pjrt", device_count=12)
    with pytest.raises(InvalidArgumentError, match="ifrtpy device 10"):
        ij.sharding_to_jax(ifrt.SingleDeviceSharding(big.lookup_device(10)))


def test_a_device_count_jax_lacks_says_how_to_give_both_the_same_count():
    """jax has 8 CPU devices here (conftest's XLA_FLAGS); a client of 12 has four it lacks,
    one of 2 lacks six of jax's."""
    big = ifrt.get_client("pjrt", device_count=12)
    a = ifrt.device_put(np.arange(4, dtype=np.float32), big.lookup_device(10))
    with pytest.raises(InvalidArgumentError) as info:
        ifrt.to_jax(a)
    for text in ("ifrtpy device 10 has no jax counterpart: jax has 8 cpu devices, this client 12",
                 "XLA_FLAGS=--xla_force_host_platform_device_count=12 before jax starts",
                 "jax.config.update('jax_num_cpu_devices', 12)", "ifrt.get_client(device_count=8)"):
        assert text in str(info.value), (text, str(info.value))
    small = ifrt.get_client("pjrt", device_count=2)
    j = jax.device_put(np.arange(4, dtype=np.float32), jax.devices()[5])
    with pytest.raises(InvalidArgumentError) as info:
        ifrt.from_jax(j, small)
    for text in ("(id 5) has no ifrtpy counterpart: the ifrtpy client has 2 devices, jax 8",
                 "ifrt.get_client(device_count=8)"):
        assert text in str(info.value), (text, str(info.value))


def test_devices_of_another_platform_are_refused(client):
    class GpuDevice:  # what jax reports for a CUDA device
        platform, id = "gpu", 0

    with pytest.raises(InvalidArgumentError, match="gpu device.*platform is cpu"):
        jax_shardings._ifrt_device(client, GpuDevice())


def test_unsupported_inputs_are_refused(client):
    with pytest.raises(InvalidArgumentError, match="jax.Array"):
        ij.from_jax(np.ones(3), client)
    with pytest.raises(InvalidArgumentError, match="ifrtpy Array"):
        ij.to_jax(np.ones(3))
    with pytest.raises(InvalidArgumentError, match="jax Sharding"):
        ij.sharding_from_jax("x", client)
    uneven = ifrt.ConcreteEvenSharding(client.devices()[:2], [4], [2], False)
    with pytest.raises(UnimplementedError, match="ConcreteEvenSharding"):
        ij.sharding_to_jax(uneven)


# -- the jax.Array surface of ifrtpy arrays ---------------------------------------------------

def _index(index, shape):
    """A NumPy index as (start, stop, step) per dimension (jax writes slice(None) where
    ifrtpy writes slice(0, n))."""
    return tuple(s.indices(n) for s, n in zip(index, shape))


def _surface(a, shape):
    return {
        "shape": tuple(a.shape), "ndim": a.ndim, "size": a.size, "nbytes": a.nbytes,
        "is_fully_addressable": a.is_fully_addressable,
        "is_fully_replicated": a.is_fully_replicated,
        "device_set": {d.id for d in a.sharding.device_set},
        "shards": sorted((s.device.id, _index(s.index, shape), s.replica_id,
                          _bytes(np.asarray(s.data))) for s in a.addressable_shards),
    }


@pytest.mark.parametrize("backend", ["pjrt", "reference", "jax"])
@given(case=jax_cases(), dtype=st.sampled_from([np.float32, np.int8, np.bool_, np.complex64,
                                                np.float16, np.uint32]),  # jax keeps 32 bits
       data=st.data())
def test_the_jax_array_surface_means_what_jax_says(backend, case, dtype, data):
    """On random meshes, device orders and specs: ndim, size, nbytes, is_fully_addressable,
    is_fully_replicated, sharding.device_set and addressable_shards (device, index,
    replica id, data) of an ifrtpy array equal jax.Array's for the same data and
    sharding; shape equals jax's tuple and dtype its NumPy dtype."""
    js, shape = case
    client = _reference() if backend == "reference" else ifrt.get_client(backend)
    x = data.draw(ifrt.testing.strategies.host_arrays(np.dtype(dtype), shape))
    ja = jax.device_put(x, js)
    ia = client.make_array_from_host_buffer(x, _same_sharding(js, client))
    assert ia.shape == ja.shape and ia.shape == x.shape and ja.shape == ia.shape
    assert ia.dtype == ja.dtype and ia.dtype == dtype and ja.dtype == ia.dtype
    assert hash(ia.dtype) == hash(ja.dtype)
    assert _surface(ia, shape) == _surface(ja, shape)
    # jax's order too: its shards follow the sharding's device assignment
    assert [s.device.id for s in ia.addressable_shards] == [s.device.id for s in ja.addressable_shards]


def _same_sharding(js, client):
    """jax's NamedSharding ``js`` over ``client``'s devices of the same ids."""
    devices = np.empty(js.mesh.devices.shape, object)
    for index, d in np.ndenumerate(js.mesh.devices):
        devices[index] = client.lookup_device(d.id)
    mesh = ifrt.Mesh(devices, js.mesh.axis_names)
    return ifrt.NamedSharding(mesh, ifrt.PartitionSpec(*js.spec), js.memory_kind)


_references = []


def _reference():
    if not _references:
        _references.append(ifrt.get_client("reference", device_count=8))
    return _references[0]


def test_the_surface_of_arrays_jax_has_no_twin_of():
    """A single-device array, a scalar and a sub-byte dtype: the same definitions."""
    client = ifrt.get_client()
    d = client.devices()[3]
    a = client.make_array_from_host_buffer(np.float64(2.5), ifrt.SingleDeviceSharding(d))
    assert (a.ndim, a.size, a.nbytes, a.shape) == (0, 1, 8, ())
    assert a.is_fully_replicated and a.is_fully_addressable and a.sharding.device_set == {d}
    [shard] = a.addressable_shards
    assert (shard.device, shard.index, shard.replica_id) == (d, (), 0)
    assert shard.data.shape == () and float(np.asarray(shard.data)) == 2.5
    int4 = client.make_array_from_host_buffer(np.zeros((3, 5), "int4"),
                                              ifrt.SingleDeviceSharding(d))
    assert (int4.size, int4.nbytes, int4.dtype == "int4") == (15, 15, True)


# -- outputs keep the NamedSharding of their inputs' mesh, as jax's do ------------------------

PROGRAMS = {"x*2+1": lambda x: x * 2 + 1, "transpose": lambda x: x.T,
            "sum of rows": lambda x: x.sum(axis=0)}


def _spec(spec, ndim, sizes):
    """A PartitionSpec as a tuple of axis-name tuples, one per dimension, without the axes
    of size 1 (which split nothing: ``P("a")`` and ``P()`` place alike when "a" has 1)."""
    entries = list(spec) + [None] * (ndim - len(spec))
    return tuple(tuple(a for a in (() if e is None else (e,) if isinstance(e, str) else e)
                       if sizes[a] > 1) for e in entries)


@pytest.mark.parametrize("backend", ["pjrt", "reference", "jax"])
@given(case=jax_cases(), name=st.sampled_from(sorted(PROGRAMS)))
def test_outputs_keep_the_named_sharding_jax_gives(backend, case, name):
    """A program jax lowers from NamedSharding inputs gives ifrtpy outputs whose sharding
    is the NamedSharding over the input's mesh that jax's own output has (mesh, axis
    names, spec), on the first execute and on the repeats the C paths make."""
    js, shape = case
    js = NamedSharding(js.mesh, js.spec)  # device memory: what jax's outputs are in
    fn = PROGRAMS[name]
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    expected = jax.jit(fn, in_shardings=js)(jax.device_put(x, js))
    # The program states the output sharding jax chose (the reference backend reads it
    # from the program; the others from the compiled module)
    lowered = jax.jit(fn, in_shardings=js, out_shardings=expected.sharding).lower(
        jax.ShapeDtypeStruct(shape, np.float32))
    client = {"pjrt": ifrt.get_client, "reference": _reference,
              "jax": lambda: ifrt.get_client("jax")}[backend]()
    sharding = _same_sharding(js, client)
    exe = client.compile(lowered, ifrt.CompileOptions(
        devices=sharding.devices, num_partitions=len(sharding.devices)))
    a = client.make_array_from_host_buffer(x, sharding)
    for _ in range(3):
        out, = exe(a)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
        jax_out = expected.sharding
        if isinstance(jax_out, NamedSharding):
            assert isinstance(out.sharding, ifrt.NamedSharding), out.sharding
            assert out.sharding.mesh == sharding.mesh
            sizes = sharding.mesh.shape
            assert _spec(out.sharding.spec, out.ndim, sizes) == _spec(jax_out.spec, out.ndim, sizes)
        assert _ifrt_domains(out.sharding, out.shape) == _jax_domains(jax_out, out.shape)


def test_outputs_are_named_after_the_mesh_of_the_call():
    """One executable, arguments over two meshes of the same devices (other axis names):
    each call's outputs are named after its own argument's mesh."""
    client = ifrt.get_client()
    devices = np.empty(8, object)
    devices[:] = client.devices()
    rows = ifrt.Mesh(devices.reshape(4, 2), ("rows", "cols"))
    data = ifrt.Mesh(devices.reshape(4, 2), ("data", "model"))
    program = """
    func.func public @main(%x: tensor<8x2xf32> {mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"})
        -> (tensor<8x2xf32> {mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"}) {
      %y = stablehlo.add %x, %x : tensor<8x2xf32>
      return %y : tensor<8x2xf32>
    }"""
    exe = client.compile(ifrt.HloProgram(program),
                         ifrt.CompileOptions(devices=client.devices(), num_partitions=8))
    assert isinstance(exe.output_shardings()[0], ifrt.HloSharding)  # as compiled
    x = np.ones((8, 2), np.float32)
    for mesh, axis in [(rows, "rows"), (data, "data"), (rows, "rows")]:
        a = client.make_array_from_host_buffer(x, ifrt.NamedSharding(mesh, ifrt.PartitionSpec(axis)))
        for _ in range(2):
            out, = exe(a)
            assert out.sharding == ifrt.NamedSharding(mesh, ifrt.PartitionSpec(axis, None))
    plain = client.make_array_from_host_buffer(x, exe.parameter_shardings()[0])
    out, = exe(plain)
    assert isinstance(out.sharding, ifrt.HloSharding)  # no mesh to name it after
