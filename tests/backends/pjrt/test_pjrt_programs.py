"""Programs lowered by jax, compiled and run by the PjRt backend (CPU plugin, 8 devices),
checked against NumPy: SPMD with NamedShardings (Shardy and GSPMD lowerings), shard_map
collectives, hypothesis-driven elementwise and matmul programs over random shapes,
dtypes and shardings; every argument mismatch (which must raise before any input is
consumed), compile errors, placement and donation."""

from __future__ import annotations

import dataclasses
import os
import re
import threading

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.sharding import Mesh as JaxMesh, NamedSharding as JaxNamedSharding, PartitionSpec as P

import ifrtpy as ifrt
from ifrtpy.array import ArraySpec
from ifrtpy.errors import (
    FailedPreconditionError, IfrtError, InternalError, InvalidArgumentError, UnimplementedError,
)
from ifrtpy.program import HloProgram
from ifrtpy.sharding import (
    ConcreteEvenSharding, Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding,
)
from ifrtpy.testing import strategies as ist
from pjrt_helpers import REFUSED_AS_TOO_NEW, shardy_lowering, too_new_for_the_plugin

TIMEOUT_S = 120.0  # a bound on a hang, not a timing assertion
BF16 = np.dtype(ml_dtypes.bfloat16)
JAX_DEVICES = {d.id: d for d in jax.devices()}


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)


# -- helpers ------------------------------------------------------------------------------

def _jax_mesh(mesh: Mesh) -> JaxMesh:
    """The jax mesh with the same devices (by id) in the same places as ``mesh``."""
    grid = np.empty(mesh.devices.shape, dtype=object)
    for index, device in np.ndenumerate(mesh.devices):
        grid[index] = JAX_DEVICES[device.id]
    return JaxMesh(grid, mesh.axis_names)


def _host(array) -> np.ndarray:
    return array.copy_to_host_buffer().result(timeout=TIMEOUT_S)


def _put(client, x, sharding):
    return client.make_array_from_host_buffer(np.asarray(x), sharding)


def _assert_close(actual, expected, dtype):
    dtype = np.dtype(dtype)
    assert actual.dtype == dtype and actual.shape == expected.shape
    if dtype == BF16:
        np.testing.assert_allclose(actual.astype(np.float32), expected.astype(np.float32),
                                   rtol=2e-2, atol=2e-2)
    elif np.issubdtype(dtype, np.floating):
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(actual, expected)


def _assert_intact(array, expected):
    """Not deleted, not failed, still holding ``expected``."""
    assert not array.is_deleted()
    array.ready_future().result(timeout=TIMEOUT_S)
    np.testing.assert_array_equal(_host(array), expected)


_COMPILED: dict = {}


def _compile_jax(client, name, fn, mesh: Mesh, in_specs, out_spec, avals, *, shardy=True,
                 donate=()):
    """``fn`` lowered by jax with NamedShardings on ``mesh`` and compiled on its devices
    (in the mesh's order); cached per (function, shapes, shardings, lowering)."""
    key = (name, tuple(avals), tuple(in_specs), out_spec, mesh.axis_names, mesh.axis_sizes,
           tuple(d.id for d in mesh.device_list), shardy, tuple(donate))
    executable = _COMPILED.get(key)
    if executable is None:
        jmesh = _jax_mesh(mesh)
        in_shardings = tuple(JaxNamedSharding(jmesh, P(*s)) for s in in_specs)
        out_sharding = JaxNamedSharding(jmesh, P(*out_spec))
        with shardy_lowering(shardy), jax.enable_x64(True):
            lowered = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_sharding,
                              donate_argnums=donate).lower(
                *(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in avals))
        executable = client.compile(lowered, ifrt.CompileOptions(
            devices=mesh.device_list, num_partitions=len(mesh.device_list)))
        _COMPILED[key] = executable
    return executable


def _values(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype in (np.float32, np.float64):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-8, 9, shape).astype(dtype)  # exact in bf16 and s32


def _mesh8(client, shape=(4, 2), names=("x", "y")) -> Mesh:
    devices = np.empty(8, dtype=object)
    devices[:] = client.addressable_devices()[:8]
    return Mesh(devices.reshape(shape), names)


def _check_output_sharding(out, mesh, spec, shape):
    expected = NamedSharding(mesh, spec)
    assert list(out.sharding.devices) == list(expected.devices)
    if 0 in tuple(shape):
        return  # XLA makes the output of a zero-size result replicated: nothing to split
    assert list(out.sharding.index_domains(shape)) == list(expected.index_domains(shape))


# -- SPMD on 8 devices --------------------------------------------------------------------

@pytest.mark.parametrize("shardy", [True, False], ids=["shardy", "gspmd"])
def test_spmd_tanh_matmul(client, shardy):
    mesh = _mesh8(client, (8,), ("x",))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    executable = _compile_jax(
        client, "tanh_matmul", lambda x, w: jax.numpy.tanh(x @ w) * 2, mesh,
        [PartitionSpec("x", None), PartitionSpec()], PartitionSpec("x", None),
        [((16, 4), np.float32), ((4, 3), np.float32)], shardy=shardy)
    assert HloProgram(executable.program_text()).uses_shardy == shardy
    args = [_put(client, x, NamedSharding(mesh, PartitionSpec("x", None))),
            _put(client, w, NamedSharding(mesh, PartitionSpec()))]
    result = executable.execute(args, ifrt.ExecuteOptions(fill_status=True))
    result.status.result(timeout=TIMEOUT_S)
    [out] = result.outputs
    _check_output_sharding(out, mesh, PartitionSpec("x", None), (16, 3))
    np.testing.assert_allclose(_host(out), np.tanh(x @ w) * 2, rtol=1e-5, atol=1e-5)
    shards = out.disassemble_into_single_device_arrays(ifrt.ArrayCopySemantics.REUSE_INPUT)
    assert [s.shape for s in shards] == [ifrt.Shape([2, 3])] * 8


