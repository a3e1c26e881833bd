"""A host callback round trip through ifrtpy, next to jax's ``pure_callback``, in one run.

The program takes f32[256] (1 KiB), hands it to a Python function on the host that
returns it unchanged (1 KiB back), and adds one: ``jax.pure_callback`` lowered by jax,
run by ifrtpy's PjRt backend (the default plugin) and by jax.jit. The same program
without the callback, run by each, is the floor of its executes: the difference is what
the round trip costs. Also: the builder's ``host_callback`` (the same call, no jax).

Each figure is the median over repeats of a batch of back-to-back calls (execute and wait
for the output), after a warm-up; the loops compared take turns within each repeat.

    python benchmarks/bench_callbacks.py [--n 2000] [--repeats 11]
"""

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

from _timing import interleaved_median_us, timed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()

    import jax

    import ifrtpy as ifrt
    from ifrtpy.builder import Builder

    x = np.arange(256, dtype=np.float32)
    like = jax.ShapeDtypeStruct(x.shape, x.dtype)

    def identity(v):
        return v

    with_callback = jax.jit(lambda v: jax.pure_callback(identity, like, v) + 1)
    without = jax.jit(lambda v: v + 1)

    client = ifrt.get_client("pjrt", device_count=1)
    a = ifrt.device_put(x, client.devices()[0])
    ours = client.compile(ifrt.HloProgram(with_callback.lower(x)))
    ours_floor = client.compile(ifrt.HloProgram(without.lower(x)))
    b = Builder("round_trip")
    p = b.parameter(x.shape, np.float32)
    built = client.compile(b.build(b.host_callback(identity, [p], (x.shape, np.float32)) + 1))
    xj = jax.device_put(x, jax.devices()[0])
    for run in (lambda: ours(a)[0], lambda: built(a)[0], lambda: with_callback(xj)):
        np.testing.assert_array_equal(np.asarray(run()), x + 1)

    times = interleaved_median_us({
        "ifrtpy, pure_callback": timed(lambda: ours(a)[0].block_until_ready()),
        "ifrtpy, builder host_callback": timed(lambda: built(a)[0].block_until_ready()),
        "ifrtpy, no callback": timed(lambda: ours_floor(a)[0].block_until_ready()),
        "jax.jit, pure_callback": timed(lambda: with_callback(xj).block_until_ready()),
        "jax.jit, no callback": timed(lambda: without(xj).block_until_ready()),
    }, args.n, args.repeats)
    jax_time = times["jax.jit, pure_callback"]
    print(f"host callback round trip, f32[256] (1 KiB) in and out, one CPU device, "
          f"median of {args.repeats} x {args.n}")
    for name, us in times.items():
        print(f"  {name:32s} {us:8.1f} us   {us / jax_time:5.2f}x jax's pure_callback")
    ours_trip = times["ifrtpy, pure_callback"] - times["ifrtpy, no callback"]
    jax_trip = jax_time - times["jax.jit, no callback"]
    print(f"  the round trip alone (minus the execute without it): ifrtpy {ours_trip:.1f} us, "
          f"jax {jax_trip:.1f} us ({ours_trip / jax_trip:.2f}x)")


if __name__ == "__main__":
    main()
