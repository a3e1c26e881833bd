"""PjrtArray: an IFRT array as one PJRT buffer per addressable device of its sharding,
in the sharding's device order; and the client operations that make and move arrays.

Every operation validates all of its inputs before the first buffer is made or moved,
so a failure leaves nothing half-made behind.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import math
import threading
import time
import weakref
from typing import Any, Sequence

import numpy as np

from ifrtpy import _pjrt
from ifrtpy.array import (
    Array, ArrayCopySemantics, ArraySpec, HostBufferSemantics, _then_value, numpy_of_view,
    single_device_piece,
)
from ifrtpy.backends.pjrt._fastpath import ArrayCore, PopulateBehind, populate_while_pending
from ifrtpy._pjrt._dlpack import host_view as _host_view
from ifrtpy.backends.pjrt import interop as _interop
from ifrtpy.backends.pjrt import strings as _strings
from ifrtpy.backends.reference import array as _host
from ifrtpy.backends.pjrt.events import future_of_events
from ifrtpy.device import DeviceList, MemoryKind
from ifrtpy.dtypes import DType, is_string_host_dtype
from ifrtpy.errors import (
    FailedPreconditionError, InvalidArgumentError, UnimplementedError, check_enum, check_type,
    invalid_argument)
from ifrtpy.future import Future, Promise, join_futures
from ifrtpy.interop import jax as _jax_bridge
from ifrtpy.layout import Layout
from ifrtpy.shape import IndexDomain, Shape, trusted_shape
from ifrtpy.sharding import OpaqueSharding, Sharding, SingleDeviceSharding, SingleDeviceShardSemantics

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
ALL_SHARDS = SingleDeviceShardSemantics.ALL_SHARDS


class PjrtArray(ArrayCore, Array):
    """An array of a PjrtClient. Made by the client's operations, not by users.

    Its fields, and ``block_until_ready``, live in the C-level ``ArrayCore`` (for the
    execute fast path).
    Thread-safe for reads; ``delete`` is idempotent.
    """

    __slots__ = ()

    def __init__(self, client, dtype: DType, shape: Shape, sharding: Sharding,
                 buffers: tuple, error: BaseException | None = None):
        self._client = client
        self._dtype = dtype
        self._shape = shape
        self._sharding = sharding
        self._buffers = buffers
        self._error = error
        self._deleted = False

    @property
    def client(self):
        return self._client

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def sharding(self) -> Sharding:
        return self._sharding

    @property
    def layout(self) -> Layout | None:
        """The device layout the plugin reports for the first shard (PJRT_Buffer_GetMemoryLayout);
        None for an error array or one with no addressable shard."""
        if self._error is not None or not self._buffers:
            return None
        return Layout(*self._live_buffers()[0].memory_layout)

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def buffers(self) -> tuple:
        """The ``_pjrt.BufferHandle`` of each addressable shard, in device order."""
        return self._live_buffers()

    def _live_buffers(self) -> tuple:
        if self.is_deleted():
            raise FailedPreconditionError(f"Array has been deleted: {self.debug_string()}")
        return self._buffers

    # -- lifetime -------------------------------------------------------------------------

    def ready_future(self) -> Future[None]:
        if self._error is not None:
            return Future.failed(self._error)
        if self.is_deleted():
            return Future.failed(FailedPreconditionError(f"Array has been deleted: {self.debug_string()}"))
        return future_of_events([b.ready_event() for b in self._buffers])

    def delete(self) -> Future[None]:
        if not self._deleted:
            self._deleted = True
            for buffer in self._buffers:
                buffer.delete()
        return Future.ready()

    def is_deleted(self) -> bool:
        return self._deleted or (bool(self._buffers) and self._buffers[0].is_deleted())

    def _take_buffers(self) -> tuple:
        """The buffers, for a new owner; this array reads as deleted afterwards."""
        buffers = self._buffers if self._error is not None else self._live_buffers()
        self._deleted = True
        return buffers

    # -- shards ---------------------------------------------------------------------------

    def disassemble_into_single_device_arrays(self, copy_semantics=ArrayCopySemantics.REUSE_INPUT,
                                              single_device_shard_semantics=ADDRESSABLE):
        if single_device_shard_semantics == ALL_SHARDS and not self._sharding.devices.is_fully_addressable:
            raise InvalidArgumentError(
                "disassemble with ALL_SHARDS needs every device addressable; "
                f"{self._sharding!r} has non-addressable devices")
        pieces = self._sharding.disassemble(self._shape, ADDRESSABLE)
        buffers = _with_copy_semantics(self, copy_semantics)
        if self._error is not None:  # each piece fails as this array does
            return [PjrtArray(self._client, self._dtype, Shape(shape), sharding, (), error=self._error)
                    for shape, sharding in pieces]
        return [PjrtArray(self._client, self._dtype, Shape(shape), sharding, (buffer,))
                for (shape, sharding), buffer in zip(pieces, buffers)]

    def fully_replicated_shard(self, copy_semantics=ArrayCopySemantics.REUSE_INPUT):
        if not self._sharding.is_fully_replicated:
            raise InvalidArgumentError(
                f"fully_replicated_shard needs a fully replicated array; sharding is {self._sharding!r}")
        buffers = _with_copy_semantics(self, copy_semantics)
        if not buffers:
            raise InvalidArgumentError("fully_replicated_shard: the array has no addressable shard")
        device = self._sharding.devices.addressable_device_list()[0]
        return PjrtArray(self._client, self._dtype, self._shape,
                         SingleDeviceSharding(device, self._sharding.memory_kind), buffers[:1])

    # -- host -----------------------------------------------------------------------------

    def copy_to_host_buffer(self, out=None, byte_strides=None) -> Future[np.ndarray]:
        if self._error is not None:
            return Future.failed(self._error)
        buffers = self._live_buffers()
        fresh = out is None and byte_strides is None  # a new dense array, still unmapped
        out = self._host_buffer(out, byte_strides)
        if buffers and self._sharding.is_fully_replicated:
            copies = [(buffers[0], out)]
        else:
            if isinstance(self._sharding, OpaqueSharding):
                raise InvalidArgumentError(
                    "an array with an OpaqueSharding cannot be copied to the host")
            domains = self._sharding.index_domains(self._shape, ADDRESSABLE)
            unique: dict[IndexDomain, Any] = {}
            for domain, buffer in zip(domains, buffers):
                unique.setdefault(domain, buffer)  # one copy per replicated domain
            covered = sum(math.prod(d.shape.dims) for d in unique)
            if covered != out.size:
                raise UnimplementedError(
                    f"copy_to_host_buffer: the addressable shards hold {covered} of the "
                    f"{out.size} elements of {self.debug_string()}")
            copies = [(buffer, out[(*domain.slices(), ...)]) for domain, buffer in unique.items()]
        staged, events = [], []
        for buffer, target in copies:
            if target.flags.c_contiguous:  # straight into ``out``
                events.append(buffer.to_host_buffer(target)[1])
            else:
                staged.append(_staged_copy(buffer, target))
        if fresh:
            _populate(out, events)
        direct = future_of_events(events, out)  # one future for every direct copy
        return _then_value(join_futures(staged + [direct]), out) if staged else direct

    # -- zero-copy exchange (DLPack, NumPy views) -----------------------------------------

    def _single_buffer(self, what: str):
        """The one buffer of a single-device array, for ``what``; clear errors otherwise."""
        if self._error is not None:
            raise self._error
        return single_device_piece(self, self._live_buffers(), what)

    def unsafe_buffer_pointer(self) -> int:
        """The address of a single-device array's data (device memory for accelerators).
        Valid while the array is alive and not deleted; for debugging and aliasing checks."""
        return self._single_buffer("unsafe_buffer_pointer()").unsafe_pointer

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(DLDeviceType, device id)`` of a single-device array, as the DLPack protocol asks."""
        return _interop.dlpack_device(self._client, self._single_buffer("__dlpack_device__()"))

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule of a single-device array (array API standard): zero-copy unless
        ``copy=True`` or ``dl_device`` names another device; versioned (read-only flag set)
        where ``max_version`` allows DLPack 1.x, legacy otherwise. The buffer stays alive,
        and its memory allocated, until the consumer releases the capsule."""
        return _interop.export_dlpack(self._single_buffer("__dlpack__()"), self, stream,
                                      max_version, dl_device, copy)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """NumPy form of the array. A single-device array in memory the host can read is
        viewed without a copy (read-only, pinning the buffer), or with ``copy=True`` copied
        from that view (writeable); other arrays are gathered into a new array, and
        ``copy=False`` raises ValueError for them."""
        buffers = self._buffers
        if (len(buffers) == 1 and self._error is None and not self._deleted
                and (self._client._host_platform or buffers[0].memory.kind in _interop.HOST_MEMORY_KINDS)):
            view = _host_view(buffers[0])
            if view is not None:  # copy=True: NumPy's copy of the view, no plugin call
                return numpy_of_view(view, dtype, copy)
        if copy is False:
            raise ValueError(
                f"np.array(copy=False) of {self.debug_string()} needs a copy: only single-device "
                "arrays of whole-byte elements in host-readable memory are viewed without one")
        out = self.copy_to_host_buffer().result()
        return out if dtype is None else out.astype(dtype, copy=False)


# A put of a piece this large to a plugin whose memories are host RAM is staged in
# NumPy-allocated memory (see _staged_copies): NumPy asks for transparent huge pages from
# 4 MiB on, below that staging does not pay.
_LARGE_BYTES = 4 << 20
# glibc serves allocations from 32 MiB on with fresh mappings (its largest mmap threshold),
# whose pages all fault: those are mapped on a second core while copies fill them (see
# _populate and _staged_copies). Smaller ones often reuse memory that is mapped already,
# where that only costs.
_FRESH_BYTES = 32 << 20


def _populate(out: np.ndarray, events: list) -> None:
    """Map the pages of ``out``, a fresh destination, while the plugin's copy into it
    (``events``, issued on a plugin thread) is pending: a fresh destination's page faults
    cost about as much as the copy itself, and this way the two run on two cores. Writes
    nothing, so it is safe whatever the copy has reached; bounded by one mapping of
    ``out``, and never waits for the copy. Not for several copies: the plugin runs those
    on several threads already, and mapping from here as well only adds contention."""
    if out.nbytes >= _FRESH_BYTES and len(events) == 1:
        populate_while_pending(out, events)


def _staged_copy(buffer, out: np.ndarray) -> Future[np.ndarray]:
    """Copy ``buffer`` into ``out`` (not C-contiguous) through a dense staging array."""
    staging, event = buffer.to_host_buffer()
    done = future_of_events([event], out)
    promise = Promise()

    def place(f):
        exc = f.exception()
        if exc is not None:
            promise.set_exception(exc)
        else:
            np.copyto(out, staging)
            promise.set_result(out)

    done.add_done_callback(place)
    return promise.future


def _with_copy_semantics(array: PjrtArray, semantics: ArrayCopySemantics) -> tuple:
    """The array's buffers as ``semantics`` says: fresh copies, shared, or taken over
    (an error array has none, and is deleted by donation all the same)."""
    semantics = check_enum(ArrayCopySemantics, semantics, "semantics")
    if semantics == ArrayCopySemantics.DONATE_INPUT:
        return array._take_buffers()
    if array._error is not None:
        return ()
    buffers = array._live_buffers()
    if semantics == ArrayCopySemantics.ALWAYS_COPY:
        return tuple(b.copy_to_memory(b.memory) for b in buffers)
    return buffers


# -- making arrays -------------------------------------------------------------------------

def _device_memories(client, sharding: Sharding) -> list:
    """The PjrtMemory each addressable device of ``sharding`` holds its shard in."""
    memories = []
    for device in sharding.devices.addressable_device_list():
        if device.client is not client:
            raise InvalidArgumentError(f"device {device} belongs to another client")
        memories.append(device.memory(sharding.memory_kind))
    return memories


def _host_domains(sharding: Sharding, shape: Shape, count: int) -> list:
    """The box of ``shape`` each of the ``count`` addressable shards holds, each checked
    to lie inside ``shape``."""
    if sharding.is_fully_replicated:
        return [IndexDomain(shape)] * count
    domains = list(sharding.index_domains(shape, ADDRESSABLE))
    if len(domains) != count:
        raise InvalidArgumentError(
            f"{sharding!r} gives {len(domains)} shards for {count} addressable devices")
    for domain in domains:
        origin, extent = domain
        if len(extent) != len(shape) or any(
                o < 0 or o + e > d for o, e, d in zip(origin, extent, shape)):
            raise InvalidArgumentError(
                f"{sharding!r} does not fit an array of shape {shape.debug_string()}: it has a "
                f"shard {domain.debug_string()}")
    return domains


_DTYPE_OF_NUMPY: dict = {}


def _dtype_of(np_dtype) -> DType:
    dtype = _DTYPE_OF_NUMPY.get(np_dtype)
    if dtype is None:
        dtype = _DTYPE_OF_NUMPY[np_dtype] = DType.from_numpy(np_dtype)
    return dtype


def make_array_from_host_buffer(client, data, sharding: Sharding, semantics, on_done, layout) -> PjrtArray:
    """Each addressable device of ``sharding`` receives its own shard of ``data`` (the
    whole of it where the sharding replicates), as ``jax.device_put`` does."""
    if (type(sharding) is SingleDeviceSharding and type(data) is np.ndarray
            and on_done is None and layout is None):
        # The common case, kept short: one device, no callback, a small array of a dtype,
        # shape and sharding seen before (else _put_single_device).
        cached = client._memory_cache.get(id(sharding))
        dtype = _DTYPE_OF_NUMPY.get(data.dtype)
        shape = _SHAPES.get(data.shape)
        if (cached is None or cached[0] is not sharding or dtype is None or shape is None
                or data.nbytes >= _LARGE_BYTES):
            return _put_single_device(client, data, sharding, semantics)
        memory = cached[1]
        array = _new_array(PjrtArray)  # ArrayCore starts with no error and not deleted
        array._buffers = (_pjrt.buffer_from_host_buffer(client._handle, data, None, memory,
                                                         semantics)[0],)
        array._client = client
        array._dtype = dtype
        array._shape = shape
        array._sharding = sharding
        return array
    if _jax_bridge.is_jax_target(sharding):
        sharding = _jax_bridge.sharding_from_jax(sharding, client, np.ndim(data))
    if not isinstance(sharding, Sharding):
        raise InvalidArgumentError(f"expected a Sharding, got {type(sharding).__name__}")
    data = data if isinstance(data, np.ndarray) else np.asarray(data)
    if is_string_host_dtype(data.dtype):  # object or StringDType: STRING data, held on the host
        return _host.make_array_from_host_buffer(client, data, sharding, semantics, on_done, layout)
    device_layout = _device_layout(client, layout, data.ndim)
    dtype = _dtype_of(data.dtype)
    shape = Shape(data.shape)
    semantics = check_enum(HostBufferSemantics, semantics, "semantics")
    memories = _device_memories(client, sharding)
    if not memories:
        raise InvalidArgumentError(f"{sharding!r} has no addressable device to put the array on")
    domains = _host_domains(sharding, shape, len(memories))
    pieces = [data[(*d.slices(), ...)] for d in domains]  # views, 0-d included
    if _stages(client, dtype, semantics):
        staged = _staged_copies([p if p.nbytes >= _LARGE_BYTES else None for p in pieces])
    else:
        staged = [None] * len(pieces)
    fan_out = (semantics == HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
               and sum(copy is None for copy in staged) > 1)
    # Several devices: copy asynchronously (the plugin overlaps those copies), then wait.
    mode = HostBufferSemantics.IMMUTABLE_UNTIL_TRANSFER_COMPLETES if fan_out else semantics
    handle = client._handle
    buffers, done = [], []
    for piece, memory, copy in zip(pieces, memories, staged):
        if copy is not None:  # copied already: nothing for on_done to wait for
            buffers.append(_pjrt.buffer_from_host_buffer(handle, copy, None, memory._handle, 2,
                                                         device_layout)[0])
            continue
        buffer, event = _pjrt.buffer_from_host_buffer(handle, piece, None, memory._handle, mode,
                                                      device_layout)
        buffers.append(buffer)
        if event is not None:
            done.append(event)
    if fan_out:
        for event in done:
            event.await_()
        done = []
    array = PjrtArray(client, dtype, shape, sharding, tuple(buffers))
    if on_done is not None:
        if done:
            future_of_events(done).add_done_callback(lambda _: on_done())
        else:
            on_done()
    return array


def _device_layout(client, layout, rank: int) -> tuple | None:
    """``layout`` as the Cython layer's ``(minor_to_major, tiles)``; None for the default.

    InvalidArgumentError for a layout of another rank; UnimplementedError on the CPU
    plugin for any layout but the row-major default: it reports a requested column-major
    layout back but keeps the elements in row-major order (measured on PJRT 0.81), so the
    layout would be a false statement about the memory.
    """
    if layout is None:
        return None
    if not isinstance(layout, Layout):
        raise InvalidArgumentError(f"layout must be an ifrtpy.Layout or None, got {layout!r}")
    if layout.rank != rank:
        raise InvalidArgumentError(f"layout {layout} has rank {layout.rank}, the data rank {rank}")
    if layout == Layout.row_major(rank):
        return None
    if client.platform_name == "cpu":
        raise UnimplementedError(
            f"the CPU PJRT plugin cannot place an array in device layout {layout}: it reports "
            f"the layout back but keeps the elements in row-major order. Read a column-major "
            f"host copy with copy_to_host_buffer(out=np.empty(shape, dtype, order='F')) instead")
    return layout.minor_to_major, layout.tiles


_SHAPES: dict = {}  # dims -> Shape, for fast puts
_new_array = PjrtArray.__new__


def _put_single_device(client, data: np.ndarray, sharding: SingleDeviceSharding, semantics) -> PjrtArray:
    """A put to one device with no callback (fills the fast path's caches; STRING data,
    never cached, always comes here)."""
    if is_string_host_dtype(data.dtype):
        return _host.make_array_from_host_buffer(client, data, sharding, semantics, None, None)
    # The cache is keyed by identity (equal shardings would cost a Python __eq__ on every
    # lookup); it holds the sharding, so that its id is not reused while cached.
    cache = client._memory_cache
    cached = cache.get(id(sharding))
    if cached is None or cached[0] is not sharding:
        if len(cache) >= 4096:
            cache.clear()
        cached = cache[id(sharding)] = (sharding, _device_memories(client, sharding)[0]._handle)
    memory = cached[1]
    dtype = _dtype_of(data.dtype)
    shape = _SHAPES.get(data.shape)
    if shape is None:
        if len(_SHAPES) >= 4096:
            _SHAPES.clear()
        shape = _SHAPES[data.shape] = trusted_shape(data.shape)
    if data.nbytes >= _LARGE_BYTES and _stages(client, dtype, semantics):
        data, semantics = _staged_copies([data])[0], 2  # the buffer aliases the copy
    buffer, _ = _pjrt.buffer_from_host_buffer(client._handle, data, None, memory, semantics)
    return PjrtArray(client, dtype, shape, sharding, (buffer,))


# The CPU plugin aliases a host array (zero-copy semantics) only at a 64-byte boundary.
_ALIGNMENT = 64


def _stages(client, dtype: DType, semantics) -> bool:
    """Whether large pieces of a put are staged (see _staged_copies): the caller's array
    is not to be aliased (semantics 0 or 1), the plugin's memories are host RAM (all
    memory kinds of the CPU plugin are), and elements are whole bytes (the plugin packs
    sub-byte elements, so it could not alias them)."""
    return (0 <= semantics <= 1 and dtype.byte_size is not None
            and client._handle.platform_name == "cpu")


def _staged_copies(pieces: list) -> list:
    """A private, dense, 64-byte aligned copy of each piece (None stays None), for buffers
    that alias them (kImmutableZeroCopy).

    The plugin would copy into memory it allocates itself, which for large buffers is
    fresh and takes one 4 KiB page fault per page: those cost more than the copy. Here
    one block of NumPy memory holds all the copies: a block that earlier copies used and
    released (see :class:`_StagingPool`), its pages mapped already, or else a new one, for
    which NumPy asks transparent huge pages (one fault per 2 MiB) and a helper thread maps
    the pages from the end while this one copies from the front. Each copy is kept alive
    by its buffer until the buffer is destroyed (the block, until all of them are); the
    caller may change or free its array at once, and runs that donate a buffer may write
    into its copy.
    """
    sizes = [0 if p is None else -(-p.nbytes // _ALIGNMENT) * _ALIGNMENT for p in pieces]
    if not any(sizes):
        return [None] * len(pieces)
    raw, fresh = _STAGING.take(sum(sizes) + _ALIGNMENT)
    offset = -raw.ctypes.data % _ALIGNMENT
    copies = []
    with PopulateBehind(raw) if fresh and raw.nbytes >= _FRESH_BYTES else contextlib.nullcontext():
        for piece, size in zip(pieces, sizes):
            if piece is None:
                copies.append(None)
                continue
            copy = raw[offset:offset + piece.nbytes].view(piece.dtype).reshape(piece.shape)
            np.copyto(copy, piece)
            copies.append(copy)
            offset += size
    _STAGING.give_back_when_released(raw, [c for c in copies if c is not None])
    return copies


class _StagingPool:
    """Blocks of staging memory whose copies are all released, kept for the next large
    put: their pages are mapped already, so copying into them runs at memory speed
    instead of paying the kernel's zeroing of fresh pages. Holds at most ``max_blocks``
    blocks (the most recent); a block is reused for a request of between half its size
    and its size. Thread-safe (blocks come back from the plugin's threads)."""

    def __init__(self, max_blocks: int = 2):
        self._max_blocks = max_blocks
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[np.ndarray, bool]:
        """A block of at least ``nbytes`` bytes, and whether it is fresh memory."""
        with self._lock:
            for i, block in enumerate(self._free):
                if nbytes <= block.nbytes <= 2 * nbytes:
                    return self._free.pop(i)[:nbytes], False
        return np.empty(nbytes, np.uint8), True

    def give_back_when_released(self, block: np.ndarray, views: list) -> None:
        """Return ``block``'s memory to the pool once every one of ``views`` is gone."""
        memory = block.base if block.base is not None else block
        left = [len(views)]

        def released():
            with self._lock:
                left[0] -= 1
                if left[0] == 0:
                    self._free.append(memory)
                    del self._free[:-self._max_blocks]

        for view in views:
            weakref.finalize(view, released)

    def clear(self) -> None:
        """Free every kept block."""
        with self._lock:
            self._free.clear()


_STAGING = _StagingPool()


def _finish_pending_work_at_exit(timeout: float = 10.0) -> None:
    """At interpreter exit, wait (at most ``timeout`` seconds in all) until the data of
    every live array is ready: a client can outlive the interpreter's teardown (held by a
    daemon thread, a cycle), and its plugin threads must not still be running programs
    while the process unloads the plugin's code."""
    deadline = time.monotonic() + timeout
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads obj.__class__, which some objects
        # compute (and warn about, as torch's deprecated aliases do)
        if not issubclass(type(obj), ArrayCore) or obj._deleted or obj._error is not None:
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            future_of_events([b.ready_event() for b in obj._buffers]).result(timeout=left)
        except Exception:  # noqa: BLE001  (failed, deleted or donated: nothing pending)
            pass


atexit.register(_finish_pending_work_at_exit)


def release_staging_memory() -> None:
    """Free the staging blocks kept for later large puts (see :class:`_StagingPool`)."""
    _STAGING.clear()


def assemble(client, shape, sharding: Sharding, arrays: Sequence[Array], copy_semantics,
             shard_semantics, dtype) -> Array:
    shape = shape if isinstance(shape, Shape) else Shape(shape)
    check_type(sharding, Sharding, "sharding", "a Sharding")
    arrays = _arrays_of(client, arrays, "assemble arrays")
    if (isinstance(sharding, SingleDeviceSharding) and len(arrays) == 1
            and isinstance(arrays[0], PjrtArray) and arrays[0].sharding == sharding
            and arrays[0].shape == shape and copy_semantics != ArrayCopySemantics.ALWAYS_COPY):
        return arrays[0]
    if _strings.is_string_call(arrays, "assemble") or (not arrays and dtype == _strings.STRING):
        return _host.assemble(client, shape, sharding, arrays, copy_semantics, shard_semantics,
                              dtype)
    if shard_semantics == ALL_SHARDS and not sharding.devices.is_fully_addressable:
        raise InvalidArgumentError(
            "SingleDeviceShardSemantics.ALL_SHARDS was requested, but the sharding has "
            f"non-addressable devices: {sharding!r}")
    devices = sharding.devices.addressable_device_list()
    if len(arrays) != len(devices):
        raise InvalidArgumentError(
            f"assemble needs one array per addressable device of the sharding: "
            f"{len(devices)} devices, got {len(arrays)} arrays")
    if dtype is None:
        if not arrays:
            raise InvalidArgumentError("assemble of no arrays needs a dtype")
        dtype = arrays[0].dtype
    shard_shapes = (None if isinstance(sharding, OpaqueSharding)
                    else [s for s, _ in sharding.disassemble(shape, ADDRESSABLE)])
    memories = _device_memories(client, sharding)
    copy_semantics = check_enum(ArrayCopySemantics, copy_semantics, "copy_semantics")
    donate = copy_semantics == ArrayCopySemantics.DONATE_INPUT
    if donate and len({id(a) for a in arrays}) != len(arrays):
        raise InvalidArgumentError("assemble with DONATE_INPUT got the same array more than once")
    for i, (array, device) in enumerate(zip(arrays, devices)):
        if not isinstance(array, PjrtArray) or array.client is not client:
            raise InvalidArgumentError(f"array {i} is not an array of this client")
        if len(array.sharding.devices) != 1:
            raise InvalidArgumentError(
                f"array {i} is not a single-device array: it is on {len(array.sharding.devices)} devices")
        if array.dtype != dtype:
            raise InvalidArgumentError(f"array {i} has dtype {array.dtype}, expected {dtype}")
        if shard_shapes is not None and array.shape != shard_shapes[i]:
            raise InvalidArgumentError(
                f"array {i} has shape {array.shape}, shard {i} of {shape} is {shard_shapes[i]}")
        held = array.sharding.devices[0]
        if held is not device:
            raise InvalidArgumentError(
                f"array {i} is on device {held}, shard {i} of the sharding is on {device}")
        if array._error is None and array._live_buffers()[0].memory.id != memories[i].id:
            raise InvalidArgumentError(
                f"array {i} is in memory kind {array._buffers[0].memory.kind}, the sharding "
                f"puts shard {i} in {memories[i].kind}")
    error = next((a._error for a in arrays if a._error is not None), None)
    taken = [_with_copy_semantics(a, copy_semantics) for a in arrays]
    if error is not None:  # the result fails as its first failing input does
        return PjrtArray(client, dtype, shape, sharding, (), error=error)
    return PjrtArray(client, dtype, shape, sharding, tuple(t[0] for t in taken))


def bitcast_arrays(client, arrays, specs, semantics) -> list[PjrtArray]:
    """Each shard reinterpreted on its device by a small compiled program (reshape and
    ``bitcast_convert``: PJRT has no buffer bitcast), compiled once per shard signature
    and device. The inputs are deleted after the outputs are ready under DONATE_INPUT."""
    from ifrtpy.bitcast import plan_bitcast

    plans = plan_bitcast(client, arrays, specs, semantics)
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
        if plan.array._error is None:
            plan.array._live_buffers()
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
                buffers.extend(exe(piece)[0]._take_buffers())
            out.append(PjrtArray(client, spec.dtype, Shape(spec.shape), spec.sharding,
                                 tuple(buffers)))
        if ArrayCopySemantics(semantics) == ArrayCopySemantics.DONATE_INPUT:
            out[-1].ready_future().exception()
            array.delete()
    return out


def _bitcast_executable(client, old_dtype, old_dims, new_dtype, new_dims, device):
    """The compiled reinterpretation of one shard signature on ``device`` (cached)."""
    import math

    from ifrtpy.builder import Builder
    from ifrtpy.executable import CompileOptions

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


def copy_arrays(client, arrays: Sequence[Array], devices, memory_kind, semantics) -> list[Array]:
    arrays = _arrays_of(client, arrays, "copy_arrays arrays")
    if not arrays:
        return []
    if _strings.is_string_call(arrays, "copy_arrays"):
        return _host.copy_arrays(client, arrays, devices, memory_kind, semantics)
    semantics = check_enum(ArrayCopySemantics, semantics, "semantics")
    first = arrays[0].sharding
    for i, array in enumerate(arrays):
        if array.sharding.devices != first.devices:
            raise InvalidArgumentError(
                f"copy_arrays needs every input on the same devices: array {i} is on "
                f"{array.sharding.devices.to_string()}, array 0 on {first.devices.to_string()}")
        if _canonical_kind(array.sharding) != _canonical_kind(first):
            raise InvalidArgumentError(
                f"copy_arrays needs every input in the same memory kind: array {i} is in "
                f"{_canonical_kind(array.sharding)}, array 0 in {_canonical_kind(first)}")
        array._live_buffers()
    if devices is not None and not isinstance(devices, DeviceList):
        devices = DeviceList(devices)
    if devices is not None and len(devices) != len(first.devices):
        raise InvalidArgumentError(
            f"copy_arrays: the new device list has {len(devices)} devices, the arrays are on "
            f"{len(first.devices)}")
    targets = []
    for array in arrays:
        sharding = array.sharding.with_device_assignment(devices, memory_kind)
        memories = _device_memories(client, sharding)
        if array._error is None and len(memories) != len(array._buffers):
            raise UnimplementedError(
                f"copy_arrays: {len(array._buffers)} addressable shards would land on "
                f"{len(memories)} addressable devices; copies across processes are not supported")
        targets.append((sharding, memories))
    out = []
    for array, (sharding, memories) in zip(arrays, targets):
        if array._error is not None:  # an error array's copy fails the same way
            array._deleted = array._deleted or semantics == ArrayCopySemantics.DONATE_INPUT
            out.append(PjrtArray(client, array.dtype, array.shape, sharding, (), error=array._error))
            continue
        buffers = []
        for buffer, memory in zip(array._buffers, memories):
            if buffer.memory.id == memory._handle.id and semantics != ArrayCopySemantics.ALWAYS_COPY:
                buffers.append(buffer)
            else:
                buffers.append(buffer.copy_to_memory(memory._handle))
        if semantics == ArrayCopySemantics.DONATE_INPUT:
            kept = {id(b) for b in buffers}
            array._deleted = True
            for buffer in array._buffers:
                if id(buffer) not in kept:
                    buffer.delete()
        out.append(PjrtArray(client, array.dtype, array.shape, sharding, tuple(buffers)))
    return out


def _arrays_of(client: Any, arrays: Any, parameter: str) -> list[Any]:
    """``arrays`` as a list, each checked to be an array of ``client`` (numeric, or a
    host-held string array)."""
    if isinstance(arrays, (str, bytes, np.ndarray, Array)) or not hasattr(arrays, "__iter__"):
        raise invalid_argument(parameter, "a sequence of Arrays", arrays)
    arrays = list(arrays)
    for i, array in enumerate(arrays):
        if not isinstance(array, (PjrtArray, _strings.BasicStringArray)):
            raise invalid_argument(f"{parameter}[{i}]", "an Array of this client", array)
        if array.client is not client:
            raise InvalidArgumentError(f"{parameter}[{i}] is an array of another client")
    return arrays


def _canonical_kind(sharding: Sharding) -> MemoryKind:
    devices = sharding.devices
    return sharding.memory_kind.canonicalize(devices[0]) if len(devices) else sharding.memory_kind


def make_error_arrays(client, error: BaseException, specs: Sequence[ArraySpec]) -> list[Array]:
    if not isinstance(error, BaseException):
        raise InvalidArgumentError(f"make_error_arrays needs an exception, got {error!r}")
    return [_strings.make_error_array(client, error, spec) if spec.dtype == _strings.STRING
            else PjrtArray(client, spec.dtype, spec.shape, spec.sharding, (), error=error)
            for spec in specs]
