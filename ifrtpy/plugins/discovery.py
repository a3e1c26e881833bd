"""Finding PJRT plugins by name.

A PJRT plugin is a shared library exporting ``GetPjrtApi``. :func:`find_plugin` turns a
name such as ``"cpu"`` or ``"cuda"`` into the library's path, looking in this order (the
first source that has the name wins):

1. ``PJRT_NAMES_AND_LIBRARY_PATHS``: ``name:path,name:path`` (jax's convention);
2. jax plugin packages: modules of the ``jax_plugins`` namespace package and the
   ``jax_plugins`` entry-point group (``jax-cuda12-pjrt`` / ``jax-cuda13-pjrt`` ship
   ``jax_plugins/xla_cuda13/xla_cuda_plugin.so``, named ``"cuda"``);
3. libtpu, named ``"tpu"``, where jax finds it: ``TPU_LIBRARY_PATH`` when it names an
   existing file (else it is passed over, as jax does after a warning), then
   ``libtpu.so`` in the ``libtpu`` package's directory (what ``libtpu.get_library_path()``
   returns);
4. the XLA CPU builds ifrtpy knows (:mod:`.builds`): ``"cpu"`` is the default one, and
   each installed build is also named by its distribution (``"xla-cpu-pjrt"``,
   ``"fastatomstruct-xla-cpu"``, ``"lammps-jax-pjrt-cpu"``);
5. ``xla_plugins`` packages (``xla-cpu-pjrt`` ships ``xla_plugins/xla_cpu_pjrt``, named
   ``"cpu"``);
6. the ``ifrtpy.pjrt_plugins`` entry-point group, for third parties: the entry point's
   name is the plugin name and its object is the library path (str or path-like) or a
   function returning it.

An explicit path (``get_client("cuda", plugin="/path/to/plugin.so")``) comes before all of
these. Nothing is imported or loaded while looking (package directories are found on
``sys.path``), except the objects of ``ifrtpy.pjrt_plugins`` entry points (third-party
code that asked to be called). No source needs a CPU build: only the default client
(no name, no path) does.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import glob
import importlib.metadata
import os
import re
import sys
from typing import Any, Callable, Iterator, Sequence

from ifrtpy.errors import NotFoundError
from ifrtpy.plugins.builds import DEFAULT_ORDER, installed_builds, package_dirs

__all__ = [
    "PluginInfo", "available_plugins", "find_plugin", "plugin_not_found", "plugins_report",
    "preload_nvidia_libraries", "ENV_VAR", "TPU_ENV_VAR", "ENTRY_POINT_GROUP", "PACKAGES",
]

#: The environment variable jax reads: ``name:path,name:path``.
ENV_VAR = "PJRT_NAMES_AND_LIBRARY_PATHS"
#: The environment variable jax reads for libtpu's path (``jax/_src/cloud_tpu_init.py``).
TPU_ENV_VAR = "TPU_LIBRARY_PATH"
#: ifrtpy's own entry-point group for third-party plugins.
ENTRY_POINT_GROUP = "ifrtpy.pjrt_plugins"

#: Where :func:`find_plugin` looks, in order (for error messages and docs).
SEARCH_ORDER = (
    f"the environment variable {ENV_VAR}",
    "the jax_plugins namespace package",
    "the jax_plugins entry-point group",
    f"libtpu ('tpu'): the environment variable {TPU_ENV_VAR}, then the libtpu package",
    "the XLA CPU builds ifrtpy knows",
    "the xla_plugins namespace package",
    f"the {ENTRY_POINT_GROUP} entry-point group",
)


#: The packages that provide a plugin of each name jax knows, the usual one first.
PACKAGES = {
    "cuda": ("jax-cuda13-pjrt", "jax-cuda12-pjrt"),
    "rocm": ("jax-rocm7-pjrt",),
    "tpu": ("libtpu",),
    "cpu": ("xla-cpu-pjrt",),
}
#: jax's platform names that stand for plugins named otherwise.
_JAX_NAMES = {"gpu": ("cuda", "rocm")}


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """A plugin found on this machine.

    ``name`` is what :func:`ifrtpy.get_client` takes; ``path`` the library; ``source``
    where it was found (e.g. ``"jax_plugins:xla_cuda13"``); ``api_version`` the PJRT C API
    version ``(major, minor)`` once the library is loaded in this process, else None.
    """

    name: str
    path: str
    source: str
    api_version: tuple[int, int] | None = None


def _plugin_name(module_name: str) -> str:
    """``xla_cuda13`` -> ``cuda``, ``xla_cpu_pjrt`` -> ``cpu``: the platform a package holds."""
    name = module_name.rsplit(".", 1)[-1]
    name = re.sub(r"^(xla|pjrt)_", "", name)
    name = re.sub(r"_(pjrt|plugin)$", "", name)
    return re.sub(r"\d+$", "", name) or module_name


def _library_in(directory: str) -> str | None:
    """The PJRT library in a plugin package's directory: the one ``.so`` that is not a
    Python extension module, preferring names with ``plugin`` or ``pjrt``."""
    libraries = sorted(
        p for p in glob.glob(os.path.join(directory, "*.so"))
        if ".cpython-" not in p and not p.endswith(".abi3.so") and os.path.isfile(p)
    )
    preferred = [p for p in libraries if re.search(r"plugin|pjrt", os.path.basename(p))]
    candidates = preferred or libraries
    return candidates[0] if candidates else None


def _from_env() -> Iterator[PluginInfo]:
    for item in os.environ.get(ENV_VAR, "").split(","):
        name, sep, path = item.strip().partition(":")
        if sep and name and path:
            yield PluginInfo(name.strip(), path.strip(), f"env:{ENV_VAR}")


def _from_namespace(package: str) -> Iterator[PluginInfo]:
    for directory in package_dirs(package):
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        for entry in entries:
            sub = os.path.join(directory, entry)
            if entry.startswith(("_", ".")) or not os.path.isdir(sub):
                continue
            library = _library_in(sub)
            if library is not None:
                yield PluginInfo(_plugin_name(entry), library, f"{package}:{entry}")


def _from_libtpu() -> Iterator[PluginInfo]:
    path = os.environ.get(TPU_ENV_VAR)
    if path and os.path.isfile(path):
        yield PluginInfo("tpu", path, f"env:{TPU_ENV_VAR}")
    for directory in package_dirs("libtpu"):
        library = os.path.join(directory, "libtpu.so")
        if os.path.isfile(library):
            yield PluginInfo("tpu", library, "the libtpu package")


def _from_cpu_builds() -> Iterator[PluginInfo]:
    found = dict(installed_builds())
    default = next((build for build in DEFAULT_ORDER if build in found), None)
    if default is not None:
        yield PluginInfo("cpu", found[default], f"the default CPU build {default.name}")
    for build, path in found.items():
        yield PluginInfo(build.name, path, f"the CPU build {build.name}")


def _entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    try:
        return sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name)
    except Exception:  # a broken distribution's metadata must not break discovery
        return []


def _from_jax_entry_points() -> Iterator[PluginInfo]:
    # jax's convention: the entry point's value is the plugin's module ("jax_plugins.xla_cuda13").
    for ep in _entry_points("jax_plugins"):
        module = ep.value.split(":")[0].strip()
        parent, _, leaf = module.rpartition(".")
        for directory in package_dirs(parent) if parent else []:
            library = _library_in(os.path.join(directory, leaf))
            if library is not None:
                yield PluginInfo(_plugin_name(ep.name), library, f"entry point jax_plugins:{ep.name}")
                break


def _from_ifrtpy_entry_points() -> Iterator[PluginInfo]:
    for ep in _entry_points(ENTRY_POINT_GROUP):
        try:
            obj: Any = ep.load()
            path = obj() if callable(obj) else obj
            path = os.fspath(path)
        except Exception:  # a broken third-party entry point is skipped, not fatal
            continue
        yield PluginInfo(ep.name, path, f"entry point {ENTRY_POINT_GROUP}:{ep.name}")


_SOURCES: tuple[Callable[[], Iterator[PluginInfo]], ...] = (
    _from_env,
    lambda: _from_namespace("jax_plugins"),
    _from_jax_entry_points,
    _from_libtpu,
    _from_cpu_builds,
    lambda: _from_namespace("xla_plugins"),
    _from_ifrtpy_entry_points,
)


def _loaded_version(path: str) -> tuple[int, int] | None:
    """The API version of the library at ``path`` if this process has loaded it."""
    base = sys.modules.get("ifrtpy._pjrt")
    if base is None:
        return None
    handle = base.loaded_plugins().get(os.path.realpath(path))
    return None if handle is None else tuple(handle.api_version)


#: The last search: (its key, what it found). See :func:`_search_key`.
_last_search: tuple[tuple[Any, ...], list[PluginInfo]] | None = None


@functools.lru_cache(maxsize=8)
def _directories(path: tuple[str, ...]) -> tuple[str, ...]:
    """The entries of ``sys.path`` that are directories."""
    return tuple(e or "." for e in path if os.path.isdir(e or "."))


def _search_key() -> tuple[Any, ...]:
    """What a search depends on: the environment variables, whether ``TPU_LIBRARY_PATH``
    names a file, ``sys.path`` and the modification times of its directories (installing
    a package changes one)."""
    path = tuple(sys.path)
    try:
        times = tuple(os.stat(d).st_mtime_ns for d in _directories(path))
    except OSError:  # a directory went away: search again
        _directories.cache_clear()
        times = None
    tpu = os.environ.get(TPU_ENV_VAR)
    return (os.environ.get(ENV_VAR), tpu, tpu is not None and os.path.isfile(tpu), path, times)


def _search() -> list[PluginInfo]:
    global _last_search
    key = _search_key()
    last = _last_search
    if last is not None and last[0] == key:
        return last[1]
    found = [info for source in _SOURCES for info in source()]
    _last_search = (key, found)
    return found


def available_plugins(*, load: bool = False) -> list[PluginInfo]:
    """Every plugin found, in search order; a name found twice is listed at each place,
    the first one being what :func:`find_plugin` picks.

    ``api_version`` is set for libraries this process has loaded; with ``load=True`` each
    library is loaded first (a library that fails to load keeps ``api_version=None``).
    The search is repeated only when ``PJRT_NAMES_AND_LIBRARY_PATHS``, ``sys.path`` or
    a directory on it has changed since the last one.
    """
    found = _search()
    if load:
        from ifrtpy import _pjrt

        for info in found:
            try:
                _pjrt.load_plugin(info.path)
            except Exception:
                pass
    return [dataclasses.replace(i, api_version=_loaded_version(i.path)) for i in found]


def find_plugin(name: str) -> PluginInfo:
    """The first plugin called ``name`` in search order.

    NotFoundError (:func:`plugin_not_found`) saying what to install, and listing the
    plugins found and where ifrtpy looked.
    """
    for info in _search():
        if info.name == name:
            return dataclasses.replace(info, api_version=_loaded_version(info.path))
    raise plugin_not_found(name)


def plugin_not_found(name: str, backends: Sequence[str] = ()) -> NotFoundError:
    """The error for a plugin ``name`` found nowhere (nor a backend of that name, where
    ``backends`` lists those there are). Its first line says what is missing and what to
    do: the package to install for a name of :data:`PACKAGES`, or the names meant by a
    near one (another case, jax's ``'gpu'``, a typo); the next lines list the backends,
    each plugin name found once, and where ifrtpy looked."""
    found = list(dict.fromkeys(info.name for info in _search()))
    what = (f"no ifrtpy backend or PJRT plugin named {name!r}" if backends
            else f"no PJRT plugin named {name!r}")
    meant = _meant(name, [*backends, *found, *PACKAGES])
    if name in PACKAGES:
        first, *others = PACKAGES[name]
        alternatives = f" (or {', '.join(others)})" if others else ""
        line = f"{what} is installed: pip install {first}{alternatives}; or give its library with {_PATH_HINT}"
    elif meant:
        line = f"{what}; did you mean " + " or ".join(
            repr(m) + (f" (pip install {PACKAGES[m][0]})" if m in PACKAGES and m not in found else "")
            for m in meant) + "?"
    else:
        packages = ", ".join(f"{' or '.join(p)} for {n!r}" for n, p in PACKAGES.items()
                             if n not in found)
        line = f"{what}: give its library with {_PATH_HINT}, or install its package ({packages})"
    lines = [line]
    if backends:
        lines.append(f"backends: {', '.join(backends)}")
    lines.append(f"plugins found: {', '.join(map(repr, found)) or 'none'} "
                 "(ifrt.available_plugins() says where)")
    lines.append(f"looked in: {'; '.join(SEARCH_ORDER)}")
    return NotFoundError("\n".join(lines))


_PATH_HINT = "plugin='/path/to/plugin.so'"


def _meant(name: str, names: Sequence[str]) -> list[str]:
    """The names a user who wrote ``name`` may have meant: jax's name for them, the same
    name in another case, or up to two close spellings."""
    if name.lower() in _JAX_NAMES:
        return list(_JAX_NAMES[name.lower()])
    names = list(dict.fromkeys(names))
    same = [n for n in names if n.lower() == name.lower()]
    return same[:1] or difflib.get_close_matches(name, names, n=2, cutoff=0.75)




#: Libraries of the ``nvidia-*`` wheels the CUDA plugin links against, loaded (in this
#: order) before the plugin so the dynamic linker finds them by soname, as jax does.
_NVIDIA_LIBRARIES = ("libcudart", "libnvrtc", "libcublasLt", "libcublas", "libcupti",
                     "libcusparse", "libcusolver", "libcufft", "libnccl", "libnvshmem_host",
                     "libcudnn")


def preload_nvidia_libraries() -> list[str]:
    """Load the CUDA libraries of installed ``nvidia-*`` wheels; the paths loaded.

    Nothing happens where no such wheel is installed; a library that fails to load is
    skipped (the plugin then reports what it misses when it is loaded).
    """
    import ctypes

    loaded = []
    for directory in package_dirs("nvidia"):
        for prefix in _NVIDIA_LIBRARIES:
            for path in sorted(glob.glob(os.path.join(directory, "*", "lib", prefix + ".so*"))):
                try:
                    ctypes.CDLL(path)
                except OSError:
                    continue
                loaded.append(path)
    return loaded


def plugins_report() -> str:
    """Lines for ``python -m ifrtpy info``: each plugin name once, with the library
    :func:`find_plugin` picks, where it was found and its version; the others of that
    name, which it shadows, on one line below it."""
    lines = ["plugins  (by name: ifrtpy.get_client(name))"]
    by_name: dict[str, list[PluginInfo]] = {}
    for info in available_plugins():
        by_name.setdefault(info.name, []).append(info)
    for name, (info, *shadowed) in by_name.items():
        version = "not loaded" if info.api_version is None else "PJRT API %d.%d" % info.api_version
        lines.append(f"  {name}: {info.path} (from {info.source}, {version})")
        if shadowed:
            lines.append("    also at (not picked): " + "; ".join(
                f"{i.path} (from {i.source})" for i in shadowed))
    if len(lines) == 1:
        lines.append(f"  none found; looked in {'; '.join(SEARCH_ORDER)}")
    return "\n".join(lines)
