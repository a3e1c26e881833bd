"""ifrtpy on an accelerator plugin, end to end: the proof that it holds there.

    python benchmarks/accelerator_check.py --plugin tpu [--jax-tests /tmp/jax/tests]
        [--parts tests,conformance,proxy,speed] [--out DIR] [--quick]

Each part runs in a process of its own, one after another (one process holds a TPU at a
time), and prints its result lines; a summary closes the run:

* ``tests``: ``tests/backends/pjrt/test_accelerator.py`` (layouts of every memory and
  dtype, custom layouts, declared inexact dtypes, the execute path) on the plugin;
* ``conformance``: the conformance suite (``ifrtpy.testing.conformance``) on the plugin;
* ``proxy``: jax through ``python -m ifrtpy serve --backend PLUGIN`` on a unix socket.
  With ``--jax-tests`` (the ``tests/`` folder of a jax checkout at the installed jax's
  tag; nothing of jax's is copied here) jax's ``lax_numpy_operators_test.py`` runs
  directly on the chip and through the server (``jax_tests_through_proxy.py``); without
  it, a few jax programs (a jit'd matmul, grad, device_put, reductions, the custom calls
  jax lowers to on the chip, tokens) through the server are compared with NumPy;
* ``speed``: the same steps timed with jax and with ifrtpy in turn on the same chip:
  a synchronous ``x + 1`` on f32[8], 100 chained calls, puts of 4 KiB and 64 MiB, a
  64 MiB get, and a bf16 matmul (8192³; 2048³ with ``--quick``).

Needs jax with the plugin's platform installed (jax finds libtpu as ifrtpy does), and
grpcio/protobuf for the proxy part. Exit status 1 when a part failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _timing import interleaved_median_us, timed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(command, env=None, timeout=None, log=None):
    """Run ``command``; its return code and output (also written to ``log``)."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, env=env, timeout=timeout, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        code, output = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        code, output = 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    if log:
        with open(log, "w") as f:
            f.write(output)
    print(f"  ({' '.join(command[:6])} ...: exit {code} in {time.perf_counter() - start:.0f} s)",
          flush=True)
    return code, output


def last_line(output, word):
    """The last line of ``output`` holding ``word``, else its last line."""
    lines = [line for line in output.splitlines() if word in line] or output.strip().splitlines()
    return lines[-1].strip() if lines else "(no output)"


# -- parts --------------------------------------------------------------------------------------

def part_tests(args):
    env = dict(os.environ, IFRTPY_TEST_PLUGIN=args.plugin, JAX_PLATFORMS="")
    code, out = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "tests/backends/pjrt/test_accelerator.py", "-rfs"], env, args.timeout,
                    os.path.join(args.out, "tests.log"))
    return code == 0, last_line(out, " in ")


def part_conformance(args):
    code, out = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                     "ifrtpy.testing.conformance.plugin", "--pyargs", "ifrtpy.testing.conformance",
                     f"--ifrtpy-backend={args.plugin}", "--hypothesis-profile=ci", "-rf"],
                    None, args.timeout, os.path.join(args.out, "conformance.log"))
    return code == 0, last_line(out, " in ")


