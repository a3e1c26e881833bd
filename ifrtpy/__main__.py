"""Command line: ``python -m ifrtpy [--version] [--debug] info|demo|bench [options]``.

``info`` prints versions, the plugin, its attributes, devices and memories. ``demo`` does
the same, then puts a sharded array on the devices, draws which device holds which rows
(:func:`ifrtpy.visualize_sharding`), and runs a StableHLO program over it (SPMD), checking
every result against NumPy. ``bench`` prints one table of headline figures next to jax
measured in the same run (``--quick``: seconds, rough figures; ``--plot FILE.png``: a bar
chart, needs matplotlib). Errors print one line; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from typing import Any, Callable

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


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def print_versions(client: Any) -> None:
    import ifrtpy

    packages = ", ".join(f"{name} {_version(name)}" for name in ("numpy", "jaxlib", "xla-cpu-pjrt", "jax"))
    print(f"ifrtpy   {ifrtpy.__version__} (Python {sys.version.split()[0]}; {packages})")


def print_plugin(client: Any) -> None:
    plugin = client.plugin
    major, minor = plugin.api_version
    print(f"plugin   {plugin.path}")
    print(f"         PJRT API {major}.{minor}, attributes {plugin.attributes}")
    print(f"platform {client.platform_name} ({client.platform_version}), "
          f"process {client.process_index()}")


def print_devices(client: Any) -> None:
    print(f"devices  {len(client.devices())} ({len(client.addressable_devices())} addressable)")
    for device in client.devices():
        default = device.default_memory()
        memories = ", ".join(
            f"{m.kind}{' (default)' if m is default else ''}" for m in device.memories())
        print(f"  {device.id}: {device.to_string()} kind={device.kind!r} memories: {memories}")
    from ifrtpy.plugins import plugins_report
    print(plugins_report())


#: What ``info`` prints, in order: each takes the client and prints its lines.
INFO_SECTIONS: list[Callable[[Any], None]] = [print_versions, print_plugin, print_devices]


def info(client: Any) -> None:
    for section in INFO_SECTIONS:
        section(client)


def demo(client: Any) -> None:
    import ifrtpy as ifrt

    info(client)
    devices = client.addressable_devices()
    n = len(devices)
    x = np.arange(n * 2 * 4, dtype=np.float32).reshape(n * 2, 4)
    sharding: ifrt.Sharding = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)),
                                                 ifrt.PartitionSpec("x"))
    a = client.make_array_from_host_buffer(x, sharding)
    print(f"\narray    {a.dtype}{list(a.shape)} split over {n} devices by {sharding}")
    ifrt.visualize_sharding(a)
    shards = a.disassemble_into_single_device_arrays()    # in the sharding's device order
    for shard, domain in zip(shards, sharding.index_domains(a.shape), strict=True):
        np.testing.assert_array_equal(np.asarray(shard), x[domain.index])
    np.testing.assert_array_equal(np.asarray(a), x)

    program = ifrt.HloProgram(DEMO_PROGRAM.format(rows=n * 2, n=n))
    exe = client.compile(program, ifrt.CompileOptions(devices=devices, num_partitions=n))
    (y,) = exe(a)
    np.testing.assert_array_equal(np.asarray(y), x * 2 + 1)
    print(f"\nprogram  y = x * 2 + 1, compiled for {n} devices (SPMD)")
    print(f"  output sharding {y.sharding}")
    print(f"  y[:, 0] = {np.asarray(y)[:, 0].tolist()}  (equals NumPy)")


def bench(client: Any, quick: bool = False, plot: str | None = None) -> None:
    from ifrtpy import _bench

    if plot:
        _bench.require_matplotlib()  # before measuring, not after
    rows = _bench.run(client, quick=quick, progress=_bench.progress_to_stderr)
    print(f"median time per call, {len(client.addressable_devices())} devices"
          f"{' (--quick: small sizes, rough figures)' if quick else ''}")
    print(_bench.table(rows))
    if plot:
        _bench.plot(rows, plot)
        print(f"plot written to {plot}")


def _parser() -> argparse.ArgumentParser:
    import ifrtpy

    parser = argparse.ArgumentParser(prog="python -m ifrtpy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"ifrtpy {ifrtpy.__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    client_options = argparse.ArgumentParser(add_help=False)
    client_options.add_argument("--plugin", help="path of a PJRT plugin .so (default: xla-cpu-pjrt)")
    client_options.add_argument("--devices", type=int, default=None, help="cpu_device_count option")
    client_options.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    commands.add_parser("info", parents=[client_options],
                        help="versions, the plugin, its devices and memories")
    commands.add_parser("demo", parents=[client_options],
                        help="a sharded array and an SPMD program, checked against NumPy")
    bench_parser = commands.add_parser(
        "bench", parents=[client_options], help="headline figures next to jax, in one run")
    bench_parser.add_argument("--quick", action="store_true",
                              help="small sizes and few repeats (seconds; figures rough)")
    bench_parser.add_argument("--plot", metavar="FILE.png", help="also draw a bar chart (matplotlib)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        import ifrtpy as ifrt

        devices = args.devices
        if args.command == "bench" and devices is None and args.plugin is None:
            devices = 8
        client = ifrt.get_client("pjrt", plugin=args.plugin, device_count=devices)
        if args.command == "bench":
            bench(client, quick=args.quick, plot=args.plot)
        else:
            {"info": info, "demo": demo}[args.command](client)
    except Exception as e:
        if args.debug:
            raise
        message = " ".join(str(e).split())
        print(f"error: {type(e).__name__}: {message} (--debug shows the traceback)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
