"""Every private jaxlib name ifrtpy uses, in one place, chosen by jaxlib version.

jaxlib's Python modules other than its MLIR bindings (``jaxlib.mlir.ir`` and the
``jaxlib.mlir.dialects`` modules, which follow upstream MLIR's Python API) are jax's
internals: they move between releases. ifrtpy reaches them only through the functions
here, each of which knows where the name lives in each supported jaxlib version.

Supported (and tested): jaxlib 0.10.x, 0.11.x and 0.12.x (``SUPPORTED``); see
docs/pjrt-backend.md for what was run with which.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from ifrtpy.errors import UnimplementedError

__all__ = [
    "SUPPORTED", "version", "xla_client", "hlo_module_class", "register_jax_dialects",
    "distributed_runtime_service", "distributed_runtime_client",
]

#: The jaxlib (major, minor) versions ifrtpy is tested with.
SUPPORTED = ((0, 10), (0, 11), (0, 12))

#: name -> [(first jaxlib version, "module:attribute")], newest first: the version switch.
_LOCATIONS: dict[str, list[tuple[tuple[int, int], str]]] = {
    # CompileOptions, DeviceAssignment, HloSharding and OpSharding.
    "xla_client": [((0, 10), "jaxlib.xla_client:")],
    # HloModule.from_serialized_hlo_module_proto, spmd_*_sharding(s).
    "HloModule": [((0, 10), "jaxlib._hlo:HloModule")],
    # register_dialects(DialectRegistry): func and the other upstream dialects.
    "register_dialects": [((0, 10), "jaxlib.mlir._mlir_libs._jax_mlir_ext:register_dialects")],
    # The coordination service and its client (ifrtpy.distributed).
    "distributed_service": [((0, 10), "jaxlib._jax:get_distributed_runtime_service")],
    "distributed_client": [((0, 10), "jaxlib._jax:get_distributed_runtime_client")],
}


@functools.lru_cache(maxsize=None)
def version() -> tuple[int, ...]:
    """The installed jaxlib's version, e.g. ``(0, 11, 2)``."""
    from jaxlib import version as jaxlib_version

    parts = []
    for part in jaxlib_version.__version__.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


@functools.lru_cache(maxsize=None)
def _lookup(name: str) -> Any:
    installed = version()
    for first, location in _LOCATIONS[name]:
        if installed[:2] >= first:
            module_name, _, attr = location.partition(":")
            try:
                module = importlib.import_module(module_name)
                return getattr(module, attr) if attr else module
            except (ImportError, AttributeError) as e:
                raise UnimplementedError(
                    f"jaxlib {'.'.join(map(str, installed))} has no {location} ({e}); ifrtpy "
                    f"supports jaxlib {', '.join('%d.%d' % v for v in SUPPORTED)}"
                ) from None
    raise UnimplementedError(f"jaxlib {installed} is older than any ifrtpy supports ({SUPPORTED})")


def xla_client() -> Any:
    """The ``jaxlib.xla_client`` module."""
    return _lookup("xla_client")


def hlo_module_class() -> Any:
    """jaxlib's ``HloModule`` class (reads serialized HloModuleProtos)."""
    return _lookup("HloModule")


def register_jax_dialects(registry: Any) -> None:
    """Add jaxlib's upstream MLIR dialects (func, ...) to an ``ir.DialectRegistry``."""
    _lookup("register_dialects")(registry)


def distributed_runtime_service(address: str, num_nodes: int, **timeouts: int) -> Any:
    """jaxlib's coordination service, listening at ``address`` (timeouts in seconds)."""
    return _lookup("distributed_service")(address, num_nodes, **timeouts)


def distributed_runtime_client(address: str, node_id: int, **options: Any) -> Any:
    """jaxlib's coordination client of the service at ``address`` (not yet connected)."""
    return _lookup("distributed_client")(address, node_id, **options)
