"""The bridge to ``jax.Array``: shardings both ways, and arrays both ways shard by shard
through DLPack (zero-copy where both sides hold host memory, as on CPU).

Devices map by id: jax's device ``i`` of the client's platform is ifrtpy's device ``i``.
Where the two clients have different device counts, a sharding that uses a device the
other side lacks raises InvalidArgumentError naming it (on CPU, give both the same count:
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` for jax, ``device_count=N`` for
ifrtpy). jax is imported only inside these functions.

Sharding kinds: jax ``NamedSharding`` <-> ifrtpy :class:`~ifrtpy.NamedSharding` (same mesh
shape, axis names and spec), ``SingleDeviceSharding`` <-> ``SingleDeviceSharding``, any
other jax sharding (``GSPMDSharding``) -> :class:`~ifrtpy.HloSharding`, and ifrtpy
``HloSharding`` -> jax ``GSPMDSharding``. Memory kinds are kept.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ifrtpy import _jaxlib
from ifrtpy.array import Array, ArrayCopySemantics
from ifrtpy.client import Client
from ifrtpy.device import Device
from ifrtpy.errors import InvalidArgumentError, UnimplementedError
from ifrtpy.sharding import HloSharding
from ifrtpy.sharding import Mesh, NamedSharding, PartitionSpec
from ifrtpy.sharding import Sharding, SingleDeviceSharding

__all__ = ["default_client", "from_jax", "to_jax", "sharding_from_jax", "sharding_to_jax",
           "is_jax_array", "is_jax_target"]

_default_lock = threading.Lock()
_default: list[Client] = []


def default_client() -> Client:
    """The ifrtpy client the bridge uses when none is given: one PjRt client on the CPU
    plugin with as many devices as jax's CPU backend (made on first use, then shared)."""
    import jax
    with _default_lock:
        if not _default:
            from ifrtpy.client import get_client
            _default.append(get_client("pjrt", device_count=len(jax.devices("cpu"))))
        return _default[0]


def is_jax_array(x: Any) -> bool:
    """Whether ``x`` is a ``jax.Array`` (without importing jax)."""
    return type(x).__module__.startswith(("jax", "jaxlib")) and hasattr(x, "addressable_shards")


def is_jax_target(x: Any) -> bool:
    """Whether ``x`` is a jax Device or jax Sharding (without importing jax)."""
    module = type(x).__module__
    return module.startswith(("jax", "jaxlib")) and (
        hasattr(x, "device_set") or hasattr(x, "platform"))


# -- devices -------------------------------------------------------------------------------

def _ifrt_device(client: Client, jax_device: Any) -> Device:
    platform = client.platform_name
    if jax_device.platform != platform and not (jax_device.platform == "gpu" and platform in ("cuda", "rocm")):
        raise InvalidArgumentError(
            f"jax device {jax_device} is a {jax_device.platform} device; the ifrtpy client's "
            f"platform is {platform}")
    try:
        return client.lookup_device(jax_device.id)
    except LookupError:
        raise InvalidArgumentError(
            f"jax device {jax_device} (id {jax_device.id}) has no ifrtpy counterpart: the "
            f"ifrtpy client has {len(client.devices())} devices (ids are matched)") from None


_jax_devices: dict[str, dict[int, Any]] = {}


def _jax_devices_by_id(platform: str) -> dict[int, Any]:
    """jax's devices of ``platform`` by id (fixed once jax's backend exists)."""
    devices = _jax_devices.get(platform)
    if devices is None:
        import jax
        devices = _jax_devices[platform] = {d.id: d for d in jax.devices(platform)}
    return devices


def _jax_device(device: Device, jax_devices: dict[int, Any]) -> Any:
    jax_device = jax_devices.get(device.id)
    if jax_device is None:
        raise InvalidArgumentError(
            f"ifrtpy device {device.id} has no jax counterpart: jax has {len(jax_devices)} "
            f"{device.client.platform_name} devices (ids are matched)")
    return jax_device


def _memory_kind(sharding: Any) -> str | None:
    kind = getattr(sharding, "memory_kind", None)
    return None if kind is None else str(kind)


