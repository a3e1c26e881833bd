"""jax programs run by an unmodified jax process through the IFRT Proxy server equal jax's
own results (jax's CPU client in the same process), on the pjrt, reference and example
backends; two clients at once; a killed client frees its session; a stopped server gives
the client an error."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytest.importorskip("grpc")
pytest.importorskip("jax")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402
from ifrtpy.testing import example_backend  # noqa: E402

#: Generous bound on a hang, not a timing assertion (a jax process starts in seconds).
HANG_S = 240

#: Run first in every jax process: connect to the server named by argv[1], make it jax's
#: default backend with jax's CPU client (8 devices) beside it as the oracle.
PRELUDE = """
import json, os, sys
os.environ["IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS"] = "true"
import jax
jax.config.update("jax_num_cpu_devices", 8)
import jax.extend.backend
from jax.extend.backend import ifrt_proxy
_client = ifrt_proxy.get_client("grpc://" + sys.argv[1], ifrt_proxy.ClientConnectionOptions())
jax.extend.backend.register_backend_factory("proxy", lambda: _client, priority=-1)
import numpy as np
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
PROXY, CPU = jax.devices("proxy"), jax.devices("cpu")

def both(make):
    # make(devices) -> a value computed with those devices; the proxy's and the CPU's.
    return np.asarray(make(PROXY)), np.asarray(make(CPU))

def emit(**values):
    print("RESULT " + json.dumps({k: [np.asarray(x).tolist() for x in v] if isinstance(v, tuple)
                                  else np.asarray(v).tolist() for k, v in values.items()}),
          flush=True)
