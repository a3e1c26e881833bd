"""``device_put``: the one-call way to put host data on devices, as in jax."""

from __future__ import annotations

from typing import Any

import numpy as np

from ifrtpy import backends
from ifrtpy.array import Array, HostBufferSemantics
from ifrtpy.device import Device
from ifrtpy.errors import InvalidArgumentError, UnimplementedError
from ifrtpy.interop import jax as _jax_bridge
from ifrtpy.sharding import Sharding, SingleDeviceSharding


def device_put(x: Any, device_or_sharding: Any = None,
               semantics: HostBufferSemantics = HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL) -> Array:
    """An array holding ``x`` (anything ``np.asarray`` takes, or a ``jax.Array``) on a
    device, or split over a sharding's devices (each device receives its own shard), on
    that sharding's client. None is the first device of the default client
    (``ifrt.get_client()``), as jax's default device; for a ``jax.Array``, its own
    sharding on that client.

    ``device_or_sharding`` may also be a jax Device or jax Sharding: the equivalent ifrtpy
    sharding over the devices with the same ids of the bridge's default client (see
    :mod:`ifrtpy.interop.jax`). A ``jax.Array`` whose sharding is already the target is
    taken without a copy (:func:`ifrtpy.interop.jax.from_jax`); otherwise it is gathered.
    """
    if device_or_sharding is None:
        device_or_sharding = (x.sharding if _jax_bridge.is_jax_array(x)
                              else backends.default_client().addressable_devices()[0])
    if _jax_bridge.is_jax_target(device_or_sharding):
        device_or_sharding = _jax_bridge.sharding_from_jax(device_or_sharding, None, np.ndim(x))
    sharding: Sharding
    if isinstance(device_or_sharding, Device):
        sharding = SingleDeviceSharding(device_or_sharding)
    elif isinstance(device_or_sharding, Sharding):
        sharding = device_or_sharding
    else:
        raise TypeError(f"device_put needs a Device or a Sharding, got {type(device_or_sharding).__name__}")
    client = sharding.devices[0].client
    if _jax_bridge.is_jax_array(x):
        try:
            same = _jax_bridge.sharding_from_jax(x.sharding, client, x.ndim) == sharding
        except (InvalidArgumentError, UnimplementedError):  # devices this client lacks: gather
            same = False
        if same:
            return _jax_bridge.from_jax(x, client)
    return client.make_array_from_host_buffer(np.asarray(x), sharding, semantics)