@pytest.mark.parametrize("shardy", [True, False], ids=["shardy", "gspmd"])
def test_spmd_2d_mesh_matmul(client, shardy):
    mesh = _mesh8(client)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    specs = [PartitionSpec("x", "y"), PartitionSpec("y", None)]
    out_spec = PartitionSpec("x", "y")
    executable = _compile_jax(client, "matmul", lambda a, b: a @ b, mesh, specs, out_spec,
                              [((8, 6), np.float32), ((6, 4), np.float32)], shardy=shardy)
    params = executable.parameter_shardings()
    for param, spec, shape in zip(params, specs, [(8, 6), (6, 4)]):
        assert list(param.index_domains(shape)) == list(
            NamedSharding(mesh, spec).index_domains(shape))
    [out] = executable(_put(client, x, NamedSharding(mesh, specs[0])),
                       _put(client, w, NamedSharding(mesh, specs[1])))
    _check_output_sharding(out, mesh, out_spec, (8, 4))
    np.testing.assert_allclose(_host(out), x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shardy", [True, False], ids=["shardy", "gspmd"])
def test_shard_map_psum(client, shardy):
    mesh = _mesh8(client, (8,), ("x",))
    jmesh = _jax_mesh(mesh)
    data = np.arange(8 * 3, dtype=np.float32).reshape(8, 3) ** 2

    def psum(x):
        return jax.lax.psum(x, "x")

    f = jax.jit(jax.shard_map(psum, mesh=jmesh, in_specs=P("x", None), out_specs=P(None, None)))
    with shardy_lowering(shardy):
        lowered = f.lower(jax.ShapeDtypeStruct((8, 3), np.float32))
    text = lowered.as_text()
    assert "all_reduce" in text
    options = ifrt.CompileOptions(devices=mesh.device_list, num_partitions=8)
    if too_new_for_the_plugin(text, client):
        with pytest.raises(ifrt.errors.IfrtError, match=REFUSED_AS_TOO_NEW):
            client.compile(lowered, options)
        return
    executable = client.compile(lowered, options)
    arg = _put(client, data, NamedSharding(mesh, PartitionSpec("x", None)))
    [out] = executable(arg)
    assert out.shape == ifrt.Shape([1, 3])
    np.testing.assert_array_equal(_host(out), data.sum(0, keepdims=True))
    for shard in out.disassemble_into_single_device_arrays(ifrt.ArrayCopySemantics.REUSE_INPUT):
        np.testing.assert_array_equal(_host(shard), data.sum(0, keepdims=True))


def test_permuted_mesh_device_order(client):
    """A mesh whose devices are not in id order: shards follow the mesh, not the ids."""
    devices = client.addressable_devices()[:8]
    order = [3, 0, 7, 1, 6, 2, 5, 4]
    grid = np.empty(8, dtype=object)
    grid[:] = [devices[i] for i in order]
    mesh = Mesh(grid.reshape(2, 4), ("x", "y"))
    spec = PartitionSpec("y", "x")
    x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    executable = _compile_jax(client, "x*2+1", lambda a: a * 2 + 1, mesh, [spec], spec,
                              [((8, 6), np.float32)])
    assert [d.id for d in executable.devices()] == order
    [out] = executable(_put(client, x, NamedSharding(mesh, spec)))
    _check_output_sharding(out, mesh, spec, (8, 6))
    np.testing.assert_array_equal(_host(out), x * 2 + 1)


# -- hypothesis: elementwise and matmul over shapes, dtypes and shardings -------------------

ELEMENTWISE = {
    "x*2+1": (1, lambda x: x * 2 + 1, lambda x: x * 2 + 1),
    "add": (2, lambda x, y: x + y, np.add),
    "mul": (2, lambda x, y: x * y, np.multiply),
    "max": (2, jax.numpy.maximum, np.maximum),
}
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), BF16]


def _expected(np_fn, dtype, *args):
    if dtype == BF16:  # compute in f32, round once
        return np_fn(*(a.astype(np.float32) for a in args)).astype(BF16)
    return np.asarray(np_fn(*args)).astype(dtype)


@st.composite
def _mesh_and_devices(draw, client):
    devices = client.addressable_devices()[:8]
    return draw(ist.meshes(devices))


@settings(max_examples=int(os.environ.get("IFRTPY_PROGRAM_EXAMPLES", 15)), deadline=None)
@given(data=st.data(), op=st.sampled_from(sorted(ELEMENTWISE)), dtype=st.sampled_from(DTYPES),
       shape=st.lists(st.sampled_from([0, 1, 2, 3, 4, 8]), min_size=0, max_size=3).map(tuple),
       seed=st.integers(0, 2**16))
