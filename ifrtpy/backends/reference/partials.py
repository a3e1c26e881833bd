"""Arrays with unreduced axes on the reference backend: each device of an unreduced group
holds a partial value, and the array is their reduction (a sum, or a max or min).

A program's argument with unreduced axes enters the program as that reduction (the
global value the program computes on); a result with unreduced axes leaves it as
partial values whose reduction is the result: the first device of each group (in the
sharding's device order) holds the value, the others the sum's identity, zeros (a max
or min holds the value on every device). Outside manual computations the reference
backend computes on global values, so these are not the partial values XLA's partitioned
program would leave on each device, only values with the same reduction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ifrtpy.backends.host_arrays import HostArray, global_value, split
from ifrtpy.errors import UnimplementedError
from ifrtpy.layout import Layout
from ifrtpy.shape import Shape
from ifrtpy.sharding import (
    HloSharding, Sharding, SingleDeviceSharding, SingleDeviceShardSemantics,
)

__all__ = ["argument_value", "result_shards"]

_ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def argument_value(array: HostArray) -> np.ndarray:
    """The global value of ``array``: its unreduced groups' partial values reduced."""
    sharding = array.sharding
    if not (isinstance(sharding, HloSharding) and sharding.has_unreduced_axes):
        return global_value(array)
    devices = list(sharding.devices.addressable_device_list())
    shards = dict(zip(devices, array._live_shards()))
    domains = dict(zip(devices, sharding.index_domains(array.shape, _ADDRESSABLE)))
    reduce = _REDUCE[sharding.reduction or "sum"]
    out = np.empty(array.shape.dims, array.dtype.to_numpy())
    filled = 0
    for group in sharding.unreduced_groups():
        members = [d for d in devices if d in group]
        if len(members) != len(group):
            raise UnimplementedError(
                f"an argument of unreduced axes whose group of {len(group)} devices has "
                f"{len(members)} addressable: its value cannot be reduced in this process")
        value = shards[members[0]]
        for device in members[1:]:
            value = reduce(value, shards[device])
        index: Any = (*domains[members[0]].slices(), ...)
        out[index] = value
        filled += 1
    out.flags.writeable = False
    return out


def result_shards(value: np.ndarray, sharding: Sharding, shape: Shape,
                  layout: Layout | None) -> tuple:
    """The shards of a result of global ``value``: partial values where ``sharding`` has
    unreduced axes (see the module)."""
    if not (isinstance(sharding, HloSharding) and sharding.has_unreduced_axes):
        return split(value, sharding, shape, layout)
    devices = list(sharding.devices.addressable_device_list())
    domains = sharding.index_domains(shape, _ADDRESSABLE)
    first = {next(d for d in devices if d in group) for group in sharding.unreduced_groups()
             if any(d in devices for d in group)}
    shards = []
    for device, domain in zip(devices, domains):
        index: Any = (*domain.slices(), ...)
        data = np.array(np.asarray(value)[index], order="C", copy=True)
        if sharding.reduction == "sum" and device not in first:
            data = np.zeros_like(data)
        if layout is not None and layout != Layout.row_major(layout.rank):
            data = split(data, SingleDeviceSharding(device), Shape(data.shape), layout)[0]
        data.flags.writeable = False
        shards.append(data)
    return tuple(shards)
