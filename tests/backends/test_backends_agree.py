"""The reference, PjRt and jax backends agree with each other and with NumPy.

Random small elementwise StableHLO programs (``ifrtpy.testing.strategies``), on 1, 2 or 4
devices with random ``mhlo.sharding`` on parameters and results, run on every backend:
every output's shards hold NumPy's answer sliced by the output sharding, and the two
backends report shardings that put the same slices on the same devices. Programs lowered
by jax (Shardy ``sdy.sharding`` attributes, sharding constraints) agree too, and so does a
shard_map with psum (tests/backends/test_manual_computations_agree.py has the rest). (The jax backend joins where jax is installed.)
"""

import importlib.util

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.sharding import SingleDeviceShardSemantics
from ifrtpy.testing import strategies as S
from ifrtpy.testing.asserts import assert_per_shard_data
from pjrt_helpers import REFUSED_AS_TOO_NEW, too_new_for_the_plugin

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS


@pytest.fixture(scope="module")
def clients():
    clients = {"reference": ifrt.get_client("reference", device_count=8),
               "pjrt": ifrt.get_client("pjrt", device_count=8)}
    if importlib.util.find_spec("jax") is not None:
        clients["jax"] = ifrt.get_client("jax", platform="cpu")
    return clients


def _same_shardings(runs, shape):
    """Every backend's executable puts the same slices on the same devices as PjRt's."""
    pjrt = runs["pjrt"][0]
    for name, (executable, _) in runs.items():
        for i, (a, b) in enumerate(zip(
                executable.output_shardings() + executable.parameter_shardings(),
                pjrt.output_shardings() + pjrt.parameter_shardings())):
            assert _domains(a, shape) == _domains(b, shape), (name, i, a, b)


def _domains(sharding, shape):
    """(device id, index domain) of each addressable shard."""
    devices = sharding.devices.addressable_device_list()
    if sharding.is_fully_replicated:
        domains = [ifrt.IndexDomain(ifrt.Shape(shape))] * len(devices)
    else:
        domains = sharding.index_domains(ifrt.Shape(shape), ADDRESSABLE)
    return [(d.id, domain) for d, domain in zip(devices, domains)]


def _run(client, text, num_devices, args):
    devices = client.make_device_list(client.addressable_devices()[:num_devices])
    executable = client.compile(text, ifrt.CompileOptions(devices=devices,
                                                          num_partitions=num_devices))
    shardings = executable.parameter_shardings()
    arrays = [client.make_array_from_host_buffer(a, s) for a, s in zip(args, shardings)]
    result = executable.execute(arrays, ifrt.ExecuteOptions(fill_status=True))
    result.status.result(timeout=30)
    return executable, result.outputs


@st.composite
def _programs_and_arguments(draw):
    num_devices = draw(st.sampled_from([1, 2, 4]))
    program = draw(S.elementwise_programs(num_devices=num_devices))
    return program, draw(S.program_arguments(program))


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                   HealthCheck.too_slow])
@given(_programs_and_arguments())
def test_random_elementwise_programs_agree_with_each_other_and_numpy(clients, case):
    program, args = case
    expected = program.evaluate(*args)
    runs = {name: _run(client, program.text, program.num_devices, args)
            for name, client in clients.items()}
    for name, (executable, outputs) in runs.items():
        program.assert_matches([np.asarray(o) for o in outputs], expected, name)
        tolerance = {} if program.dtype.kind in "biu" else {"rtol": 2e-2, "atol": 2e-2}
        for i, (out, value) in enumerate(zip(outputs, expected)):
            assert out.sharding.devices == executable.output_shardings()[i].devices, (name, i)
            assert_per_shard_data(out, value, **tolerance)
    _same_shardings(runs, program.shape)
    pjrt_out = runs["pjrt"][1]
    for name, (_, outputs) in runs.items():
        for i, (a, b) in enumerate(zip(outputs, pjrt_out)):
            program.assert_matches([np.asarray(a)], [np.asarray(b)], f"output {i}, {name} vs pjrt")


