"""The array requests of a session: puts, reads, assemble/disassemble, copies, reshards,
remaps, bitcasts, error arrays, deletion and readiness, each on ifrtpy's public
``Client`` / ``Array`` interfaces. The values requests carry are decoded and checked by
:mod:`.wire`; a read whose host buffer would exceed the session's host-buffer limit is
refused before the buffer is allocated."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from ifrtpy.array import ArrayCopySemantics, ArraySpec, HostBufferSemantics
from ifrtpy.client import HostBufferShards
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError, ResourceExhaustedError, UnimplementedError
from ifrtpy.future import join_futures
from ifrtpy.remap import Interval, Mapping, RemapPlan
from ifrtpy.shape import Shape
from ifrtpy.sharding import ConcreteEvenSharding, ConcreteSharding, SingleDeviceShardSemantics
from ifrtpy.proxy import steps, wire
from ifrtpy.proxy._protocol import messages
from ifrtpy.proxy.kind import Kind, Later
from ifrtpy.proxy.pool import POOL

__all__ = ["KINDS", "LEAST_PIECE", "in_flight"]

#: A lookup's pieces are made smaller, down to this, where less of the host-buffer budget
#: is left; a copy out is refused where its lookup's least piece would not fit beside it.
LEAST_PIECE = 64 << 10


def in_flight(left: int, piece: int) -> int:
    """The host-buffer bytes a lookup's next piece (at most ``piece`` of the ``left``
    bytes to send) is counted for while in flight: twice, its message and gRPC's copy."""
    return 2 * min(piece, left)

_COPY = {0: ArrayCopySemantics.ALWAYS_COPY, 1: ArrayCopySemantics.ALWAYS_COPY,
         2: ArrayCopySemantics.REUSE_INPUT, 3: ArrayCopySemantics.DONATE_INPUT}
_SHARDS = {0: SingleDeviceShardSemantics.ADDRESSABLE_SHARDS,
           1: SingleDeviceShardSemantics.ADDRESSABLE_SHARDS,
           2: SingleDeviceShardSemantics.ALL_SHARDS}


def _copy_semantics(value: int) -> ArrayCopySemantics:
    if value not in _COPY:
        raise InvalidArgumentError(f"unknown ArrayCopySemantics {value}")
    return _COPY[value]


def _shard_semantics(request: Any) -> SingleDeviceShardSemantics:
    if not request.HasField("single_device_shard_semantics"):
        return SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
    value = request.single_device_shard_semantics
    if value not in _SHARDS:
        raise InvalidArgumentError(f"unknown SingleDeviceShardSemantics {value}")
    return _SHARDS[value]


# -- host data ---------------------------------------------------------------------------

def _host_array(data: Any, dtype: DType, dims: Shape, strides: Any) -> np.ndarray:
    """The ndarray of ``data`` (read-only view) as ``dtype[dims]`` with ``strides`` (bytes;
    None: C order), after checking that the buffer holds every element."""
    if dtype.kind == DType.Kind.STRING:
        return _string_array(data, dims)
    data = memoryview(data).toreadonly()
    np_dtype = dtype.to_numpy()
    itemsize = np_dtype.itemsize
    count = math.prod(dims)
    if strides is None:
        if len(data) != count * itemsize:
            raise InvalidArgumentError(
                f"host buffer holds {len(data)} bytes, but {dtype}{list(dims)} needs "
                f"{count * itemsize}")
        return np.frombuffer(data, np_dtype).reshape(dims)
    strides = tuple(int(s) for s in strides)
    if len(strides) != len(dims):
        raise InvalidArgumentError(
            f"byte_strides {list(strides)} has {len(strides)} entries for {len(dims)} dims")
    if count == 0:
        return np.zeros(dims, np_dtype)
    if any(s < 0 or s % itemsize for s in strides):
        raise InvalidArgumentError(
            f"byte_strides {list(strides)} must be non-negative multiples of {itemsize}")
    end = sum((d - 1) * s for d, s in zip(dims, strides)) + itemsize
    if end > len(data):
        raise InvalidArgumentError(
            f"host buffer holds {len(data)} bytes, but {dtype}{list(dims)} with byte_strides "
            f"{list(strides)} reads {end}")
    return np.ndarray(dims, np_dtype, buffer=data, strides=strides)