def part_proxy(args):
    socket = os.path.join(tempfile.mkdtemp(), "proxy.sock")
    if args.jax_tests:
        code, out = run([sys.executable, os.path.join(HERE, "jax_tests_through_proxy.py"),
                         args.jax_tests, "lax_numpy_operators_test.py", "--backend", args.plugin,
                         "--platform", args.plugin, "--address", f"unix:{socket}"],
                        dict(os.environ, JAX_NUM_GENERATED_CASES=str(args.cases)), args.timeout * 3,
                        os.path.join(args.out, "proxy.log"))
        return code == 0 and "| lax_numpy_operators_test.py" in out, last_line(out, "| lax_numpy")
    server = subprocess.Popen([sys.executable, "-m", "ifrtpy", "serve", "--backend", args.plugin,
                               "--address", f"unix:{socket}"], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
    try:
        line = server.stdout.readline()
        if "serving" not in line:
            return False, f"the server did not start: {line!r}"
        target = line.rsplit(" at ", 1)[1].strip()
        env = dict(os.environ, JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=target)
        code, out = run([sys.executable, __file__, "--worker", "jax-programs"], env, args.timeout,
                        os.path.join(args.out, "proxy.log"))
        return code == 0 and "programs ok" in out, last_line(out, "programs")
    finally:
        server.terminate()
        server.wait(timeout=60)


def part_speed(args):
    results = {}
    for runtime in ("jax", "ifrtpy"):
        code, out = run([sys.executable, __file__, "--worker", f"speed-{runtime}", "--plugin",
                         args.plugin] + (["--quick"] if args.quick else []), None, args.timeout,
                        os.path.join(args.out, f"speed-{runtime}.log"))
        found = [line for line in out.splitlines() if line.startswith("{")]
        if code != 0 or not found:
            return False, f"{runtime} failed: {out.strip()[-300:]}"
        results[runtime] = json.loads(found[-1])
    jax, ours = results["jax"], results["ifrtpy"]
    lines, ok = [], True
    print("| step | jax | ifrtpy | ratio (ifrtpy / jax time) |")
    for name, unit, higher_is_better in STEPS:
        ratio = jax[name] / ours[name] if higher_is_better else ours[name] / jax[name]
        ok &= ratio <= 1.0
        lines.append(f"| {name} | {jax[name]:.4g} {unit} | {ours[name]:.4g} {unit} | {ratio:.2f}x |")
    print("\n".join(lines))
    with open(os.path.join(args.out, "speed.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return ok, "every step at or below jax's time" if ok else "some steps behind jax (table)"


PARTS = {"tests": part_tests, "conformance": part_conformance, "proxy": part_proxy,
         "speed": part_speed}

#: name, unit, whether a higher figure is better (bandwidth) rather than lower (time).
STEPS = [("sync execute", "us", False), ("chained execute, per call", "us", False),
         ("put 4 KiB", "us", False), ("put 64 MiB", "GB/s", True), ("get 64 MiB", "GB/s", True),
         ("bf16 matmul", "TFLOP/s", True)]


# -- workers (each in its own process) ------------------------------------------------------

def _median_us(fn, number, repeats=7):
    """Median µs per call of ``fn`` over ``repeats`` loops of ``number`` calls."""
    return interleaved_median_us({"": timed(fn)}, number, repeats)[""]


def speed(runtime, plugin, quick):
    """The STEPS figures of ``runtime`` ("jax" or "ifrtpy"), as one JSON line."""
    import numpy as np

    x8 = np.arange(8, dtype=np.float32)
    small = np.ones(1024, np.float32)
    big = np.ones(16 << 20, np.float32)
    n = 2048 if quick else 8192
    if runtime == "jax":
        import jax
        import jax.numpy as jnp

        f = jax.jit(lambda v: v + 1)
        a = jax.device_put(x8)
        put = jax.device_put

        def sync():
            f(a).block_until_ready()

        def chained():
            v = a
            for _ in range(100):
                v = f(v)
            v.block_until_ready()

        def put_small():
            put(small).block_until_ready()

        get = np.asarray
        m = jax.jit(lambda p, q: p @ q)
        p = put(np.ones((n, n), jnp.bfloat16))

        def matmul():
            m(p, p).block_until_ready()
    else:
        import ifrtpy as ifrt
        from ifrtpy.builder import Builder

        client = ifrt.get_client(plugin)
        sharding = ifrt.SingleDeviceSharding(client.devices()[0])
        b = Builder("add_one")
        f = client.compile(b.build(b.parameter((8,), np.float32) + 1.0))
        a = client.make_array_from_host_buffer(x8, sharding)

        def put(v):
            return client.make_array_from_host_buffer(v, sharding)

        def sync():
            f(a)[0].block_until_ready()

        def chained():
            v = a
            for _ in range(100):
                v = f(v)[0]
            v.block_until_ready()

        def put_small():
            put(small).block_until_ready()

        get = np.asarray
        import ml_dtypes

        b = Builder("matmul")
        lhs = b.parameter((n, n), ml_dtypes.bfloat16)
        rhs = b.parameter((n, n), ml_dtypes.bfloat16)
        m = client.compile(b.build(b.dot(lhs, rhs)))
        p = put(np.ones((n, n), ml_dtypes.bfloat16))

        def matmul():
            m(p, p)[0].block_until_ready()

    def put_big():
        put(big).block_until_ready()

    figures = {
        "sync execute": _median_us(sync, 200),
        "chained execute, per call": _median_us(chained, 5) / 100,
        "put 4 KiB": _median_us(put_small, 200),
        "put 64 MiB": big.nbytes / _median_us(put_big, 3) / 1e3,
        "get 64 MiB": big.nbytes / _median_us(_fresh_get(runtime, put, big, get), 3) / 1e3,
        "bf16 matmul": 2 * n ** 3 / _median_us(matmul, 3) / 1e6,
    }
    print(json.dumps(figures), flush=True)


def _fresh_get(runtime, put, big, get):
    """A get of a new device array each time (a runtime may cache the host copy)."""
    arrays = []

    def get_one():
        if not arrays:
            arrays.extend(put(big) for _ in range(4))
        get(arrays.pop())
    return get_one


def jax_programs():
    """A few jax programs through the proxy client, compared with NumPy."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    x = np.arange(256 * 256, dtype=np.float32).reshape(256, 256) / 65536
    checks = [
        ("matmul", np.asarray(jax.jit(lambda a: a @ a)(x)), x @ x, 1e-2),
        ("device_put", np.asarray(jax.device_put(x)), x, 0),
        ("grad", np.asarray(jax.grad(lambda a: jnp.sum(jnp.sin(a)))(x)), np.cos(x), 1e-5),
        ("reduce", np.asarray(jnp.sum(jnp.asarray(x), axis=0)), x.sum(axis=0), 1e-3),
        ("bf16", np.asarray(jnp.asarray(x, jnp.bfloat16) * 2).astype(np.float32),
         (x.astype(jnp.bfloat16) * 2).astype(np.float32), 1e-2),
    ]
    for name, got, want, tol in checks:
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)
        print(f"{name}: ok", flush=True)
    jax_custom_calls_and_tokens()
    print(f"programs ok on {jax.devices()[0].device_kind} through {jax.devices()[0].client.runtime_type}")


def jax_custom_calls_and_tokens():
    """The custom calls jax lowers to on the chip (linear algebra, a Pallas kernel,
    ``dce_sink``) and tokens, through the proxy client, against NumPy; each one reported."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax._src import core
    from jax.experimental import pallas as pl

    a = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    s = a @ a.T + 64 * np.eye(64, dtype=np.float32)

    def sink(v):
        jax.lax.dce_sink(v * 2, prevent_mlir_dce=True)
        return v + 1

    def add_one(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    def eigh():
        w, v = jnp.linalg.eigh(s)
        return (v * w) @ v.T, s

    def svd():
        u, sv, vt = jnp.linalg.svd(a, full_matrices=False)
        return (u * sv) @ vt, a

    checks = {
        "qr": lambda: (jnp.matmul(*jnp.linalg.qr(a)), a),
        "eigh": eigh,
        "svd": svd,
        "lu": lambda: (jnp.linalg.multi_dot(jax.scipy.linalg.lu(a)), a),
        "pallas": lambda: (pl.pallas_call(add_one, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype))(a),
                           a + 1),
        "dce_sink": lambda: (jax.jit(sink)(a), a + 1),
        "token": lambda: (isinstance(jax.jit(jax.lax.create_token)(1.0), core.Token), True),
    }
    failed = []
    with jax.default_matmul_precision("highest"):
        for name, check in checks.items():
            try:
                got, want = check()
                np.testing.assert_allclose(np.asarray(got), want, rtol=1e-3,
                                           atol=1e-3 * np.abs(want).max())
                print(f"{name}: ok", flush=True)
            except Exception as e:  # noqa: BLE001 - every check is reported
                failed.append(name)
                print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    assert not failed, f"failed through the proxy: {failed}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plugin", default="tpu", help="plugin name or path (default tpu)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to run")
    parser.add_argument("--jax-tests", help="the tests/ folder of a jax checkout (proxy part)")
    parser.add_argument("--cases", type=int, default=2, help="JAX_NUM_GENERATED_CASES (default 2)")
    parser.add_argument("--out", default=".", help="folder for the parts' logs")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per part")
    parser.add_argument("--quick", action="store_true", help="smaller speed steps")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "jax-programs":
        return jax_programs()
    if args.worker:
        return speed(args.worker.removeprefix("speed-"), args.plugin, args.quick)
    os.makedirs(args.out, exist_ok=True)
    summary = []
    for name in args.parts.split(","):
        print(f"== {name}", flush=True)
        try:
            ok, detail = PARTS[name](args)
        except Exception as e:  # one failing part must not hide the others
            ok, detail = False, f"{type(e).__name__}: {e}"
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        summary.append(ok)
    sys.exit(0 if all(summary) else 1)


if __name__ == "__main__":
    main()