def test_elementwise_matches_numpy(client, data, op, dtype, shape, seed):
    arity, jax_fn, np_fn = ELEMENTWISE[op]
    mesh = data.draw(_mesh_and_devices(client))
    in_specs = [data.draw(ist.partition_specs(mesh, len(shape), shape)) for _ in range(arity)]
    out_spec = data.draw(ist.partition_specs(mesh, len(shape), shape))
    executable = _compile_jax(client, op, jax_fn, mesh, in_specs, out_spec,
                              [(shape, dtype)] * arity)
    assert executable.output_dtypes() == [ifrt.DType.from_numpy(dtype)]
    assert executable.output_shapes() == [ifrt.Shape(shape)]
    rng = np.random.default_rng(seed)
    host = [_values(rng, shape, dtype) for _ in range(arity)]
    args = [_put(client, h, NamedSharding(mesh, s)) for h, s in zip(host, in_specs)]
    result = executable.execute(args, ifrt.ExecuteOptions(fill_status=True))
    result.status.result(timeout=TIMEOUT_S)
    [out] = result.outputs
    _check_output_sharding(out, mesh, out_spec, shape)
    _assert_close(_host(out), _expected(np_fn, dtype, *host), dtype)
    for arg, h in zip(args, host):  # nothing donated
        _assert_intact(arg, h)


@settings(max_examples=int(os.environ.get("IFRTPY_PROGRAM_EXAMPLES", 15)), deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES[:3]),
       mkn=st.tuples(*[st.sampled_from([1, 2, 4, 6, 8])] * 3), seed=st.integers(0, 2**16))
def test_matmul_matches_numpy(client, data, dtype, mkn, seed):
    m, k, n = mkn
    mesh = data.draw(_mesh_and_devices(client))
    lhs_spec = data.draw(ist.partition_specs(mesh, 2, (m, k)))
    rhs_spec = data.draw(ist.partition_specs(mesh, 2, (k, n)))
    out_spec = data.draw(ist.partition_specs(mesh, 2, (m, n)))
    executable = _compile_jax(client, "matmul", lambda a, b: a @ b, mesh, [lhs_spec, rhs_spec],
                              out_spec, [((m, k), dtype), ((k, n), dtype)])
    rng = np.random.default_rng(seed)
    a, b = _values(rng, (m, k), dtype), _values(rng, (k, n), dtype)
    [out] = executable(_put(client, a, NamedSharding(mesh, lhs_spec)),
                       _put(client, b, NamedSharding(mesh, rhs_spec)))
    _check_output_sharding(out, mesh, out_spec, (m, n))
    _assert_close(_host(out), (a @ b).astype(dtype), dtype)


# -- argument mismatches: raise, and consume nothing ----------------------------------------

X = np.arange(8, dtype=np.float32)
Y = np.arange(8, dtype=np.float32) * 10


@pytest.fixture(scope="module")
def donating(client):
    """``x * 2 + y`` on f32[8], device 0, donating x."""
    lowered = jax.jit(lambda x, y: x * 2 + y, donate_argnums=0).lower(X, Y)
    executable = client.compile(lowered, ifrt.CompileOptions(
        devices=[client.addressable_devices()[0]]))
    assert executable.donatable_input_indices() == frozenset({0})
    return executable


@pytest.fixture(scope="module")
def donating8(client):
    """``x * 2 + y`` on f32[8] split over 8 devices (both P("x")), donating x."""
    mesh = _mesh8(client, (8,), ("x",))
    spec = PartitionSpec("x")
    return mesh, _compile_jax(client, "x*2+y", lambda x, y: x * 2 + y, mesh, [spec, spec],
                              spec, [((8,), np.float32)] * 2, donate=(0,))


def _x(client, device_index=0):
    return _put(client, X, SingleDeviceSharding(client.addressable_devices()[device_index]))


def _run_fails(executable, args, error=InvalidArgumentError, match=None, **kwargs):
    with pytest.raises(error, match=match):
        executable.execute(args, **kwargs)


def test_donating_program_runs_and_donates(client, donating):
    x, y = _x(client), _put(client, Y, SingleDeviceSharding(client.addressable_devices()[0]))
    [out] = donating(x, y)
    np.testing.assert_array_equal(_host(out), X * 2 + Y)
    assert x.is_deleted()
    assert x.ready_future().exception(timeout=TIMEOUT_S) is not None
    _assert_intact(y, Y)


@pytest.mark.parametrize("count", [0, 1, 3])
def test_wrong_argument_count(client, donating, count):
    d0 = SingleDeviceSharding(client.addressable_devices()[0])
    args = [_put(client, X, d0) for _ in range(count)]
    _run_fails(donating, args, match="takes 2 arguments")
    for arg in args:
        _assert_intact(arg, X)


@pytest.mark.parametrize("which", [0, 1])
def test_wrong_dtype(client, donating, which):
    """s32[8] has f32[8]'s byte size: the plugin alone would run it."""
    d0 = SingleDeviceSharding(client.addressable_devices()[0])
    good = _put(client, X, d0)
    bad = _put(client, X.astype(np.int32), d0)
    args = [bad, good] if which == 0 else [good, bad]
    _run_fails(donating, args, match="s32")
    _assert_intact(good, X)
    _assert_intact(bad, X.astype(np.int32))


