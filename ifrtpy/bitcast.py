"""``Client.bitcast_arrays``: the same shard bytes read as another array (IFRT ``BitcastArrays``).

Each array is reinterpreted under its spec: the spec's sharding must place its addressable
shards on the array's addressable devices, in the same order and memory kind, and every
shard must hold as many bytes under the spec as it does now. The data is not converted:
a shard's bytes, read in row-major order, become the new shard's elements. The result's
sharding is the spec's sharding object.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from ifrtpy.array import Array, ArrayCopySemantics, ArraySpec
from ifrtpy.array import check_of_client
from ifrtpy.array_plans import check_live
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError, UnimplementedError, check_enum
from ifrtpy.sharding import SingleDeviceShardSemantics

__all__ = ["BitcastPlan", "plan_bitcast"]

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS


@dataclasses.dataclass(frozen=True)
class BitcastPlan:
    """One array to reinterpret: ``old_shards``/``new_shards`` are the per-addressable-shard
    dims before and after, in device order."""

    array: Array
    spec: ArraySpec
    old_shards: tuple[tuple[int, ...], ...]
    new_shards: tuple[tuple[int, ...], ...]


def _shard_dims(sharding: Any, shape: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(s.dims) for s, _ in sharding.disassemble(shape, ADDRESSABLE))


def _bytes(dtype: DType, dims: tuple[int, ...], what: str) -> int:
    if dtype.byte_size is None:
        raise UnimplementedError(f"bitcast_arrays: {what} has dtype {dtype}, which is not "
                                 "a whole number of bytes per element")
    return dtype.byte_size * math.prod(dims)


def plan_bitcast(client: Any, arrays: Sequence[Array], specs: Sequence[ArraySpec],
                 semantics: ArrayCopySemantics, array_type: Any) -> list[BitcastPlan]:
    """Check a ``bitcast_arrays`` call: arrays of ``client`` (instances of ``array_type``)
    and specs that fit them (InvalidArgumentError naming the array and what does not
    match), then every array live (FailedPreconditionError; error arrays pass). Nothing
    is changed."""
    semantics = check_enum(ArrayCopySemantics, semantics, "semantics")
    arrays, specs = list(arrays), list(specs)
    if len(arrays) != len(specs):
        raise InvalidArgumentError(
            f"bitcast_arrays: {len(arrays)} arrays but {len(specs)} specs")
    plans = []
    for i, (array, spec) in enumerate(zip(arrays, specs)):
        check_of_client(client, array, f"bitcast_arrays: array {i}", array_type)
        if not isinstance(spec, ArraySpec):
            raise InvalidArgumentError(f"bitcast_arrays: spec {i} is not an ArraySpec: {spec!r}")
        old, new = array.sharding, spec.sharding
        old_devices = list(old.devices.addressable_device_list())
        new_devices = list(new.devices.addressable_device_list())
        if old_devices != new_devices or old.memory_kind != new.memory_kind:
            raise InvalidArgumentError(
                f"bitcast_arrays: spec {i} puts shards on {new!r}, array {i} is on {old!r}; "
                "the addressable devices (in order) and memory kind must be the same")
        old_shards = _shard_dims(old, array.shape)
        new_shards = _shard_dims(new, spec.shape)
        for j, (a, b) in enumerate(zip(old_shards, new_shards)):
            old_bytes = _bytes(array.dtype, a, f"array {i}")
            new_bytes = _bytes(spec.dtype, b, f"spec {i}")
            if old_bytes != new_bytes:
                raise InvalidArgumentError(
                    f"bitcast_arrays: shard {j} of array {i} is {array.dtype}{list(a)} "
                    f"({old_bytes} bytes), under spec {i} it would be {spec.dtype}{list(b)} "
                    f"({new_bytes} bytes)")
        plans.append(BitcastPlan(array, spec, old_shards, new_shards))
    for plan in plans:  # after every shape check, as the backends have always checked
        check_live(plan.array)
    return plans
