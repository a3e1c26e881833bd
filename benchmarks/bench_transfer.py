"""Host <-> device transfers through the Array API, next to jax and the floors.

Floors, measured in the same run: the plugin's own BufferFromHostBuffer called from a
Cython loop (small puts), and a NumPy copy into freshly allocated memory (large
transfers: the plugin's fresh buffers page-fault just as such a copy does).
Ratios > 1 mean faster than the floor ("x floor" is floor time / our time).

    python benchmarks/bench_transfer.py [--repeats 7]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import numpy as np

from _build import load_floor

MiB = 1 << 20


def median_s(fn, repeats, number=1):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    r = args.repeats

    import jax
    import ifrtpy as ifrt
    from ifrtpy import _pjrt

    floor = load_floor()
    client = ifrt.get_client("pjrt", device_count=8)
    devices = client.devices()
    dev0 = devices[0]
    one = ifrt.SingleDeviceSharding(dev0)
    mesh = ifrt.Mesh(np.array(devices), ("x",))
    sharded = ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x"))
    jdev = jax.devices()[0]
    jsharded = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("x",)),
                                          jax.sharding.PartitionSpec("x"))

    rows = []

    # 4 KiB put: per-call overhead against the raw plugin call.
    small = np.arange(1024, dtype=np.float32)
    n = 20000
    t_floor = median_s(lambda: floor.put_loop(client._handle, small, dev0._handle, n), r) / n
    t_ours = median_s(lambda: client.make_array_from_host_buffer(small, one), r, n)
    t_jax = median_s(lambda: jax.device_put(small, jdev), r, 2000)
    rows.append(("put 4 KiB", t_floor, t_ours, t_jax, "raw plugin call (Cython loop)"))

    big = np.random.default_rng(0).random(64 * MiB // 8)  # f64, 64 MiB

    def fresh_copy():
        out = np.empty_like(big)
        np.copyto(out, big)
        return out

    t_copy = median_s(fresh_copy, r)
    t_put = median_s(lambda: client.make_array_from_host_buffer(big, one).block_until_ready(), r)
    t_jput = median_s(lambda: jax.device_put(big, jdev).block_until_ready(), r)
    rows.append(("put 64 MiB", t_copy, t_put, t_jput, "NumPy copy into fresh memory"))

    a = client.make_array_from_host_buffer(big, one)
    ja = jax.device_put(big, jdev)
    t_get = median_s(lambda: np.asarray(a), r)
    t_jget = median_s(lambda: np.asarray(ja.copy()) if False else np.array(ja), r)
    rows.append(("get 64 MiB", t_copy, t_get, t_jget, "NumPy copy into fresh memory"))

    t_sput = median_s(lambda: client.make_array_from_host_buffer(big, sharded).block_until_ready(), r)
    t_jsput = median_s(lambda: jax.device_put(big, jsharded).block_until_ready(), r)
    rows.append(("sharded put 64 MiB / 8", t_copy, t_sput, t_jsput, "NumPy copy into fresh memory"))

    s = client.make_array_from_host_buffer(big, sharded)
    js = jax.device_put(big, jsharded)
    t_sget = median_s(lambda: np.asarray(s), r)
    t_jsget = median_s(lambda: np.array(js), r)
    rows.append(("sharded get 64 MiB / 8", t_copy, t_sget, t_jsget, "NumPy copy into fresh memory"))

    print(f"{'operation':24s} {'floor':>10s} {'ifrtpy':>10s} {'jax':>10s} {'floor/ifrtpy':>13s} {'floor/jax':>10s}  floor")
    for name, tf, to, tj, what in rows:
        unit, scale = ("us", 1e6) if tf < 1e-3 else ("ms", 1e3)
        print(f"{name:24s} {tf*scale:8.2f}{unit} {to*scale:8.2f}{unit} {tj*scale:8.2f}{unit} "
              f"{tf/to:12.2f}x {tf/tj:9.2f}x  {what}")


if __name__ == "__main__":
    main()