@pytest.mark.parametrize("shape", [(4,), (2, 4), (9,), ()], ids=str)
def test_wrong_shape(client, donating, shape):
    d0 = SingleDeviceSharding(client.addressable_devices()[0])
    good = _put(client, X, d0)
    data = np.ones(shape, np.float32)
    bad = _put(client, data, d0)
    _run_fails(donating, [good, bad])
    _assert_intact(good, X)
    _assert_intact(bad, data)


def test_argument_on_wrong_device(client, donating):
    good, bad = _x(client, 0), _x(client, 1)
    _run_fails(donating, [good, bad], match="is on")
    _assert_intact(good, X)
    _assert_intact(bad, X)


def test_argument_on_more_devices(client, donating):
    good = _x(client, 0)
    devices = client.addressable_devices()[:2]
    bad = _put(client, X, ConcreteEvenSharding(devices, ifrt.Shape([8]), ifrt.Shape([8]), True))
    _run_fails(donating, [good, bad])
    _assert_intact(good, X)
    _assert_intact(bad, X)


def test_argument_of_another_client(client, donating):
    other = ifrt.get_client("pjrt", device_count=8)
    assert other is not client
    good = _x(client)
    bad = _put(other, Y, SingleDeviceSharding(other.addressable_devices()[0]))
    _run_fails(donating, [good, bad], match="not an array of this client")
    _assert_intact(good, X)
    _assert_intact(bad, Y)


def test_argument_not_an_array(client, donating):
    good = _x(client)
    _run_fails(donating, [good, Y])
    _assert_intact(good, X)


@pytest.mark.parametrize("kind", ["replicated", "other_split", "permuted", "subset"])
def test_argument_with_other_sharding(client, donating8, kind):
    mesh, executable = donating8
    devices = client.addressable_devices()[:8]
    if kind == "replicated":  # same devices, every device holding everything
        sharding = NamedSharding(mesh, PartitionSpec())
    elif kind == "other_split":  # same devices, 2 pieces each replicated 4 times
        sharding = NamedSharding(Mesh(np.array(devices, dtype=object).reshape(2, 4), ("a", "b")),
                                 PartitionSpec("a"))
    elif kind == "permuted":  # same split, devices in another order
        grid = np.empty(8, dtype=object)
        grid[:] = devices[::-1]
        sharding = NamedSharding(Mesh(grid, ("x",)), PartitionSpec("x"))
    else:  # split over 4 of the 8 devices
        grid = np.empty(4, dtype=object)
        grid[:] = devices[:4]
        sharding = NamedSharding(Mesh(grid, ("x",)), PartitionSpec("x"))
    good = _put(client, X, NamedSharding(mesh, PartitionSpec("x")))
    bad = _put(client, Y, sharding)
    _run_fails(executable, [good, bad])
    _assert_intact(good, X)
    _assert_intact(bad, Y)
    # and the right sharding still works afterwards (nothing cached wrongly)
    right = _put(client, Y, NamedSharding(mesh, PartitionSpec("x")))
    [out] = executable(good, right)
    np.testing.assert_array_equal(_host(out), X * 2 + Y)
    assert good.is_deleted()


def test_sharding_check_is_per_parameter(client):
    """A sharding accepted for one parameter is not thereby accepted for another."""
    mesh = _mesh8(client, (8,), ("x",))
    spec = PartitionSpec("x")
    replicated = NamedSharding(mesh, PartitionSpec())
    executable = _compile_jax(client, "x+y mixed", lambda x, y: x + y, mesh,
                              [spec, PartitionSpec()], spec, [((8,), np.float32)] * 2)
    [out] = executable(_put(client, X, NamedSharding(mesh, spec)), _put(client, Y, replicated))
    np.testing.assert_array_equal(_host(out), X + Y)
    a, b = _put(client, X, replicated), _put(client, Y, replicated)
    _run_fails(executable, [a, b])
    _assert_intact(a, X)
    _assert_intact(b, Y)


def test_deleted_argument(client, donating):
    good, bad = _x(client), _x(client)
    bad.delete().result(timeout=TIMEOUT_S)
    _run_fails(donating, [good, bad], match="deleted")
    _assert_intact(good, X)


def test_donated_argument_reused(client, donating):
    x, y = _x(client), _put(client, Y, SingleDeviceSharding(client.addressable_devices()[0]))
    donating(x, y)
    assert x.is_deleted()
    y2 = _put(client, Y, SingleDeviceSharding(client.addressable_devices()[0]))
    _run_fails(donating, [x, y2], match="deleted")
    _assert_intact(y2, Y)


def test_same_array_donated_and_read_in_one_call(client, donating):
    x = _x(client)
    with pytest.raises(IfrtError, match="donated"):
        donating.execute([x, x])
    _assert_intact(x, X)


def test_error_array_argument(client, donating):
    good = _x(client)
    spec = ArraySpec(ifrt.DType.from_numpy(np.float32), ifrt.Shape([8]),
                     SingleDeviceSharding(client.addressable_devices()[0]))
    [bad] = client.make_error_arrays(RuntimeError("upstream failure"), [spec])
    _run_fails(donating, [good, bad], match="upstream failure")
    _assert_intact(good, X)


