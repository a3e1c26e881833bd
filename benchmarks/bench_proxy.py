"""jax through ifrtpy's IFRT Proxy server next to jax direct, in one run (docs/proxy.md).

The server (``ifrtpy.proxy.serve`` over the chosen backend) runs in this process; one jax
process started from here holds both jax's own CPU backend and the ``proxy`` backend
(``JAX_PLATFORMS=cpu,proxy``), and times each case on both, the loops taking turns:

1. synchronous ``jit(x + 1)`` on f32[8]: call and wait, per call;
2. 50 chained ``jit(x + 1)`` calls, then one wait: per call (the client pipelines);
3. a 64 MiB f32 ``device_put`` and wait: GB/s;
4. a 64 MiB get (``np.array(x)``, a fresh device array each time): GB/s.

Targets (the IFRT Proxy issue): synchronous <= 30x and chained <= 10x jax direct's time per
call; put and get >= 0.5x jax direct's bandwidth.

    python benchmarks/bench_proxy.py [--backend pjrt] [--n 300] [--repeats 7]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MIB64 = 64 * 2**20
CHAIN = 50


def worker(n, repeats):
    """In the jax process: the figures of every case on ``cpu`` and ``proxy``, as JSON."""
    import jax
    import numpy as np

    from _timing import interleaved_median_us, timed

    devices = {"jax direct": jax.devices("cpu")[0], "proxy": jax.devices("proxy")[0]}
    add_one = jax.jit(lambda v: v + 1)
    small = {k: jax.device_put(np.arange(8, dtype=np.float32), d) for k, d in devices.items()}

    def chained(x):
        for _ in range(CHAIN):
            x = add_one(x)
        x.block_until_ready()

    sync = interleaved_median_us(
        {k: timed(lambda x=x: add_one(x).block_until_ready()) for k, x in small.items()},
        n, repeats)
    chain = interleaved_median_us(
        {k: timed(lambda x=x: chained(x)) for k, x in small.items()}, max(1, n // CHAIN), repeats)
    host = np.random.default_rng(0).random(MIB64 // 4, dtype=np.float32)
    put = {k: [] for k in devices}
    get = {k: [] for k in devices}
    for _ in range(repeats):
        for k, d in devices.items():
            start = time.perf_counter()
            x = jax.device_put(host, d).block_until_ready()
            put[k].append(time.perf_counter() - start)
            start = time.perf_counter()
            np.array(x)
            get[k].append(time.perf_counter() - start)
            del x
    figures = {k: {"sync_us": sync[k], "chained_us": chain[k] / CHAIN,
                   "put_gbs": MIB64 / statistics.median(put[k]) / 1e9,
                   "get_gbs": MIB64 / statistics.median(get[k]) / 1e9} for k in devices}
    print(json.dumps(figures))


def measure(backend, device_count, n, repeats):
    """Serve ``backend`` here, run the jax process against it; its figures."""
    import ifrtpy as ifrt
    from ifrtpy import proxy
    from ifrtpy.proxy.jax_client import jax_target

    client = ifrt.get_client(backend, device_count=device_count)
    with proxy.serve(client) as server:
        env = dict(os.environ, JAX_PLATFORMS="cpu,proxy",
                   JAX_BACKEND_TARGET=jax_target(server.address))
        here = os.path.dirname(os.path.abspath(__file__))
        proc = subprocess.run([sys.executable, __file__, "--worker", "--n", str(n),
                               "--repeats", str(repeats)],
                              env=env, cwd=here, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"the jax process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def report(backend, figures):
    jax_direct, through = figures["jax direct"], figures["proxy"]
    rows = [  # name, unit, key, target, lower is better
        ("sync jit(x + 1)", "us/call", "sync_us", 30, True),
        (f"{CHAIN} chained jit(x + 1)", "us/call", "chained_us", 10, True),
        ("put 64 MiB", "GB/s", "put_gbs", 0.5, False),
        ("get 64 MiB", "GB/s", "get_gbs", 0.5, False),
    ]
    print(f"jax through `ifrtpy serve --backend {backend}` next to jax direct (CPU), one run")
    print(f"{'case':24s} {'unit':8s} {'proxy':>10s} {'jax':>10s} {'ratio':>8s}  target")
    for name, unit, key, target, lower in rows:
        ratio = through[key] / jax_direct[key]
        meets = ratio <= target if lower else ratio >= target
        bound = f"<= {target}x" if lower else f">= {target}x"
        print(f"{name:24s} {unit:8s} {through[key]:10.2f} {jax_direct[key]:10.2f} "
              f"{ratio:7.2f}x  {bound} {'meets' if meets else 'MISSES'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="pjrt", help="the server's backend (default pjrt)")
    parser.add_argument("--device-count", type=int, default=1)
    parser.add_argument("--n", type=int, default=300, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.n, args.repeats)
    else:
        report(args.backend, measure(args.backend, args.device_count, args.n, args.repeats))


if __name__ == "__main__":
    main()
