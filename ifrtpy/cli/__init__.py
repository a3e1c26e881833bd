"""The command line: ``python -m ifrtpy [--version] [--debug] info|demo|bench|launch|serve [options]``.

``info`` prints versions, the plugin, its attributes, devices and memories. ``demo`` does
the same, then puts a sharded array on the devices, draws which device holds which rows
(:func:`ifrtpy.visualize_sharding`), and runs a StableHLO program over it (SPMD), checking
every result against NumPy. ``bench`` prints one table of headline figures next to jax
measured in the same run (``--quick``: seconds, rough figures; ``--plot FILE.png``: a bar
chart, needs matplotlib). ``launch -n N -- CMD ...`` runs a job of N processes of CMD on
this machine (:mod:`ifrtpy.cli.launch`). ``serve`` runs an IFRT Proxy server that jax
uses as its backend (:mod:`ifrtpy.cli.serve`, docs/proxy.md). Errors print one line;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys

import ifrtpy as ifrt
from ifrtpy.cli import bench, demo, info, launch, serve

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ifrtpy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"ifrtpy {ifrt.__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    client_options = argparse.ArgumentParser(add_help=False)
    client_options.add_argument("--plugin", help="a PJRT plugin by name ('tpu', 'cuda', ...) or path of its .so "
                                "(default: the CPU plugin docs/plugins.md names)")
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
    launch.configure(commands.add_parser(
        "launch", help="a job of N processes of a command on this machine",
        description="Run a job of N processes of CMD on this machine; in each, "
                    "ifrtpy.distributed.initialize() needs no arguments."))
    serve.configure(commands.add_parser(
        "serve", help="an IFRT Proxy server: jax runs on this backend's devices",
        description="Serve a backend's devices to jax (JAX_PLATFORMS=proxy) over IFRT Proxy."))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "launch":
        return launch.run(args)
    try:
        if args.command == "serve":
            return serve.serve(args)
        devices = args.devices
        if args.command == "bench" and devices is None and args.plugin is None:
            devices = 8
        client = ifrt.get_client("pjrt", plugin=args.plugin, device_count=devices)
        if args.command == "bench":
            bench.bench(client, quick=args.quick, plot_file=args.plot)
        else:
            {"info": info.info, "demo": demo.demo}[args.command](client)
    except Exception as e:
        if args.debug:
            raise
        message = " ".join(str(e).split())
        print(f"error: {type(e).__name__}: {message} (--debug shows the traceback)", file=sys.stderr)
        return 1
    return 0
