"""PjrtArray: an IFRT array as one PJRT buffer per addressable device of its sharding,
in the sharding's device order: its lifetime, shards, host reads and zero-copy exports.

Arrays are made by :mod:`.put` (from host data), :mod:`.operations` (assemble, copy,
bitcast, error arrays), :mod:`.reshard` and the executables.
"""

from __future__ import annotations

import atexit
import gc
import time
from typing import Any

import numpy as np

from ifrtpy.array import (
    ArrayCopySemantics, StoredArray, deleted_error, distinct_shards, numpy_of_view,
    plan_fully_replicated_shard, single_device_piece,
)
from ifrtpy.array_plans import plan_disassemble
from ifrtpy._host_memory import FRESH_BYTES as _FRESH_BYTES
from ifrtpy._host_memory import populate_while_pending, prefault_fresh
from ifrtpy.backends.pjrt._array_storage import ArrayCore, free_directly
from ifrtpy.backends.pjrt import dlpack
from ifrtpy.backends.pjrt.copies import copy_to_memory
from ifrtpy._pjrt import _dlpack
from ifrtpy.backends.pjrt.events import await_events, future_of_events
from ifrtpy.backends.pjrt.layouts import buffer_layout
from ifrtpy.dtypes import DType
from ifrtpy.errors import FailedPreconditionError
from ifrtpy.future import Future, Promise, join_futures, then_value
from ifrtpy.layout import Layout
from ifrtpy.shape import Shape
from ifrtpy.sharding import Sharding, SingleDeviceShardSemantics
from ifrtpy.user_context import current_user_context

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS


