"""A session's host buffers: their storage, the requests and lookups waiting for them,
and the bytes they hold against the session's limit and the server's.

A host buffer arrives from the client (``HostBufferStore``, a put file) and is consumed by
the request that names it, or is made by a copy out of a device (``CopyToHostBuffer``),
read by the client's lookups and deleted (``HostBufferDelete``). Every thread may touch
them (the worker, the event loop's RPCs, the threads completing copies), so
:class:`HostBuffers` holds one lock.

Two rules keep a handle's bytes its own:

* a copy out is a :class:`Copy` record: only the copy still recorded for its handle
  stores its bytes there. Deleting the handle orphans its running copy (its bytes are
  dropped, uncounted, when it ends), and a new copy to the same handle never receives
  the old one's bytes.
* memory goes back to :data:`~ifrtpy.proxy.pool.POOL` only when nothing reads it: a
  lookup streaming a buffer holds a lease on it (:meth:`HostBuffers.lease`); a buffer
  deleted meanwhile goes to the pool when its last lease ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator

from ifrtpy.errors import (FailedPreconditionError, InvalidArgumentError, NotFoundError,
                           ResourceExhaustedError)
from ifrtpy.proxy.limits import Budget, Limits
from ifrtpy.proxy.pool import POOL

__all__ = ["HostBuffers", "HostBytes", "Copy", "HOST_BUFFER_WAIT_S", "bare"]

#: A host buffer's bytes: ``bytes``, or any object whose buffer holds them and whose
#: ``len`` is their count (a bytearray, a flat uint8 NumPy array).
HostBytes = Any

#: How long a request naming a host buffer waits for it to arrive (a bound on a client
#: that names a buffer it never sends).
HOST_BUFFER_WAIT_S = 60.0


def bare(error: BaseException) -> BaseException:
    """``error`` without its traceback and chained errors: kept (for a handle, a copy's
    lookups), it must not keep alive what the failed call's frames held (a host buffer,
    arrays)."""
    error.__traceback__ = None
    error.__context__ = error.__cause__ = None
    return error


class Copy:
    """A copy out to a host buffer: running (``error`` None) or failed (its error)."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None


