"""reshard_arrays for the PjRt backend: any sharding to any other, over any devices.

Each target shard is made the cheapest way available: the source buffer itself (when it
already holds that exact slice in that memory and may be donated), a device-to-device
copy of a source shard holding that exact slice, or else a host-staged assembly from the
source shards that overlap it (each such source shard is read to the host once).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ifrtpy import _pjrt
from ifrtpy.array import Array, ArrayCopySemantics, ArraySpec
from ifrtpy.array_plans import addressable_domains, arrays_of, plan_reshard
from ifrtpy.backends import host_arrays
from ifrtpy.backends.pjrt.array import PjrtArray
from ifrtpy.backends.pjrt.copies import copy_to_memory
from ifrtpy.backends.pjrt.operations import ARRAY_TYPES
from ifrtpy.backends.pjrt.put import _device_memories
from ifrtpy.backends.pjrt.strings import BasicStringArray, is_string_call
from ifrtpy.shape import IndexDomain, Shape


def reshard_arrays(client, arrays: Sequence[Array], specs: Sequence[ArraySpec],
                   semantics: ArrayCopySemantics) -> list[Array]:
    arrays = arrays_of(client, arrays, "reshard_arrays arrays", ARRAY_TYPES)
    if is_string_call(arrays, "reshard_arrays"):
        return host_arrays.reshard_arrays(BasicStringArray, client, arrays, specs, semantics)
    plan = plan_reshard(client, arrays, specs, semantics, PjrtArray)
    targets = [(array, spec, array._buffers, _device_memories(client, spec.sharding))
               for array, spec in zip(plan.arrays, plan.specs)]
    return [_reshard_one(client, *target, plan.semantics) for target in targets]


def _reshard_one(client, array: PjrtArray, spec: ArraySpec, buffers: tuple, memories: list,
                 semantics: ArrayCopySemantics) -> PjrtArray:
    if array._error is not None:  # an error array's reshard fails the same way
        array._take(semantics)  # donated all the same
        return PjrtArray(client, spec.dtype, spec.shape, spec.sharding, (), error=array._error)
    source_domains = addressable_domains(array.sharding, array.shape)
    target_domains = addressable_domains(spec.sharding, Shape(spec.shape))
    donate = semantics == ArrayCopySemantics.DONATE_INPUT
    by_domain: dict[IndexDomain, list] = {}
    for domain, buffer in zip(source_domains, buffers):
        by_domain.setdefault(domain, []).append(buffer)
    host_copies: dict[int, np.ndarray] = {}
    used: set[int] = set()
    out = []
    for domain, memory in zip(target_domains, memories):
        holders = by_domain.get(domain, [])
        same_memory = [b for b in holders if b.memory.id == memory._handle.id]
        if same_memory and donate and id(same_memory[0]) not in used:
            used.add(id(same_memory[0]))
            out.append(same_memory[0])
        elif holders:
            source = (same_memory or [b for b in holders if b.device.id == memory.devices()[0].id] or holders)[0]
            out.append(copy_to_memory(source, memory._handle))
        else:
            data = _assemble_on_host(array, domain, source_domains, buffers, host_copies)
            buffer, _ = _pjrt.buffer_from_host_buffer(client._handle, data, memory=memory._handle)
            out.append(buffer)
    if donate:
        array._take(semantics)
        for buffer in buffers:
            if id(buffer) not in used:
                buffer.delete()
    return PjrtArray(client, spec.dtype, spec.shape, spec.sharding, tuple(out))


def _assemble_on_host(array, target: IndexDomain, source_domains, buffers, host_copies) -> np.ndarray:
    """The ``target`` slice of ``array``, gathered from the source shards overlapping it."""
    out = np.empty(target.shape.dims, array.dtype.to_numpy())
    filled = set()
    for domain, buffer in zip(source_domains, buffers):
        if domain in filled:
            continue
        overlap = _intersection(domain, target)
        if overlap is None:
            continue
        filled.add(domain)
        data = host_copies.get(id(buffer))
        if data is None:
            data = host_copies[id(buffer)] = buffer.to_numpy()
        out[_relative(overlap, target)] = data[_relative(overlap, domain)]
    return out


def _intersection(a: IndexDomain, b: IndexDomain):
    lo = [max(x, y) for x, y in zip(a.origin, b.origin)]
    hi = [min(x + n, y + m) for x, n, y, m in zip(a.origin, a.shape.dims, b.origin, b.shape.dims)]
    if any(h <= l for l, h in zip(lo, hi)) and len(lo):
        return None
    return list(zip(lo, hi))


def _relative(box, domain: IndexDomain) -> tuple:
    return tuple(slice(l - o, h - o) for (l, h), o in zip(box, domain.origin))
