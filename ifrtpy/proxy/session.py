"""One client's session: its handle tables, its host buffers, its limits and the dispatch
of its requests.

A session owns every array, executable, future and host buffer its client made. Its
requests are handled one at a time in arrival order (by the session's own worker thread,
or on the server's event loop for one that cannot block while the worker is idle: see
:mod:`ifrtpy.proxy.server`). A request that fails answers its error and binds it to
the result handles the client minted for it, so a later request naming one of them fails
with that error.

A session's end has one owner, its worker (:mod:`ifrtpy.proxy.server`): when its client
has gone, :meth:`Session.stop` (any thread) refuses new host-buffer work, wakes the
requests that wait for a host buffer and cancels the running request's program where the
backend can stop it; the worker then finishes the request it is running, drops the queued
ones and calls :meth:`Session.release` as its last item, which drops everything the
session holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import struct
import threading
import time
from typing import Any, Callable, Iterator

from ifrtpy._xla import varint_bytes
from ifrtpy.cancellation import Cancellation, cancellation_scope
from ifrtpy.errors import (FailedPreconditionError, InvalidArgumentError, NotFoundError,
                           ResourceExhaustedError, UnimplementedError)
from ifrtpy.proxy import wire
from ifrtpy.proxy.pool import POOL, machine_memory
from ifrtpy.proxy._protocol import messages
from ifrtpy.proxy.kind import Handler, Kind
from ifrtpy.proxy.tokens import Token

__all__ = ["Limits", "Budget", "Executions", "Session", "Handler", "Kind", "kinds"]

#: A host buffer's bytes: ``bytes``, or any object whose buffer holds them and whose
#: ``len`` is their count (a bytearray, a flat uint8 NumPy array).
HostBytes = Any

#: How long a request naming a host buffer waits for it to arrive (a bound on a client
#: that names a buffer it never sends).
HOST_BUFFER_WAIT_S = 60.0

# Handles the server mints start here, far from the client's counter (which starts low).
_SERVER_HANDLES = 1 << 62

#: gRPC takes message sizes as 32-bit ints.
_MAX_GRPC_MESSAGE = (1 << 31) - 1


_MEMORY = machine_memory()


@dataclasses.dataclass(frozen=True)
class Limits:
    """What clients may make the server hold. A request over a limit is answered
    RESOURCE_EXHAUSTED, naming the limit; nothing is half done.

    For the whole server: ``max_sessions`` (sessions counted: live ones, and those whose
    client has gone while their worker finishes the request it runs; the next IfrtSession
    is refused), ``max_sessions_per_process`` (those of one peer process, where the socket
    can tell it: loopback TCP, see :mod:`ifrtpy.proxy.peers`; a process of another user
    that cannot be found counts as its user), ``max_sessions_per_connection`` (those of
    one TCP connection; a unix socket tells its connections apart to no one),
    ``max_total_host_buffer_bytes`` (host buffers of every session together, counted as
    their bytes arrive; by default half of :func:`~ifrtpy.proxy.pool.machine_memory`) and
    ``max_message_bytes`` (one gRPC message, a request or a chunk). ``idle_timeout_s`` (None, the default: never) ends a session that has had no
    request, no host-buffer RPC and nothing running for that many seconds.

    Per session: ``max_host_buffer_bytes`` (host buffers held at once: stored by the
    client and not yet consumed, arriving, copied out and not yet deleted, and the pieces
    of lookups in flight, which gRPC has not taken yet; by default a quarter of
    :func:`~ifrtpy.proxy.pool.machine_memory`), ``max_handles`` (live arrays,
    executables, futures and host buffers together),
    ``max_pending_requests`` (requests received and not yet answered, or answered and not
    yet read by the client: past it the server stops reading the session's stream until
    the client reads its answers) and ``max_host_buffer_rpcs`` (host-buffer RPCs of the
    session in flight at once).
    """

    max_sessions: int = 32
    max_sessions_per_process: int = 8
    max_sessions_per_connection: int = 8
    max_total_host_buffer_bytes: int = _MEMORY // 2
    max_message_bytes: int = 1 << 30
    max_host_buffer_bytes: int = _MEMORY // 4
    max_handles: int = 1 << 20
    max_pending_requests: int = 1024
    max_host_buffer_rpcs: int = 256
    idle_timeout_s: float | None = None

    def __post_init__(self) -> None:
        idle = self.idle_timeout_s
        if idle is not None and (not isinstance(idle, (int, float)) or isinstance(idle, bool)
                                 or not 0 < idle < float("inf")):
            raise InvalidArgumentError(
                f"proxy limit idle_timeout_s must be a number of seconds > 0 or None, got "
                f"{idle!r}")
        for field in dataclasses.fields(self):
            if field.name == "idle_timeout_s":
                continue
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgumentError(
                    f"proxy limit {field.name} must be an int >= 1, got {value!r}")
        if self.max_message_bytes > _MAX_GRPC_MESSAGE:
            raise InvalidArgumentError(
                f"proxy limit max_message_bytes must be at most {_MAX_GRPC_MESSAGE} (gRPC's), "
                f"got {self.max_message_bytes}")


class Budget:
    """Bytes held against a limit, by any thread: :meth:`reserve` or ResourceExhaustedError."""

    def __init__(self, limit: int, what: str):
        self.limit = limit
        self.what = what
        self.used = 0
        self._lock = threading.Lock()

    def reserve(self, size: int) -> None:
        self.reserve_up_to(size, size)

    def reserve_up_to(self, want: int, least: int) -> int:
        """Reserve as many bytes of ``want`` as fit, at least ``least``; that count, or
        ResourceExhaustedError (nothing reserved) where not even ``least`` fits."""
        with self._lock:
            size = min(want, self.limit - self.used)
            if size < least:
                raise ResourceExhaustedError(
                    f"{self.what} would hold {self.used + least} bytes of host buffers, over "
                    f"its limit of {self.limit}")
            self.used += size
            return size

    def release(self, size: int) -> None:
        with self._lock:
            self.used -= size


class Executions:
    """The executions the server has started and not yet seen end, every session's
    together, against the backend's cap (``Client.executions_in_flight_cap``, None: none):
    past the cap the backend's next execute waits for one to end, which an execute on the
    server's event loop must never do (see :meth:`room`). An execution's end is seen by
    asking its status future (``done()``) when the count matters, never by a callback: a
    callback would take the GIL on the backend's thread as each run ends."""

    def __init__(self, cap: int | None):
        self.cap = cap
        self._running: list[Any] = []  # the status futures of those not yet seen to end
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """Executions started and not seen to end."""
        with self._lock:
            self._forget_ended_locked()
            return len(self._running)

    def room(self) -> bool:
        """Whether an execute may start on the event loop: below half the cap, as the other
        sessions' workers start executions unchecked meanwhile (each one at a time)."""
        if self.cap is None:
            return True
        with self._lock:
            if len(self._running) >= self.cap // 2:
                self._forget_ended_locked()
            return len(self._running) < self.cap // 2

    def started(self, status: Any) -> None:
        """Count an execution until its ``status`` future is done."""
        if self.cap is None:
            return
        with self._lock:
            if len(self._running) >= self.cap:
                self._forget_ended_locked()
            self._running.append(status)

    def _forget_ended_locked(self) -> None:
        self._running = [status for status in self._running if not status.done()]


