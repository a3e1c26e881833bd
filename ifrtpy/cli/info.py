"""``python -m ifrtpy info``: versions, the plugin, its attributes, devices and memories.

Where no CPU plugin is installed and ``--plugin`` names none, every plugin found is
described instead (its client, devices and memories), after a note that the default
client needs a CPU build: a machine with only an accelerator is described, not refused.
"""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any, Callable

import ifrtpy
from ifrtpy import _jaxlib
from ifrtpy.plugins import available_plugins, plugins_report
from ifrtpy.plugins.builds import installed_builds

#: The line ``info`` prints where no CPU plugin is installed.
NO_CPU_PLUGIN = ("no CPU plugin is installed (the default client, get_client(), needs "
                 "one: pip install xla-cpu-pjrt)")


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def print_versions(client: Any) -> None:
    packages = ", ".join(f"{name} {_version(name)}" for name in ("numpy", "jaxlib", "xla-cpu-pjrt", "fastatomstruct-xla-cpu", "jax"))
    print(f"ifrtpy   {ifrtpy.__version__} (Python {sys.version.split()[0]}; {packages})")
    problem = _jaxlib.jax_problem()
    if problem is not None:
        print(f"{'ERROR' if problem.fatal else 'warning'}: {problem.message}")


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


def print_plugins(client: Any) -> None:
    print(plugins_report())


#: What ``info`` prints, in order: each takes the client and prints its lines.
INFO_SECTIONS: list[Callable[[Any], None]] = [print_versions, print_plugin, print_devices,
                                              print_plugins]


def info(client: Any) -> None:
    for section in INFO_SECTIONS:
        section(client)


def no_cpu_plugin() -> bool:
    """Whether no XLA CPU build is installed (so the default client cannot be made)."""
    return not installed_builds()


def plugin_names() -> list[str]:
    """Each plugin name found, once, in search order."""
    return list(dict.fromkeys(found.name for found in available_plugins()))


def describe_machine() -> None:
    """``info`` without a CPU plugin: the versions, the note that none is installed, then
    each plugin found described by its client (a plugin that cannot be opened, by its
    error's first line), then where each was found."""
    print_versions(None)
    print(NO_CPU_PLUGIN)
    for name in plugin_names():
        print(f"\n{name}:")
        try:
            client = ifrtpy.get_client("pjrt", plugin=name)
        except Exception as e:  # one plugin that cannot be opened must not hide the others
            first = (str(e).splitlines() or [""])[0]
            print(f"  cannot be opened: {type(e).__name__}: {first}")
            continue
        print_plugin(client)
        print_devices(client)
    print()
    print_plugins(None)