@pytest.mark.parametrize("kind", ["donated", "deleted", "error", "dtype", "shape", "count"])
@pytest.mark.parametrize("position", [0, 1])
def test_mismatch_after_an_accepted_call(client, donating, kind, position):
    """The same sharding object as an accepted call (the executable's fast path for
    repeated calls) must not let a bad argument through, nor consume the good one."""
    sharding = SingleDeviceSharding(client.addressable_devices()[0])
    [out] = donating(_put(client, X, sharding), _put(client, Y, sharding))  # accepted
    np.testing.assert_array_equal(_host(out), X * 2 + Y)
    good = _put(client, Y, sharding)
    if kind == "donated":
        bad = _put(client, X, sharding)
        donating(bad, _put(client, Y, sharding))
        assert bad.is_deleted()
    elif kind == "deleted":
        bad = _put(client, X, sharding)
        bad.delete()
    elif kind == "error":
        spec = ArraySpec(ifrt.DType.from_numpy(np.float32), ifrt.Shape([8]), sharding)
        [bad] = client.make_error_arrays(RuntimeError("upstream failure"), [spec])
    elif kind == "dtype":
        bad = _put(client, X.astype(np.int32), sharding)
    elif kind == "shape":
        bad = _put(client, X[:4], sharding)
    else:
        bad = None
    args = [good, good] if bad is None else ([bad, good] if position == 0 else [good, bad])
    if bad is None:
        args = args[:1] if position == 0 else args + [good]
    with pytest.raises(IfrtError) as info:
        donating.execute(args)
    assert isinstance(info.value, InvalidArgumentError), repr(info.value)
    _assert_intact(good, Y)
    if kind in ("dtype", "shape"):
        assert not bad.is_deleted()


def test_deleted_executable(client):
    lowered = jax.jit(lambda x: x * 2, donate_argnums=0).lower(X)
    executable = client.compile(lowered, ifrt.CompileOptions(
        devices=[client.addressable_devices()[0]]))
    x = _x(client)
    executable.delete().result(timeout=TIMEOUT_S)
    assert executable.is_deleted()
    _run_fails(executable, [x], error=FailedPreconditionError)
    with pytest.raises(FailedPreconditionError):
        executable(x)
    _assert_intact(x, X)


@pytest.fixture(scope="module")
def portable(client):
    lowered = jax.jit(lambda x: x * 2 + 1, donate_argnums=0).lower(X)
    return client.compile(lowered, ifrt.CompileOptions(compile_portable_executable=True))


def test_portable_without_devices(client, portable):
    assert portable.devices() is None
    x = _x(client, 2)
    _run_fails(portable, [x], match="portable")
    _run_fails(portable, [x], devices=client.make_device_list(client.addressable_devices()[:2]),
               match="portable")
    _assert_intact(x, X)


@pytest.mark.parametrize("index", [0, 5])
def test_portable_on_a_device(client, portable, index):
    device = client.addressable_devices()[index]
    x = _x(client, index)
    [out] = portable.execute([x], devices=client.make_device_list([device])).outputs
    assert list(out.sharding.devices) == [device]
    np.testing.assert_array_equal(_host(out), X * 2 + 1)
    assert x.is_deleted()  # donated


def test_portable_argument_not_on_the_execute_device(client, portable):
    x = _x(client, 1)
    _run_fails(portable, [x],
               devices=client.make_device_list([client.addressable_devices()[2]]))
    _assert_intact(x, X)


def test_non_portable_with_other_devices(client, donating):
    x, y = _x(client), _x(client)
    _run_fails(donating, [x, y], devices=client.make_device_list([client.addressable_devices()[1]]))
    _assert_intact(x, X)
    _assert_intact(y, X)


# -- compile errors -----------------------------------------------------------------------

def test_invalid_stablehlo_text(client):
    with pytest.raises(InvalidArgumentError):
        HloProgram("module { func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { return } }")
    with pytest.raises(InvalidArgumentError):
        client.compile("this is not StableHLO", ifrt.CompileOptions())


def test_unknown_custom_call_is_rejected_by_the_plugin(client):
    text = """module @cc {
      func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
        %0 = stablehlo.custom_call @ifrtpy_no_such_target(%a) : (tensor<4xf32>) -> tensor<4xf32>
        return %0 : tensor<4xf32>
      }
    }"""
    HloProgram(text)  # valid StableHLO
    with pytest.raises(IfrtError, match="ifrtpy_no_such_target"):
        client.compile(text, ifrt.CompileOptions(devices=[client.addressable_devices()[0]]))


@pytest.mark.parametrize("op", ["infeed", "outfeed"])
def test_a_program_waiting_on_the_host_is_refused(client, op):
    """An infeed or outfeed waits for the host forever (PJRT's C API has no feed): the
    program is refused at compile, before any run could hang."""
    feed = ('%i:2 = "stablehlo.infeed"(%t) {infeed_config = ""} : (!stablehlo.token) -> '
            '(tensor<4xf32>, !stablehlo.token)' if op == "infeed" else
            '%o = "stablehlo.outfeed"(%a, %t) {outfeed_config = ""} : (tensor<4xf32>, '
            '!stablehlo.token) -> !stablehlo.token')
    text = f"""module @fed {{
      func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {{
        %t = stablehlo.after_all : !stablehlo.token
        {feed}
        return %a : tensor<4xf32>
      }}
    }}"""
    with pytest.raises(UnimplementedError, match=f"stablehlo.{op}"):
        client.compile(text, ifrt.CompileOptions(devices=[client.addressable_devices()[0]]))


