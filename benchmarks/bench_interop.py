"""Zero-copy interop next to jax's own paths, in one run.

Rows (each the median over repeats of many calls, ifrtpy and jax measured in turns):

* ifrtpy -> NumPy: ``np.asarray(a)`` (a read-only view) vs ``np.asarray(jax_array)``
* ifrtpy -> jax: ``ifrtpy.to_jax(a)`` vs ``jax.dlpack.from_dlpack(jax_array)``
* NumPy -> ifrtpy: ``ifrtpy.from_dlpack(x)`` of a 64-byte-aligned array vs
  ``jax.dlpack.from_dlpack(x)``
* jax -> ifrtpy: ``ifrtpy.from_jax(j)`` vs ``jax.dlpack.from_dlpack(j)``

at 4 KiB and 64 MiB on one device, then a 64 MiB array over 8 devices jax -> ifrtpy ->
jax, and the sharded 64 MiB put of ``make_array_from_host_buffer`` vs ``jax.device_put``.
Targets (checked at the end): zero-copy paths independent of size (64 MiB within 2x of
4 KiB) and within 2x of jax's; the 8-device bridge at most 100 us each way; the sharded
put at least as fast as jax's.

    cd benchmarks && PYTHONPATH=.. python bench_interop.py [--repeats 7]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import numpy as np

MiB = 1 << 20


def per_call(fn, number):
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def in_turns(fns, repeats, number):
    """Median seconds per call of each of ``fns``, measured one after the other in each
    repeat (so that the machine's load falls on all of them alike)."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for t, fn in zip(times, fns):
            t.append(per_call(fn, number))
    return [statistics.median(t) for t in times]


def aligned(nbytes, dtype=np.float32):
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    out = raw[start:start + nbytes].view(dtype)
    out[...] = np.arange(out.size, dtype=dtype)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    import jax

    import ifrtpy as ifrt
    from ifrtpy.interop import jax as ij

    client = ij.default_client()
    dev0, jdev0 = client.devices()[0], jax.devices()[0]
    r = args.repeats
    rows, results = [], {}

    for label, nbytes, number in (("4 KiB", 4096, 2000), ("64 MiB", 64 * MiB, 2000)):
        x = aligned(nbytes)
        a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(dev0))
        j = jax.device_put(x, jdev0).block_until_ready()
        np.asarray(j)
        pairs = {
            "ifrtpy -> NumPy": (lambda: np.asarray(a), lambda: np.asarray(j)),
            "ifrtpy -> jax": (lambda: ij.to_jax(a), lambda: jax.dlpack.from_dlpack(j)),
            "NumPy -> ifrtpy": (lambda: ifrt.from_dlpack(x, client),
                                lambda: jax.dlpack.from_dlpack(x)),
            "jax -> ifrtpy": (lambda: ij.from_jax(j, client), lambda: jax.dlpack.from_dlpack(j)),
        }
        for name, (ours, theirs) in pairs.items():
            n = number if "NumPy ->" not in name or nbytes < MiB else 20  # jax copies there
            t_ours = in_turns([ours], r, number)[0]
            t_jax = in_turns([theirs], r, n)[0]
            results[(name, label)] = (t_ours, t_jax)
            rows.append((f"{name} {label}", t_ours, t_jax))

    mesh = jax.make_mesh((8,), ("x",))
    jsharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    big = np.random.default_rng(0).random(64 * MiB // 4, dtype=np.float32)
    j8 = jax.device_put(big, jsharded).block_until_ready()
    i8 = ij.from_jax(j8, client)
    t_in, t_out = in_turns([lambda: ij.from_jax(j8, client), lambda: ij.to_jax(i8)], r, 500)
    rows.append(("jax -> ifrtpy 64 MiB / 8 devices", t_in, None))
    rows.append(("ifrtpy -> jax 64 MiB / 8 devices", t_out, None))

    sharded = ij.sharding_from_jax(jsharded, client)
    t_put, t_jput = in_turns([
        lambda: client.make_array_from_host_buffer(big, sharded).block_until_ready(),
        lambda: jax.device_put(big, jsharded).block_until_ready(),
    ], r, 3)
    rows.append(("sharded put 64 MiB / 8 devices", t_put, t_jput))

    print(f"{'path':36s} {'ifrtpy':>11s} {'jax':>11s} {'jax/ifrtpy':>10s}")
    for name, ours, theirs in rows:
        j_text = f"{theirs * 1e6:9.1f}us" if theirs is not None else " " * 11
        ratio = f"{theirs / ours:9.2f}x" if theirs is not None else ""
        print(f"{name:36s} {ours * 1e6:9.1f}us {j_text} {ratio}")

    print()
    checks = []
    for name in ("ifrtpy -> NumPy", "ifrtpy -> jax", "NumPy -> ifrtpy", "jax -> ifrtpy"):
        small, large = results[(name, "4 KiB")], results[(name, "64 MiB")]
        checks.append((f"{name}: 64 MiB within 2x of 4 KiB", large[0] <= 2 * small[0]))
        for label in ("4 KiB", "64 MiB"):
            ours, theirs = results[(name, label)]
            checks.append((f"{name} {label}: within 2x of jax", ours <= 2 * theirs))
    checks.append(("8-device bridge jax -> ifrtpy <= 100 us", t_in <= 100e-6))
    checks.append(("8-device bridge ifrtpy -> jax <= 100 us", t_out <= 100e-6))
    checks.append(("sharded put at least as fast as jax", t_put <= t_jput))
    for what, ok in checks:
        print(f"{'PASS' if ok else 'MISS'}  {what}")


if __name__ == "__main__":
    main()
