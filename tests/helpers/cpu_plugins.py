"""The CPU PJRT plugins ifrtpy supports, found where installed: the default one
(xla-cpu-pjrt) and the newer builds from PyPI that tests run where present.

``PLUGINS`` maps a short name to ``(distribution, library file name)``; :func:`plugin_path`
finds the library (None where the distribution is not installed); :func:`plugin_params`
gives pytest parameters that skip the absent ones.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

import pytest

#: name -> (distribution, library): the default plugin first.
PLUGINS = {
    "xla-cpu-pjrt": ("xla-cpu-pjrt", "xla_cpu_pjrt.so"),
    "fastatomstruct": ("fastatomstruct-xla-cpu", "libpjrt_cpu.so"),
    "lammps": ("lammps-jax-pjrt-cpu", "pjrt_c_api_cpu_plugin.so"),
}


def plugin_path(name: str) -> str | None:
    """The library of plugin ``name``, or None where its distribution is not installed."""
    distribution, library = PLUGINS[name]
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == library:
            path = Path(file.locate()).resolve()
            if path.is_file():
                return str(path)
    return None


def plugin_params(names=tuple(PLUGINS)):
    """pytest params of the plugins, each skipped where not installed."""
    return [pytest.param(n, marks=pytest.mark.skipif(plugin_path(n) is None,
                                                      reason=f"{PLUGINS[n][0]} not installed"))
            for n in names]
