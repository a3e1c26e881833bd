"""Host <-> device transfers through the Array API, next to the floors, the plugin and jax.

Floors, measured in the same run: the plugin's own BufferFromHostBuffer called from a
Cython loop (small puts), and a NumPy copy of the array into freshly allocated memory
(large transfers: a transfer into a fresh buffer page-faults as that copy does; see
shared/reference/pjrt_floor.md). "plugin" is the bare ``ifrtpy._pjrt`` call (PJRT's own
copy: kImmutableOnlyDuringCall per shard, or ToHostBuffer into a new array). jax gets
the same float32 array (its canonical dtype, so it converts nothing). Each figure is the
median over repeats of one operation on a new result; ``--runs`` runs it all that many
times and reports each figure's median run. "x floor" is floor time / time (> 1: faster
than the floor); "flt/op" is ifrtpy's minor page faults per operation.

    cd benchmarks && PYTHONPATH=.. python bench_transfer.py [--repeats 9] [--runs 3] [--plugin NAME]
"""

import argparse
import os
import resource
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import numpy as np

from _build import load_floor

MiB = 1 << 20


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def median_s(fn, repeats, number=1, setup=None):
    """Median seconds per call of ``fn(setup())`` (setup untimed), and faults per call."""
    fn(setup() if setup else None)
    times, faults = [], []
    for _ in range(repeats):
        arg = setup() if setup else None
        f0 = _faults()
        start = time.perf_counter()
        for _ in range(number):
            fn(arg)
        times.append((time.perf_counter() - start) / number)
        faults.append((_faults() - f0) / number)
        del arg
    return statistics.median(times), statistics.median(faults)


def sharded_get(name, data, t_floor, floor_name, r, client, sharded, jsharded, memories,
                _pjrt, jax, number=1):
    """The row of reading ``data`` back from an array split over the devices: the plugin's
    copies of each shard into one new array, ``np.asarray`` of the ifrtpy array, and
    jax's first read of a new array (jax caches an array's host value)."""
    buffers = [_pjrt.buffer_from_host_buffer(client._handle, p, None, m, 0)[0]
               for p, m in zip(np.split(data, len(memories)), memories)]

    def plugin_get(_):
        out = np.empty_like(data)
        events = [b.to_host_buffer(o)[1] for b, o in zip(buffers, np.split(out, len(buffers)))]
        for event in events:
            event.await_()
        return out

    t_plugin = median_s(plugin_get, r, number)[0]
    array = client.make_array_from_host_buffer(data, sharded)
    t_ours, faults = median_s(lambda _: np.asarray(array), r, number)
    fresh = [jax.device_put(data, jsharded).block_until_ready() for _ in range(number)]

    def jax_get(arrays):
        for ja in arrays:
            np.array(ja)

    t_jax = median_s(jax_get, r, setup=lambda: [jax.device_put(data, jsharded) for _ in fresh])[0]
    return name, t_floor, t_plugin, t_ours, t_jax / number, faults, floor_name


