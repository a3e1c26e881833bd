"""The PjRt backend's client operations that make and move arrays from arrays: assemble,
copy, bitcast and error arrays (reshard is :mod:`.reshard`). Each is checked completely
first (:mod:`ifrtpy.array_plans`), so a failure leaves nothing half-made behind. STRING
arrays, held on the host, go to :mod:`ifrtpy.backends.host_arrays`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ifrtpy.array import Array, ArrayCopySemantics, ArraySpec
from ifrtpy.array_plans import arrays_of, plan_assemble, plan_copy, plan_error_arrays
from ifrtpy.backends import host_arrays
from ifrtpy.backends.pjrt.array import PjrtArray
from ifrtpy.backends.pjrt.copies import copy_to_memory
from ifrtpy.backends.pjrt.layouts import buffer_layout
from ifrtpy.backends.pjrt.strings import STRING, BasicStringArray, is_string_call
from ifrtpy.bitcast import plan_bitcast
from ifrtpy.builder import Builder
from ifrtpy.errors import UnimplementedError
from ifrtpy.executable import CompileOptions
from ifrtpy.shape import Shape
from ifrtpy.sharding import SingleDeviceSharding

__all__ = ["assemble", "copy_arrays", "bitcast_arrays", "make_error_arrays"]

#: What a call may take: numeric arrays, or STRING arrays held on the host.
ARRAY_TYPES = (PjrtArray, BasicStringArray)


def assemble(client: Any, shape: Any, sharding: Any, arrays: Any, copy_semantics: Any,
             shard_semantics: Any, dtype: Any) -> Array:
    arrays = arrays_of(client, arrays, "assemble arrays", ARRAY_TYPES)
    shape = shape if isinstance(shape, Shape) else Shape(shape)
    if (isinstance(sharding, SingleDeviceSharding) and len(arrays) == 1
            and isinstance(arrays[0], PjrtArray) and arrays[0].sharding == sharding
            and arrays[0].shape == shape and copy_semantics != ArrayCopySemantics.ALWAYS_COPY):
        return arrays[0]  # the array is its own only shard
    if is_string_call(arrays, "assemble") or (not arrays and dtype == STRING):
        return host_arrays.assemble(BasicStringArray, client, shape, sharding, arrays,
                                    copy_semantics, shard_semantics, dtype)
    plan = plan_assemble(client, shape, sharding, arrays, copy_semantics, shard_semantics, dtype,
                         PjrtArray)
    taken = [a._take(plan.copy_semantics) for a in plan.arrays]
    if plan.error is not None:  # the result fails as its first failing input does
        return PjrtArray(client, plan.dtype, plan.shape, plan.sharding, (), error=plan.error)
    return PjrtArray(client, plan.dtype, plan.shape, plan.sharding, tuple(t[0] for t in taken),
                     layout=plan.arrays[0]._layout if plan.arrays else None)


def bitcast_arrays(client, arrays, specs, semantics) -> list[PjrtArray]:
    """Each shard reinterpreted on its device by a small compiled program (reshape and
    ``bitcast_convert``: PJRT has no buffer bitcast), compiled once per shard signature
    and device. The inputs are deleted after the outputs are ready under DONATE_INPUT."""
    plans = plan_bitcast(client, arrays, specs, semantics, ARRAY_TYPES)
    for i, plan in enumerate(plans):
        for dtype in (plan.array.dtype, plan.spec.dtype):
            if dtype.to_numpy().kind == "c":
                raise UnimplementedError(
                    f"bitcast_arrays: array {i} involves {dtype}; StableHLO's bitcast_convert, "
                    "which the PjRt backend runs, does not take complex types")
        sharding = plan.array.sharding
        for device in sharding.devices.addressable_device_list():
            if device.memory(sharding.memory_kind) is not device.default_memory():
                raise UnimplementedError(
                    f"bitcast_arrays: array {i} is in memory kind {sharding.memory_kind}; the "
                    "PjRt backend bitcasts arrays in the devices' default memory only")
    out = []
    for plan in plans:
        spec, array = plan.spec, plan.array
        if array._error is not None:
            out.extend(make_error_arrays(client, array._error, [spec]))
        else:
            pieces = array.disassemble_into_single_device_arrays(ArrayCopySemantics.REUSE_INPUT)
            buffers = []
            for piece, old, new in zip(pieces, plan.old_shards, plan.new_shards):
                device = piece.sharding.devices[0]
                exe = _bitcast_executable(client, array.dtype, old, spec.dtype, new, device)
                buffers.extend(exe(piece)[0]._take(ArrayCopySemantics.DONATE_INPUT))
            out.append(PjrtArray(client, spec.dtype, Shape(spec.shape), spec.sharding,
                                 tuple(buffers)))
        if ArrayCopySemantics(semantics) == ArrayCopySemantics.DONATE_INPUT:
            out[-1].ready_future().exception()
            array.delete()
    return out


def _bitcast_executable(client, old_dtype, old_dims, new_dtype, new_dims, device):
    """The compiled reinterpretation of one shard signature on ``device`` (cached)."""
    cache = client.__dict__.setdefault("_bitcast_executables", {})
    key = (old_dtype, old_dims, new_dtype, new_dims, device.id)
    exe = cache.get(key)
    if exe is None:
        b = Builder("bitcast")
        x = b.parameter(old_dims, old_dtype, name="x")
        flat = b.reshape(x, (math.prod(old_dims),))
        ratio_old, ratio_new = old_dtype.bit_size, new_dtype.bit_size
        if ratio_old < ratio_new:  # narrower elements: group them first
            flat = b.reshape(flat, (flat.shape.dims[0] * ratio_old // ratio_new,
                                    ratio_new // ratio_old))
        y = b.bitcast_convert(flat, new_dtype)
        exe = client.compile(b.build(b.reshape(y, new_dims)), CompileOptions(devices=[device]))
        cache[key] = exe
    return exe


def copy_arrays(client: Any, arrays: Any, devices: Any, memory_kind: Any, semantics: Any
                ) -> list[Array]:
    """Each shard goes to the memory of the device in its place: a device-to-device copy,
    or the buffer itself where it stays put and need not be copied."""
    arrays = arrays_of(client, arrays, "copy_arrays arrays", ARRAY_TYPES)
    if is_string_call(arrays, "copy_arrays"):
        return host_arrays.copy_arrays(BasicStringArray, client, arrays, devices, memory_kind,
                                       semantics)
    plan = plan_copy(client, arrays, devices, memory_kind, semantics, PjrtArray)
    donate = plan.semantics == ArrayCopySemantics.DONATE_INPUT
    out = []
    for array, sharding in zip(plan.arrays, plan.targets):
        if array._error is not None:  # an error array's copy fails the same way
            array._take(plan.semantics)  # donated all the same
            out.append(PjrtArray(client, array.dtype, array.shape, sharding, (), error=array._error))
            continue
        kind = sharding.memory_kind
        memories = [d.memory(kind) for d in sharding.devices.addressable_device_list()]
        buffers = []
        for buffer, memory in zip(array._buffers, memories):
            if buffer.memory.id == memory._handle.id and plan.semantics != ArrayCopySemantics.ALWAYS_COPY:
                buffers.append(buffer)
            else:
                buffers.append(copy_to_memory(buffer, memory._handle))
        if donate:
            kept = {id(b) for b in buffers}
            array._take(plan.semantics)
            for buffer in array._buffers:
                if id(buffer) not in kept:
                    buffer.delete()
        # A copy of an array in the default layout gets the default of its new memory.
        layout = None if array._layout is None else buffer_layout(buffers[0], array.dtype)
        out.append(PjrtArray(client, array.dtype, array.shape, sharding, tuple(buffers),
                             layout=layout))
    return out


def make_error_arrays(client: Any, error: BaseException, specs: Sequence[ArraySpec]) -> list[Array]:
    return [(BasicStringArray if spec.dtype == STRING else PjrtArray)(
                client, spec.dtype, spec.shape, spec.sharding, (), error)
            for spec in plan_error_arrays(client, error, specs)]
