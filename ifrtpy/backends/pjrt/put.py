"""The PjRt backend's put: host data split by a sharding into one PJRT buffer per
addressable device, copied or aliased as the host-buffer semantics allow.

Large pieces bound for host RAM (the CPU plugin) are staged in reused, pre-faulted
NumPy memory that the buffer then aliases (see :func:`_staged_copies`); small puts of a
dtype, shape and sharding seen before take a short path.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import numpy as np

from ifrtpy import _pjrt
from ifrtpy.array import ArrayCopySemantics, HostBufferSemantics
from ifrtpy.array_plans import addressable_domains, check_placement
from ifrtpy.backends import host_arrays
from ifrtpy._host_memory import PopulateBehind
from ifrtpy.backends.pjrt.array import _FRESH_BYTES, _LARGE_BYTES, PjrtArray
from ifrtpy.backends.pjrt.events import future_of_events
from ifrtpy.backends.pjrt.layouts import buffer_layout
from ifrtpy.backends.pjrt.strings import BasicStringArray
from ifrtpy.dtypes import DType, is_string_host_dtype
from ifrtpy.errors import InvalidArgumentError, UnimplementedError, check_enum
from ifrtpy.layout import Layout
from ifrtpy.shape import Shape, trusted_shape
from ifrtpy.backends import jax_shardings
from ifrtpy.device import MemoryKind
from ifrtpy.sharding import Sharding, SingleDeviceSharding
from ifrtpy.user_context import ACTIVE

__all__ = ["make_array_from_host_buffer", "release_staging_memory"]


def _device_memories(client, sharding: Sharding) -> list:
    """The PjrtMemory each addressable device of ``sharding`` holds its shard in
    (InvalidArgumentError for a sharding of another client or memory kind)."""
    check_placement(client, sharding)
    kind = sharding.memory_kind
    return [device.memory(kind) for device in sharding.devices.addressable_device_list()]


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
        array._user_context = _active_context()
        return array
    if jax_shardings.is_jax_target(sharding):
        sharding = jax_shardings.sharding_from_jax(sharding, client, np.ndim(data))
    if not isinstance(sharding, Sharding):
        raise InvalidArgumentError(f"expected a Sharding, got {type(sharding).__name__}")
    data = data if isinstance(data, np.ndarray) else np.asarray(data)
    if data.dtype == np.complex128 and _scrambles_complex128(client, sharding):
        return _put_through_device_memory(client, data, sharding, semantics, on_done, layout)
    if is_string_host_dtype(data.dtype):  # object or StringDType: STRING data, held on the host
        return host_arrays.make_array_from_host_buffer(BasicStringArray, client, data, sharding,
                                                       semantics, on_done, layout)
    dtype = _dtype_of(data.dtype)
    shape = Shape(data.shape)
    semantics = check_enum(HostBufferSemantics, semantics, "semantics")
    memories = _device_memories(client, sharding)
    if not memories:
        raise InvalidArgumentError(f"{sharding!r} has no addressable device to put the array on")
    domains = addressable_domains(sharding, shape)
    pieces = [data[(*d.slices(), ...)] for d in domains]  # views, 0-d included
    device_layout = _device_layout(client, layout, dtype, pieces[0].shape, memories[0])
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
    array = PjrtArray(client, dtype, shape, sharding, tuple(buffers),
                      layout=None if device_layout is None else buffer_layout(buffers[0], dtype))
    if on_done is not None:
        if done:
            future_of_events(done).add_done_callback(lambda _: on_done())
        else:
            on_done()
    return array


def _device_layout(client, layout, dtype: DType, dims, memory) -> tuple | None:
    """``layout`` (of a shard of ``dims`` in ``memory``) as the Cython layer's
    ``(minor_to_major, tiles)``; None for the memory's default layout.

    A layout without tiles asks for that dimension order, tiled as the plugin chooses
    (a TPU tiles every array in its own memory). InvalidArgumentError for a layout of
    another rank or element size; UnimplementedError on the CPU plugin for any layout
    but its row-major default: it reports a requested column-major layout back but keeps
    the elements in row-major order (measured on PJRT 0.81), so the layout would be a
    false statement about the memory.
    """
    if layout is None:
        return None
    if not isinstance(layout, Layout):
        raise InvalidArgumentError(f"layout must be an ifrtpy.Layout or None, got {layout!r}")
    rank = len(dims)
    if layout.rank != rank:
        raise InvalidArgumentError(f"layout {layout} has rank {layout.rank}, the data rank {rank}")
    default = client.get_default_layout(dtype, dims, memory.devices()[0], memory.kind)
    if layout.element_size_in_bits not in (0, default.element_size_in_bits):
        raise InvalidArgumentError(
            f"layout {layout} packs {dtype} elements in {layout.element_size_in_bits} bits; "
            f"the device holds them in {default.element_size_in_bits or dtype.bit_size}")
    if layout.accepts(default):
        return None
    if client._host_platform:
        raise UnimplementedError(
            f"ifrtpy places arrays on a CPU PJRT plugin in the default layout only, not in device "
            f"layout {layout}: the official build (PJRT 0.81) reports the layout back but keeps "
            f"the elements in row-major order. Read a column-major host copy with "
            f"copy_to_host_buffer(out=np.empty(shape, dtype, order='F')) instead")
    return layout.minor_to_major, layout.tiles


def _scrambles_complex128(client, sharding: Sharding) -> bool:
    """Whether a put of complex128 data into ``sharding``'s memory comes back wrong: libtpu
    (0.0.42, PJRT 0.112) returns the imaginary part in both parts of complex128 put into
    ``pinned_host`` memory (jax's device_put too), while a copy there from ``device``
    memory keeps both (measured on a TPU v5e)."""
    return (client.platform_name == "tpu" and sharding.memory_kind.value == "pinned_host")


def _put_through_device_memory(client, data, sharding, semantics, on_done, layout) -> PjrtArray:
    """The put into the devices' default memory, then a copy into ``sharding``'s."""
    staged = make_array_from_host_buffer(client, data, sharding.with_device_assignment(
        None, MemoryKind("device")), semantics, on_done, layout)
    (array,) = client.copy_arrays([staged], None, sharding.memory_kind,
                                  ArrayCopySemantics.DONATE_INPUT)
    array._sharding = sharding  # the caller's object, as every put returns
    return array


_SHAPES: dict = {}  # dims -> Shape, for fast puts
_new_array = PjrtArray.__new__
_active_context = ACTIVE.get


def _put_single_device(client, data: np.ndarray, sharding: SingleDeviceSharding, semantics) -> PjrtArray:
    """A put to one device with no callback (fills the fast path's caches; STRING data,
    never cached, always comes here)."""
    if is_string_host_dtype(data.dtype):
        return host_arrays.make_array_from_host_buffer(BasicStringArray, client, data, sharding,
                                                       semantics, None, None)
    # The cache is keyed by identity (equal shardings would cost a Python __eq__ on every
    # lookup); it holds the sharding, so that its id is not reused while cached.
    if _scrambles_complex128(client, sharding):  # never cached: the fast path knows no dtype
        if data.dtype == np.complex128:
            return _put_through_device_memory(client, data, sharding, semantics, None, None)
        memory = _device_memories(client, sharding)[0]._handle
    else:
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


def release_staging_memory() -> None:
    """Free the staging blocks kept for later large puts (see :class:`_StagingPool`)."""
    _STAGING.clear()

