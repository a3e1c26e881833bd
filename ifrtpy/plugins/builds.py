"""The XLA CPU plugin builds ifrtpy knows, and which one is the default.

Each build is a package on PyPI holding one PJRT library. ``"cpu"`` names the default:
the first of :data:`DEFAULT_ORDER` that is installed. ifrtpy's dependencies install
``fastatomstruct-xla-cpu`` on Linux x86_64 (a newer XLA, about twice as fast on dots as
the official build) and the official ``xla-cpu-pjrt`` everywhere; every installed build
is also found by its distribution name. Why this order: ``docs/plugins.md``.

Nothing is imported while looking: the packages' directories are found on ``sys.path``.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from ifrtpy.errors import NotFoundError

__all__ = ["CpuBuild", "CPU_BUILDS", "DEFAULT_ORDER", "installed_builds",
           "default_cpu_library", "build_at", "package_dirs"]


@dataclasses.dataclass(frozen=True)
class CpuBuild:
    """An XLA CPU plugin build: its distribution ``name`` (also its plugin name), the
    ``package`` directory holding it (dotted) and the ``library`` file in it."""

    name: str
    package: str
    library: str


OFFICIAL = CpuBuild("xla-cpu-pjrt", "xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so")
ZML = CpuBuild("fastatomstruct-xla-cpu", "fastatomstruct_xla_cpu", "libpjrt_cpu.so")
LAMMPS = CpuBuild("lammps-jax-pjrt-cpu", "lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so")

#: Every build ifrtpy knows (its option table is in :mod:`ifrtpy.plugins.options`).
CPU_BUILDS = (ZML, OFFICIAL, LAMMPS)
#: The default CPU plugin is the first of these that is installed.
DEFAULT_ORDER = (ZML, OFFICIAL)


def package_dirs(package: str) -> list[str]:
    """The directories of a (namespace) package on ``sys.path``, in order, found without
    importing it (nor trusting the import system's caches of directory listings)."""
    parts = package.split(".")
    dirs: list[str] = []
    for entry in sys.path:
        candidate = os.path.join(entry or ".", *parts)
        if candidate not in dirs and os.path.isdir(candidate):
            dirs.append(candidate)
    return dirs


def _library(build: CpuBuild) -> str | None:
    for directory in package_dirs(build.package):
        path = os.path.join(directory, build.library)
        if os.path.isfile(path):
            return path
    return None


def installed_builds() -> list[tuple[CpuBuild, str]]:
    """(build, library path) of each build installed, in :data:`CPU_BUILDS` order."""
    found = [(build, _library(build)) for build in CPU_BUILDS]
    return [(build, path) for build, path in found if path is not None]


def default_cpu_library() -> str:
    """The library of the default CPU plugin: the first of :data:`DEFAULT_ORDER` installed.

    NotFoundError when none is.
    """
    for build in DEFAULT_ORDER:
        path = _library(build)
        if path is not None:
            return path
    raise NotFoundError(
        "the default PJRT plugin needs one of the packages "
        f"{', '.join(b.name for b in DEFAULT_ORDER)}: pip install xla-cpu-pjrt")


def build_at(path: str) -> CpuBuild | None:
    """The known build whose library ``path`` is (symbolic links followed), else None."""
    real = os.path.realpath(path)
    name = os.path.basename(real)
    for build in CPU_BUILDS:
        if name == build.library and os.path.basename(os.path.dirname(real)) == \
                build.package.rpartition(".")[2]:
            return build
    return None