def _string_array(data: bytes, dims: Shape) -> np.ndarray:
    contents = wire.parse(messages().StringArrayContents, bytes(data), "a STRING host buffer")
    if len(contents.strings) != math.prod(dims):
        raise InvalidArgumentError(
            f"a STRING host buffer holds {len(contents.strings)} strings for shape {list(dims)}")
    out = np.empty(len(contents.strings), dtype=object)
    out[:] = [bytes(s) for s in contents.strings]
    return out.reshape(dims)


def _host_bytes(values: np.ndarray, dtype: DType) -> bytes:
    if dtype.kind == DType.Kind.STRING:
        strings = [v.encode() if isinstance(v, str) else bytes(v) for v in values.flat]
        return messages().StringArrayContents(strings=strings).SerializeToString()
    return values.tobytes()  # C order


# -- puts --------------------------------------------------------------------------------

def _semantics(taken: list[Any], devices_per_buffer: int) -> HostBufferSemantics:
    """How a put may use the host buffers it took, the session's alone now: buffers the
    server allocated (NumPy memory, 64-byte aligned: a put file read, a copy out), each
    bound for one device, become the arrays' own memory where the backend can alias them;
    others are copied: bytes that arrived over gRPC (a bytearray, unaligned) copy best in
    the backend, and a buffer several devices' buffers aliased could be changed under all
    of them by a run that donates one."""
    if devices_per_buffer == 1 and all(isinstance(data, np.ndarray) for data in taken):
        return HostBufferSemantics.IMMUTABLE_ZERO_COPY
    return HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL


def _aliases(array: Any, data: Any) -> bool:
    """Whether ``array`` may hold the memory of the host buffer ``data`` it was made from
    with zero-copy semantics: True unless the backend tells the array's address and it
    lies outside ``data`` (the backend copied, as into a device's own memory)."""
    try:
        address = array.unsafe_buffer_pointer()
        start = np.frombuffer(data, np.uint8).ctypes.data
    except Exception:  # noqa: BLE001 - no address told: it may alias
        return True
    return start <= address < start + max(1, len(data))


def make_array_from_host_buffer(session: Any, request: Any) -> Any:
    dtype = wire.dtype_from_proto(request.dtype)
    dims = wire.array_shape(dtype, request.shape)
    sharding = wire.sharding_from_proto(session.client, request.sharding)
    strides = request.byte_strides.strides if request.HasField("byte_strides") else None
    layout = wire.layout_from_proto(request.layout) if request.HasField("layout") else None
    handle = session.result_handle(request.array_handle if request.HasField("array_handle") else 0)
    buffer = request.host_buffer_handle
    steps.LOG.mark(session.id, buffer, "put arrived")
    data = session.take_host_buffer(buffer)
    values = _host_array(data, dtype, dims, strides)
    semantics = _semantics([data], len(sharding.devices.addressable_device_list()))
    array = session.client.make_array_from_host_buffer(values, sharding, semantics, layout=layout)
    session.put_arrays([handle], [array])
    nbytes, held = len(data), [data]
    del data, values

    def ready(_: Any) -> None:
        steps.LOG.mark(session.id, buffer, "put ready", nbytes)
        # the memory of a put the backend copied (a device's own memory) is the next put
        # file's; one the array may alias stays the array's
        if semantics == HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL or not _aliases(
                array, held[0]):
            POOL.give(held)

    steps.LOG.mark(session.id, buffer, "put made", nbytes)
    array.ready_future().add_done_callback(ready)
    return messages().MakeArrayFromHostBufferResponse(array_handle=handle)


