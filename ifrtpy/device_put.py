"""``device_put``: the one-call way to put host data on devices, as in jax."""

from __future__ import annotations

from typing import Any

import numpy as np

from ifrtpy.array import Array, HostBufferSemantics
from ifrtpy.device import Device
from ifrtpy.sharding import Sharding, SingleDeviceSharding


def device_put(x: Any, device_or_sharding: Device | Sharding,
               semantics: HostBufferSemantics = HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL) -> Array:
    """An array holding ``x`` (anything ``np.asarray`` takes) on a device, or split over a
    sharding's devices (each device receives its own shard), on that sharding's client."""
    if isinstance(device_or_sharding, Device):
        sharding: Sharding = SingleDeviceSharding(device_or_sharding)
    elif isinstance(device_or_sharding, Sharding):
        sharding = device_or_sharding
    else:
        raise TypeError(f"device_put needs a Device or a Sharding, got {type(device_or_sharding).__name__}")
    client = sharding.devices[0].client
    return client.make_array_from_host_buffer(np.asarray(x), sharding, semantics)