def _jax_lowered():
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devices = jax.devices()
    if len(devices) < 4:
        pytest.skip("jax needs 4 CPU devices (XLA_FLAGS from tests/conftest.py)")
    return jax, Mesh(np.array(devices[:4]).reshape(2, 2), ("x", "y")), NamedSharding, P


def test_jax_lowered_shardy_program_agrees(clients):
    jax, mesh, NamedSharding, P = _jax_lowered()
    import jax.numpy as jnp

    def f(a, b):
        c = a * 2 + b
        c = jax.lax.with_sharding_constraint(c, NamedSharding(mesh, P("y", None)))
        return c, jnp.maximum(a, b) - 1

    lowered = jax.jit(
        f, in_shardings=(NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P())),
        out_shardings=(NamedSharding(mesh, P(None, "x")), NamedSharding(mesh, P(("x", "y")))),
    ).lower(jnp.zeros((4, 4), jnp.float32), jnp.zeros((4, 4), jnp.float32))
    program = ifrt.HloProgram(lowered)
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    b = np.full((4, 4), 3, np.float32)
    expected = [a * 2 + b, np.maximum(a, b) - 1]
    runs = {name: _run(client, program, 4, [a, b]) for name, client in clients.items()}
    for name, (executable, outputs) in runs.items():
        for out, value in zip(outputs, expected):
            assert_per_shard_data(out, value)
    _same_shardings(runs, (4, 4))


def test_output_shardings_the_program_leaves_open_are_xlas(clients):
    """jit without out_shardings: the reference backend's outputs are sharded as XLA's
    partitioner shards them (Shardy's propagation), not replicated."""
    jax, mesh, NamedSharding, P = _jax_lowered()
    import jax.numpy as jnp

    lowered = jax.jit(lambda a: (a * 2, a.sum(0), a @ a.T),
                      in_shardings=NamedSharding(mesh, P("x", "y"))).lower(
        jnp.zeros((4, 4), jnp.float32))
    program = ifrt.HloProgram(lowered)
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    runs = {name: _run(client, program, 4, [a]) for name, client in clients.items()}
    for name, (executable, outputs) in runs.items():
        for out, value in zip(outputs, [a * 2, a.sum(0), a @ a.T]):
            assert_per_shard_data(out, value)
    reference = runs["reference"][0].output_shardings()
    assert not any(s.is_fully_replicated for s in reference), reference
    for name, (executable, _) in runs.items():
        for i, shape in enumerate([(4, 4), (4,), (4, 4)]):
            assert (_domains(executable.output_shardings()[i], shape)
                    == _domains(runs["pjrt"][0].output_shardings()[i], shape)), (name, i)


def test_shard_map_psum_agrees(clients):
    jax, mesh, NamedSharding, P = _jax_lowered()
    import jax.numpy as jnp

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    f = jax.jit(shard_map(lambda x: jax.lax.psum(x, "x"), mesh=mesh, in_specs=P("x"),
                          out_specs=P(None, "y")))
    lowered = f.lower(jnp.zeros((4, 4), jnp.float32))
    program = ifrt.HloProgram(lowered)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    if too_new_for_the_plugin(lowered.as_text(), clients["pjrt"]):
        with pytest.raises(ifrt.errors.IfrtError, match=REFUSED_AS_TOO_NEW):
            _run(clients["pjrt"], program, 4, [x])
        names = ("reference", "jax")
    else:
        names = ("reference", "pjrt", "jax")
    # psum over x of each device's rows; each y device's copy a tile of its own
    expected = np.tile(x[:2] + x[2:], (1, 2))
    for name in names:
        if name in clients:
            _, (out,) = _run(clients[name], program, 4, [x])
            np.testing.assert_array_equal(np.asarray(out), expected, err_msg=name)