def measure(r, floor, client, jax, _pjrt, ifrt):
    devices = client.devices()
    dev0 = devices[0]
    one = ifrt.SingleDeviceSharding(dev0)
    mesh = ifrt.Mesh(np.array(devices), ("x",))
    sharded = ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x"))
    memories = [d.memory(one.memory_kind)._handle for d in devices]
    jdev = jax.devices()[0]
    jsharded = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("x",)),
                                          jax.sharding.PartitionSpec("x"))
    rows = []

    # 4 KiB put: per-call overhead against the raw plugin call.
    small = np.arange(1024, dtype=np.float32)
    n = 20000
    t_floor = median_s(lambda _: floor.put_loop(client._handle, small, dev0._handle, n), r)[0] / n
    handle, memory = client._handle, memories[0]

    def plugin_loop(_):  # the loops are written out: no extra Python call per put
        for _ in range(n):
            _pjrt.buffer_from_host_buffer(handle, small, None, memory, 0)

    def ours_loop(_):
        for _ in range(n):
            client.make_array_from_host_buffer(small, one)

    def jax_loop(_):
        for _ in range(n // 10):
            jax.device_put(small, jdev)

    t_plugin = median_s(plugin_loop, r)[0] / n
    t_ours, f_ours = median_s(ours_loop, r)
    t_ours, f_ours = t_ours / n, f_ours / n
    t_jax = median_s(jax_loop, r)[0] / (n // 10)
    rows.append(("put 4 KiB", t_floor, t_plugin, t_ours, t_jax, f_ours, "raw plugin call (Cython loop)"))

    big = np.random.default_rng(0).random(64 * MiB // 4, dtype=np.float32)  # 64 MiB
    pieces = np.split(big, len(devices))
    fresh_copy = "NumPy copy into fresh memory"

    def copy(_):
        out = np.empty_like(big)
        np.copyto(out, big)
        return out

    t_copy = median_s(copy, r)[0]

    def plugin_put(_):
        return _pjrt.buffer_from_host_buffer(client._handle, big, None, memories[0], 0)

    t_plugin = median_s(plugin_put, r)[0]
    t_put, f_put = median_s(lambda _: client.make_array_from_host_buffer(big, one).block_until_ready(), r)
    t_jput = median_s(lambda _: jax.device_put(big, jdev).block_until_ready(), r)[0]
    rows.append(("put 64 MiB", t_copy, t_plugin, t_put, t_jput, f_put, fresh_copy))

    buffer, _ = plugin_put(None)
    t_plugin = median_s(lambda _: buffer.to_numpy(), r)[0]
    a = client.make_array_from_host_buffer(big, one)
    t_get, f_get = median_s(lambda _: np.array(a), r)  # a copy: np.asarray is a view
    # jax caches an array's host value: time the first read of a new array each time.
    t_jget = median_s(lambda ja: np.array(ja), r,
                      setup=lambda: jax.device_put(big, jdev).block_until_ready())[0]
    rows.append(("get 64 MiB", t_copy, t_plugin, t_get, t_jget, f_get, fresh_copy))

    def plugin_sharded_put(_):
        return [_pjrt.buffer_from_host_buffer(client._handle, p, None, m, 0)[0]
                for p, m in zip(pieces, memories)]

    t_plugin = median_s(plugin_sharded_put, r)[0]
    t_sput, f_sput = median_s(
        lambda _: client.make_array_from_host_buffer(big, sharded).block_until_ready(), r)
    t_jsput = median_s(lambda _: jax.device_put(big, jsharded).block_until_ready(), r)[0]
    rows.append(("sharded put 64 MiB / 8", t_copy, t_plugin, t_sput, t_jsput, f_sput, fresh_copy))

    rows.append(sharded_get("sharded get 64 MiB / 8", big, t_copy, fresh_copy, r,
                            client, sharded, jsharded, memories, _pjrt, jax))
    medium = big[:256 * 1024 // 4]  # 256 KiB: the per-call cost shows
    t_medium = median_s(lambda _: np.copyto(np.empty_like(medium), medium), r, number=100)[0]
    rows.append(sharded_get("sharded get 256 KiB / 8", medium, t_medium, fresh_copy, r,
                            client, sharded, jsharded, memories, _pjrt, jax, number=100))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--plugin", default=None, help="a plugin name (default: the default CPU plugin)")
    args = parser.parse_args()

    import jax
    import ifrtpy as ifrt
    from ifrtpy import _pjrt

    floor = load_floor()
    client = ifrt.get_client("pjrt", plugin=args.plugin, device_count=8)
    print(f"plugin {client.plugin.path} (PJRT {'.'.join(map(str, client.plugin.api_version))})")
    runs = [measure(args.repeats, floor, client, jax, _pjrt, ifrt) for _ in range(args.runs)]
    rows = []
    for i, (name, *_, what) in enumerate(runs[0]):
        values = list(zip(*[run[i][1:6] for run in runs]))
        rows.append((name, *[statistics.median(v) for v in values], what))

    print(f"{'operation':24s} {'floor':>9s} {'plugin':>9s} {'ifrtpy':>9s} {'jax':>9s} "
          f"{'x floor':>8s} {'plugin':>7s} {'jax':>7s} {'flt/op':>7s}  floor")
    for name, tf, tp, to, tj, faults, what in rows:
        unit, scale = ("us", 1e6) if tf < 1e-3 else ("ms", 1e3)
        print(f"{name:24s} {tf*scale:7.2f}{unit} {tp*scale:7.2f}{unit} {to*scale:7.2f}{unit} "
              f"{tj*scale:7.2f}{unit} {tf/to:7.2f}x {tf/tp:6.2f}x {tf/tj:6.2f}x {faults:7.0f}  {what}")
    if args.runs > 1:
        print(f"(median of {args.runs} runs of {args.repeats} repeats each; x columns: floor/time)")


if __name__ == "__main__":
    main()