def test_sharding_for_more_devices_than_partitions_is_rejected(client):
    mesh = _mesh8(client, (8,), ("x",))
    lowered = jax.jit(lambda x: x * 2, in_shardings=JaxNamedSharding(_jax_mesh(mesh), P("x"))
                      ).lower(X)
    with pytest.raises(IfrtError, match="tile_assignment|devices"):
        client.compile(lowered, ifrt.CompileOptions(devices=client.addressable_devices()[:2],
                                                    num_partitions=2))


def test_a_misread_compiled_sharding_refuses_the_program(client, monkeypatch):
    """Were a compiled sharding read wrongly (here: every one read as replicated, as a
    jaxlib form ifrtpy did not know once was), buffers of the wrong size would reach the
    plugin, which does not check them: the compile is refused, naming both shapes."""
    import ifrtpy.sharding.hlo as hlo

    replicated = hlo._xla_client().HloSharding.replicate()
    monkeypatch.setattr(hlo._jaxlib, "tile_form", lambda sharding: replicated)
    mesh = _mesh8(client, (8,), ("x",))
    lowered = jax.jit(lambda x: x * 2, in_shardings=JaxNamedSharding(_jax_mesh(mesh), P("x"))
                      ).lower(X)
    with pytest.raises(InternalError, match=r"parameter 0 .*shards of shape \[8\], but the "
                                            r"compiled program's are \[1\]"):
        client.compile(lowered, ifrt.CompileOptions(devices=mesh.device_list, num_partitions=8))


def test_shardy_sharding_only_on_results_compiles(client):
    """A Shardy program whose only sharding (inline mesh, no sdy.mesh op) is on its
    result must be compiled with the Shardy partitioner: with it off, XLA fails with
    INTERNAL "custom call named 'xla.sdy.*' ... Shardy was then disabled"."""
    text = """module @r {
      func.func @main(%a: tensor<8xf32>)
          -> (tensor<8xf32> {sdy.sharding = #sdy.sharding<mesh<["x"=8]>, [{"x"}]>}) {
        %0 = stablehlo.add %a, %a : tensor<8xf32>
        return %0 : tensor<8xf32>
      }
    }"""
    devices = client.addressable_devices()[:8]
    executable = client.compile(text, ifrt.CompileOptions(devices=devices, num_partitions=8))
    [out_sharding] = executable.output_shardings()
    assert list(out_sharding.index_domains(ifrt.Shape([8]))) == list(
        NamedSharding(_mesh8(client, (8,), ("x",)), PartitionSpec("x")).index_domains(
            ifrt.Shape([8])))
    [param] = executable.parameter_shardings()  # whatever propagation chose
    [out] = executable(_put(client, X, param))
    np.testing.assert_array_equal(_host(out), X * 2)


def test_a_mesh_with_device_ids_partitions_as_its_sharding_says(client):
    """The identity of an array whose mesh numbers its devices in another order
    (``device_ids``, as jax writes a reordering of shards), gathered along ``y``. With
    jaxlib 0.12's default debug options (``xla_enable_hlo_sharding_v3``) sent to it, the
    plugin read the mesh as ``device_ids``-free: each row came back wrong."""
    text = """module @reorder attributes {mhlo.num_partitions = 4 : i32} {
      sdy.mesh @mesh = <["x"=2, "y"=2], device_ids=[3, 2, 1, 0]>
      sdy.mesh @mesh_0 = <["x"=2, "y"=2]>
      func.func public @main(%a: tensor<8x2xi32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {"y"}]>})
          -> (tensor<8x2xi32> {sdy.sharding = #sdy.sharding<@mesh_0, [{"x"}, {}]>}) {
        return %a : tensor<8x2xi32>
      }
    }"""
    devices = client.addressable_devices()[:4][::-1]
    executable = client.compile(text, ifrt.CompileOptions(devices=devices, num_partitions=4))
    x = np.arange(16, dtype=np.int32).reshape(8, 2)
    [param] = executable.parameter_shardings()
    [out] = executable(_put(client, x, param))
    np.testing.assert_array_equal(_host(out), x)
    for shard in out.disassemble_into_single_device_arrays():  # devices 3, 2 hold rows 0-3
        np.testing.assert_array_equal(_host(shard), x[:4] if shard.sharding.devices[0].id in (
            devices[0].id, devices[1].id) else x[4:])


@pytest.mark.parametrize("kwargs", [
    {"num_replicas": 0}, {"num_partitions": 0}, {"num_replicas": -1},
    {"num_partitions": 2, "devices": "one"}, {"compile_portable_executable": True,
                                                "num_partitions": 2},
], ids=str)
def test_bad_compile_options(client, kwargs):
    if kwargs.get("devices") == "one":
        kwargs = dict(kwargs, devices=[client.addressable_devices()[0]])
    with pytest.raises(InvalidArgumentError):
        ifrt.CompileOptions(**kwargs)