class Session:
    """The state of one IfrtSession stream (see the module docstring).

    ``send`` takes each serialized ``IfrtResponse``; it is called from the session's
    worker or, for an answer that waits on a future, from the thread that completes it.
    ``total`` is the server's budget of host-buffer bytes, shared by every session;
    ``transfer_directory`` the directory where this session's client leaves its puts as
    files (None: it puts over gRPC only); ``executions`` the server's count of executions
    in flight, where the backend's execute cannot block (None: it may, and every execute
    goes to the worker).
    """

    def __init__(self, session_id: int, peer: str, client: Any, limits: Limits,
                 protocol_version: int, send: Callable[[bytes], None], total: Budget,
                 transfer_directory: str | None = None, executions: Executions | None = None):
        self.id = session_id
        self.executions = executions
        self.peer = peer
        self.client = client
        self.limits = limits
        self.protocol_version = protocol_version
        self.transfer_directory = transfer_directory
        self._send = send
        self._total = total
        self.arrays: dict[int, Any] = {}
        self.executables: dict[int, Any] = {}
        self.futures: dict[int, Any] = {}
        self.failed: dict[int, BaseException] = {}
        self._host_buffers: dict[int, HostBytes] = {}
        self._host_bytes = 0  # stored, arriving and copied out: counted against both limits
        self._waiters: dict[int, list[Callable[[], None]]] = {}
        # copies out to host buffers still running (None) or failed (their error)
        self._copies: dict[int, BaseException | None] = {}
        self._rpcs = 0  # host-buffer RPCs in flight
        self._lock = threading.Lock()  # host buffers are touched by other RPCs' threads
        self._stored = threading.Condition(self._lock)
        self._handles = itertools.count(_SERVER_HANDLES)
        self._seq = itertools.count(1)
        #: numbers the OK answers in the order they are sent (two threads answer: the
        #: worker, and those completing the futures an answer waits on)
        self._answering = threading.Lock()
        #: cancelled when the session stops: the backend may stop the running program
        self.cancellation = Cancellation(f"a request of session {session_id}")
        self.closed = False  # stopped: the client is gone (see stop)
        #: when the client last sent a request or a host-buffer RPC (time.monotonic())
        self.last_active = time.monotonic()
        self._current: tuple[int, str] = (0, "")

    # -- handles -------------------------------------------------------------------------

    def handle_counts(self) -> dict[str, int]:
        with self._lock:
            buffers = len(self._host_buffers)
        return {"arrays": len(self.arrays), "executables": len(self.executables),
                "futures": len(self.futures), "host_buffers": buffers}

    def _live_handles(self) -> int:
        return (len(self.arrays) + len(self.executables) + len(self.futures)
                + len(self._host_buffers) + len(self._copies))

    def check_room(self, extra: int = 1) -> None:
        """ResourceExhaustedError unless ``extra`` more handles fit the session's limit."""
        if self._live_handles() + extra > self.limits.max_handles:
            raise ResourceExhaustedError(
                f"session {self.id} would hold {self._live_handles() + extra} handles, over its "
                f"limit of {self.limits.max_handles}")

    def result_handle(self, handle: int) -> int:
        """``handle`` if the client minted one (checked unused), else a new server handle."""
        if not handle:
            return next(self._handles)
        if handle in self.arrays or handle in self.futures or handle in self.executables:
            raise InvalidArgumentError(f"handle {handle} is already in use")
        return handle

    def result_handles(self, handles: Any, count: int) -> list[int]:
        handles = list(handles)
        if handles and len(handles) != count:
            raise InvalidArgumentError(
                f"the request names {len(handles)} result handles for {count} results")
        return [self.result_handle(h) for h in handles] if handles else [
            next(self._handles) for _ in range(count)]

    def put_arrays(self, handles: list[int], arrays: list[Any]) -> list[int]:
        self.check_room(len(arrays))
        for handle, array in zip(handles, arrays):
            self.arrays[handle] = array
        return handles

    def put_future(self, handle: int, future: Any) -> int:
        handle = self.result_handle(handle)
        self.check_room()
        self.futures[handle] = future
        return handle

    def put_executable(self, executable: Any) -> int:
        self.check_room()
        handle = next(self._handles)
        self.executables[handle] = executable
        return handle

    def value(self, handle: int) -> Any:
        """The array or :class:`~ifrtpy.proxy.tokens.Token` under ``handle``."""
        found = self.arrays.get(handle)
        if found is None:
            raise self._missing("array", handle)
        return found

    def values_of(self, handles: Any) -> list[Any]:
        return [self.value(h) for h in handles]

    def array(self, handle: int) -> Any:
        """The array under ``handle``; InvalidArgumentError for a token, which holds no
        data (it can be waited on, deleted and passed where a program takes a token)."""
        found = self.value(handle)
        if isinstance(found, Token):
            raise InvalidArgumentError(
                f"handle {handle} is a token a program returned, not an array: it can be "
                "waited on, deleted, or passed where a program takes a token")
        return found

    def arrays_of(self, handles: Any) -> list[Any]:
        return [self.array(h) for h in handles]

    def executable(self, handle: int) -> Any:
        found = self.executables.get(handle)
        if found is None:
            raise self._missing("executable", handle)
        return found

    def take_future(self, handle: int) -> Any:
        found = self.futures.pop(handle, None)
        if found is None:
            raise self._missing("future", handle)
        return found

    def _missing(self, what: str, handle: int) -> BaseException:
        error = self.failed.get(handle)
        if error is not None:
            return error
        return NotFoundError(f"session {self.id} has no {what} with handle {handle}")

    def drop(self, handle: int) -> None:
        """Forget an array handle (DestructArray); unknown handles are ignored, as IFRT
        destroys are."""
        self.arrays.pop(handle, None)
        self.failed.pop(handle, None)

    # -- host buffers ----------------------------------------------------------------------

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

    def expect_host_buffer(self, handle: int) -> None:
        """Mark host buffer ``handle`` as being copied out (CopyToHostBuffer is answered at
        once): lookups wait for it as long as the copy runs, without a deadline, until
        :meth:`copied_host_buffer` stores it or its failure."""
        with self._lock:
            self._check_new_handle_locked(handle)
            self._copies[handle] = None

    def copied_host_buffer(self, handle: int, data: HostBytes | None,
                           error: BaseException | None = None) -> None:
        """The copy out to ``handle`` (:meth:`expect_host_buffer`) ended: store ``data``
        (its bytes reserved already), or keep ``error`` for the lookups of ``handle``. Data
        no one expects any more (the handle deleted, the session closed) is uncounted."""
        with self._lock:
            if self._copies.get(handle, False) is not None or self.closed:
                if data is not None:
                    self._release_locked(len(data))
                return
            if data is None:
                self._copies[handle] = None if error is None else _bare(error)
            else:
                del self._copies[handle]
                self._host_buffers[handle] = data
            waiters = self._waiters_of_locked(handle)
        for wake in waiters:
            wake()

    def host_buffer_pending(self, handle: int) -> bool:
        """Whether ``handle``'s copy out is running (its lookups wait without a deadline)."""
        with self._lock:
            return handle in self._copies and self._copies[handle] is None

    def notify_when_stored(self, handle: int, wake: Callable[[], None]) -> None:
        """Call ``wake()`` (from any thread) once host buffer ``handle`` is stored or the
        session closes: at once if either is so already."""
        with self._lock:
            ready = (self.closed or handle in self._host_buffers
                     or self._copies.get(handle) is not None)
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
            if handle in self._copies:
                error = self._copies[handle]
                if error is not None:
                    raise error
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
            error = self._copies.get(handle)
            if error is not None:
                raise error
            return self._host_buffers.get(handle)

    def take_host_buffer(self, handle: int) -> HostBytes:
        with self._lock:
            data = self._wait_for_buffer_locked(handle)
            del self._host_buffers[handle]
            self._release_locked(len(data))
            return data

    def delete_host_buffer(self, handle: int) -> None:
        """Forget a host buffer (HostBufferDelete); NotFoundError for an unknown one. A
        copy out still running to it is forgotten too (its bytes go when it ends)."""
        waiters: Any = ()
        with self._lock:
            held = [self._host_buffers.pop(handle, None)]
            if held[0] is not None:
                self._release_locked(len(held[0]))
            elif handle in self._copies:
                del self._copies[handle]
                waiters = self._waiters_of_locked(handle)
            else:
                raise NotFoundError(f"session {self.id} has no host buffer with handle {handle}")
        for wake in waiters:
            wake()
        POOL.give(held)  # its memory, for the next copy out of its size

    def host_bytes(self) -> int:
        """Bytes of host buffers the session holds (stored, arriving, copied out)."""
        with self._lock:
            return self._host_bytes

    # -- requests ---------------------------------------------------------------------------

    def cannot_block(self, request: Any) -> bool:
        """Whether handling ``request`` now cannot block (its kind's ``cannot_block``):
        it may be handled on the event loop while no other request of the session is
        queued or running (see :mod:`ifrtpy.proxy.server`)."""
        kind = request.WhichOneof("request")
        found = kinds().get(kind) if kind is not None else None
        if found is None or found.cannot_block is None:
            return False
        try:
            return found.cannot_block(self, getattr(request, kind))
        except Exception:  # noqa: BLE001 - the worker handles it, and answers its error
            return False

    def handle(self, request: Any, send: Callable[[bytes], None] | None = None) -> None:
        """Handle one ``IfrtRequest`` and send its answer (now, or later for one that
        waits on a future). Never raises: every failure is answered as a status. An answer
        sent now goes through ``send`` (default: the session's), as the last thing done."""
        op_id = request.request_metadata.op_id
        kind = request.WhichOneof("request")
        try:
            if kind is None:
                raise InvalidArgumentError("the request sets none of IfrtRequest's requests")
            found = kinds().get(kind)
            if found is None:
                raise UnimplementedError(f"{kind} is not served by the ifrtpy proxy")
            self._current = (op_id, kind)
            with cancellation_scope(self.cancellation):
                inner = found.handler(self, getattr(request, kind))
        except Exception as error:  # noqa: BLE001 - every failure becomes the answer
            self._bind_failure(kind, request, _bare(error))  # before the answer: see send
            self.answer_error(op_id, error, send)
            return
        if inner is not None:
            self.answer(op_id, kind, inner, send)

    def _bind_failure(self, kind: str | None, request: Any, error: BaseException) -> None:
        if kind is None:
            return
        found = kinds().get(kind)
        inner = getattr(request, kind)
        for name in found.results if found is not None else ():
            value = getattr(inner, name)
            for handle in [value] if isinstance(value, int) else list(value):
                fresh = handle not in self.arrays and handle not in self.futures
                if handle and fresh and len(self.failed) < self.limits.max_handles:
                    self.failed[handle] = error

    def answer(self, op_id: int, kind: str, inner: Any,
               send: Callable[[bytes], None] | None = None) -> None:
        """Send the OK answer ``inner`` (a message or its serialized bytes) to the request
        ``op_id`` of ``kind`` (through ``send``, default the session's): the response is
        written around it, not copied into one."""
        body = inner if isinstance(inner, bytes) else inner.SerializeToString()
        head = b"\x09" + _U64.pack(op_id) + b"\x18"
        tail = b"".join((_response_tag(kind), _varint(len(body)), body))
        with self._answering:  # the numbers go out in the order they are taken
            metadata = head + _varint(next(self._seq))
            (send or self._send)(b"".join((b"\x0a", _varint(len(metadata)), metadata, tail)))

    def answer_error(self, op_id: int, error: BaseException,
                     send: Callable[[bytes], None] | None = None) -> None:
        metadata = messages().ResponseMetadata(op_id=op_id, status=wire.status_proto(error))
        serialized = metadata.SerializeToString()
        (send or self._send)(b"\x0a" + _varint(len(serialized)) + serialized)

    def answer_later(self, future: Any, make: Callable[[], Any]) -> None:
        """Answer the request being handled when ``future`` completes: ``make()`` on
        success, its error otherwise (the handler then returns None)."""
        op_id, kind = self._current

        def done(f: Any) -> None:
            error = f.exception()
            if error is None:
                try:
                    inner = make()
                except Exception as failure:  # noqa: BLE001 - e.g. over the host-buffer limit
                    error = failure
                else:
                    self.answer(op_id, kind, inner)
                    return
            self.answer_error(op_id, error)

        future.add_done_callback(done)

    # -- end --------------------------------------------------------------------------------

    def stop(self) -> None:
        """The client is gone (any thread; idempotent): host-buffer work is refused from
        now on, requests waiting for a host buffer fail, and the running request's program
        is cancelled where the backend can stop it. What the session holds stays, and
        stays counted, until :meth:`release`."""
        with self._lock:
            self.closed = True
            waiters = [wake for ws in self._waiters.values() for wake in ws]
            self._waiters.clear()
            self._stored.notify_all()
        for wake in waiters:
            wake()
        self.cancellation.cancel()

    def idle_since(self) -> float | None:
        """When the session last had something to do (see :attr:`last_active`), or None
        while a host-buffer RPC of it is in flight."""
        with self._lock:
            return None if self._rpcs else self.last_active

    def release(self) -> None:
        """Drop every handle of the session and uncount its host bytes: the last item of
        its worker, once no request of it runs."""
        self.stop()
        with self._lock:
            self._total.release(self._host_bytes)  # copies still running counted too
            self._host_buffers.clear()
            self._copies.clear()  # their bytes, when they end, are dropped uncounted
            self._waiters.clear()
            self._host_bytes = 0
        self.arrays.clear()
        self.executables.clear()
        self.futures.clear()
        self.failed.clear()

    def close(self) -> None:
        """:meth:`stop` and :meth:`release` at once, for a session that no worker runs."""
        self.release()


