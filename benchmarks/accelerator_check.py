"""ifrtpy on an accelerator plugin, end to end: the proof that it holds there.

    python benchmarks/accelerator_check.py --plugin tpu [--jax-tests /tmp/jax/tests]
        [--parts tests,conformance,proxy,speed,steps] [--out DIR] [--quick]

Each part runs in a process of its own, one after another (one process holds a TPU at a
time), and prints its result lines; a summary closes the run:

* ``tests``: ``tests/backends/pjrt/test_accelerator.py`` (layouts of every memory and
  dtype, custom layouts, declared inexact dtypes, the execute path) on the plugin;
* ``conformance``: the conformance suite (``ifrtpy.testing.conformance``) on the plugin,
  with the skips this module declares for it (:data:`PLATFORM_SKIPS`, and the cases that
  need more devices than the machine has; every other skip fails the run);
* ``proxy``: jax through ``python -m ifrtpy serve --backend PLUGIN`` on a unix socket.
  With ``--jax-tests`` (the ``tests/`` folder of a jax checkout at the installed jax's
  tag; nothing of jax's is copied here) jax's ``lax_numpy_operators_test.py`` runs
  directly on the chip and through the server (``jax_tests_through_proxy.py``); without
  it, a few jax programs (a jit'd matmul, grad, device_put, reductions, the custom calls
  jax lowers to on the chip, tokens) through the server are compared with NumPy;
* ``speed``: the same steps timed with jax and with ifrtpy in turn on the same chip:
  a synchronous ``x + 1`` on f32[8], 100 chained calls, puts of 4 KiB and 64 MiB, a
  64 MiB get, and a bf16 matmul (8192³; 2048³ with ``--quick``);
* ``steps``: ``bench_steps.py``'s single-device steps (``infer``, the donated ``train``
  step, ``attention``): jax lowers and runs each on the plugin's platform in one process
  (the lowered StableHLO and its first outputs written to ``--out``), then ifrtpy compiles
  those same programs on the plugin in another and runs them; outputs compared with
  jax's, p50 times and their ratios printed.

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
    env = dict(os.environ, IFRTPY_TEST_PLUGIN=args.plugin,
               PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])))
    code, out = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                     "ifrtpy.testing.conformance.plugin", "--pyargs", "ifrtpy.testing.conformance",
                     f"--ifrtpy-backend={args.plugin}", "--hypothesis-profile=ci", "-rfs",
                     "--ifrtpy-expected-skips=accelerator_check:EXPECTED_SKIPS"],
                    env, args.timeout, os.path.join(args.out, "conformance.log"))
    return code == 0, last_line(out, " in ")


#: Conformance cases that need more addressable devices than a small machine has (one
#: TPU chip): case -> how many. The suite skips them on a client with fewer; they are
#: declared only where that is so.
DEVICES_NEEDED = {
    **{case: 2 for case in (
        "test_analysis", "test_assemble_and_disassemble_array", "test_assemble_array",
        "test_batch_mapping_deinterleave", "test_batch_mapping_identity", "test_bitcast_arrays",
        "test_copy_arrays_exhaustive", "test_copy_mixed_source_devices", "test_copy_poisoned_array",
        "test_copy_to_different_device", "test_detect_bad_input", "test_execute_add_sub_on_two_devices",
        "test_extract_single_shard", "test_fingerprint_survives_serialization", "test_get_hlo_modules",
        "test_interleave_arrays_donate", "test_interleave_arrays_reuse",
        "test_make_arrays_from_host_buffer_shards_and_copy_to_host_buffer",
        "test_make_arrays_from_host_buffer_shards_and_copy_to_host_buffer_with_string",
        "test_make_arrays_from_host_buffer_shards_with_different_memory_kinds",
        "test_make_arrays_from_host_buffer_shards_with_layout", "test_make_error_arrays",
        "test_output_memory_kinds", "test_parameter_and_output_layouts", "test_program_text",
        "test_properties")},
    "test_deinterleave_arrays": 3,
    **{case: 4 for case in (
        "test_copy_arrays_with_partial_reuse", "test_donation_deletes_exactly_the_donated_inputs",
        "test_make_arrays_from_host_buffer_shards_with_different_devices")},
}
#: The laws that draw arrays over several devices say so in their own words.
MULTI_DEVICE_LAWS = ("test_bad_assemble_raises_and_leaves_inputs_intact",
                     "test_shardings_taken_as_given_are_checked_where_an_array_is_made")

#: What the PjRt backend does not do on each platform: case -> a text of its skip message.
PLATFORM_SKIPS = {
    # The PJRT C API has no call to cancel an execution (PJRT 0.112, libtpu 0.0.42.1).
    "tpu": {"test_cancel_execution": "has no call to cancel a launched execution"},
    # The CPU plugin keeps elements row-major whatever layout it reports (docs/plugins.md),
    # and holds every dtype exactly.
    "cpu": {"test_make_array_from_host_buffer_with_a_column_major_layout": "default layout only",
            "test_make_arrays_from_host_buffer_shards_with_layout": "default layout only",
            "test_compile_with_a_column_major_result_layout": "on the CPU platform",
            "test_cancel_execution": "has no call to cancel a launched execution",
            "test_declared_inexact_dtypes_are_what_the_devices_hold": "declares every dtype exact"},
}


def expected_skips(client) -> dict:
    """The conformance cases ``client`` skips, each with a text of its skip message: the
    cases of another process's devices (it has none), those needing more devices than it
    has, and what its platform does not do (:data:`PLATFORM_SKIPS`)."""
    from ifrtpy.testing.conformance import ONE_PROCESS_SKIPS

    count = len(client.addressable_devices())
    too_few = {case: f"the client has {count}" for case, needed in DEVICES_NEEDED.items()
               if count < needed}
    if count < 2:
        too_few.update(dict.fromkeys(MULTI_DEVICE_LAWS, "cannot hold arrays over several devices"))
    # A case the client has too few devices for skips for that first.
    return {**ONE_PROCESS_SKIPS, **PLATFORM_SKIPS.get(client.platform_name, {}), **too_few}


def __getattr__(name):
    """``EXPECTED_SKIPS``: :func:`expected_skips` of the plugin ``IFRTPY_TEST_PLUGIN``
    names, made when the conformance part's pytest reads it (the suite's own client:
    ``get_client`` returns the one client of a plugin in a process)."""
    if name != "EXPECTED_SKIPS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import ifrtpy as ifrt

    return expected_skips(ifrt.get_client(os.environ["IFRTPY_TEST_PLUGIN"]))


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
    lines, behind = [], []
    print("| step | jax | ifrtpy | ratio (ifrtpy / jax time) |")
    for name, unit, higher_is_better in STEPS:
        ratio = jax[name] / ours[name] if higher_is_better else ours[name] / jax[name]
        if round(ratio, 2) > 1.0:  # behind as printed: 1.00x is a tie within 0.5 %
            behind.append(f"{name} {ratio:.2f}x")
        lines.append(f"| {name} | {jax[name]:.4g} {unit} | {ours[name]:.4g} {unit} | {ratio:.2f}x |")
    print("\n".join(lines))
    with open(os.path.join(args.out, "speed.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if behind:
        return False, "behind jax: " + ", ".join(behind)
    return True, "every step at or below jax's time (1.00x: within 0.5 %)"


def part_steps(args):
    folder = os.path.join(args.out, "steps")
    os.makedirs(folder, exist_ok=True)
    results = {}
    for runtime in ("jax", "ifrtpy"):
        code, out = run([sys.executable, __file__, "--worker", f"steps-{runtime}", "--plugin",
                         args.plugin, "--out", folder] + (["--quick"] if args.quick else []),
                        None, args.timeout, os.path.join(args.out, f"steps-{runtime}.log"))
        found = [line for line in out.splitlines() if line.startswith("{")]
        if code != 0 or not found:
            return False, f"{runtime} failed: {out.strip()[-300:]}"
        results[runtime] = json.loads(found[-1])
    jax, ours = results["jax"], results["ifrtpy"]
    lines = ["| step | jax p50 | ifrtpy p50 | ratio (ifrtpy / jax time) | outputs |"]
    for step in STEP_NAMES:
        lines.append(f"| {step} | {jax[step]['p50_ms']:.3f} ms | {ours[step]['p50_ms']:.3f} ms | "
                     f"{ours[step]['p50_ms'] / jax[step]['p50_ms']:.2f}x | {ours[step]['outputs']} |")
    print("\n".join(lines))
    with open(os.path.join(args.out, "steps.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    worst = max(ours[s]["p50_ms"] / jax[s]["p50_ms"] for s in STEP_NAMES)
    return True, f"outputs match jax's; worst ratio {worst:.2f}x (table)"


PARTS = {"tests": part_tests, "conformance": part_conformance, "proxy": part_proxy,
         "speed": part_speed, "steps": part_steps}

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


#: bench_steps.py's single-device steps the ``steps`` part runs.
STEP_NAMES = ("infer", "train", "attention")


def steps(runtime, plugin, folder, quick):
    """bench_steps' single-device steps with ``runtime`` on the plugin, as one JSON line:
    per step the p50 time of a step (ms) and, for ifrtpy, how its first output compares
    with jax's. jax writes each step's lowered StableHLO and first output to ``folder``;
    ifrtpy compiles those programs and checks its first outputs against those."""
    import numpy as np

    platform = _jax_platform(plugin)
    # jax on the plugin's platform lowers and runs; under ifrtpy jax only defines the steps
    os.environ["JAX_PLATFORMS"] = platform if runtime == "jax" else "cpu"
    import bench_steps
    import jax

    fns = bench_steps.programs(jax)
    batch_list = bench_steps.batches(64)
    rounds = 3 if quick else 7
    if runtime == "jax":
        runner = bench_steps.JaxSteps(jax, platform, fns)
    else:
        import ifrtpy as ifrt

        lowered = {}
        for step in STEP_NAMES:
            with open(os.path.join(folder, f"{step}.mlir")) as f:
                lowered[step] = f.read()
        runner = bench_steps.IfrtpySteps(ifrt, ifrt.get_client(plugin), fns, lowered)
    figures = {}
    for step in STEP_NAMES:
        first = os.path.join(folder, f"{step}.npy")
        if runtime == "jax":
            fn, donated, host = fns[step]
            f, _ = bench_steps.jitted(jax, step, fn, donated, runner.devices)
            with open(os.path.join(folder, f"{step}.mlir"), "w") as out:
                out.write(f.lower(*host).as_text())
        runner.setup(step)
        output = runner.first_output(step)
        if runtime == "jax":
            np.save(first, output)
            outputs = "jax's"
        else:
            expected = np.load(first)
            np.testing.assert_allclose(output, expected, rtol=2e-3, atol=2e-4,
                                       err_msg=f"ifrtpy computes another {step} step than jax")
            outputs = ("bit-identical" if np.array_equal(output, expected) else
                       f"max abs diff {float(np.max(np.abs(output - expected))):.2g}")
        samples, _ = bench_steps.measure({runtime: runner}, step, rounds, batch_list)
        figures[step] = {"p50_ms": bench_steps.percentile(samples[runtime], 50) * 1e3,
                         "p99_ms": bench_steps.percentile(samples[runtime], 99) * 1e3,
                         "outputs": outputs}
        runner.state.pop(step, None)
    print(json.dumps(figures), flush=True)


def _jax_platform(plugin):
    """The jax platform of a plugin given by name (a CPU build's is "cpu")."""
    from ifrtpy.plugins.builds import CPU_BUILDS

    return "cpu" if plugin in {"cpu", *(b.name for b in CPU_BUILDS)} else plugin


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
    if args.worker and args.worker.startswith("steps-"):
        return steps(args.worker.removeprefix("steps-"), args.plugin, args.out, args.quick)
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