def make_arrays_from_host_buffer_shards(session: Any, request: Any) -> Any:
    handles = session.result_handles(request.array_handles, len(request.specs))
    specs, taken, devices_per_buffer = [], [], 1
    for spec in request.specs:
        array_spec = wire.array_spec_from_proto(session.client, spec.array_spec)
        if len(spec.addressable_shard_indices) != len(spec.host_buffers):
            raise InvalidArgumentError(
                f"a spec pairs {len(spec.addressable_shard_indices)} index lists with "
                f"{len(spec.host_buffers)} host buffers")
        buffers = []
        for indices, buffer in zip(spec.addressable_shard_indices, spec.host_buffers):
            strides = buffer.byte_strides.strides if buffer.HasField("byte_strides") else None
            dtype = wire.dtype_from_proto(buffer.dtype)
            dims = wire.array_shape(dtype, buffer.shape, "a host buffer's shape")
            taken.append(session.take_host_buffer(buffer.host_buffer_handle))
            devices_per_buffer = max(devices_per_buffer, len(indices.indices))
            buffers.append((list(indices.indices), _host_array(taken[-1], dtype, dims, strides)))
        specs.append(HostBufferShards(buffers, array_spec))
    arrays = session.client.make_arrays_from_host_buffer_shards(
        specs, _semantics(taken, devices_per_buffer))
    session.put_arrays(handles, arrays)
    return messages().MakeArraysFromHostBufferShardsResponse(array_handles=handles)


def make_error_arrays(session: Any, request: Any) -> Any:
    handles = session.result_handles(request.array_handles, len(request.array_specs))
    specs = [wire.array_spec_from_proto(session.client, s) for s in request.array_specs]
    error = wire.error_of_status(request.error, "MakeErrorArrays' error")
    arrays = session.client.make_error_arrays(error, specs)
    session.put_arrays(handles, arrays)
    return messages().MakeErrorArraysResponse(array_handles=handles)


# -- reads -------------------------------------------------------------------------------

def copy_to_host_buffer(session: Any, request: Any) -> Any:
    """Start the copy out and answer at once: the client's lookup of the host buffer then
    waits for the bytes, and the copy overlaps the answer's round trip. A copy that fails
    before it starts is this request's error; one that fails later, its lookups'."""
    handle = request.host_buffer_handle
    steps.LOG.mark(session.id, handle, "copy arrived")
    array = session.array(request.array_handle)
    strides = list(request.byte_strides.strides) if request.HasField("byte_strides") else None
    size = _host_buffer_size(array, strides)
    # counted before it is allocated, so reads in flight count against the limits; its
    # lookup's least piece in flight must fit beside it, or the lookup is refused
    least = in_flight(size, LEAST_PIECE)
    try:
        session.reserve_host_bytes(size + least)
    except ResourceExhaustedError as error:
        raise ResourceExhaustedError(
            f"CopyToHostBuffer: {array.dtype}{list(array.shape)} with byte_strides {strides} "
            f"takes a host buffer of {size} bytes and {least} more while its lookup streams "
            f"it: {error}") from None
    session.release_host_bytes(least)
    try:
        copy = session.expect_host_buffer(handle)
    except BaseException:
        session.release_host_bytes(size)
        raise
    try:
        future = array.copy_to_host_buffer(_kept_memory(array, size, strides),
                                           byte_strides=strides)
    except BaseException:
        session.delete_host_buffer(handle)
        session.release_host_bytes(size)
        raise
    dtype = array.dtype

    def copied(f: Any) -> None:
        error, data, held = f.exception(), None, size
        if error is None:
            try:
                data = _strided_bytes(f.result(), dtype)
                if len(data) != size:  # the backend laid it out otherwise: count what it holds
                    session.release_host_bytes(size)
                    held = 0
                    session.reserve_host_bytes(len(data))
                    held = len(data)
            except BaseException as failure:  # noqa: BLE001 - the lookups get it
                error, data = failure, None
        steps.LOG.mark(session.id, handle, "copy done", size)
        if data is None:
            assert error is not None
            session.release_host_bytes(held)
            session.copied_host_buffer(handle, copy, None, error)
        else:
            session.copied_host_buffer(handle, copy, data)

    failed = future.exception() if future.done() else None
    if failed is not None:  # failed at once: answer it
        session.delete_host_buffer(handle)
        session.release_host_bytes(size)
        raise failed
    future.add_done_callback(copied)
    steps.LOG.mark(session.id, handle, "copy answered")
    return messages().CopyToHostBufferResponse()