def _bare(error: BaseException) -> BaseException:
    """``error`` without its traceback and chained errors: bound to a handle, it must not
    keep alive what the failed request's frames held (a host buffer, arrays)."""
    error.__traceback__ = None
    error.__context__ = error.__cause__ = None
    return error


# Answers are serialized ``IfrtResponse``s written by hand around the handler's serialized
# message: field 1 ``response_metadata`` (``op_id=1:fixed64``, ``seq_num=3:int64``), then
# the answer as the field of ``IfrtResponse``'s oneof that the request kind names (the
# numbers are checked against jaxlib's by ifrtpy.proxy.fields).
_U64 = struct.Struct("<Q")


def _varint(value: int) -> bytes:
    return bytes((value,)) if value < 0x80 else varint_bytes(value)


@functools.lru_cache(maxsize=None)
def _response_tag(kind: str) -> bytes:
    """The tag of the ``IfrtResponse`` field answering a request of ``kind``."""
    name = kind[: -len("request")] + "response"
    return _varint(messages().IfrtResponse.DESCRIPTOR.fields_by_name[name].number << 3 | 2)


_KINDS: dict[str, Kind] = {}


def kinds() -> dict[str, Kind]:
    """Every kind of request a session serves, by its field name in ``IfrtRequest``."""
    if not _KINDS:
        from ifrtpy.proxy import arrays, executables, topology

        _KINDS.update(topology.KINDS)
        _KINDS.update(arrays.KINDS)
        _KINDS.update(executables.KINDS)
    return _KINDS