class PjrtArray(ArrayCore, StoredArray):
    """An array of a PjrtClient. Made by the client's operations, not by users.

    Its fields, ``is_deleted`` and ``block_until_ready`` live in the C-level ``ArrayCore``
    (for the execute fast path).
    Thread-safe for reads; ``delete`` is idempotent.
    """

    __slots__ = ()

    def __init__(self, client, dtype: DType, shape: Shape, sharding: Sharding,
                 buffers: tuple, error: BaseException | None = None, layout: Layout | None = None):
        self._client = client
        self._dtype = dtype
        self._shape = shape
        self._sharding = sharding
        self._buffers = buffers
        self._error = error
        self._deleted = False
        self._user_context = current_user_context()
        self._layout = layout  # where it may not be the default layout of its memory

    @property
    def layout(self) -> Layout | None:
        """The device layout the plugin reports for the first shard; None for an error array
        or one with no addressable shard."""
        if self._error is not None or not self._buffers:
            return None
        buffer = self._live_buffers()[0]
        return self._layout if self._layout is not None else buffer_layout(buffer, self._dtype)

    @property
    def buffers(self) -> tuple:
        """The ``_pjrt.BufferHandle`` of each addressable shard, in device order."""
        return self._live_buffers()

    def _live_buffers(self) -> tuple:
        if self.is_deleted():
            raise deleted_error(self)
        return self._buffers

    # -- lifetime -------------------------------------------------------------------------

    def ready_future(self) -> Future[None]:
        if self._error is not None:
            return Future.failed(self._error)
        if self.is_deleted():
            return Future.failed(deleted_error(self))
        return future_of_events([b.ready_event() for b in self._buffers])

    def delete(self) -> Future[None]:
        if not self._deleted:
            self._deleted = True
            for buffer in self._buffers:
                buffer.delete()
        return Future.ready()

    def _data(self) -> tuple:
        return self._buffers if self._error is not None else self._live_buffers()

    def _copy_of(self, buffers: tuple) -> tuple:
        return tuple(copy_to_memory(b, b.memory) for b in buffers)

    def _drop_data(self) -> None:
        self._deleted = True  # the buffers belong to the new array

    # -- shards ---------------------------------------------------------------------------

    def disassemble_into_single_device_arrays(self, copy_semantics=ArrayCopySemantics.REUSE_INPUT,
                                              single_device_shard_semantics=ADDRESSABLE):
        plan = plan_disassemble(self, copy_semantics, single_device_shard_semantics)
        buffers = self._take(plan.copy_semantics)
        if self._error is not None:  # each piece fails as this array does
            return [PjrtArray(self._client, self._dtype, shape, sharding, (), error=self._error)
                    for shape, sharding in plan.pieces]
        return [PjrtArray(self._client, self._dtype, shape, sharding, (buffer,), layout=self._layout)
                for (shape, sharding), buffer in zip(plan.pieces, buffers)]

    def fully_replicated_shard(self, copy_semantics=ArrayCopySemantics.REUSE_INPUT):
        sharding = plan_fully_replicated_shard(self)
        buffers = self._take(copy_semantics)
        return PjrtArray(self._client, self._dtype, self._shape, sharding, buffers[:1],
                         self._error, self._layout)

    # -- host -----------------------------------------------------------------------------

    def copy_to_host_buffer(self, out=None, byte_strides=None) -> Future[np.ndarray]:
        return self._copy_to_host(out, byte_strides, wait=False)

    def _copy_to_host(self, out, byte_strides, wait: bool) -> Future[np.ndarray]:
        """copy_to_host_buffer; ``wait``: block (GIL released) until the shards are ready
        where NumPy then copies them from views (for a caller that waits anyway)."""
        if self._error is not None:
            return Future.failed(self._error)
        buffers = self._live_buffers()
        fresh = out is None and byte_strides is None  # a new dense array, still unmapped
        out = self._host_buffer(out, byte_strides)
        copies = [(buffers[i], out[index]) for i, index in self._read_plan(buffers)]
        # Data in host memory, ready: NumPy copies each shard from a view, no plugin copy
        # (each a task on a plugin thread, and a wake-up) to wait for. Not into a large
        # fresh array, whose page faults the plugin's copies (on several threads) or
        # _populate (on a second core) take.
        if self._host_readable() and not (fresh and out.nbytes >= _FRESH_BYTES):
            events = [buffer.ready_event() for buffer, _ in copies]
            if wait:
                await_events(events)
            if all(e.is_ready() for e in events):
                try:
                    views = [_dlpack.host_view(buffer) for buffer, _ in copies]  # no wait
                except Exception as exc:  # noqa: BLE001 - a failed shard: the read fails
                    return Future.failed(exc)
                if all(view is not None for view in views):
                    for view, (_, target) in zip(views, copies):
                        np.copyto(target, view)
                    return Future.ready(out)
        if fresh:
            prefault_fresh(out)  # before any copy writes it
        staged, events = [], []
        for buffer, target in copies:
            if target.flags.c_contiguous:  # straight into ``out``
                events.append(buffer.to_host_buffer(target)[1])
            else:
                staged.append(_staged_copy(buffer, target))
        if fresh:
            _populate(out, events)
        direct = future_of_events(events, out)  # one future for every direct copy
        return then_value(join_futures(staged + [direct]), out) if staged else direct

    def _read_plan(self, buffers: tuple) -> tuple:
        """``(i, index)`` for each distinct shard of a read of the whole array: ``buffers[i]``
        holds ``out[index]``. Cached by the client per sharding and shape (the same for
        every array of those); raises as :func:`ifrtpy.array.distinct_shards` does."""
        key = (self._sharding, self._shape)
        plans = self._client._read_plans
        plan = plans.get(key)
        if plan is None:
            if buffers and self._sharding.is_fully_replicated:
                plan = ((0, (...,)),)
            else:
                plan = tuple((i, (*domain.slices(), ...))
                             for domain, i in distinct_shards(self, range(len(buffers))).items())
            if len(plans) >= 4096:
                plans.clear()
            plans[key] = plan
        return plan

    def _host_readable(self) -> bool:
        """Whether every buffer of this live array is in memory the host reads (and the
        plugin can view)."""
        client = self._client
        return (self._error is None and not self._deleted and client._host_views
                and (client._host_platform
                     or all(b.memory.kind in dlpack.HOST_MEMORY_KINDS for b in self._buffers)))

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
        return dlpack.dlpack_device(self._client, self._single_buffer("__dlpack_device__()"))

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule of a single-device array (array API standard): zero-copy unless
        ``copy=True`` or ``dl_device`` names another device; versioned (read-only flag set)
        where ``max_version`` allows DLPack 1.x, legacy otherwise. The buffer stays alive,
        and its memory allocated, until the consumer releases the capsule."""
        return dlpack.export_dlpack(self._single_buffer("__dlpack__()"), self, stream,
                                      max_version, dl_device, copy)

    def dlpack_shards(self) -> list[Any]:
        """A legacy DLPack capsule of each addressable shard's buffer, in device order,
        without a copy: what jaxlib imports (see :meth:`ifrtpy.Array.dlpack_shards`)."""
        if self._error is not None:
            raise self._error
        client = self._client
        return [_dlpack.export(buffer, *dlpack.dlpack_device(client, buffer), False)
                for buffer in self._live_buffers()]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """NumPy form of the array. A single-device array in memory the host can read is
        viewed without a copy (read-only, pinning the buffer), or with ``copy=True`` copied
        from that view (writeable); other arrays are gathered into a new array, and
        ``copy=False`` raises ValueError for them."""
        if len(self._buffers) == 1 and self._host_readable():
            buffer = self._buffers[0]
            try:
                view = _dlpack.host_view(buffer)
            except FailedPreconditionError:  # donated: the plugin deleted the buffer
                raise deleted_error(self) from None
            if view is not None:  # copy=True: NumPy's copy of the view, no plugin call
                return numpy_of_view(view, dtype, copy)
        if copy is False:
            raise ValueError(
                f"np.array(copy=False) of {self.debug_string()} needs a copy: only single-device "
                "arrays of whole-byte elements in host-readable memory are viewed without one")
        out = self._copy_to_host(None, None, wait=True).result()
        return out if dtype is None else out.astype(dtype, copy=False)


free_directly(PjrtArray)  # every execute frees arrays: ArrayCore's dealloc, no subtype_dealloc


# A put of a piece this large to a plugin whose memories are host RAM is staged in
# NumPy-allocated memory (see _staged_copies): NumPy asks for transparent huge pages from
# 4 MiB on, below that staging does not pay.
_LARGE_BYTES = 4 << 20


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