def _kept_memory(array: Any, size: int, strides: list[int] | None) -> np.ndarray | None:
    """Memory a deleted host buffer of ``size`` bytes left (:mod:`ifrtpy.proxy.pool`: its
    pages mapped) as the destination of a dense copy of ``array``; None for a new one."""
    if strides is not None or array.dtype.kind == DType.Kind.STRING:
        return None
    block = POOL.take(size)
    if block is None:
        return None
    return block.view(array.dtype.to_numpy()).reshape(tuple(array.shape))


def _host_buffer_size(array: Any, strides: list[int] | None) -> int:
    """The bytes of the host buffer a read of ``array`` laid out by byte ``strides`` (None:
    C order) allocates: the span the strides reach (each element's own bytes, the padding
    between them zeros)."""
    dims = tuple(array.shape)
    itemsize = array.dtype.to_numpy().itemsize
    if strides is None or 0 in dims:
        return math.prod(dims) * itemsize
    if len(strides) != len(dims):
        raise InvalidArgumentError(
            f"byte_strides {strides} has {len(strides)} entries for {len(dims)} dims")
    return sum(abs(s) * (d - 1) for s, d in zip(strides, dims)) + itemsize


def _strided_bytes(values: np.ndarray, dtype: DType) -> Any:
    """The bytes of ``values`` as laid out in the buffer its byte strides index (the one
    ``copy_to_host_buffer`` allocated for them): a flat uint8 view, not a copy, where the
    memory is contiguous."""
    if dtype.kind == DType.Kind.STRING or values.size == 0:
        return _host_bytes(values, dtype)
    if values.flags.c_contiguous:
        return values.reshape(-1).view(np.uint8)
    base = values
    while isinstance(base.base, np.ndarray):
        base = base.base
    return base.reshape(-1).view(np.uint8) if base.flags.c_contiguous else _host_bytes(values, dtype)


def disassemble(session: Any, request: Any) -> Any:
    array = session.array(request.array_handle)
    for handle in request.result_handles:  # checked before a DONATE_INPUT consumes the array
        session.result_handle(handle)
    pieces = array.disassemble_into_single_device_arrays(
        _copy_semantics(request.copy_semantics), _shard_semantics(request))
    handles = session.result_handles(request.result_handles, len(pieces))
    session.put_arrays(handles, pieces)
    return messages().DisassembleIntoSingleDeviceArraysResponse(array_handles=handles)


def fully_replicated_shard(session: Any, request: Any) -> Any:
    array = session.array(request.array_handle)
    handle = session.result_handle(request.result_handle)
    shard = array.fully_replicated_shard(_copy_semantics(request.copy_semantics))
    session.put_arrays([handle], [shard])
    return messages().FullyReplicatedShardResponse(array_handle=handle)


# -- arrays from arrays ------------------------------------------------------------------

def assemble(session: Any, request: Any) -> Any:
    pieces = session.arrays_of(request.single_device_array_handles)
    dtype = wire.dtype_from_proto(request.dtype) if request.HasField("dtype") else None
    shape = (wire.shape_of(request.shape) if dtype is None
             else wire.array_shape(dtype, request.shape))
    handle = session.result_handle(request.result_handle)
    array = session.client.assemble_array_from_single_device_arrays(
        shape, wire.sharding_from_proto(session.client, request.sharding),
        pieces, _copy_semantics(request.copy_semantics), _shard_semantics(request), dtype=dtype)
    session.put_arrays([handle], [array])
    return messages().AssembleArrayFromSingleDeviceArraysResponse(array_handle=handle)


