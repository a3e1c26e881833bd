"""Command line: ``python -m ifrtpy info|demo [--plugin PATH] [--devices N]``.

``info`` prints the plugin, its attributes, devices and memories. ``demo`` does the same,
then puts a sharded array on the devices, shows its shards, and runs a StableHLO program
over it (SPMD), checking every result against NumPy.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

# y = x * 2 + 1 on f32[R, 4], rows split over all devices (GSPMD sharding annotations).
DEMO_PROGRAM = """
func.func public @main(%x: tensor<{rows}x4xf32> {{mhlo.sharding = "{{devices=[{n},1]<=[{n}]}}"}})
    -> (tensor<{rows}x4xf32> {{mhlo.sharding = "{{devices=[{n},1]<=[{n}]}}"}}) {{
  %two = stablehlo.constant dense<2.0> : tensor<{rows}x4xf32>
  %one = stablehlo.constant dense<1.0> : tensor<{rows}x4xf32>
  %0 = stablehlo.multiply %x, %two : tensor<{rows}x4xf32>
  %1 = stablehlo.add %0, %one : tensor<{rows}x4xf32>
  return %1 : tensor<{rows}x4xf32>
}}
"""


def info(client) -> None:
    plugin = client.plugin
    major, minor = plugin.api_version
    print(f"plugin   {plugin.path}")
    print(f"         PJRT API {major}.{minor}, attributes {plugin.attributes}")
    print(f"platform {client.platform_name} ({client.platform_version}), "
          f"process {client.process_index()}")
    print(f"devices  {len(client.devices())} ({len(client.addressable_devices())} addressable)")
    for device in client.devices():
        default = device.default_memory()
        memories = ", ".join(
            f"{m.kind}{' (default)' if m is default else ''}" for m in device.memories())
        print(f"  {device.id}: {device.to_string()} kind={device.kind!r} memories: {memories}")
    from ifrtpy.plugins import plugins_report
    print(plugins_report())


def demo(client) -> None:
    import ifrtpy as ifrt

    info(client)
    devices = client.addressable_devices()
    n = len(devices)
    x = np.arange(n * 2 * 4, dtype=np.float32).reshape(n * 2, 4)
    sharding = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))
    a = client.make_array_from_host_buffer(x, sharding)
    print(f"\narray    {a.dtype}{list(a.shape)} split over {n} devices by {sharding}")
    for shard in a.disassemble_into_single_device_arrays():
        print(f"  device {shard.sharding.devices[0].id}: rows {np.asarray(shard)[:, 0].tolist()}")
    np.testing.assert_array_equal(np.asarray(a), x)

    program = ifrt.HloProgram(DEMO_PROGRAM.format(rows=n * 2, n=n))
    exe = client.compile(program, ifrt.CompileOptions(devices=devices, num_partitions=n))
    (y,) = exe(a)
    np.testing.assert_array_equal(np.asarray(y), x * 2 + 1)
    print(f"\nprogram  y = x * 2 + 1, compiled for {n} devices (SPMD)")
    print(f"  output sharding {y.sharding}")
    print(f"  y[:, 0] = {np.asarray(y)[:, 0].tolist()}  (equals NumPy)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ifrtpy", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["info", "demo"])
    parser.add_argument("--plugin", help="path of a PJRT plugin .so (default: xla-cpu-pjrt)")
    parser.add_argument("--devices", type=int, default=None, help="cpu_device_count option")
    args = parser.parse_args(argv)

    import ifrtpy as ifrt

    client = ifrt.get_client("pjrt", plugin=args.plugin, device_count=args.devices)
    {"info": info, "demo": demo}[args.command](client)
    return 0


if __name__ == "__main__":
    sys.exit(main())
