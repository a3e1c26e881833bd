"""The command line: ``python -m ifrtpy [--version] [--debug] info|demo|bench|launch|serve [options]``.

``info`` prints versions, the plugin, its attributes, devices and memories (where no CPU
plugin is installed: every plugin found, each described). ``demo`` does
the same, then puts a sharded array on the devices, draws which device holds which rows
(:func:`ifrtpy.visualize_sharding`), and runs a StableHLO program over it (SPMD), checking
every result against NumPy. ``bench`` prints one table of headline figures next to jax
measured in the same run (``--quick``: seconds, rough figures; ``--plot FILE.png``: a bar
chart, needs matplotlib). ``launch -n N -- CMD ...`` runs a job of N processes of CMD on
this machine (:mod:`ifrtpy.cli.launch`). ``serve`` runs an IFRT Proxy server that jax
uses as its backend (:mod:`ifrtpy.cli.serve`, docs/proxy.md). An error prints one line,
its message's first line (what is wrong and the fix); ``--debug`` shows the whole message
and the traceback. Where no CPU plugin is installed, ``demo`` and ``bench`` without
``--plugin`` run on the first plugin found, or say what to install.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
from types import ModuleType
from typing import Any

import ifrtpy as ifrt
from ifrtpy.cli import launch, serve
from ifrtpy.errors import NotFoundError

__all__ = ["main"]

# --help, --version and argument errors import nothing heavy: ifrtpy's names load on first
# use, and a command's module (numpy, the builder, the plugin) once the command runs or its
# --help shows its description.


def plain(text: str) -> str:
    """reST markup as plain text: ``x``, `x` and :role:`x` as x (--help shows docstrings)."""
    return re.sub(r"(?::\w+:)?``?~?([^`]+?)``?", r"\1", text)


def _about(module: ModuleType) -> str:
    """The first paragraph of a command module's docstring, less its ``python -m ifrtpy
    NAME``: heading, as the command's description."""
    first = (module.__doc__ or "").split("\n\n")[0].split("``: ", 1)[-1]
    return plain(first[:1].upper() + first[1:])


class _Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too), its help in plain text; a command's
    description is its module's docstring (``about``), read when its help is shown."""

    about: str | None = None

    def format_help(self) -> str:
        if self.about is not None and self.description is None:
            self.description = _about(importlib.import_module(f"ifrtpy.cli.{self.about}"))
        return plain(super().format_help())


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m ifrtpy", description=(
        "ifrtpy's commands; python -m ifrtpy COMMAND --help says more of each, docs/index.md "
        "which page to read for what."))
    parser.add_argument("--version", action="version", version=f"ifrtpy {ifrt.__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    client_options = _Parser(add_help=False)
    client_options.add_argument("--plugin", help="a PJRT plugin by name ('tpu', 'cuda', ...) or path of its .so "
                                "(default: the CPU plugin docs/plugins.md names; where none "
                                "is installed, the first plugin found)")
    client_options.add_argument("--devices", type=int, default=None,
                                help="the number of CPU devices, the plugin's cpu_device_count "
                                     "(default 4, or what XLA_FLAGS gives jax; bench: 8)")
    client_options.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    for name, summary in [("info", "versions, the plugin, its devices and memories"),
                          ("demo", "a sharded array and an SPMD program, checked against NumPy")]:
        commands.add_parser(name, parents=[client_options], help=summary).about = name
    bench_parser = commands.add_parser(
        "bench", parents=[client_options], help="headline figures next to jax, in one run")
    bench_parser.about = "bench"
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
    parser.set_defaults(commands=commands.choices)
    return parser


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments; an unknown option exits 2 as argparse's do, naming the command's
    nearest option (``bench --quik``: did you mean --quick?)."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        options = [option for action in args.commands[args.command]._actions
                   for option in action.option_strings]
        hints = [f"{word} (did you mean {close[0]}?)" if close else word
                 for word in unknown
                 for close in [difflib.get_close_matches(word.split("=")[0], options, n=1)]]
        parser.error(f"unrecognized arguments: {' '.join(hints)}")
    return args


def _devices_line(args: argparse.Namespace, client: Any, default: int | None) -> str:
    """The first line of info, demo and bench: how many devices the command runs on, and why
    that many."""
    from ifrtpy.backends.pjrt.client import host_device_count

    count, platform = len(client.devices()), client.platform_name
    if args.devices is not None:
        why = f"--devices {args.devices}"
    elif platform != "cpu":
        why = "all the plugin's"
    elif default is not None:
        why = f"{args.command}'s default, its sharded rows span {default}; --devices N for another"
    elif host_device_count() is not None:
        why = ("XLA_FLAGS' --xla_force_host_platform_device_count, as for jax; --devices N for "
               "another")
    else:
        why = ("the CPU plugin's default, as for ifrt.get_client(); --devices N or XLA_FLAGS="
               "--xla_force_host_platform_device_count=N for another")
    return f"{args.command}: {count} {platform} device{'' if count == 1 else 's'} ({why})"


def _first_plugin(command: str) -> str:
    """The plugin ``command`` runs on where no CPU plugin is installed: the first found
    (said on stderr); NotFoundError saying what to install where none is."""
    from ifrtpy.cli import info
    from ifrtpy.plugins.discovery import PACKAGES

    names = info.plugin_names()
    if not names:
        accelerators = ", ".join(f"{packages[0]} for {name!r}"
                                 for name, packages in PACKAGES.items() if name != "cpu")
        raise NotFoundError(f"no PJRT plugin is installed: pip install xla-cpu-pjrt for the "
                            f"CPU, or an accelerator's ({accelerators})")
    print(f"{command}: no CPU plugin is installed; running on the plugin {names[0]!r} "
          f"(--plugin NAME picks another; found: {', '.join(names)})", file=sys.stderr)
    return names[0]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.command == "launch":
        return launch.run(args)
    try:
        if args.command == "serve":
            return serve.serve(args)
        from ifrtpy.cli import bench, demo, info

        plugin = args.plugin
        if plugin is None and info.no_cpu_plugin():
            if args.command == "info":
                info.describe_machine()
                return 0
            plugin = _first_plugin(args.command)
        default = 8 if args.command == "bench" and plugin is None else None
        devices = default if args.devices is None else args.devices
        client = ifrt.get_client("pjrt", plugin=plugin, device_count=devices)
        print(_devices_line(args, client, default))
        if args.command == "bench":
            bench.bench(client, quick=args.quick, plot_file=args.plot)
        else:
            {"info": info.info, "demo": demo.demo}[args.command](client)
    except Exception as e:
        if args.debug:
            raise
        first, *rest = str(e).splitlines() or [""]
        shows = "the rest of the message and the traceback" if rest else "the traceback"
        print(f"error: {type(e).__name__}: {' '.join(first.split())} (--debug shows {shows})",
              file=sys.stderr)
        return 1
    return 0