"""


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_BACKEND_TARGET", "XLA_FLAGS")}
    env["JAX_PLATFORMS"] = "proxy,cpu"
    return env


def run_jax(address, code, timeout=HANG_S):
    """Run ``code`` (after PRELUDE) in a fresh jax process against the server at
    ``address``; the dict its ``emit`` printed."""
    script = PRELUDE + textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", script, address], capture_output=True,
                          text=True, timeout=timeout, env=_env())
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"no result (rc {done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}")


def assert_pairs_equal(result):
    for name, (through_proxy, direct) in result.items():
        if through_proxy != direct:  # the server's plugin and jax's CPU client are two XLA builds
            np.testing.assert_allclose(np.asarray(through_proxy, dtype=float),
                                       np.asarray(direct, dtype=float), rtol=1e-5, err_msg=name)


@pytest.fixture(scope="module")
def server():
    with proxy.serve(ifrt.get_client("pjrt", device_count=8)) as running:
        yield running


def test_plain_jit_through_the_pjrt_backend(server):
    result = run_jax(server.address, """
        f = jax.jit(lambda x: x * 2 + 1)
        emit(y=both(lambda d: f(jax.device_put(jnp.arange(8.0), d[0]))),
             ints=both(lambda d: jax.jit(lambda a, b: a @ b)(
                 jax.device_put(np.arange(12, dtype=np.int32).reshape(3, 4), d[0]),
                 jax.device_put(np.arange(8, dtype=np.int32).reshape(4, 2), d[0]))),
             bf16=both(lambda d: jax.jit(lambda x: (x * 3).astype(jnp.float32))(
                 jax.device_put(jnp.arange(6, dtype=jnp.bfloat16), d[0]))),
             grad=both(lambda d: jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(x) ** 2)))(
                 jax.device_put(jnp.linspace(0, 1, 5), d[0]))),
             strided=both(lambda d: jax.device_put(np.arange(24.0).reshape(4, 6)[:, ::2], d[1])),
             ndev=[len(PROXY), len(PROXY)])
    """)
    assert_pairs_equal(result)
    assert result["y"][0] == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0]


def test_a_get_larger_than_a_lookup_piece_arrives_whole(server):
    # 9 MiB and 12 bytes: two whole pieces of the server's HostBufferLookup and a part
    result = run_jax(server.address, """
        host = np.random.default_rng(0).random((9 << 18) + 3, dtype=np.float32)
        got = np.asarray(jax.jit(lambda x: x * 2)(jax.device_put(host, PROXY[0])))
        emit(equal=bool(np.array_equal(got, host * 2)), size=got.nbytes)
    """)
    assert result == {"equal": True, "size": (9 << 20) + 12}


def test_spmd_over_8_devices_shard_map_donation_and_reshards(server):
    result = run_jax(server.address, """
        from jax.experimental.shard_map import shard_map
        x = np.arange(64, dtype=np.float32).reshape(8, 8)

        def sharded(d, spec, value=x):
            return jax.device_put(value, NamedSharding(Mesh(np.array(d).reshape(4, 2), ("a", "b")), spec))

        def spmd(d):
            return jax.jit(lambda v: jnp.sin(v) @ v.T + 1)(sharded(d, P("a", "b")))

        def psum(d):
            mesh = Mesh(np.array(d).reshape(4, 2), ("a", "b"))
            f = shard_map(lambda v: jax.lax.psum(v, "a"), mesh=mesh, in_specs=P("a", None),
                          out_specs=P(None, None))
            return jax.jit(f)(sharded(d, P("a", None)))

        def donate(d):
            f = jax.jit(lambda v: v * 2, donate_argnums=0)
            a = sharded(d, P("a"))
            out = f(a)
            assert a.is_deleted()
            return out

        def reshard(d):
            a = sharded(d, P("a", "b"))
            return jax.device_put(a, NamedSharding(Mesh(np.array(d).reshape(2, 4), ("p", "q")), P(None, "q")))

        def sharded_put_readback(d):
            a = sharded(d, P("b", "a"), np.arange(32, dtype=np.int32).reshape(4, 8))
            return np.asarray(a) + 0

        emit(spmd=both(spmd), psum=both(psum), donate=both(donate), reshard=both(reshard),
             put=both(sharded_put_readback))
    """)
    assert_pairs_equal(result)


def test_a_reshard_between_two_orders_of_the_same_devices(server):
    # jax regroups the shards into the target's device order (a RemapArrays whose output
    # sharding names no index domains), then runs a program compiled for that placement
    result = run_jax(server.address, """
        def moved(d, spec, donate):
            mesh = Mesh(np.array(d[:4]).reshape(2, 2), ("x", "y"))
            reordered = Mesh(np.array(d[:4][::-1]).reshape(2, 2), ("x", "y"))
            x = jax.device_put(np.arange(16).reshape(8, 2), NamedSharding(mesh, P("x", "y")))
            out = jax.device_put(x, NamedSharding(reordered, spec), donate=donate)
            shards = sorted(out.addressable_shards, key=lambda s: d.index(s.device))
            return np.stack([np.asarray(s.data) for s in shards]), x.is_deleted()
        emit(rows=both(lambda d: moved(d, P("x"), False)[0]),
             whole=both(lambda d: moved(d, P(), False)[0]),
             donated=both(lambda d: moved(d, P("x", "y"), True)[0]),
             input_deleted=both(lambda d: moved(d, P("x"), True)[1]))
    """)
    assert_pairs_equal(result)
    rows = np.arange(16).reshape(8, 2)
    # device 3 (first of the reordered mesh) holds the first half of the rows
    assert result["rows"][0] == [rows[4:].tolist(), rows[4:].tolist(), rows[:4].tolist(),
                                 rows[:4].tolist()]


def test_a_donation_the_compiler_cannot_use_leaves_the_input_live(server):
    """jax marks a sharded donated input ``jax.buffer_donor`` and leaves the aliasing to
    XLA: an input no output can take (``v @ v.T`` has another shape) stays live and reads
    back, one XLA aliases is deleted, as on jax's own client."""
    result = run_jax(server.address, """
        def donations(d):
            sharding = NamedSharding(Mesh(np.array(d[:2]), ("x",)), P("x"))
            x, y = (jax.device_put(np.arange(16.0).reshape(8, 2), sharding) for _ in range(2))
            jax.jit(lambda v: v @ v.T, donate_argnums=0)(x)
            jax.jit(lambda v: v * 2, donate_argnums=0)(y)
            return [float(x.is_deleted()), float(y.is_deleted()), float(np.asarray(x).sum())]

        emit(donations=both(donations))
    """)
    assert_pairs_equal(result)
    assert result["donations"][0] == [0.0, 1.0, 120.0]


