"""Host callbacks (IFRT's LoadedHostCallback): jax programs with ``pure_callback``,
``io_callback`` (unordered and ordered) and ``jax.debug.print`` run with their Python
callables on the PjRt backend (every CPU plugin installed) and on the jax backend,
against jax's own results.

Also: the order of ordered callbacks across executes, a callback's exception as the
execute's error, callbacks that call ifrtpy, many threads, a callback pending at
interpreter exit, and programs that cannot carry their callables (text), refused.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import ifrtpy as ifrt
from cpu_plugins import plugin_params, plugin_path
from ifrtpy.errors import FailedPreconditionError, InternalError, UnimplementedError

jax = pytest.importorskip("jax")
jnp = jax.numpy
io_callback = pytest.importorskip("jax.experimental").io_callback
P = jax.sharding.PartitionSpec


@pytest.fixture(scope="module", params=plugin_params())
def client(request):
    return ifrt.get_client("pjrt", plugin=plugin_path(request.param), device_count=8)


@pytest.fixture(scope="module")
def default_client():
    return ifrt.get_client("pjrt", device_count=8)


def _like(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _run(client, f, *args):
    """Outputs of jax-jitted ``f`` lowered for ``args`` and run by ifrtpy on device 0."""
    exe = client.compile(ifrt.HloProgram(f.lower(*args)))
    device = client.devices()[0]
    return [np.asarray(o) for o in exe(*[ifrt.device_put(np.asarray(a), device) for a in args])]


def test_pure_callback_values(client):
    x = np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)
    n = np.arange(3, dtype=np.int32)

    def host(a, b):
        return np.cos(a) * 2, (b * 10).astype(np.int32), np.float32(a.sum())

    f = jax.jit(lambda a, b: jax.pure_callback(
        host, (_like(a), _like(b), jax.ShapeDtypeStruct((), np.float32)), a + 1, b))
    want = [np.asarray(v) for v in f(x, n)]
    got = _run(client, f, x, n)
    assert len(got) == 3
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_io_callbacks_and_debug_print(client, capsys):
    seen = []

    def record(v):
        seen.append(v.copy())
        return v.sum(keepdims=True)

    def f(x):
        jax.debug.print("x is {x}", x=x)
        total = io_callback(record, jax.ShapeDtypeStruct((1,), x.dtype), x * 2)
        return total + 1

    x = np.arange(4, dtype=np.float32)
    (out,) = _run(client, jax.jit(f), x)
    np.testing.assert_array_equal(out, [13.0])
    np.testing.assert_array_equal(seen[0], x * 2)
    assert "x is [0. 1. 2. 3.]" in capsys.readouterr().out


def test_ordered_io_callbacks_run_in_the_order_of_the_executes(client):
    seen = []
    f = jax.jit(lambda v: io_callback(lambda t: (seen.append(int(t[0])), t)[1], _like(v), v,
                                      ordered=True))
    program = ifrt.HloProgram(f.lower(np.zeros(2, np.int32)))
    assert program.token_parameters == (0,) and program.token_results == (0,)
    exe = client.compile(program)
    device = client.devices()[0]
    outs = [exe(ifrt.device_put(np.full(2, i, np.int32), device))[0] for i in range(40)]
    assert [int(np.asarray(o)[0]) for o in outs] == list(range(40))
    assert seen == list(range(40))


def test_two_ordered_callbacks_chain_within_a_program(client):
    seen = []

    def f(v):
        a = io_callback(lambda t: (seen.append(("a", int(t))), t + 1)[1], _like(v), v, ordered=True)
        return io_callback(lambda t: (seen.append(("b", int(t))), t * 2)[1], _like(v), a, ordered=True)

    (out,) = _run(client, jax.jit(f), np.int32(5))
    assert int(out) == 12 and seen == [("a", 5), ("b", 6)]


def test_a_callback_spmd_over_8_devices(client):
    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    s = jax.sharding.NamedSharding(mesh, P("x"))
    f = jax.jit(lambda x: jax.pure_callback(lambda t: np.sqrt(t), _like(x), x * x) + x,
                in_shardings=s, out_shardings=s)
    x = np.arange(16, dtype=np.float32)
    exe = client.compile(ifrt.HloProgram(f.lower(x)), ifrt.CompileOptions(
        devices=ifrt.DeviceList(client.devices()), num_partitions=8))
    (out,) = exe(ifrt.device_put(x, exe.parameter_shardings()[0]))
    np.testing.assert_allclose(np.asarray(out), np.asarray(f(jax.device_put(x, s))))


def test_an_exception_is_the_executes_error(default_client):
    def bad(v):
        raise ValueError("no such value")

    f = jax.jit(lambda v: jax.pure_callback(bad, _like(v), v) * 2)
    exe = default_client.compile(ifrt.HloProgram(f.lower(np.ones(3, np.float32))))
    x = ifrt.device_put(np.ones(3, np.float32), default_client.devices()[0])
    with pytest.raises(InternalError, match="host callback 0 raised ValueError: no such value"):
        result = exe.execute([x], ifrt.ExecuteOptions(fill_status=True))
        result.status.result(timeout=60)
    with pytest.raises(InternalError, match="no such value"):
        np.asarray(exe(x)[0])


def test_an_exception_after_the_execute_returned_is_raised_by_the_wait(default_client):
    """A program the plugin runs on its own threads (not inline: four 256² matmuls first)
    fails after the execute returned: its output is not known ready, and waiting for it
    raises the callback's error."""
    def bad(v):
        raise ValueError("no such value")

    def f(v):
        for _ in range(4):
            v = jax.numpy.tanh(v @ v)
        return jax.pure_callback(bad, _like(v), v) * 2

    x = np.full((256, 256), 1 / 256, np.float32)
    exe = default_client.compile(ifrt.HloProgram(jax.jit(f).lower(x)))
    a = ifrt.device_put(x, default_client.devices()[0])
    for _ in range(3):
        with pytest.raises(InternalError, match="host callback 0 raised ValueError: no such value"):
            exe(a)[0].block_until_ready()


