"""Execute through ifrtpy, next to jax and the floor, in one run.

1. ``x + 1`` on f32[8], one device: the Array API (``execute`` + wait for the output; and
   the ``exe(x)`` shorthand), ``ifrtpy._pjrt`` (execute + await), jax.jit, and the floor:
   the same PJRT execute + await + destroy called from a Cython loop with no Python in
   between (benchmarks/_floor.pyx); and the floor making the PJRT calls ifrtpy's
   ``exe(x)[0].block_until_ready()`` makes (the completion event asked whether it fired
   and for its error, not awaited). Beside them, what the shape of the call costs with
   nothing behind it (``_floor.EmptyCall``: Python into C, the GIL released once, a new
   object returned in a list), and the floor's calls made by one such Python call
   (``_floor.FloorCall``, its output an object that destroys the buffer when freed): the
   least a Python ``exe(x)`` of this shape can cost with the plugin running between calls.
2. SPMD ``x * 2 + 1`` over an f32 array split over 8 devices, 64 MiB (bound by the
   plugin's own work, the same for both) and 512 bytes (bound by dispatch): ifrtpy vs
   jax.jit.

Each figure is the median over repeats of a batch of back-to-back calls, after a warm-up;
the loops compared take turns within each repeat.

    python benchmarks/bench_execute.py [--n 20000] [--repeats 15] [--plugin NAME]

``--plugin`` picks a plugin by name (default: the default CPU plugin; e.g. ``xla-cpu-pjrt``
or ``fastatomstruct-xla-cpu``, see docs/plugins.md).
"""

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import numpy as np

from _build import load_floor
from _timing import interleaved_median_us, timed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--plugin", default=None, help="a plugin name (default: the default CPU plugin)")
    args = parser.parse_args()

    import jax

    import ifrtpy as ifrt

    floor = load_floor()
    client = ifrt.get_client("pjrt", plugin=args.plugin, device_count=8)
    print(f"plugin {client.plugin.path} (PJRT {'.'.join(map(str, client.plugin.api_version))})")
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

    empty = floor.EmptyCall()
    floor_call = floor.FloorCall(handle)
    arg = a.buffers[0]

    def floor_call_loop(n):
        start = time.perf_counter()
        for _ in range(n):
            floor_call(arg)[0].block_until_ready()
        return time.perf_counter() - start

    def empty_loop(n):
        start = time.perf_counter()
        for _ in range(n):
            empty(a)[0].block_until_ready()
        return time.perf_counter() - start

    def jax_loop(n):
        start = time.perf_counter()
        for _ in range(n):
            f(xj).block_until_ready()
        return time.perf_counter() - start

    small = interleaved_median_us({
        "floor (Cython loop)": lambda n: floor.execute_loop(handle, a.buffers[0], n),
        "floor, ifrtpy's calls": lambda n: floor.execute_loop(handle, a.buffers[0], n, True),
        "ifrtpy._pjrt": pjrt_loop,
        "ifrtpy Array API": array_loop,
        "floor as a Python call": floor_call_loop,
        "ifrtpy exe(x)": call_loop,
        "jax.jit": jax_loop,
        "empty call (shape)": empty_loop,
    }, args.n, args.repeats)
    base = small["floor (Cython loop)"]
    print(f"execute x+1 f32[8] on one device, median of {args.repeats} x {args.n}")
    shape = small.pop("empty call (shape)")
    for name, us in small.items():
        print(f"  {name:22s} {us:8.2f} us   {us / base:5.2f}x floor   {us / small['jax.jit']:5.2f}x jax")
    least = base + shape
    print(f"  the call's shape alone costs {shape:.2f} us: floor + shape = {least:.2f} us "
          f"({least / base:.2f}x floor); exe(x) is {small['ifrtpy exe(x)'] / least:.2f}x that")

    for columns, n in ((2 * 1024 * 1024, 20), (16, 2000)):
        spmd_case(client, jax, ifrt, columns, n, args.repeats)


def spmd_case(client, jax, ifrt, columns, n, repeats):
    """``x * 2 + 1`` over f32[8, columns] split over 8 devices: ifrtpy against jax.jit,
    taking turns."""
    devices = client.devices()
    x = np.random.default_rng(0).random((8, columns), dtype=np.float32)
    jmesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    jsharding = jax.sharding.NamedSharding(jmesh, jax.sharding.PartitionSpec("x"))
    g = jax.jit(lambda v: v * 2 + 1, in_shardings=jsharding, out_shardings=jsharding)
    xj = jax.device_put(x, jsharding)
    sharding = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))
    spmd = client.compile(g.lower(x), ifrt.CompileOptions(devices=devices, num_partitions=8))
    a = client.make_array_from_host_buffer(x, sharding)
    np.testing.assert_allclose(np.asarray(spmd.execute([a]).outputs[0]), x * 2 + 1, rtol=1e-6)
    times = interleaved_median_us({
        "ifrtpy": timed(lambda: spmd.execute([a]).outputs[0].block_until_ready()),
        "jax.jit": timed(lambda: g(xj).block_until_ready()),
    }, n, repeats)
    ours, theirs = times["ifrtpy"], times["jax.jit"]
    size = f"{x.nbytes >> 20} MiB" if x.nbytes >= 1 << 20 else f"{x.nbytes} bytes"
    print(f"SPMD x*2+1 on f32[8, {columns}] ({size}) over 8 devices, median of {repeats} x {n}")
    print(f"  {'ifrtpy':22s} {ours:10.1f} us   {ours / theirs:5.2f}x jax")
    print(f"  {'jax.jit':22s} {theirs:10.1f} us")

if __name__ == "__main__":
    main()
