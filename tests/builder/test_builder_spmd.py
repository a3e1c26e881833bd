"""Sharded programs built with the builder run SPMD on 8 devices and equal NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.builder import Builder, hlo_sharding_string
from ifrtpy.errors import InvalidArgumentError

P = ifrt.PartitionSpec


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)


def _run(client, program, devices, *args):
    exe = client.compile(program, ifrt.CompileOptions(devices=devices, num_partitions=len(devices)))
    return exe, exe(*args)


def _domains(sharding, shape):
    return sorted((tuple(d.origin), tuple(d.shape)) for d in sharding.index_domains(shape))


CASES = [
    ((8,), ("x",), P("x", None), P()),
    ((4, 2), ("x", "y"), P("x", None), P(None, "y")),
    ((4, 2), ("x", "y"), P("x", "y"), P("y", None)),
    ((2, 4), ("x", "y"), P(("x", "y")), P()),
    ((2, 4), ("x", "y"), P(None, "x"), P("x", "y")),
]


@pytest.mark.parametrize("mesh_shape, names, a_spec, w_spec", CASES)
def test_mlp_layer_runs_spmd(client, mesh_shape, names, a_spec, w_spec):
    mesh = ifrt.Mesh(np.array(client.devices()).reshape(mesh_shape), names)
    a_sh, w_sh = ifrt.NamedSharding(mesh, a_spec), ifrt.NamedSharding(mesh, w_spec)
    out_sh = ifrt.NamedSharding(mesh, P(names[0], None))
    rng = np.random.default_rng(len(names) + mesh_shape[0])
    a = rng.standard_normal((8, 8)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)

    b = Builder("layer", devices=mesh.device_list)
    pa = b.parameter(a.shape, np.float32, sharding=a_sh, name="a")
    pw = b.parameter(w.shape, np.float32, sharding=w_sh, name="w")
    h = b.tanh(b.dot(pa, pw, precision="HIGHEST"))
    total = b.reduce(h, None, [0, 1], "sum")
    program = b.build(h, total, shardings=[out_sh, None])
    assert "mhlo.sharding" in program.text

    exe, (out, out_total) = _run(client, program, mesh.device_list,
                                 ifrt.device_put(a, a_sh), ifrt.device_put(w, w_sh))
    want = np.tanh(a.astype(np.float64) @ w.astype(np.float64))
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out_total), want.sum(), rtol=1e-4, atol=1e-4)
    assert _domains(out.sharding, (8, 8)) == _domains(out_sh, (8, 8))
    assert len(out.disassemble_into_single_device_arrays()) == 8


def test_hlo_sharding_strings_and_constraints(client):
    devices = client.devices()
    rows = "{devices=[8,1]<=[8]}"
    cols = "{devices=[1,8]<=[8]}"
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    b = Builder()
    p = b.parameter((8, 8), np.float32, sharding=rows)
    y = b.with_sharding(p * 2, cols)
    program = b.build(y + 1, shardings=["{replicated}"])
    dl = client.make_device_list(devices) if hasattr(client, "make_device_list") else ifrt.DeviceList(devices)
    mesh = ifrt.Mesh(np.array(devices), ("x",))
    exe, (out,) = _run(client, program, dl, ifrt.device_put(x, ifrt.NamedSharding(mesh, P("x"))))
    np.testing.assert_array_equal(np.asarray(out), x * 2 + 1)
    assert out.sharding.is_fully_replicated


def test_builder_devices_map_shardings_to_logical_ids(client):
    """A mesh over devices in another order than the program's: tile assignments name
    positions in the program's device list."""
    devices = list(client.devices())
    mesh = ifrt.Mesh(np.array(devices[::-1]).reshape(4, 2), ("x", "y"))
    sh = ifrt.NamedSharding(mesh, P("x", "y"))
    text = hlo_sharding_string(sh, 2, devices)
    assert text == "{devices=[4,2]7,6,5,4,3,2,1,0}"
    assert hlo_sharding_string(sh, 2) == "{devices=[4,2]<=[8]}"
    x = np.arange(32, dtype=np.int32).reshape(8, 4)
    b = Builder(devices=devices)
    p = b.parameter(x.shape, np.int32, sharding=sh)
    program = b.build(b.reverse(p, [0]) - 3, shardings=[sh])
    # the same placement over the program's device order (what the backend takes)
    same = ifrt.HloSharding(devices, text)
    exe, (out,) = _run(client, program, ifrt.DeviceList(devices), ifrt.device_put(x, same))
    np.testing.assert_array_equal(np.asarray(out), x[::-1] - 3)

    def by_device(sharding):
        return {d.id: (tuple(dom.origin), tuple(dom.shape))
                for d, dom in zip(sharding.devices, sharding.index_domains(x.shape))}
    assert by_device(out.sharding) == by_device(sh)  # each device holds the tile sh gives it


def test_sharding_conversions():
    client = ifrt.get_client("pjrt", device_count=8)
    devices = list(client.devices())
    mesh = ifrt.Mesh(np.array(devices).reshape(4, 2), ("x", "y"))
    assert hlo_sharding_string(ifrt.NamedSharding(mesh, P("x", None)), 2) == \
        "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"
    assert hlo_sharding_string(ifrt.NamedSharding(mesh, P(None, "x")), 2) == \
        "{devices=[1,4,2]<=[8] last_tile_dim_replicate}"
    assert hlo_sharding_string(ifrt.NamedSharding(mesh, P("y", "x")), 2) == \
        "{devices=[2,4]0,2,4,6,1,3,5,7}"
    assert hlo_sharding_string(ifrt.NamedSharding(mesh, P()), 2) == "{replicated}"
    assert hlo_sharding_string(ifrt.SingleDeviceSharding(devices[3]), 1, devices) == \
        "{maximal device=3}"
    hlo = ifrt.HloSharding(devices, "{devices=[2,4]<=[8]}")
    assert hlo_sharding_string(hlo, 2) == "{devices=[2,4]<=[8]}"
    assert hlo_sharding_string(hlo, 2, devices[::-1]) == "{devices=[2,4]7,6,5,4,3,2,1,0}"
    with pytest.raises(InvalidArgumentError, match="not an HLO sharding"):
        hlo_sharding_string("{devices=[2", 2)
    with pytest.raises(InvalidArgumentError, match="not among the builder's devices"):
        hlo_sharding_string(ifrt.NamedSharding(mesh, P("x")), 2, devices[:4])
    with pytest.raises(InvalidArgumentError, match="cannot annotate"):
        hlo_sharding_string(object(), 2)