# -- shardings -----------------------------------------------------------------------------

def sharding_from_jax(sharding: Any, client: Client | None = None, ndim: int | None = None) -> Sharding:
    """The ifrtpy sharding equivalent to a jax ``sharding`` (a jax Device gives a
    SingleDeviceSharding), over ``client``'s devices with the same ids (default:
    :func:`default_client`). ``ndim`` (the array's rank) is needed only for jax shardings
    other than Named and SingleDevice. Index domains equal jax's ``devices_indices_map``."""
    import jax
    client = client or default_client()
    if isinstance(sharding, jax.Device):
        return SingleDeviceSharding(_ifrt_device(client, sharding))
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        (device,) = sharding.device_set
        return SingleDeviceSharding(_ifrt_device(client, device), _memory_kind(sharding))
    if isinstance(sharding, jax.sharding.NamedSharding):
        mesh = sharding.mesh
        devices = np.vectorize(lambda d: _ifrt_device(client, d), otypes=[object])(mesh.devices)
        spec = PartitionSpec(*[_spec_entry(e) for e in sharding.spec])
        return NamedSharding(Mesh(devices, mesh.axis_names), spec, _memory_kind(sharding))
    if isinstance(sharding, jax.sharding.Sharding):
        if ndim is None:
            raise InvalidArgumentError(
                f"sharding_from_jax of a {type(sharding).__name__} needs ndim (the array's rank)")
        devices = [_ifrt_device(client, d) for d in sharding._device_assignment]
        return HloSharding(devices, sharding._to_xla_hlo_sharding(ndim), _memory_kind(sharding))
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
    import jax
    devices = _jax_devices_by_id(sharding.devices[0].client.platform_name)
    kind = None if not sharding.memory_kind else str(sharding.memory_kind)
    if isinstance(sharding, SingleDeviceSharding):
        return jax.sharding.SingleDeviceSharding(_jax_device(sharding.devices[0], devices), memory_kind=kind)
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


# -- arrays --------------------------------------------------------------------------------

_CACHE_SIZE = 256
_from_jax_cache: dict = {}  # (id(client), jax sharding, ndim) -> (client, ifrtpy sharding)
_to_jax_cache: dict = {}  # ifrtpy sharding -> jax sharding


def _cached_from_jax(client: Client, jax_sharding: Any, ndim: int) -> Sharding:
    key = (id(client), jax_sharding, ndim)
    hit = _from_jax_cache.get(key)
    if hit is not None and hit[0] is client:
        return hit[1]
    sharding = sharding_from_jax(jax_sharding, client, ndim)
    if len(_from_jax_cache) >= _CACHE_SIZE:
        _from_jax_cache.clear()
    _from_jax_cache[key] = (client, sharding)
    return sharding


def _cached_to_jax(sharding: Sharding) -> Any:
    hit = _to_jax_cache.get(sharding)
    if hit is None:
        hit = sharding_to_jax(sharding)
        if len(_to_jax_cache) >= _CACHE_SIZE:
            _to_jax_cache.clear()
        _to_jax_cache[sharding] = hit
    return hit


def from_jax(x: Any, client: Client | None = None) -> Array:
    """An ifrtpy array with ``x``'s global shape, dtype and equivalent sharding (see
    :func:`sharding_from_jax`), each shard taken through DLPack: zero-copy where the
    plugin can alias jax's memory (host memory: CPU), else one copy per shard. ``x``
    stays valid and unchanged; its shards' memory is held while the ifrtpy array lives."""
    if not is_jax_array(x):
        raise InvalidArgumentError(f"from_jax needs a jax.Array, got {type(x).__name__}")
    client = client or default_client()
    sharding = _cached_from_jax(client, x.sharding, x.ndim)
    shards = {s.device.id: s.data for s in x.addressable_shards}
    devices = sharding.devices.addressable_device_list()
    missing = [d.id for d in devices if d.id not in shards]
    if missing:
        raise InvalidArgumentError(f"the jax array has no addressable shard on devices {missing}")
    from ifrtpy.backends.pjrt import interop as pjrt_interop
    if pjrt_interop.is_pjrt_host_client(client):
        return pjrt_interop.assemble_from_dlpack(
            client, x.shape, np.dtype(x.dtype), sharding, list(devices),
            [_jax_capsule(shards[d.id]) for d in devices])
    pieces = [client.from_dlpack(shards[d.id], d) for d in devices]
    return client.assemble_array_from_single_device_arrays(
        x.shape, sharding, pieces, ArrayCopySemantics.DONATE_INPUT, dtype=pieces[0].dtype)