def copy_arrays(session: Any, request: Any) -> Any:
    arrays = session.arrays_of(request.array_handles)
    handles = session.result_handles(request.result_handles, len(arrays))
    devices = (wire.devices_of(session.client, request.device_ids, "CopyArrays' device_ids")
               if request.device_ids else None)
    kind = request.memory_kind if request.HasField("memory_kind") and request.memory_kind else None
    out = session.client.copy_arrays(arrays, devices, kind, _copy_semantics(request.copy_semantics))
    session.put_arrays(handles, out)
    return messages().CopyArraysResponse(array_handles=handles)


def _to_specs(session: Any, request: Any, operation: Any, response_type: Any) -> Any:
    """A reshard or bitcast: ``operation(arrays, specs, semantics)`` into the result handles."""
    arrays = session.arrays_of(request.array_handles)
    handles = session.result_handles(request.result_handles, len(arrays))
    specs = [wire.array_spec_from_proto(session.client, s) for s in request.array_specs]
    session.put_arrays(handles, operation(arrays, specs, _copy_semantics(request.copy_semantics)))
    return response_type(array_handles=handles)


def reshard_arrays(session: Any, request: Any) -> Any:
    return _to_specs(session, request, session.client.reshard_arrays,
                     messages().ReshardArraysResponse)


def bitcast_arrays(session: Any, request: Any) -> Any:
    return _to_specs(session, request, session.client.bitcast_arrays,
                     messages().BitcastArraysResponse)


def _intervals(starts: Sequence[int], ends: Sequence[int], steps: Sequence[int]) -> list[Interval]:
    if not len(starts) == len(ends) == len(steps):
        raise InvalidArgumentError(
            f"a remap mapping has {len(starts)} starts, {len(ends)} ends and {len(steps)} steps")
    return [Interval(a, b, c) for a, b, c in zip(starts, ends, steps)]


def remap_arrays(session: Any, request: Any) -> Any:
    plan_proto = request.plan
    mappings = [Mapping(m.in_array, m.out_array,
                        _intervals(m.from_start, m.from_end, m.from_step),
                        _intervals(m.to_start, m.to_end, m.to_step))
                for m in plan_proto.mappings]
    def specs(protos: Any) -> list[ArraySpec]:
        return [wire.array_spec_from_proto(session.client, s) for s in protos]

    plan = RemapPlan(specs(plan_proto.input_specs), specs(plan_proto.output_specs), mappings)
    arrays = session.arrays_of(request.array_handles)
    handles = session.result_handles(request.result_handles, len(plan_proto.output_specs))
    out = session.client.remap_arrays(_with_index_domains(plan, arrays), arrays,
                                      _copy_semantics(request.copy_semantics))
    session.put_arrays(handles, out)
    return messages().RemapArraysResponse(array_handles=handles)


def _with_index_domains(plan: RemapPlan, arrays: Sequence[Any]) -> RemapPlan:
    """``plan``, where an output sharding names no index domains (a ConcreteEvenSharding
    that is not fully replicated: jax reorders an array's shards to another device order
    that way), with a ConcreteSharding of the domains the moved shards hold instead.

    A remap moves no data, so each output shard holds what its input shard held; saying so
    lets the output be read and passed to programs compiled for that placement (jax's
    reshard between two device orders of the same devices). Plans this cannot complete
    stay as they are, for ``remap_arrays`` to take or refuse."""
    unknown = [b for b, spec in enumerate(plan.output_specs)
               if type(spec.sharding) is ConcreteEvenSharding
               and not spec.sharding.is_fully_replicated]
    if not unknown or len(arrays) != len(plan.input_specs):
        return plan
    moves = plan.shard_moves()
    outputs = list(plan.output_specs)
    held: dict[int, Any] = {}  # the index domains of each input, or None
    for b in unknown:
        for a in {a for a, _ in moves[b]} - held.keys():
            held[a] = _index_domains(arrays[a])
        if any(held[a] is None for a, _ in moves[b]):
            continue
        domains = [held[a][k] for a, k in moves[b]]
        spec, sharding = outputs[b], outputs[b].sharding
        known = ConcreteSharding(sharding.devices, spec.shape,
                                 [sharding.shard_shape(spec.shape)] * len(domains), domains,
                                 sharding.memory_kind)
        outputs[b] = dataclasses.replace(spec, sharding=known)
    return RemapPlan(plan.input_specs, outputs, plan.mappings)


