"""What printing a large array costs: ``repr(a)`` and ``str(a)`` of a 1 GiB float32 array
on one device and split by rows over 8, next to ``np.array(a)`` (a copy of it all) and to
``repr`` of the same jax.Array (jax reads the whole array to print it).

An ifrtpy repr reads only the elements NumPy prints, from the shards that hold them
(docs/concepts.md, "Arrays: what they print"), so its time does not grow with the array.

    cd benchmarks && PYTHONPATH=.. python bench_repr.py [--mib 1024] [--repeats 5]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import numpy as np


def median_time(fn, repeats, fresh=lambda: None):
    """The median time of ``fn(fresh())`` (``fresh`` untimed)."""
    times = []
    for _ in range(repeats):
        argument = fresh()
        start = time.perf_counter()
        fn(argument)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="the array's size (default 1024)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import ifrtpy as ifrt
    import jax

    side = int((args.mib * (1 << 20) // 4) ** 0.5) // 8 * 8
    x = np.arange(side * side, dtype=np.float32).reshape(side, side)
    client = ifrt.get_client("pjrt", device_count=8)
    mesh = ifrt.Mesh(np.array(client.devices()), ("x",))
    print(f"float32[{side}, {side}] ({x.nbytes / (1 << 20):.0f} MiB), median of {args.repeats}")
    for name, sharding, jax_sharding in [
            ("1 device", ifrt.SingleDeviceSharding(client.devices()[0]), jax.devices()[0]),
            ("rows over 8", ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x")),
             jax.sharding.NamedSharding(jax.make_mesh((8,), ("x",)), jax.sharding.PartitionSpec("x")))]:
        a = client.make_array_from_host_buffer(x, sharding).block_until_ready()
        j = jax.device_put(x, jax_sharding).block_until_ready()
        rows = [("repr(a)", lambda _: repr(a), lambda: None),
                ("str(a)", lambda _: str(a), lambda: None),
                ("np.array(a)", lambda _: np.array(a), lambda: None),
                # a new jax.Array each time: jax keeps the host copy a repr made
                ("repr(jax.Array)", repr, lambda: (j + 0).block_until_ready())]
        for what, fn, fresh in rows:
            seconds = median_time(fn, args.repeats, fresh)
            print(f"  {name:12s} {what:16s} {seconds * 1e3:10.3f} ms")
        a.delete()
        j.delete()


if __name__ == "__main__":
    main()
