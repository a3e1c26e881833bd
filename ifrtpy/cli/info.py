"""``python -m ifrtpy info``: versions, the plugin, its attributes, devices and memories."""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any, Callable

import ifrtpy
from ifrtpy.plugins import plugins_report


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def print_versions(client: Any) -> None:
    packages = ", ".join(f"{name} {_version(name)}" for name in ("numpy", "jaxlib", "xla-cpu-pjrt", "fastatomstruct-xla-cpu", "jax"))
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
    print(plugins_report())


#: What ``info`` prints, in order: each takes the client and prints its lines.
INFO_SECTIONS: list[Callable[[Any], None]] = [print_versions, print_plugin, print_devices]


def info(client: Any) -> None:
    for section in INFO_SECTIONS:
        section(client)
