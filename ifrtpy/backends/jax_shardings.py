"""jax's shardings and ifrtpy's, each way, over devices matched by id.

jax's device ``i`` of a client's platform is ifrtpy's device ``i``. jax ``NamedSharding``
<-> ifrtpy :class:`NamedSharding` (same mesh shape, axis names and spec),
``SingleDeviceSharding`` <-> :class:`SingleDeviceSharding`, any other jax sharding
(``GSPMDSharding``) -> :class:`HloSharding`, and ifrtpy ``HloSharding`` -> jax
``GSPMDSharding``; memory kinds are kept. A sharding that uses a device the other side lacks
raises InvalidArgumentError naming it. jax is imported only inside these functions. Shared
by the backends that take jax shardings (pjrt's put, the jax backend) and, above them, the
jax bridge (:mod:`ifrtpy.interop.jax`); it imports only value types.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ifrtpy import _jaxlib
from ifrtpy.errors import InvalidArgumentError, UnimplementedError
from ifrtpy.sharding import (
    HloSharding, Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding,
)

__all__ = ["sharding_from_jax", "sharding_to_jax", "cached_from_jax", "cached_to_jax",
           "jax_device_of", "is_jax_array", "is_jax_target"]


def is_jax_array(x: Any) -> bool:
    """Whether ``x`` is a ``jax.Array`` (without importing jax)."""
    return type(x).__module__.startswith(("jax", "jaxlib")) and hasattr(x, "addressable_shards")


def is_jax_target(x: Any) -> bool:
    """Whether ``x`` is a jax Device or jax Sharding (without importing jax)."""
    module = type(x).__module__
    return module.startswith(("jax", "jaxlib")) and (
        hasattr(x, "device_set") or hasattr(x, "platform"))


# -- devices -------------------------------------------------------------------------------

def _ifrt_device(client: Any, jax_device: Any) -> Any:
    platform = client.platform_name
    if jax_device.platform != platform and not (jax_device.platform == "gpu" and platform in ("cuda", "rocm")):
        raise InvalidArgumentError(
            f"jax device {jax_device} is a {jax_device.platform} device; the ifrtpy client's "
            f"platform is {platform}")
    try:
        return client.lookup_device(jax_device.id)
    except LookupError:
        import jax
        ours, theirs = len(client.devices()), len(jax.devices(jax_device.platform))
        raise InvalidArgumentError(
            f"jax device {jax_device} (id {jax_device.id}) has no ifrtpy counterpart: the "
            f"ifrtpy client has {ours} devices, jax {theirs} (devices are matched by id). "
            f"{_same_count(platform, ours, theirs)}") from None


def _same_count(platform: str, ours: int, theirs: int) -> str:
    """How to give ifrtpy's client (``ours`` devices) and jax (``theirs``) the same devices."""
    if platform != "cpu":
        return "Run ifrtpy and jax on the same devices (docs/interop.md)"
    return (f"Give both the same CPU device count: XLA_FLAGS=--xla_force_host_platform_device_count"
            f"={ours} before jax starts (or jax.config.update('jax_num_cpu_devices', {ours}) "
            "before its first use; ifrtpy's default client reads both), or make the arrays on a "
            f"client of jax's count, ifrt.get_client(device_count={theirs})")


_jax_devices: dict[str, dict[int, Any]] = {}


def _jax_devices_by_id(platform: str) -> dict[int, Any]:
    """jax's devices of ``platform`` by id (fixed once jax's backend exists)."""
    devices = _jax_devices.get(platform)
    if devices is None:
        import jax
        devices = _jax_devices[platform] = {d.id: d for d in jax.devices(platform)}
    return devices


def jax_device_of(device: Any) -> Any:
    """jax's device with ``device``'s id on its client's platform."""
    return _jax_device(device, _jax_devices_by_id(device.client.platform_name))


def _jax_device(device: Any, jax_devices: dict[int, Any]) -> Any:
    jax_device = jax_devices.get(device.id)
    if jax_device is None:
        platform, ours = device.client.platform_name, len(device.client.devices())
        raise InvalidArgumentError(
            f"ifrtpy device {device.id} has no jax counterpart: jax has {len(jax_devices)} "
            f"{platform} device{'' if len(jax_devices) == 1 else 's'}, this client {ours} "
            "(devices are matched by id). "
            f"{_same_count(platform, ours, len(jax_devices))}")
    return jax_device


def _memory_kind(sharding: Any) -> str | None:
    kind = getattr(sharding, "memory_kind", None)
    return None if kind is None else str(kind)


# -- shardings -----------------------------------------------------------------------------

