"""The jax backend's client operations that make and move arrays: assemble, copy,
reshard and error arrays. Each is checked completely first (:mod:`ifrtpy.array_plans`,
and whether jax can hold the sharding), so a failure leaves the inputs as they were."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ifrtpy import _jaxlib
from ifrtpy.array import ArrayCopySemantics, ArraySpec
from ifrtpy.array_plans import (
    canonical_kind, plan_assemble, plan_copy, plan_error_arrays, plan_reshard,
)
from ifrtpy.backends.jax.array import (
    ALWAYS_COPY, DONATE_INPUT, JaxArray, _device_put, jax_device, to_jax_sharding,
)
from ifrtpy.backends.jax.calls import call_jax
from ifrtpy.shape import Shape
from ifrtpy.sharding import Sharding

__all__ = ["make_error_arrays", "assemble", "copy_arrays", "reshard_arrays"]


def make_error_arrays(client: Any, error: BaseException, specs: Sequence[ArraySpec]
                      ) -> list[JaxArray]:
    return [JaxArray(client, spec.dtype, Shape(spec.shape), spec.sharding, None, error)
            for spec in plan_error_arrays(client, error, specs)]


def assemble(client: Any, shape: Any, sharding: Any, arrays: Any, copy_semantics: Any,
             shard_semantics: Any, dtype: Any) -> JaxArray:
    plan = plan_assemble(client, shape, sharding, arrays, copy_semantics, shard_semantics, dtype,
                         JaxArray)
    jax_sharding = to_jax_sharding(plan.sharding)
    values = [a._take(plan.copy_semantics) for a in plan.arrays]
    if plan.error is not None:  # the result fails as its first failing input does
        return JaxArray(client, plan.dtype, plan.shape, plan.sharding, None, plan.error)
    import jax

    value = call_jax(jax.make_array_from_single_device_arrays, tuple(plan.shape.dims),
                     jax_sharding, values)
    return JaxArray(client, plan.dtype, plan.shape, plan.sharding, value)


def copy_arrays(client: Any, arrays: Any, devices: Any, memory_kind: Any, semantics: Any
                ) -> list[JaxArray]:
    """Each shard moves to the device in its place (within this process: reshard_arrays
    moves data across processes)."""
    plan = plan_copy(client, arrays, devices, memory_kind, semantics, JaxArray)
    return _moved(client, plan.arrays, plan.targets, plan.semantics, by_shard=True)


def reshard_arrays(client: Any, arrays: Any, specs: Any, semantics: Any) -> list[JaxArray]:
    """jax moves the data, across processes too."""
    plan = plan_reshard(client, arrays, specs, semantics, JaxArray)
    for spec in plan.specs:
        to_jax_sharding(spec.sharding)  # UnimplementedError for what jax cannot hold
    return _moved(client, plan.arrays, [s.sharding for s in plan.specs], plan.semantics,
                  by_shard=False)


def _moved(client: Any, arrays: list[JaxArray], targets: list[Sharding],
           semantics: ArrayCopySemantics, by_shard: bool) -> list[JaxArray]:
    """Each array's value put on its target sharding, inputs taken as ``semantics`` says.
    ``by_shard``: shard i moves to the target's device i (copy_arrays, within this
    process); else jax moves the data (resharding, across processes too). Everything is
    already validated."""
    may_alias = semantics != ALWAYS_COPY
    out = []
    for array, target in zip(arrays, targets):
        if array.error is not None:  # an error array's copy fails the same way
            out.append(JaxArray(client, array.dtype, array.shape, target, None, array.error))
        else:
            move = _moved_by_shard if by_shard else _moved_whole
            value = call_jax(move, array.jax_value, array.sharding, target, may_alias)
            out.append(JaxArray(client, array.dtype, array.shape, target, value))
    if semantics == DONATE_INPUT:
        for array in arrays:
            array._take(DONATE_INPUT)
    return out


def _moved_whole(value: Any, source: Sharding, target: Sharding, may_alias: bool) -> Any:
    import jax

    kind = canonical_kind(source)
    if kind != canonical_kind(target) and source.devices != target.devices:
        # jax refuses a move onto other devices, or the same ones in another order, and
        # into another memory kind at once ("Memory kind mismatch", "PjRtBuffer's memory
        # kind does not match"): the devices first
        step = target.with_device_assignment(None, kind)
        value, source = _moved_whole(value, source, step, may_alias=False), step
    jax_target = to_jax_sharding(target)
    if (source.devices != target.devices and set(source.devices) == set(target.devices)
            and not isinstance(jax_target, jax.sharding.NamedSharding)):
        # jax moves an array to the same devices in another order only onto a
        # NamedSharding: through the whole array on each device, in the target's order
        grid = np.array([jax_device(d) for d in target.devices], dtype=object)
        whole = jax.sharding.NamedSharding(jax.sharding.Mesh(grid, ("devices",)),
                                           jax.sharding.PartitionSpec())  # type: ignore[no-untyped-call]
        value = _device_put(value, whole, may_alias=False)
    return _device_put(value, jax_target, may_alias=may_alias)


def _moved_by_shard(value: Any, source: Sharding, target: Sharding, may_alias: bool) -> Any:
    import jax

    shards = {s.device.id: s.data for s in value.addressable_shards}
    kind = str(target.memory_kind) if target.memory_kind else None
    pieces, places = [], []
    for old, new in zip(source.devices, target.devices):
        if old.is_addressable:
            pieces.append(shards[old.id])
            places.append(_jaxlib.single_device_sharding(jax_device(new), kind))
    moved = _device_put(pieces, places, may_alias=may_alias)
    return jax.make_array_from_single_device_arrays(
        value.shape, to_jax_sharding(target), moved)
