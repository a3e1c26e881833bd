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

from typing import Any

import numpy as np

from ifrtpy import _jaxlib
from ifrtpy.array import Array
from ifrtpy import backends
from ifrtpy.client import Client
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.backends import jax_shardings
from ifrtpy.backends.jax_shardings import cached_from_jax, cached_to_jax, is_jax_array, is_jax_target
from ifrtpy.sharding import Sharding, SingleDeviceSharding

__all__ = ["default_client", "from_jax", "to_jax", "sharding_from_jax", "sharding_to_jax",
           "is_jax_array", "is_jax_target"]

_CACHE_SIZE = 256


def default_client() -> Client:
    """The ifrtpy client the bridge uses when none is given: the process's default PjRt
    client, ``ifrt.get_client()`` (on the CPU plugin, with the CPU device count jax is
    given: ``XLA_FLAGS=--xla_force_host_platform_device_count`` or
    ``jax_num_cpu_devices``)."""
    return backends.default_client("pjrt")


def sharding_from_jax(sharding: Any, client: Client | None = None, ndim: int | None = None
                      ) -> Sharding:
    """The ifrtpy sharding equivalent to a jax ``sharding`` (a jax Device gives a
    SingleDeviceSharding), over ``client``'s devices with the same ids (default:
    :func:`default_client`). ``ndim`` (the array's rank) is needed only for jax shardings
    other than Named and SingleDevice. Index domains equal jax's ``devices_indices_map``."""
    return jax_shardings.sharding_from_jax(sharding, client or default_client(), ndim)


sharding_to_jax = jax_shardings.sharding_to_jax


# -- arrays --------------------------------------------------------------------------------

def from_jax(x: Any, client: Client | None = None) -> Array:
    """An ifrtpy array with ``x``'s global shape, dtype and equivalent sharding (see
    :func:`sharding_from_jax`), each shard taken through DLPack: zero-copy where the
    client can alias jax's memory (host memory: CPU), else one copy per shard
    (:meth:`ifrtpy.Client.assemble_array_from_dlpack`). ``x`` stays valid and unchanged;
    its shards' memory is held while the ifrtpy array lives."""
    _jaxlib.check_jax()
    if not is_jax_array(x):
        raise InvalidArgumentError(f"from_jax needs a jax.Array, got {type(x).__name__}")
    client = client or default_client()
    sharding = cached_from_jax(client, x.sharding, x.ndim)
    shards = {s.device.id: s.data for s in x.addressable_shards}
    devices = sharding.devices.addressable_device_list()
    missing = [d.id for d in devices if d.id not in shards]
    if missing:
        raise InvalidArgumentError(f"the jax array has no addressable shard on devices {missing}")
    capsules = [_jaxlib.buffer_to_dlpack(shards[d.id]) for d in devices]  # without jax's checks
    return client.assemble_array_from_dlpack(x.shape, sharding, capsules, np.dtype(x.dtype))


def to_jax(array: Array) -> Any:
    """A ``jax.Array`` with ``array``'s global shape, dtype and equivalent sharding (see
    :func:`sharding_to_jax`), each shard handed over through DLPack without a copy where
    jax can alias it (the default memory kind; shards in host memory kinds are copied
    once, as jax imports DLPack tensors into device memory). The ifrtpy buffers stay allocated while the jax array lives
    (``delete()`` of ``array`` is deferred until then; donating it is refused). The shards
    come from :meth:`ifrtpy.Array.dlpack_shards`."""
    _jaxlib.check_jax()
    if not isinstance(array, Array):
        raise InvalidArgumentError(f"to_jax needs an ifrtpy Array, got {type(array).__name__}")
    jax_sharding, targets, order, to_kind = _to_jax_plan(array.sharding)
    arrays = [_jaxlib.dlpack_to_buffer(c, d) for c, d in zip(array.dlpack_shards(), targets)]
    if to_kind is not None:
        import jax
        # jax takes DLPack tensors into device memory: one copy into the memory kind
        arrays = [jax.device_put(a, _jaxlib.single_device_sharding(d, to_kind))
                  for a, d in zip(arrays, targets)]
    if isinstance(array.sharding, SingleDeviceSharding):
        return arrays[0]
    # the shards are ifrtpy's, checked already: jax's own checks are skipped (half the time)
    return _jaxlib.array_from_single_device_arrays(
        tuple(array.shape.dims), arrays[0].dtype, jax_sharding, [arrays[i] for i in order])


_to_jax_plans: dict[Sharding, tuple[Any, list[Any], list[int], str | None]] = {}


def _to_jax_plan(sharding: Sharding) -> tuple[Any, list[Any], list[int], str | None]:
    """For arrays of ``sharding``: the jax sharding, the jax device of each addressable
    shard (in ifrtpy's order), the positions of those shards in jax's order, and the
    memory kind shards must be copied into (None: jax's device memory, no copy)."""
    plan = _to_jax_plans.get(sharding)
    if plan is None:
        jax_sharding = cached_to_jax(sharding)
        targets = [jax_shardings.jax_device_of(d) for d in sharding.devices.addressable_device_list()]
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