def _jax_capsule(shard: Any) -> Any:
    """A legacy DLPack capsule of a single-device jax array on the host."""
    return _jaxlib.buffer_to_dlpack(shard)  # jaxlib's export, without jax's Python checks


def to_jax(array: Array) -> Any:
    """A ``jax.Array`` with ``array``'s global shape, dtype and equivalent sharding (see
    :func:`sharding_to_jax`), each shard handed over through DLPack without a copy where
    jax can alias it (the default memory kind; shards in host memory kinds are copied
    once, as jax imports DLPack tensors into device memory). The ifrtpy buffers stay allocated while the jax array lives
    (``delete()`` of ``array`` is deferred until then; donating it is refused)."""
    if not isinstance(array, Array):
        raise InvalidArgumentError(f"to_jax needs an ifrtpy Array, got {type(array).__name__}")
    jax_sharding, targets, order, to_kind = _to_jax_plan(array.sharding, array.client.platform_name)
    from ifrtpy.backends.pjrt import interop as pjrt_interop
    if pjrt_interop.is_pjrt_array(array):
        capsules = pjrt_interop.legacy_capsules(array)
    else:
        # another backend's arrays: those that are DLPack producers
        capsules = [getattr(s, "__dlpack__")() for s in array.disassemble_into_single_device_arrays()]
    arrays = [_capsule_to_jax(c, d) for c, d in zip(capsules, targets)]
    if to_kind is not None:
        import jax
        # jax takes DLPack tensors into device memory: one copy into the memory kind
        arrays = [jax.device_put(a, jax.sharding.SingleDeviceSharding(d, memory_kind=to_kind))
                  for a, d in zip(arrays, targets)]
    if isinstance(array.sharding, SingleDeviceSharding):
        return arrays[0]
    # the shards are ifrtpy's, checked already: jax's own checks are skipped (half the time)
    return _jaxlib.array_from_single_device_arrays(
        tuple(array.shape.dims), arrays[0].dtype, jax_sharding, [arrays[i] for i in order])


_to_jax_plans: dict[Sharding, tuple[Any, list[Any], list[int], str | None]] = {}


def _to_jax_plan(sharding: Sharding, platform: str) -> tuple[Any, list[Any], list[int], str | None]:
    """For arrays of ``sharding``: the jax sharding, the jax device of each addressable
    shard (in ifrtpy's order), the positions of those shards in jax's order, and the
    memory kind shards must be copied into (None: jax's device memory, no copy)."""
    plan = _to_jax_plans.get(sharding)
    if plan is None:
        jax_sharding = _cached_to_jax(sharding)
        devices = _jax_devices_by_id(platform)
        targets = [_jax_device(d, devices) for d in sharding.devices.addressable_device_list()]
        position = {d: i for i, d in enumerate(targets)}
        order = [position[d] for d in _jaxlib.addressable_device_assignment(jax_sharding)]
        kind = sharding.memory_kind
        to_kind = (str(kind) if kind and str(kind.canonicalize(sharding.devices[0])) != "device"
                   else None)
        plan = (jax_sharding, targets, order, to_kind)
        if len(_to_jax_plans) >= _CACHE_SIZE:
            _to_jax_plans.clear()
        _to_jax_plans[sharding] = plan
    return plan


def _capsule_to_jax(capsule: Any, jax_device: Any) -> Any:
    """A legacy DLPack capsule as a jax array on ``jax_device`` (aliased where jax can)."""
    return _jaxlib.dlpack_to_buffer(capsule, jax_device)
