"""Execute through ifrtpy, next to jax and the floor, in one run.

1. ``x + 1`` on f32[8], one device: the Array API (``execute`` + wait for the output; and
   the ``exe(x)`` shorthand), ``ifrtpy._pjrt`` (execute + await), jax.jit, and the floor: the same PJRT execute +
   await + destroy called from a Cython loop with no Python in between
   (benchmarks/_floor.pyx).
2. SPMD ``x * 2 + 1`` over a 64 MiB f32 array sharded over 8 devices: ifrtpy vs jax.jit.

Each figure is the median over repeats of a batch of back-to-back calls, after a warm-up;
the small-call loops take turns within each repeat.

    python benchmarks/bench_execute.py [--n 20000] [--repeats 15]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import numpy as np

from _build import load_floor


def median_us(fn, n, repeats):
    fn(max(1, n // 10))
    return statistics.median(fn(n) / n * 1e6 for _ in range(repeats))


def interleaved_median_us(fns, n, repeats):
    """Median µs per call of each loop in ``fns``, the loops taking turns in every repeat
    so that a slow stretch of the machine falls on all of them alike."""
    for fn in fns.values():
        fn(max(1, n // 10))
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(fn(n) / n * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def timed(body):
    def run(n):
        start = time.perf_counter()
        for _ in range(n):
            body()
        return time.perf_counter() - start
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    import jax

    import ifrtpy as ifrt

    floor = load_floor()
    client = ifrt.get_client("pjrt", device_count=8)
    devices = client.devices()
    x = np.arange(8, dtype=np.float32)
    exe = client.compile(jax.jit(lambda v: v + 1).lower(x))
    a = ifrt.device_put(x, devices[0])
    handle, buffers = exe._handle, [a.buffers]

    f = jax.jit(lambda v: v + 1)
    xj = jax.device_put(x, jax.devices()[0])

    # The loops are written out: no Python call per iteration beyond the one measured.
    def pjrt_loop(n):
        start = time.perf_counter()
        for _ in range(n):
            _, events = handle.execute_by_argument(buffers)
            events[0].await_()
        return time.perf_counter() - start

    def array_loop(n):
        start = time.perf_counter()
        for _ in range(n):
            exe.execute([a]).outputs[0].block_until_ready()
        return time.perf_counter() - start

    def call_loop(n):
        start = time.perf_counter()
        for _ in range(n):
            exe(a)[0].block_until_ready()
        return time.perf_counter() - start

    def jax_loop(n):
        start = time.perf_counter()
        for _ in range(n):
            f(xj).block_until_ready()
        return time.perf_counter() - start

    small = interleaved_median_us({
        "floor (Cython loop)": lambda n: floor.execute_loop(handle, a.buffers[0], n),
        "ifrtpy._pjrt": pjrt_loop,
        "ifrtpy Array API": array_loop,
        "ifrtpy exe(x)": call_loop,
        "jax.jit": jax_loop,
    }, args.n, args.repeats)
    base = small["floor (Cython loop)"]
    print(f"execute x+1 f32[8] on one device, median of {args.repeats} x {args.n}")
    for name, us in small.items():
        print(f"  {name:22s} {us:8.2f} us   {us / base:5.2f}x floor")

    big = np.random.default_rng(0).random((8, 2 * 1024 * 1024), dtype=np.float32)  # 64 MiB
    jmesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    jsharding = jax.sharding.NamedSharding(jmesh, jax.sharding.PartitionSpec("x"))
    g = jax.jit(lambda v: v * 2 + 1, in_shardings=jsharding, out_shardings=jsharding)
    bj = jax.device_put(big, jsharding)
    sharding = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))
    spmd = client.compile(g.lower(big), ifrt.CompileOptions(devices=devices, num_partitions=8))
    b = client.make_array_from_host_buffer(big, sharding)
    np.testing.assert_allclose(np.asarray(spmd.execute([b]).outputs[0]), big * 2 + 1, rtol=1e-6)
    n = 20
    ours = median_us(timed(lambda: spmd.execute([b]).outputs[0].block_until_ready()), n, args.repeats)
    theirs = median_us(timed(lambda: g(bj).block_until_ready()), n, args.repeats)
    print(f"SPMD x*2+1 on f32[8, 2M] (64 MiB) over 8 devices, median of {args.repeats} x {n}")
    print(f"  {'ifrtpy':22s} {ours / 1e3:8.2f} ms   {ours / theirs:5.2f}x jax")
    print(f"  {'jax.jit':22s} {theirs / 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