def _index_domains(array: Any) -> list[Any] | None:
    """The index domain of each shard of ``array``; None where its sharding names none, or
    has unreduced axes (a domain does not say which partial value a shard holds)."""
    if array.sharding.has_unreduced_axes:
        return None
    try:
        return list(array.sharding.index_domains(array.shape))
    except InvalidArgumentError:
        return None


# -- lifetime and readiness ----------------------------------------------------------------

def delete_array(session: Any, request: Any) -> Any:
    futures = [session.value(h).delete() for h in request.array_handle]
    handle = session.put_future(0, join_futures(futures))
    return messages().DeleteArrayResponse(deletion_future_handle=handle)


def is_array_deleted(session: Any, request: Any) -> Any:
    return messages().IsArrayDeletedResponse(
        deleted=session.value(request.array_handle).is_deleted())


def destruct_array(session: Any, request: Any) -> Any:
    for handle in request.array_handle:
        session.drop(handle)
    return b""  # an empty DestructArrayResponse, serialized


def check_value_ready(session: Any, request: Any) -> Later:
    values = session.values_of(request.value_handles)
    return Later(join_futures([v.ready_future() for v in values]),
                 bytes)  # an empty CheckValueReadyResponse, serialized


def check_future(session: Any, request: Any) -> Later:
    return Later(session.take_future(request.future_handle),
                 bytes)  # an empty CheckFutureResponse, serialized


def hash_values(session: Any, request: Any) -> Any:
    raise UnimplementedError(
        "HashValues is not served by the ifrtpy proxy: its backends keep no hash of an "
        "array's contents that a client could compare with its own")


#: The request kinds of this module (see :class:`~ifrtpy.proxy.session.Kind`).
KINDS = {
    "make_array_from_host_buffer_request": Kind(make_array_from_host_buffer, 4, ("array_handle",)),
    "make_arrays_from_host_buffer_shards_request":
        Kind(make_arrays_from_host_buffer_shards, 25, ("array_handles",)),
    "make_error_arrays_request": Kind(make_error_arrays, 26, ("array_handles",)),
    "copy_to_host_buffer_request": Kind(copy_to_host_buffer, 6),
    "disassemble_into_single_device_arrays_request": Kind(disassemble, 7, ("result_handles",)),
    "fully_replicated_shard_request": Kind(fully_replicated_shard, 20, ("result_handle",)),
    "assemble_array_from_single_device_arrays_request": Kind(assemble, 5, ("result_handle",)),
    "copy_arrays_request": Kind(copy_arrays, 24, ("result_handles",)),
    "reshard_arrays_request": Kind(reshard_arrays, 33, ("result_handles",)),
    "bitcast_arrays_request": Kind(bitcast_arrays, 34, ("result_handles",)),
    "remap_arrays_request": Kind(remap_arrays, 23, ("result_handles",)),
    "delete_array_request": Kind(delete_array, 9),
    "is_array_deleted_request": Kind(is_array_deleted, 11),
    "destruct_array_request": Kind(destruct_array, 12),
    "check_value_ready_request": Kind(check_value_ready, 8),
    "check_future_request": Kind(check_future, 3),
}

#: Kinds that newer jaxlibs' protocols have (0.12.1), refused by name: served where the
#: installed jaxlib's ``IfrtRequest`` has them.
NEWER_KINDS = {
    "hash_values_request": Kind(hash_values, 36),
}