class HostBuffers:
    """The host buffers of session ``session_id`` (see the module docstring); ``total``
    is the server's budget shared by every session. :meth:`other_handles` (the session's
    arrays, executables, futures) counts toward ``limits.max_handles`` with them."""

    def __init__(self, session_id: int, limits: Limits, total: Budget):
        self.id = session_id
        self.limits = limits
        self._total = total
        self._host_buffers: dict[int, HostBytes] = {}
        self._host_bytes = 0  # stored, arriving and copied out: counted against both limits
        self._waiters: dict[int, list[Callable[[], None]]] = {}
        self._copies: dict[int, Copy] = {}  # copies out still running, or failed
        self._leases: dict[int, int] = {}  # id(buffer) -> lookups streaming it
        self._deleted: dict[int, HostBytes] = {}  # id(buffer) -> a deleted buffer still leased
        self._rpcs = 0  # host-buffer RPCs in flight
        self._lock = threading.Lock()
        self._stored = threading.Condition(self._lock)
        self.closed = False  # stopped: the client is gone (see stop_host_buffers)
        #: when the session last made progress: a request read, an answer written, host
        #: buffer bytes moved (time.monotonic())
        self.last_active = time.monotonic()

    def other_handles(self) -> int:
        return 0

    def _live_handles(self) -> int:
        return self.other_handles() + len(self._host_buffers) + len(self._copies)

    # -- RPCs and bytes ------------------------------------------------------------------

    @contextlib.contextmanager
    def rpc(self) -> Iterator[None]:
        """Count a host-buffer RPC of the session while it runs (see :meth:`open_rpc`)."""
        self.open_rpc()
        try:
            yield
        finally:
            self.close_rpc()

    def open_rpc(self) -> None:
        """Count one more host-buffer RPC in flight; ResourceExhaustedError at the limit."""
        with self._lock:
            if self._rpcs >= self.limits.max_host_buffer_rpcs:
                raise ResourceExhaustedError(
                    f"session {self.id} has {self._rpcs} host-buffer RPCs in flight, its "
                    f"limit (max_host_buffer_rpcs)")
            self._rpcs += 1

    def close_rpc(self) -> None:
        with self._lock:
            self._rpcs -= 1

    def reserve_host_bytes(self, size: int) -> None:
        """Count ``size`` more bytes against the session's limit and the server's (bytes
        about to arrive); ResourceExhaustedError, and nothing counted, if either is full."""
        self.reserve_host_bytes_up_to(size, size)

    def reserve_host_bytes_up_to(self, want: int, least: int) -> int:
        """Count as many bytes of ``want`` as fit both limits, at least ``least`` (bytes
        the server holds while it sends them: a lookup's piece in flight); that count, or
        ResourceExhaustedError and nothing counted."""
        with self._lock:
            if self.closed:
                raise FailedPreconditionError(f"session {self.id} is closed")
            room = self.limits.max_host_buffer_bytes - self._host_bytes
            if room < least:
                raise ResourceExhaustedError(
                    f"session {self.id} would hold {self._host_bytes + least} bytes of host "
                    f"buffers, over its limit of {self.limits.max_host_buffer_bytes}")
            size = self._total.reserve_up_to(min(want, room), least)
            self._host_bytes += size
            return size

    def release_host_bytes(self, size: int) -> None:
        """Uncount bytes :meth:`reserve_host_bytes` counted (bytes that did not arrive)."""
        with self._lock:
            self._release_locked(size)

    def _release_locked(self, size: int) -> None:
        if not self.closed:  # a closed session released everything at once
            self._host_bytes -= size
            self._total.release(size)

    def host_bytes(self) -> int:
        """Bytes of host buffers the session holds (stored, arriving, copied out)."""
        with self._lock:
            return self._host_bytes

    # -- storing -------------------------------------------------------------------------

    def store_host_buffer(self, handle: int, data: HostBytes, reserved: bool = False) -> None:
        """Keep ``data`` as host buffer ``handle``. Its bytes are counted here, or were by
        :meth:`reserve_host_bytes` (``reserved``); a failure uncounts them either way."""
        if not reserved:
            self.reserve_host_bytes(len(data))
        with self._lock:
            try:
                self._check_new_handle_locked(handle)
            except Exception:
                self._release_locked(len(data))
                raise
            self._host_buffers[handle] = data
            waiters = self._waiters_of_locked(handle)
        for wake in waiters:
            wake()

    def _waiters_of_locked(self, handle: int) -> Any:
        """The waiters of ``handle`` to wake (once the lock is released); those waiting
        on the condition are woken now."""
        self._stored.notify_all()
        return self._waiters.pop(handle, ())

    def _check_new_handle_locked(self, handle: int) -> None:
        if self.closed:
            raise FailedPreconditionError(f"session {self.id} is closed")
        if handle in self._host_buffers or handle in self._copies:
            raise InvalidArgumentError(f"host buffer handle {handle} is already in use")
        if self._live_handles() + 1 > self.limits.max_handles:
            raise ResourceExhaustedError(
                f"session {self.id} is at its limit of {self.limits.max_handles} handles")

    def expect_host_buffer(self, handle: int) -> Copy:
        """Record a copy out to host buffer ``handle`` (CopyToHostBuffer is answered at
        once): lookups wait for it as long as it runs, without a deadline, until
        :meth:`copied_host_buffer` stores its bytes or its failure."""
        with self._lock:
            self._check_new_handle_locked(handle)
            copy = self._copies[handle] = Copy()
            return copy

    def copied_host_buffer(self, handle: int, copy: Copy, data: HostBytes | None,
                           error: BaseException | None = None) -> None:
        """The ``copy`` out to ``handle`` ended: store ``data`` (its bytes reserved
        already), or keep ``error`` for the lookups of ``handle``. Bytes of a copy no
        longer recorded for the handle (deleted, the session closed) are uncounted and
        dropped: they never become another copy's."""
        with self._lock:
            if self._copies.get(handle) is not copy or copy.error is not None or self.closed:
                if data is not None:
                    self._release_locked(len(data))
                return
            if data is None:
                copy.error = bare(error or InvalidArgumentError(f"the copy to {handle} failed"))
            else:
                del self._copies[handle]
                self._host_buffers[handle] = data
            waiters = self._waiters_of_locked(handle)
        for wake in waiters:
            wake()

    # -- reading -------------------------------------------------------------------------

    def host_buffer_pending(self, handle: int) -> bool:
        """Whether ``handle``'s copy out is running (its lookups wait without a deadline)."""
        with self._lock:
            copy = self._copies.get(handle)
            return copy is not None and copy.error is None

    def notify_when_stored(self, handle: int, wake: Callable[[], None]) -> None:
        """Call ``wake()`` (from any thread) once host buffer ``handle`` is stored, its
        copy failed or was deleted, or the session closes: at once if so already."""
        with self._lock:
            copy = self._copies.get(handle)
            ready = (self.closed or handle in self._host_buffers
                     or (copy is not None and copy.error is not None))
            if not ready:
                self._waiters.setdefault(handle, []).append(wake)
        if ready:
            wake()

    def forget_waiter(self, handle: int, wake: Callable[[], None]) -> None:
        with self._lock:
            waiting = self._waiters.get(handle, [])
            if wake in waiting:
                waiting.remove(wake)
            if not waiting:
                self._waiters.pop(handle, None)

    def _wait_for_buffer_locked(self, handle: int) -> HostBytes:
        """The host buffer ``handle``, waiting for it: the client sends requests naming a
        buffer without waiting for its store (or its copy out) to finish."""
        deadline = time.monotonic() + HOST_BUFFER_WAIT_S
        while handle not in self._host_buffers and not self.closed:
            copy = self._copies.get(handle)
            if copy is not None:
                if copy.error is not None:
                    raise copy.error
                self._stored.wait()  # a copy out runs: as long as it takes
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotFoundError(
                    f"session {self.id} has no host buffer with handle {handle} (waited "
                    f"{HOST_BUFFER_WAIT_S:g} s)")
            self._stored.wait(left)
        if self.closed:
            raise FailedPreconditionError(f"session {self.id} is closed")
        return self._host_buffers[handle]

    def host_buffer(self, handle: int) -> HostBytes:
        with self._lock:
            return self._wait_for_buffer_locked(handle)

    def stored_host_buffer(self, handle: int) -> HostBytes | None:
        """The host buffer ``handle`` if it is there now, else None (no wait); the error of
        its copy out if that failed."""
        with self._lock:
            copy = self._copies.get(handle)
            if copy is not None and copy.error is not None:
                raise copy.error
            return self._host_buffers.get(handle)

    def lease(self, data: HostBytes) -> None:
        """Count a lookup streaming ``data`` (a buffer :meth:`stored_host_buffer` returned):
        its memory is not reused until :meth:`end_lease`."""
        with self._lock:
            self._leases[id(data)] = self._leases.get(id(data), 0) + 1

    def end_lease(self, data: HostBytes) -> None:
        """The lookup streaming ``data`` is done with it: a buffer deleted meanwhile, no
        longer leased, goes to the pool."""
        key = id(data)
        with self._lock:
            left = self._leases[key] - 1
            if left:
                self._leases[key] = left
                return
            del self._leases[key]
            held = [self._deleted.pop(key)] if key in self._deleted else []
        del data
        if held:
            POOL.give(held)

    def take_host_buffer(self, handle: int) -> HostBytes:
        """The host buffer ``handle``, no longer the session's (a request consumes it: the
        backend may alias its memory, so it never goes to the pool)."""
        with self._lock:
            data = self._wait_for_buffer_locked(handle)
            del self._host_buffers[handle]
            self._release_locked(len(data))
            return data

    def delete_host_buffer(self, handle: int) -> None:
        """Forget a host buffer (HostBufferDelete); NotFoundError for an unknown one. A
        copy out still running to it is orphaned (its bytes are dropped when it ends)."""
        waiters: Any = ()
        held: list[HostBytes] = []
        with self._lock:
            data = self._host_buffers.pop(handle, None)
            if data is not None:
                self._release_locked(len(data))
                if id(data) in self._leases:
                    self._deleted[id(data)] = data  # to the pool when its lookups end
                else:
                    held.append(data)
            elif handle in self._copies:
                del self._copies[handle]
                waiters = self._waiters_of_locked(handle)
            else:
                raise NotFoundError(f"session {self.id} has no host buffer with handle {handle}")
            del data
        for wake in waiters:
            wake()
        if held:
            POOL.give(held)  # its memory, for the next copy out of its size

    # -- end --------------------------------------------------------------------------------

    def stop_host_buffers(self) -> None:
        """Refuse host-buffer work from now on and wake everything waiting for a buffer."""
        with self._lock:
            self.closed = True
            waiters = [wake for ws in self._waiters.values() for wake in ws]
            self._waiters.clear()
            self._stored.notify_all()
        for wake in waiters:
            wake()

    def progressed(self) -> None:
        """Mark progress now (see :attr:`last_active`)."""
        self.last_active = time.monotonic()

    def copies_running(self) -> bool:
        """Whether a copy out of the session is running (work of the server's, not the
        client's silence)."""
        with self._lock:
            return any(copy.error is None for copy in self._copies.values())

    def release_host_buffers(self) -> None:
        """Drop every host buffer and uncount the session's host bytes."""
        self.stop_host_buffers()
        with self._lock:
            self._total.release(self._host_bytes)  # copies still running counted too
            self._host_buffers.clear()
            self._copies.clear()  # their bytes, when they end, are dropped uncounted
            self._waiters.clear()
            self._deleted.clear()
            self._host_bytes = 0

    def host_buffer_count(self) -> int:
        with self._lock:
            return len(self._host_buffers)