def test_unreduced_shardings_of_jax_explicit_mode(server):
    """Arrays with unreduced axes (``P(..., unreduced={...})``): a matmul leaving its
    contraction unreduced, a program keeping it so, one reducing it (``reshard``), a fully
    unreduced result, and a vjp whose forward program has no outputs: every device holds
    what it holds on jax's CPU client, the reductions equal NumPy's, and a read of the
    partial values is refused as jax's own client refuses it (0.10 and 0.12.1: in Python,
    0.12.0: INVALID_ARGUMENT from the runtime, here the server)."""
    result = run_jax(server.address, """
        from jax.sharding import AxisType
        a = np.arange(32, dtype=np.float32).reshape(4, 8)
        b = np.linspace(-1, 1, 48, dtype=np.float32).reshape(8, 6)

        def outcome(f):
            try:
                f()
                return "read"
            except Exception as e:  # the kind of refusal, as each client reports it
                return type(e).__name__ + (" INVALID_ARGUMENT" if "INVALID_ARGUMENT" in str(e) else "")

        def shards(x):
            return np.stack([np.asarray(s.data) for s in x.addressable_shards])

        def program(d):
            mesh = Mesh(np.array(d).reshape(2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
            with jax.set_mesh(mesh):
                def matmul(a_spec, b_spec, out_spec):
                    return jax.jit(lambda u, v: jnp.einsum("ij,jk->ik", u, v, out_sharding=out_spec))(
                        jax.device_put(a, NamedSharding(mesh, a_spec)),
                        jax.device_put(b, NamedSharding(mesh, b_spec)))
                out = matmul(P("x", "y"), P("y", None), P("x", None, unreduced={"y"}))
                kept = jax.jit(lambda w: w + w)(out)
                reduced = jax.jit(lambda w: jax.sharding.reshard(w + w, P("x", None)))(kept)
                full = matmul(P(None, ("x", "y")), P(("x", "y"), None),
                              P(None, None, unreduced={"x", "y"}))
                summed = jax.jit(lambda w: jax.sharding.reshard(w, P()))(full)
                r1, r2 = (jax.reshard(np.arange(8.0), P(reduced={"x"})) for _ in range(2))
                _, f_vjp = jax.vjp(jax.jit(lambda p, q: q), r1, r2)
                x_bar, y_bar = f_vjp(jax.reshard(jnp.arange(8.0), P(unreduced={"x"})))
                return dict(
                    specs=[str(x.sharding.spec) for x in (out, kept, full, x_bar, y_bar)],
                    shard_shape=list(out.sharding.shard_shape(out.shape)),
                    out=shards(out), kept=shards(kept), full=shards(full),
                    reduced=np.asarray(reduced), summed=np.asarray(summed),
                    bars=np.concatenate([shards(x_bar), shards(y_bar)]),
                    read=outcome(lambda: np.asarray(out)),
                    get=outcome(lambda: jax.device_get(kept)))

        through, direct = program(PROXY), program(CPU)
        emit(**{k: (through[k], direct[k]) for k in through})
    """)
    assert_pairs_equal({k: v for k, v in result.items() if k not in ("specs", "read", "get")})
    for name in ("specs", "read", "get"):
        assert result[name][0] == result[name][1], name
    assert "unreduced={'y'}" in result["specs"][0][0]
    assert result["shard_shape"][0] == [2, 6]
    # refused as jax's own client refuses it: jax 0.10 in Python (NotImplementedError),
    # jax 0.12.0 by the server (INVALID_ARGUMENT), jax 0.12.1 in Python again (its
    # UnreducedArray: "Fetching value for `jax.Array` that is unreduced is not allowed")
    assert result["read"][0] in ("NotImplementedError", "JaxRuntimeError INVALID_ARGUMENT",
                                 "RuntimeError")
    product = np.arange(32.0).reshape(4, 8) @ np.linspace(-1, 1, 48, dtype=np.float32).reshape(8, 6)
    np.testing.assert_allclose(result["reduced"][0], 4 * product, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result["summed"][0], product, rtol=1e-5, atol=1e-5)
    # Each "y" group of 4 devices adds up to the product's rows of its "x" block.
    out = np.asarray(result["out"][0])
    np.testing.assert_allclose(out[:4].sum(0), product[:2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[4:].sum(0), product[2:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(result["full"][0]).sum(0), product, rtol=1e-5, atol=1e-5)


def test_reference_backend():
    with proxy.serve(ifrt.get_client("reference", device_count=2)) as running:
        result = run_jax(running.address, """
            f = jax.jit(lambda x, y: x * y + 1)
            emit(y=both(lambda d: f(jax.device_put(np.arange(6.0).reshape(2, 3), d[0]),
                                    jax.device_put(np.full((2, 3), 2.0), d[0]))),
                 ndev=[len(PROXY), 2])
        """)
    assert_pairs_equal(result)


def test_tokens_are_served_as_jax_cpu_client_serves_them(server):
    """jax's eager create_token, a jit returning, capturing or taking a token (on one
    device and sharded over four, donating), a token's buffer read: as on jax's CPU client."""
    result = run_jax(server.address, """
        from jax._src import core

        def tokens(d):
            with jax.default_device(d[0]):
                token = jax.lax.create_token()
                made = jax.jit(jax.lax.create_token)(1.0)
                y, captured = jax.jit(lambda v: (v + 2, token))(7)
                x, passed = jax.jit(lambda v, t: (v, t))(jax.device_put(jnp.arange(8), d[0]), token)
                sharded = jax.device_put(jnp.arange(8.0), NamedSharding(Mesh(np.array(d[:4]), ("x",)), P("x")))
                doubled, kept = jax.jit(lambda v, t: (v * 2, t), donate_argnums=0)(sharded, token)
                kept.block_until_ready()
                try:
                    token._buf._value
                    read = "read"
                except Exception as e:
                    read = str(e)
            return dict(tokens=[isinstance(t, core.Token) for t in (token, made, captured, passed, kept)],
                        y=int(y), x=np.asarray(x), doubled=np.asarray(doubled),
                        donated=sharded.is_deleted(), read=read)

        through, direct = tokens(PROXY), tokens(CPU)
        emit(**{k: (through[k], direct[k]) for k in through})
    """)
    assert result["read"][0] == result["read"][1], result["read"]
    assert "Cannot convert a token-shape buffer" in result["read"][0]
    del result["read"]
    assert_pairs_equal(result)
    assert result["tokens"][0] == [True] * 5 and result["donated"][0] is True
    assert result["doubled"][0] == [2.0 * i for i in range(8)]


def test_compiler_options_and_jax_runtime_custom_calls(server):
    """``jit(..., compiler_options=...)`` reaches the backend's compiler, which refuses an
    option it does not know as jax's CPU client does; ``lax.dce_sink`` runs."""
    result = run_jax(server.address, """
        def outcome(f):
            try:
                return np.asarray(f()).tolist()
            except Exception as e:
                return type(e).__name__ + ": " + str(e).split("\\n")[0]

        def compiled(d, options):
            x = jax.device_put(jnp.arange(3.0), d[0])
            return outcome(lambda: jax.jit(lambda v: jnp.sqrt(v ** 2) + 1.0,
                                           compiler_options=options)(x))

        def sink(d):
            def f(v):
                jax.lax.dce_sink(v * 2, prevent_mlir_dce=True)
                return v + 1
            return outcome(lambda: jax.jit(f)(jax.device_put(jnp.arange(3.0), d[0])))

        emit(valid=both(lambda d: compiled(d, {"xla_embed_ir_in_executable": True})),
             effort=both(lambda d: compiled(d, {"exec_time_optimization_effort": 0.0})),
             invalid=both(lambda d: compiled(d, {"invalid_key": "invalid_value"})),
             sink=both(sink))
    """)
    assert result["valid"][0] == result["sink"][0] == [1.0, 2.0, 3.0]
    # jax 0.10 sends this one as a build option; jax 0.12 as an override, which jax's CPU
    # client and the plugin both refuse
    assert result["effort"][0] == result["effort"][1], result["effort"]
    assert "No such compile option: 'invalid_key'" in result["invalid"][0], result["invalid"]
    assert "No such compile option: 'invalid_key'" in result["invalid"][1], result["invalid"]
    assert_pairs_equal({k: result[k] for k in ("valid", "sink")})


def test_example_backend_serves_arrays_and_refuses_hlo_programs_by_name():
    # The example backend's programs are Python functions, not HLO: jax's puts, copies
    # and reads work through it; a jit is refused with the backend's own reason.
    with proxy.serve(example_backend.create_client(device_count=2)) as running:
        result = run_jax(running.address, """
            x = np.arange(12, dtype=np.int32).reshape(3, 4)
            put = lambda d: jax.device_put(x, d[1])
            moved = lambda d: jax.device_put(jax.device_put(x[:, ::2], d[0]), d[1])
            try:
                jax.jit(lambda v: v + 1)(jax.device_put(x, PROXY[0]))
                error = ""
            except Exception as e:
                error = str(e)
            emit(put=both(put), moved=both(moved), ndev=[len(PROXY), 2],
                 error=[error, error])
        """)
    error = result.pop("error")[0]
    assert "UNIMPLEMENTED" in error and "does not compile HloProgram" in error, error
    assert_pairs_equal(result)


def _wait_for(predicate, what):
    deadline = time.monotonic() + 60  # a bound on a hang, not a timing assertion
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


HOLD = """
a = jax.device_put(np.arange(1000.0), PROXY[0])
exe = jax.jit(lambda v: v + 1)
b = exe(a)
b.block_until_ready()
print("READY", flush=True)
sys.stdin.readline()
emit(b=np.asarray(b))
"""


def _start_holder(address, stderr=subprocess.DEVNULL):
    script = PRELUDE + HOLD
    child = subprocess.Popen([sys.executable, "-c", script, address], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=stderr, text=True, env=_env())
    assert child.stdout.readline().strip() == "READY"
    return child


def test_two_clients_at_once_and_a_killed_one_frees_its_session(server):
    first, second = _start_holder(server.address), _start_holder(server.address)
    try:
        _wait_for(lambda: len(server.sessions()) == 2, "two sessions")
        counts = [s.handles for s in server.sessions()]
        assert all(c["arrays"] >= 2 and c["executables"] >= 1 for c in counts), counts
        first.send_signal(signal.SIGKILL)
        first.wait(HANG_S)
        _wait_for(lambda: len(server.sessions()) == 1, "the killed client's session to close")
        out, _ = second.communicate("\n", timeout=HANG_S)
        result = json.loads(out.split("RESULT ", 1)[1])
        assert result["b"] == [float(i + 1) for i in range(1000)]
    finally:
        for child in (first, second):
            if child.poll() is None:
                child.kill()
                child.wait()
    _wait_for(lambda: not server.sessions(), "every session to close")


def test_a_stopped_server_gives_the_client_an_error():
    running = proxy.serve(ifrt.get_client("pjrt", device_count=2))
    child = _start_holder(running.address, stderr=subprocess.PIPE)
    try:
        running.stop()
        out, err = child.communicate("\n", timeout=HANG_S)  # a hang fails here
        assert "RESULT" not in out
        assert child.returncode == 1  # a Python exception, not an abort
        assert "JaxRuntimeError: UNAVAILABLE" in err, err[-2000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
