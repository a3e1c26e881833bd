"""Execute of ``x + 1`` on f32[8], one device: ifrtpy._pjrt vs jax.jit vs the floor.

The floor is the same PJRT execute + await + destroy, called from a Cython loop with no
Python in between (benchmarks/_floor.pyx). Each figure is the median over repeats of a
batch of back-to-back executes, after a warm-up; all three run in this one process.

    python benchmarks/bench_execute.py [--n 20000] [--repeats 15]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

from _build import load_floor


def median_us(fn, n, repeats):
    fn(n // 10)
    return statistics.median(fn(n) / n * 1e6 for _ in range(repeats))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    import jax
    from jaxlib import xla_client as xc

    from ifrtpy import _pjrt

    floor = load_floor()
    x = np.arange(8, dtype=np.float32)
    client = _pjrt.create_client(_pjrt.load_plugin(), {"cpu_device_count": 1})
    text = jax.jit(lambda v: v + 1).lower(x).as_text()
    exe = _pjrt.compile(client, text.encode(), xc.CompileOptions().SerializeAsString())
    arg, _ = _pjrt.buffer_from_host_buffer(client, x, client.devices[0])

    def ifrtpy_loop(n):
        lists = [[arg]]
        start = time.perf_counter()
        for _ in range(n):
            _, events = exe.execute(lists)
            events[0].await_()
        return time.perf_counter() - start

    f = jax.jit(lambda v: v + 1)
    xj = jax.device_put(x)

    def jax_loop(n):
        start = time.perf_counter()
        for _ in range(n):
            f(xj).block_until_ready()
        return time.perf_counter() - start

    results = {
        "floor (Cython loop)": median_us(lambda n: floor.execute_loop(exe, arg, n), args.n, args.repeats),
        "ifrtpy._pjrt": median_us(ifrtpy_loop, args.n, args.repeats),
        "jax.jit": median_us(jax_loop, args.n, args.repeats),
    }
    base = results["floor (Cython loop)"]
    print(f"execute x+1 f32[8], median of {args.repeats} x {args.n}")
    for name, us in results.items():
        print(f"  {name:22s} {us:7.2f} us   {us / base:5.2f}x floor")


if __name__ == "__main__":
    main()
