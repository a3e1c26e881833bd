"""Command line: ``python -m ifrtpy info|demo [--plugin PATH] [--devices N]``.

``info`` prints the plugin, its attributes, devices and memories; ``demo`` does the same,
then compiles a small StableHLO program and runs it on every device, checking the result
against NumPy.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

# y = x * 2 + 1 on f32[8]: StableHLO text the plugin compiles as it is.
DEMO_PROGRAM = """
func.func public @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %two = stablehlo.constant dense<2.0> : tensor<8xf32>
  %one = stablehlo.constant dense<1.0> : tensor<8xf32>
  %0 = stablehlo.multiply %x, %two : tensor<8xf32>
  %1 = stablehlo.add %0, %one : tensor<8xf32>
  return %1 : tensor<8xf32>
}
"""


def _compile_options(device_id: int) -> bytes:
    from jaxlib import xla_client

    options = xla_client.CompileOptions()
    build = options.executable_build_options
    build.num_replicas = 1
    build.num_partitions = 1
    build.device_assignment = xla_client.DeviceAssignment.create(np.array([[device_id]]))
    return options.SerializeAsString()


def info(client) -> None:
    plugin = client.plugin
    major, minor = plugin.api_version
    print(f"plugin   {plugin.path}")
    print(f"         PJRT API {major}.{minor}, attributes {plugin.attributes}")
    print(f"platform {client.platform_name} ({client.platform_version}), process {client.process_index}")
    print(f"devices  {len(client.devices)} ({len(client.addressable_devices)} addressable)")
    for device in client.devices:
        memories = ", ".join(
            f"{m.kind}{' (default)' if m is device.default_memory else ''}" for m in device.memories
        )
        print(f"  {device.id}: {device.to_string} kind={device.kind!r} memories: {memories}")


def demo(client) -> None:
    from ifrtpy import _pjrt

    info(client)
    x = np.arange(8, dtype=np.float32)
    expected = x * 2 + 1
    print(f"\nprogram  y = x * 2 + 1 on f32[8], x = {x.tolist()}")
    for device in client.addressable_devices:
        executable = _pjrt.compile(client, DEMO_PROGRAM.encode(), _compile_options(device.id))
        buffer, _ = _pjrt.buffer_from_host_buffer(client, x, device)
        (outputs,), _ = executable.execute([[buffer]])
        y = outputs[0].to_numpy()
        np.testing.assert_array_equal(y, expected)
        print(f"  on device {device.id}: {y.tolist()}  (equals NumPy)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ifrtpy", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["info", "demo"])
    parser.add_argument("--plugin", help="path of a PJRT plugin .so (default: xla-cpu-pjrt)")
    parser.add_argument("--devices", type=int, default=None, help="cpu_device_count option")
    args = parser.parse_args(argv)

    from ifrtpy import _pjrt

    plugin = _pjrt.load_plugin(args.plugin)
    options = {} if args.devices is None else {"cpu_device_count": args.devices}
    client = _pjrt.create_client(plugin, options)
    {"info": info, "demo": demo}[args.command](client)
    return 0


if __name__ == "__main__":
    sys.exit(main())
