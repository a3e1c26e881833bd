"""The jax backend (``get_client("jax")``) next to jax called directly, in one run.

1. ``x + 1``, f32[8] on one device: ``execute`` + wait through the adapter vs
   ``jax.jit`` + wait (dispatch-bound: the adapter's Python checks show here).
2. ``x + 1`` on f32 split over 8 devices, 64 MiB (bound by XLA's own work).
3. A 64 MiB f32 host array put split over 8 devices, and waited for: the adapter with
   IMMUTABLE_ZERO_COPY (jax's own semantics: it may alias the host data) and with the
   default IMMUTABLE_ONLY_DURING_CALL (the adapter copies first), vs ``jax.device_put``.

Each figure is the median over repeats of a batch of back-to-back calls after a warm-up,
the loops compared taking turns within each repeat. Target: adapter <= 1.2x jax.

    python benchmarks/bench_jax_backend.py [--n 2000] [--repeats 9]
"""

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import numpy as np

from _timing import interleaved_median_us, timed

ADD_ONE = """module @add_one {{
  func.func @main(%x: tensor<{n}xf32> {{mhlo.sharding = "{s}"}})
      -> (tensor<{n}xf32> {{mhlo.sharding = "{s}"}}) {{
    %one = stablehlo.constant dense<1.0> : tensor<{n}xf32>
    %y = stablehlo.add %x, %one : tensor<{n}xf32>
    return %y : tensor<{n}xf32>
  }}
}}"""


def report(title, results, adapter_names, jax_name):
    print(title)
    base = results[jax_name]
    for name, us in results.items():
        print(f"  {name:34s} {us:10.2f} us   {us / base:5.2f}x jax")
    for name in adapter_names:
        ratio = results[name] / base
        print(f"  -> {name}: {'meets' if ratio <= 1.2 else 'MISSES'} the 1.2x target ({ratio:.2f}x)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    import jax

    import ifrtpy as ifrt

    client = ifrt.get_client("jax", platform="cpu")
    devices = client.addressable_devices()[:8]
    mesh = ifrt.Mesh(np.array(devices), ("x",))
    split = ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x"))
    jax_split = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",)),
                                           jax.sharding.PartitionSpec("x"))

    # 1. x + 1 on one device
    exe = client.compile(ADD_ONE.format(n=8, s="{maximal device=0}"),
                         ifrt.CompileOptions(devices=devices[:1]))
    x = client.make_array_from_host_buffer(np.arange(8, dtype=np.float32),
                                           ifrt.SingleDeviceSharding(devices[0]))
    jit = jax.jit(lambda v: v + 1)
    jx = jax.device_put(np.arange(8, dtype=np.float32), jax.devices()[0])
    results = interleaved_median_us({
        "adapter execute + wait": timed(lambda: exe.execute([x]).outputs[0].block_until_ready()),
        "jax.jit + wait": timed(lambda: jit(jx).block_until_ready()),
    }, args.n, args.repeats)
    report("x + 1, f32[8], one device", results, ["adapter execute + wait"], "jax.jit + wait")

    # 2. x + 1 over 8 devices, 64 MiB
    count = 64 * 2**20 // 4
    host = np.random.default_rng(0).random(count, dtype=np.float32)
    exe8 = client.compile(ADD_ONE.format(n=count, s="{devices=[8]<=[8]}"),
                          ifrt.CompileOptions(devices=devices, num_partitions=8))
    big = client.make_array_from_host_buffer(host, split)
    jbig = jax.device_put(host, jax_split)
    jit8 = jax.jit(lambda v: v + 1, out_shardings=jax_split)
    small_n = max(1, args.n // 100)
    results = interleaved_median_us({
        "adapter execute + wait": timed(lambda: exe8.execute([big]).outputs[0].block_until_ready()),
        "jax.jit + wait": timed(lambda: jit8(jbig).block_until_ready()),
    }, small_n, args.repeats)
    report("x + 1, f32 64 MiB over 8 devices", results, ["adapter execute + wait"], "jax.jit + wait")

    # 3. 64 MiB sharded put
    zero_copy = ifrt.HostBufferSemantics.IMMUTABLE_ZERO_COPY
    results = interleaved_median_us({
        "adapter put (ZERO_COPY) + wait": timed(
            lambda: client.make_array_from_host_buffer(host, split, zero_copy).block_until_ready()),
        "adapter put (ONLY_DURING_CALL) + wait": timed(
            lambda: client.make_array_from_host_buffer(host, split).block_until_ready()),
        "jax.device_put + wait": timed(lambda: jax.device_put(host, jax_split).block_until_ready()),
    }, small_n, args.repeats)
    report("put f32 64 MiB split over 8 devices", results,
           ["adapter put (ZERO_COPY) + wait", "adapter put (ONLY_DURING_CALL) + wait"],
           "jax.device_put + wait")


if __name__ == "__main__":
    main()