def test_the_options_sent_to_the_plugin_keep_the_pjrt_layers_contract(client, monkeypatch):
    # ifrtpy._pjrt.compile does not parse compile options (it refuses empty ones only):
    # the caller sends a CompileOptionsProto with at least one replica and one partition
    # (the CPU plugin aborts the process on 0). The backend builds it from a CompileOptions,
    # which refuses fewer when it is made, however it is made; nothing reaches the plugin.
    from jaxlib import xla_client

    from ifrtpy import _pjrt
    sent = []
    real = _pjrt.compile

    def spy(handle, code, options):
        sent.append(options)
        return real(handle, code, options)

    monkeypatch.setattr(_pjrt, "compile", spy)
    base = ifrt.CompileOptions()
    for name in ("num_replicas", "num_partitions"):
        with pytest.raises(InvalidArgumentError, match=f"{name} must be >= 1, got 0"):
            dataclasses.replace(base, **{name: 0})
    assert not sent
    program = "func.func public @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }"
    for options in [None, ifrt.CompileOptions(num_partitions=2), ifrt.CompileOptions(num_replicas=2),
                    ifrt.CompileOptions(compile_portable_executable=True)]:
        client.compile(program, options)
    assert len(sent) == 4
    for options in sent:
        build = xla_client.CompileOptions.ParseFromString(options).executable_build_options
        assert options and build.num_replicas >= 1 and build.num_partitions >= 1


def test_more_devices_than_the_client_has(client):
    lowered = jax.jit(lambda x: x + 1).lower(X)
    with pytest.raises(InvalidArgumentError):
        client.compile(lowered, ifrt.CompileOptions(num_partitions=16))


# -- placement and donation ---------------------------------------------------------------

@pytest.mark.parametrize("index", [0, 3])
def test_execute_on_one_device(client, index):
    device = client.addressable_devices()[index]
    lowered = jax.jit(lambda x, y: (x * y + 1, x - y)).lower(X, Y)
    executable = client.compile(lowered, ifrt.CompileOptions(devices=[device]))
    assert list(executable.devices()) == [device]
    assert [d.id for d in executable.addressable_devices()] == [device.id]
    x, y = _put(client, X, SingleDeviceSharding(device)), _put(client, Y, SingleDeviceSharding(device))
    prod, diff = executable(x, y)
    for out in (prod, diff):
        assert list(out.sharding.devices) == [device]
    np.testing.assert_array_equal(_host(prod), X * Y + 1)
    np.testing.assert_array_equal(_host(diff), X - Y)
    _assert_intact(x, X)
    _assert_intact(y, Y)


def test_replicated_executable_outputs_are_readable(client):
    """num_replicas=2 without SPMD: each replica runs on its own full-shape input. As in
    IFRT's PjRt executable (no HLO sharding: ``ConcreteEvenSharding(devices, shape,
    shard_shape=shape)``), each output holds one full-shape shard per replica, which can
    be disassembled and read."""
    devices = client.addressable_devices()[:2]
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    executable = client.compile(jax.jit(lambda x: x + 1).lower(data),
                                ifrt.CompileOptions(devices=devices, num_replicas=2))
    shape = ifrt.Shape([2, 3])
    shards = [_put(client, data * (i + 1), SingleDeviceSharding(d)) for i, d in enumerate(devices)]
    arg = client.assemble_array_from_single_device_arrays(
        shape, ConcreteEvenSharding(devices, shape, shape), shards)
    [out] = executable(arg)
    assert out.shape == shape
    pieces = out.disassemble_into_single_device_arrays(ifrt.ArrayCopySemantics.REUSE_INPUT)
    assert [list(p.sharding.devices) for p in pieces] == [[d] for d in devices]
    for i, piece in enumerate(pieces):
        np.testing.assert_array_equal(_host(piece), data * (i + 1) + 1)


def test_default_devices_are_the_first_addressable(client):
    executable = client.compile(jax.jit(lambda x: x + 1).lower(X))
    assert list(executable.devices()) == [client.addressable_devices()[0]]


def test_donation_through_jax_jit(client):
    lowered = jax.jit(lambda x: x + 1, donate_argnums=0).lower(X)
    assert "tf.aliasing_output" in lowered.as_text()
    executable = client.compile(lowered, ifrt.CompileOptions(
        devices=[client.addressable_devices()[0]]))
    assert executable.donatable_input_indices() == frozenset({0})
    x = _x(client)
    early = x.copy_to_host_buffer()  # enqueued before the donation
    result = executable.execute([x], ifrt.ExecuteOptions(fill_status=True))
    assert x.is_deleted()
    assert x.ready_future().exception(timeout=TIMEOUT_S) is not None
    np.testing.assert_array_equal(early.result(timeout=TIMEOUT_S), X)
    result.status.result(timeout=TIMEOUT_S)
    np.testing.assert_array_equal(_host(result.outputs[0]), X + 1)
    # opting out keeps the input
    kept = _x(client)
    result = executable.execute(
        [kept], ifrt.ExecuteOptions(non_donatable_input_indices=frozenset({0})))
    np.testing.assert_array_equal(_host(result.outputs[0]), X + 1)
    _assert_intact(kept, X)


def test_donation_on_8_devices(client, donating8):
    mesh, executable = donating8
    spec = NamedSharding(mesh, PartitionSpec("x"))
    x, y = _put(client, X, spec), _put(client, Y, spec)
    [out] = executable(x, y)
    assert x.is_deleted() and not y.is_deleted()
    np.testing.assert_array_equal(_host(out), X * 2 + Y)
    _assert_intact(y, Y)


def test_outputs_feed_the_next_execution(client):
    lowered = jax.jit(lambda x: x * 2 + 1).lower(X)
    executable = client.compile(lowered, ifrt.CompileOptions(
        devices=[client.addressable_devices()[0]]))
    value, expected = _x(client), X
    for _ in range(5):
        [value] = executable(value)
        expected = expected * 2 + 1
    np.testing.assert_array_equal(_host(value), expected)