def sharding_from_jax(sharding: Any, client: Any, ndim: int | None = None) -> Sharding:
    """The ifrtpy sharding equivalent to a jax ``sharding`` (a jax Device gives a
    SingleDeviceSharding), over ``client``'s devices with the same ids. ``ndim`` (the
    array's rank) is needed only for jax shardings other than Named and SingleDevice, and
    for a NamedSharding with unreduced axes, which becomes an HloSharding (ifrtpy's
    NamedSharding has no form for them; jax's ``reduced`` axes are replicated ones). Index
    domains equal jax's ``devices_indices_map`` (which jax refuses for unreduced axes)."""
    _jaxlib.check_jax()
    import jax
    if isinstance(sharding, jax.Device):
        return SingleDeviceSharding(_ifrt_device(client, sharding))
    if _jaxlib.is_single_device_sharding(sharding):
        (device,) = sharding.device_set
        return SingleDeviceSharding(_ifrt_device(client, device), _memory_kind(sharding))
    if isinstance(sharding, jax.sharding.NamedSharding) and not getattr(sharding.spec, "unreduced", None):
        mesh = sharding.mesh
        devices = np.vectorize(lambda d: _ifrt_device(client, d), otypes=[object])(mesh.devices)
        entries = getattr(sharding.spec, "partitions", sharding.spec)  # without (un)reduced axes
        spec = PartitionSpec(*[_spec_entry(e) for e in entries])
        return NamedSharding(Mesh(devices, mesh.axis_names), spec, _memory_kind(sharding))
    if isinstance(sharding, jax.sharding.Sharding):
        if ndim is None:
            raise InvalidArgumentError(
                f"sharding_from_jax of a {type(sharding).__name__} needs ndim (the array's rank)")
        devices = [_ifrt_device(client, d) for d in _jaxlib.device_assignment(sharding)]
        return HloSharding(devices, _jaxlib.to_xla_hlo_sharding(sharding, ndim), _memory_kind(sharding))
    raise InvalidArgumentError(f"expected a jax Sharding or Device, got {type(sharding).__name__}")


def _spec_entry(entry: Any) -> Any:
    if entry is None or isinstance(entry, str):
        return entry
    if isinstance(entry, (tuple, list)) and all(isinstance(e, str) for e in entry):
        return tuple(entry)
    raise UnimplementedError(f"PartitionSpec entry {entry!r} has no ifrtpy equivalent")


def sharding_to_jax(sharding: Sharding) -> Any:
    """The jax sharding equivalent to an ifrtpy ``sharding``, over jax's devices with the
    same ids: Single -> SingleDeviceSharding, Named -> NamedSharding, Hlo -> GSPMDSharding.
    Other kinds raise UnimplementedError (jax has no uneven or explicit-shape shardings)."""
    _jaxlib.check_jax()
    import jax
    devices = _jax_devices_by_id(sharding.devices[0].client.platform_name)
    kind = None if not sharding.memory_kind else str(sharding.memory_kind)
    if isinstance(sharding, SingleDeviceSharding):
        return _jaxlib.single_device_sharding(_jax_device(sharding.devices[0], devices), kind)
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        jax_devices = np.vectorize(lambda d: _jax_device(d, devices), otypes=[object])(mesh.devices)
        return jax.sharding.NamedSharding(jax.sharding.Mesh(jax_devices, mesh.axis_names),
                                          jax.sharding.PartitionSpec(*sharding.spec), memory_kind=kind)
    if isinstance(sharding, HloSharding):
        return _jaxlib.gspmd_sharding([_jax_device(d, devices) for d in sharding.devices],
                                      sharding.xla_hlo_sharding, kind)
    raise UnimplementedError(
        f"sharding_to_jax: {type(sharding).__name__} has no jax equivalent; convert to a "
        "NamedSharding or HloSharding first, or export shard by shard")


# -- memoized, for the array paths -----------------------------------------------------------

_CACHE_SIZE = 256
_from_jax_cache: dict[Any, Any] = {}  # (id(client), jax sharding, ndim) -> (client, ifrtpy sharding)
_to_jax_cache: dict[Any, Any] = {}  # (ifrtpy sharding, its spec) -> jax sharding


def cached_from_jax(client: Any, jax_sharding: Any, ndim: int) -> Sharding:
    """:func:`sharding_from_jax`, memoized (the array paths convert the same few shardings)."""
    key = (id(client), jax_sharding, ndim)
    hit = _from_jax_cache.get(key)
    if hit is not None and hit[0] is client:
        return hit[1]
    sharding = sharding_from_jax(jax_sharding, client, ndim)
    if len(_from_jax_cache) >= _CACHE_SIZE:
        _from_jax_cache.clear()
    _from_jax_cache[key] = (client, sharding)
    return sharding


def cached_to_jax(sharding: Sharding) -> Any:
    """:func:`sharding_to_jax`, memoized. Named shardings whose specs differ by trailing
    Nones compare equal (``P()`` and ``P(None)``), but jax holds a scalar with ``P()``
    only: the spec is part of the key."""
    key = (sharding, tuple(sharding.spec) if isinstance(sharding, NamedSharding) else None)
    hit = _to_jax_cache.get(key)
    if hit is None:
        hit = sharding_to_jax(sharding)
        if len(_to_jax_cache) >= _CACHE_SIZE:
            _to_jax_cache.clear()
        _to_jax_cache[key] = hit
    return hit