def test_a_result_of_the_wrong_type_is_the_executes_error(default_client):
    f = jax.jit(lambda v: jax.pure_callback(lambda t: t, _like(v), v))
    program = ifrt.HloProgram(f.lower(np.ones(3, np.float32)),
                              host_callbacks=[lambda t: (t.astype(np.float64),)])
    exe = default_client.compile(program)
    with pytest.raises(InternalError, match=r"result 0 is float64\[3\], the program takes float32\[3\]"):
        np.asarray(exe(ifrt.device_put(np.ones(3, np.float32), default_client.devices()[0]))[0])


def test_callbacks_that_call_ifrtpy(default_client):
    device = default_client.devices()[0]
    double = default_client.compile(ifrt.HloProgram(jax.jit(lambda v: v * 2).lower(np.ones(3, np.float32))))

    def host(v):
        a = ifrt.device_put(v + 1, device)  # a put, an execute and reads, from the callback
        (b,) = double(a)
        return (np.asarray(b) + np.asarray(a)).astype(np.float32)

    f = jax.jit(lambda v: jax.pure_callback(host, _like(v), v))
    x = np.arange(3, dtype=np.float32)
    for _ in range(3):
        (out,) = _run(default_client, f, x)
        np.testing.assert_array_equal(out, 3 * (x + 1))


def test_many_threads_execute_callback_programs(default_client):
    f = jax.jit(lambda v: jax.pure_callback(lambda t: t * t, _like(v), v) + 1)
    exe = default_client.compile(ifrt.HloProgram(f.lower(np.zeros(4, np.float32))))
    devices = default_client.devices()
    errors = []

    def work(k):
        try:
            for i in range(25):
                x = np.full(4, k * 100 + i, np.float32)
                (out,) = exe(ifrt.device_put(x, devices[0]))
                np.testing.assert_array_equal(np.asarray(out), x * x + 1)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]


def test_exit_with_callbacks_pending_is_clean():
    """A callback running when the interpreter exits finishes; one that starts once exit has
    begun (from an exit handler that runs after ifrtpy's) is refused with an error."""
    code = textwrap.dedent("""
        import atexit, threading, time
        import numpy as np

        def late():
            try:
                np.asarray(exe(ifrt.device_put(np.ones(2, np.float32), device))[0])
                print("late: ran", flush=True)
            except Exception as e:
                print(f"late: {type(e).__name__}: {e}", flush=True)

        atexit.register(late)  # before ifrtpy's exit handler: runs after it
        import jax, ifrtpy as ifrt
        client = ifrt.get_client("pjrt", device_count=2)
        device = client.devices()[0]

        def slow(v):
            time.sleep(0.5)
            print("slow callback done", flush=True)
            return v

        f = jax.jit(lambda v: jax.pure_callback(slow, jax.ShapeDtypeStruct(v.shape, v.dtype), v))
        exe = client.compile(ifrt.HloProgram(f.lower(np.ones(2, np.float32))))
        x = ifrt.device_put(np.ones(2, np.float32), device)
        threading.Thread(target=lambda: exe(x), daemon=True).start()
        time.sleep(0.1)
        print("exiting", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[:2] == ["exiting", "slow callback done"], done.stdout
    assert lines[2].startswith("late: UnavailableError: host callback refused: the Python "
                               "interpreter is exiting"), done.stdout


def test_programs_that_cannot_carry_their_callables_are_refused(default_client):
    f = jax.jit(lambda v: jax.pure_callback(np.sin, _like(v), v))
    lowered = f.lower(np.ones(3, np.float32))
    exe = default_client.compile(ifrt.HloProgram(lowered))
    with pytest.raises(UnimplementedError, match="cannot be serialized"):
        exe.serialize()
    for program in (lowered.as_text(), lowered.as_text().encode()):
        with pytest.raises(FailedPreconditionError, match="carries no Python callables"):
            default_client.compile(ifrt.HloProgram(program))
    jax_client = ifrt.get_client("jax")
    with pytest.raises(FailedPreconditionError, match="carries no Python callables"):
        jax_client.compile(ifrt.HloProgram(lowered.as_text()), ifrt.CompileOptions(
            devices=ifrt.DeviceList(jax_client.devices()[:1])))


def test_the_jax_backend_runs_callback_programs():
    client = ifrt.get_client("jax")
    seen = []

    def f(v):
        io_callback(lambda t: seen.append(int(t.sum())), None, v, ordered=True)
        return jax.pure_callback(lambda t: t[::-1].copy(), _like(v), v) * 2

    exe = client.compile(ifrt.HloProgram(jax.jit(f).lower(np.zeros(3, np.int32))),
                         ifrt.CompileOptions(devices=ifrt.DeviceList(client.devices()[:1])))
    for i in range(5):
        (out,) = exe(ifrt.device_put(np.arange(3, dtype=np.int32) + i, client.devices()[0]))
        np.testing.assert_array_equal(np.asarray(out), (np.arange(3)[::-1] + i) * 2)
    assert seen == [3 + 3 * i for i in range(5)]