def test_serialized_spmd_executable_runs(client):
    mesh = _mesh8(client)
    specs = [PartitionSpec("x", "y"), PartitionSpec("y", None)]
    executable = _compile_jax(client, "matmul", lambda a, b: a @ b, mesh, specs,
                              PartitionSpec("x", "y"), [((8, 6), np.float32), ((6, 4), np.float32)])
    again = client.deserialize_executable(executable.serialize())
    assert list(again.devices()) == list(executable.devices())
    rng = np.random.default_rng(3)
    a = rng.standard_normal((8, 6)).astype(np.float32)
    b = rng.standard_normal((6, 4)).astype(np.float32)
    [out] = again(_put(client, a, NamedSharding(mesh, specs[0])),
                  _put(client, b, NamedSharding(mesh, specs[1])))
    np.testing.assert_allclose(_host(out), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["device3", "two_devices"])
def test_deserialize_onto_other_devices_is_consistent(client, target):
    """Loading a serialized executable with ``options.devices`` other than those it was
    compiled for must either refuse (InvalidArgumentError) or really run there: it may
    not report devices() it does not run on."""
    devices = client.addressable_devices()
    executable = client.compile(jax.jit(lambda x: x + 1).lower(X),
                                ifrt.CompileOptions(devices=[devices[0]]))
    options = (ifrt.CompileOptions(devices=[devices[3]]) if target == "device3" else
               ifrt.CompileOptions(devices=devices[:2], num_partitions=2))
    try:
        loaded = client.deserialize_executable(executable.serialize(), options)
    except InvalidArgumentError:
        return  # refusing is fine
    assert [d.id for d in loaded.addressable_devices()] == [d.id for d in loaded.devices()]
    assert list(loaded.devices()) == list(options.devices)
    if target == "device3":
        [out] = loaded(_put(client, X, SingleDeviceSharding(devices[3])))
        assert list(out.sharding.devices) == [devices[3]]
        np.testing.assert_array_equal(_host(out), X + 1)


def test_concurrent_executes(client):
    """execute is thread-safe: threads sharing one executable (and the repeated-call fast
    path) each get their own right results."""
    mesh = _mesh8(client, (8,), ("x",))
    spec = PartitionSpec("x")
    executable = _compile_jax(client, "x*2+y", lambda x, y: x * 2 + y, mesh, [spec, spec],
                              spec, [((8,), np.float32)] * 2)
    sharding = NamedSharding(mesh, spec)
    errors = []

    def work(k):
        try:
            y = _put(client, Y, sharding)
            for i in range(20):
                x = _put(client, X + 100 * k + i, sharding)
                [out] = executable(x, y)
                np.testing.assert_array_equal(_host(out), (X + 100 * k + i) * 2 + Y)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


ADD_ONE = """
func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %0 = stablehlo.add %x, %one : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def test_a_program_the_plugin_cannot_parse_names_both_stablehlo_versions(client, monkeypatch):
    program = HloProgram(ADD_ONE)
    monkeypatch.setattr(HloProgram, "serialize_for", lambda self, target: (b"ML\xefRnot bytecode", "bytecode 1.13.3"))
    with pytest.raises(IfrtError) as e:
        client.compile(program)
    message = str(e.value)
    producer = ".".join(map(str, ifrt.program.stablehlo_version()))
    consumer = ".".join(map(str, client.plugin.attributes["stablehlo_current_version"]))
    assert f"jaxlib writes StableHLO {producer}" in message
    assert f"this plugin reads StableHLO up to {consumer}" in message
    assert "sent as bytecode 1.13.3" in message


def test_debug_options_reach_the_compiler(client, tmp_path):
    options = ifrt.CompileOptions(debug_options={"xla_dump_to": str(tmp_path)})
    exe = client.compile(ADD_ONE, options)
    np.testing.assert_array_equal(
        np.asarray(exe(ifrt.device_put(np.arange(4, dtype=np.float32), client.devices()[0]))[0]),
        np.arange(4, dtype=np.float32) + 1)
    assert any(tmp_path.iterdir()), "xla_dump_to wrote no dump"


def test_unknown_debug_option_is_refused(client):
    with pytest.raises(InvalidArgumentError, match="xla_no_such_option"):
        client.compile(ADD_ONE, ifrt.CompileOptions(debug_options={"xla_no_such_option": 1}))


def test_a_program_for_more_devices_than_the_compile_says_how_to_compile_it(client):
    """XLA's verifier says 'tile_assignment should have 4 devices but has 8'; the error
    says which count the program needs and the options that give it."""
    from ifrtpy.cli.demo import DEMO_PROGRAM  # rows split over n devices

    program = ifrt.HloProgram(DEMO_PROGRAM.format(rows=16, n=8))
    four = client.make_device_list(client.devices()[:4])
    with pytest.raises(InvalidArgumentError, match=re.escape(
            "the program's shardings are for 8 devices, the compile for 4 (num_replicas * "
            "num_partitions): compile it with CompileOptions(devices=<8 devices>, "
            "num_partitions=8), or lower it for 4 devices")):
        client.compile(program, ifrt.CompileOptions(devices=four, num_partitions=4))
    eight = client.make_device_list(client.devices()[:8])
    client.compile(program, ifrt.CompileOptions(devices=eight, num_partitions=8))  # as it says
