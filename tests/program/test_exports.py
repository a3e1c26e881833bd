"""``jax.export`` programs load from the Exported object and from its serialized bytes:
sharded ones (Shardy meshes and shardings, ``shard_map``, sharding constraints) and ones
with custom calls, which jaxlib serializes with attributes only the full dialect set
reads back. Each runs SPMD on 8 devices of the PjRt backend and equals jax."""

from __future__ import annotations

import numpy as np
import pytest

import ifrtpy as ifrt

jax = pytest.importorskip("jax")
jnp = jax.numpy
P = jax.sharding.PartitionSpec


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))


def _sharded(mesh):
    s = jax.sharding.NamedSharding(mesh, P("x"))
    return jax.jit(lambda x: jnp.sin(x) * 2, in_shardings=s, out_shardings=s), s


def _shard_map(mesh):
    s = jax.sharding.NamedSharding(mesh, P("x"))
    body = jax.shard_map(lambda x: x - jax.lax.psum(x, "x") / 8, mesh=mesh,
                         in_specs=P("x"), out_specs=P("x"))
    return jax.jit(body, in_shardings=s), s


def _constraint(mesh):
    s = jax.sharding.NamedSharding(mesh, P("x"))

    def f(x):
        y = jax.lax.with_sharding_constraint(jnp.cos(x), s)
        return y * y

    return jax.jit(f), s


@pytest.mark.parametrize("make", [_sharded, _shard_map, _constraint])
@pytest.mark.parametrize("form", ["object", "bytes"])
def test_sharded_export_runs(client, mesh, make, form):
    f, s = make(mesh)
    x = jax.device_put(jnp.arange(16, dtype=jnp.float32) / 3, s)
    exported = jax.export.export(f)(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s))
    program = ifrt.HloProgram(exported if form == "object" else exported.serialize())
    assert program.uses_shardy
    devices = ifrt.DeviceList(client.devices())
    exe = client.compile(program, ifrt.CompileOptions(devices=devices, num_partitions=8))
    (sharding,) = exe.parameter_shardings()
    (out,) = exe(ifrt.device_put(np.asarray(x), sharding))
    np.testing.assert_allclose(np.asarray(out), np.asarray(f(x)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("form", ["object", "bytes"])
def test_custom_call_export_loads(form):
    exported = jax.export.export(jax.jit(jnp.linalg.inv))(jax.ShapeDtypeStruct((3, 3), jnp.float32))
    program = ifrt.HloProgram(exported if form == "object" else exported.serialize())
    assert "stablehlo.custom_call @lapack_sgetrf_ffi" in program.text
    assert [str(p) for p in program.parameters] == ["f32[3, 3]"]


def test_many_serialized_programs_are_read_by_one_reader():
    from ifrtpy.program import inputs

    exports = [jax.export.export(jax.jit(lambda x, k=k: x * k + 0.25))(jax.ShapeDtypeStruct((3,), jnp.float32))
               for k in range(4)]
    texts = inputs.stablehlo_texts([e.serialize() for e in exports] + [e for e in exports])
    reader = inputs._reader_pid()
    assert reader is not None
    assert texts[:4] == texts[4:] == [inputs.stablehlo_text(e) for e in exports]
    assert inputs._reader_pid() == reader
    garbage = b"\x00\x01 not a program" * 10
    with pytest.raises(ifrt.errors.InvalidArgumentError, match="not a valid program"):
        inputs.stablehlo_texts([garbage, exports[0].serialize(), b"ML\xefR" + garbage])
    assert inputs._reader_pid() is None  # a reader that refused an input is not reused
