"""The gRPC service (``xla.ifrt.proxy.GrpcIfrtService``) and :class:`ProxyServer`.

Concurrency: every RPC runs on one grpc.aio event loop in a thread of the server, which
only decodes, dispatches and writes. Each ``IfrtSession`` stream is a
:class:`~ifrtpy.proxy.session.Session` with a worker thread of its own that handles the
session's requests one at a time, in arrival order (XLA's C++ server does the same: an
in-order processor per session); answers are written in the order they are made, an
answer that waits on a future as soon as it completes. A slow or blocked request delays
only its own session's later requests. A request that cannot block (its kind's
``cannot_block``: an execute where the backend's execute only dispatches and a slot of its
executions in flight is free, a readiness check, a destruction) is handled on the loop
itself while no request of its session is queued or running, so it overtakes none. ``HostBufferStore`` / ``HostBufferLookup`` /
``HostBufferDelete`` move a session's bulk bytes on the loop, and
``HostBufferReadFromDisk`` reads a large put that a client on this machine left as a file
(in a thread of a small pool). A stream that ends (the client closed, crashed or was
killed) closes its session: its queued requests are dropped and everything it held is
freed. Every resource a client can make the server hold is bounded (:class:`Limits`).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import os
import queue
import secrets
import threading
import time
from typing import Any, AsyncIterator, Callable, NoReturn

import ifrtpy_jax_plugin
from ifrtpy._xla import varint, varint_bytes
from ifrtpy.errors import (FailedPreconditionError, IfrtError, InvalidArgumentError,
                           NotFoundError, PermissionDeniedError, ResourceExhaustedError,
                           UnavailableError, UnimplementedError)
from ifrtpy.proxy import local, peers, steps, wire
from ifrtpy.proxy._protocol import messages
from ifrtpy.proxy.arrays import LEAST_PIECE, in_flight
from ifrtpy.proxy.session import HOST_BUFFER_WAIT_S, Budget, Executions, Limits, Session

__all__ = ["ProxyServer", "SessionInfo", "serve", "PROTOCOL_VERSIONS", "SERDES_VERSIONS"]

_log = logging.getLogger("ifrtpy.proxy")

_SERVICE = "xla.ifrt.proxy.GrpcIfrtService"
_SESSION_HEADER = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
_STORE_HEADER = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"

#: Protocol versions the server speaks (jaxlib 0.10 and 0.12 clients send 16-25).
PROTOCOL_VERSIONS = (16, 25)
#: IFRT serdes versions the server reads and writes (0.10 clients send 0-3, 0.12 2-6).
SERDES_VERSIONS = (0, 3)

#: HostBufferLookup answers in pieces of this size (the client joins messages of any size;
#: of pieces from 1/16 to 64 MiB none made a 64 MiB get faster: docs/proxy.md)
_CHUNK = 4 << 20
#: How long a session refused at a limit waits for its first request, to answer it with
#: the refusal (seconds).
_REFUSAL_WAIT_S = 2.0
#: How long a stopping server waits for its cancelled RPCs to end (seconds).
_END_WAIT_S = 5.0
#: Put files one session reads at once, each in a thread of the server's pool (which has
#: room for this many per session: a session's reads never wait for another's).
_FILE_READS = 2


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """A session the server counts: its id, the client's address, how many handles and
    host-buffer bytes it holds, how many of its requests wait for their answers to be
    written, and whether it is closing (its client has gone; its worker has not yet
    finished the request it runs)."""

    id: int
    peer: str
    protocol_version: int
    handles: dict[str, int]
    host_buffer_bytes: int
    #: requests read and not yet answered, or answered and not yet written to the client
    pending_requests: int
    closing: bool = False


def _pick(client_min: int, client_max: int, ours: tuple[int, int], what: str) -> int:
    low, high = max(client_min, ours[0]), min(client_max, ours[1])
    if low > high:
        raise InvalidArgumentError(
            f"the client speaks {what} versions {client_min}-{client_max}; this server "
            f"{ours[0]}-{ours[1]}")
    return high


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """Call ``fn(*args)`` on ``loop`` from another thread; nothing once the loop is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the server stopped: nobody is left to answer
        pass


class _Stream:
    """The transport of one session: requests decoded on the loop are queued for the
    session's worker thread, which handles them in order; the answers it (or a completing
    future) makes are written on the loop in the order they were made.

    The loop stops reading the client's stream while ``max_pending_requests`` requests are
    unanswered or answered but not yet written (a client that does not read its answers
    holds at most that many), or while the queued requests hold ``max_message_bytes``.

    A request that cannot block (:meth:`Session.cannot_block`) is handled on the loop
    itself when no request of the session is queued or running (:meth:`take`): it cannot
    overtake one, and the loop waits on nothing (DESIGN 20).

    The stream's end (:meth:`close`, when the client has gone) stops the session; the
    worker finishes the request it runs, drops those queued, releases the session and
    calls ``ended(session)`` as its last item (XLA's in-order processor shuts down so),
    after any request the loop is handling.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: Limits, name: str,
                 ended: Callable[[Session], None]):
        self.loop = loop
        self.session: Session | None = None
        self._ended = ended
        self._max_pending = limits.max_pending_requests
        self._max_queued = limits.max_message_bytes
        self._lock = threading.Lock()
        #: (request, its size) for the worker; None ends it
        self._inbox: queue.SimpleQueue[tuple[Any, int] | None] = queue.SimpleQueue()
        self._queued = 0            # bytes of the requests in the inbox (under the lock)
        #: requests queued for the worker or running there: the loop adds one, the worker
        #: takes it away as it queues the request's answer, under the lock, or once the
        #: handler returns where the answer comes later (the loop reads 0 only when none
        #: is queued or running, and the worker's answers are queued before the loop's)
        self._busy = 0
        self._handling = False  # the worker's request is not yet answered (under the lock)
        #: held while the loop handles a request, and by the worker's end
        self._here = threading.Lock()
        self._outbox: collections.deque[bytes] = collections.deque()
        self._signalled = False     # the writer was told of answers (under the lock)
        self._closed = False
        self.pending = 0            # requests read whose answers are not written (loop only)
        self._reader_waiting = False
        self._room = asyncio.Event()
        self._answers = asyncio.Event()
        self._drained = asyncio.Event()
        #: the session's put files being read (see _FILE_READS)
        self.file_reads = asyncio.Semaphore(_FILE_READS)
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._work_loop, name=name, daemon=True)

    def start(self, session: Session) -> None:
        self.session = session
        self._thread.start()

    # -- the loop's side ---------------------------------------------------------------------

    def take(self, request: Any, size: int) -> None:
        """Handle a decoded request (of ``size`` bytes on the wire) here, on the loop,
        if it cannot block and no request of the session is queued or running; else
        queue it for the worker (:meth:`put`)."""
        session = self.session
        assert session is not None
        if self._busy or not session.cannot_block(request):
            self.put(request, size)
            return
        self.pending += 1
        self._drained.clear()
        # held elsewhere only by the worker releasing the ended session: the loop does not
        # wait for that, and the request goes unrun, as once the session is closed
        if not self._here.acquire(blocking=False):
            return
        try:
            if not self._closed:
                session.handle(request)
        finally:
            self._here.release()

    def put(self, request: Any, size: int) -> None:
        """Queue a decoded request (of ``size`` bytes on the wire) for the worker."""
        self.pending += 1
        self._drained.clear()
        with self._lock:
            self._queued += size
            self._busy += 1
        self._inbox.put((request, size))

    def full(self) -> bool:
        """Whether the reader must wait for :meth:`room` before reading on."""
        return self.pending >= self._max_pending or self._queued >= self._max_queued

    async def room(self) -> None:
        """Return once the reader may read the next request."""
        while self.full():
            self._reader_waiting = True
            self._room.clear()
            if self.full():
                await self._room.wait()
            self._reader_waiting = False

    async def drained(self) -> None:
        """Return once every request read has been answered and its answer written."""
        if self.pending:
            await self._drained.wait()

    async def write(self, context: Any) -> None:
        """Write the answers in the order they were made, until the stream closes."""
        while True:
            await self._answers.wait()
            self._answers.clear()
            while True:
                with self._lock:
                    if not self._outbox:
                        self._signalled = False
                        break
                    answer = self._outbox.popleft()
                try:
                    await context.write(answer)
                except Exception as error:  # noqa: BLE001 - the stream ended under it
                    _log.debug("an answer was not written: %s", error)
                    self.close()
                    return
                self.pending -= 1
                if not self.pending:
                    self._drained.set()
                if self._reader_waiting and not self.full():
                    self._room.set()

    def close(self) -> None:
        """Drop the queued requests and answers and stop the session (idempotent); the
        worker ends after the request it is handling, releasing the session."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._outbox.clear()
        self._inbox.put(None)
        if self.session is not None:
            self.session.stop()

    @property
    def closed(self) -> bool:
        return self._closed

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the worker to end; whether it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- any thread --------------------------------------------------------------------------

    def send(self, answer: bytes) -> None:
        """Queue a serialized answer to be written (the session's ``send``)."""
        self._queue(answer, False)

    def _send_last(self, answer: bytes) -> None:
        """Queue the answer of the request the worker is handling: the last thing its
        handler does, so the loop may handle the session's next request from now on."""
        self._queue(answer, True)

    def _queue(self, answer: bytes, last: bool) -> None:
        with self._lock:
            if last and self._handling:
                self._handling = False
                self._busy -= 1
            if self._closed:
                return
            self._outbox.append(answer)
            if self._signalled:
                return
            self._signalled = True
        if threading.get_ident() == self._loop_thread:
            self._answers.set()
        else:
            _on_loop(self.loop, self._answers.set)

    # -- the worker --------------------------------------------------------------------------

    def _work_loop(self) -> None:
        session = self.session
        assert session is not None
        try:
            while True:
                item = self._inbox.get()
                if item is None or self._closed:
                    break
                request, size = item
                with self._lock:
                    self._queued -= size
                    self._handling = True
                if self._reader_waiting:
                    _on_loop(self.loop, self._room.set)
                session.handle(request, self._send_last)
                with self._lock:
                    if self._handling:  # answered later, or not at all
                        self._handling = False
                        self._busy -= 1
        finally:  # the session's end, its worker's last item
            while not self._inbox.empty():  # what the stream queued goes unrun
                self._inbox.get_nowait()
            try:
                with self._here:  # after a request the loop is handling
                    session.release()
            finally:
                self._ended(session)


def _host(peer: str) -> str:
    """The host part of a gRPC peer (``ipv4:127.0.0.1:5000`` -> ``ipv4:127.0.0.1``);
    ``unix`` for a unix socket, whose peers are all alike."""
    if peer.startswith("unix"):
        return "unix"
    return peer.rsplit(":", 1)[0]


class _Service:
    """The RPC handlers over the server's sessions (coroutines on the server's loop)."""

    def __init__(self, client: Any, limits: Limits):
        self.client = client
        self.limits = limits
        self.total = Budget(limits.max_total_host_buffer_bytes, "the server")
        self.sessions: dict[int, Session] = {}
        self.streams: dict[int, _Stream] = {}
        #: the peer process (or user) of each session, where the socket tells it
        self.owners: dict[int, str | None] = {}
        #: the server's TCP port (None on a unix socket), to find a peer's socket by
        self.port: int | None = None
        self.lock = threading.Lock()
        self._count = 0
        self.stopping = threading.Event()
        #: where clients on this machine leave large puts as files (None: nowhere)
        self.transfers: local.TransferRoot | None = None
        #: executions in flight, where the backend's execute cannot block (DESIGN 20)
        self.executions = (None if getattr(client, "execute_may_block", True)
                           else Executions(getattr(client, "executions_in_flight_cap", None)))
        self.files = concurrent.futures.ThreadPoolExecutor(
            _FILE_READS * limits.max_sessions, thread_name_prefix="ifrtpy-proxy-files")

    # -- GetVersion -----------------------------------------------------------------------

    async def get_version(self, raw: bytes, context: Any) -> Any:
        m = messages()
        try:
            request = wire.parse(m.GrpcGetVersionRequest, raw, "the GetVersion request")
            protocol = _pick(request.min_version.protocol_version,
                             request.max_version.protocol_version, PROTOCOL_VERSIONS, "protocol")
            serdes = _pick(request.min_version.ifrt_serdes_version_number,
                           request.max_version.ifrt_serdes_version_number, SERDES_VERSIONS,
                           "IFRT serdes")
        except IfrtError as error:
            await _abort(context, error)
        return m.GrpcGetVersionResponse(version=m.IfrtProxyVersion(
            protocol_version=protocol, ifrt_serdes_version_number=serdes))

    # -- IfrtSession ----------------------------------------------------------------------

    async def ifrt_session(self, requests: AsyncIterator[bytes], context: Any) -> None:
        m = messages()
        try:
            metadata = wire.parse(m.GrpcIfrtSessionMetadata, _header(context, _SESSION_HEADER),
                               f"the {_SESSION_HEADER} header")
            version = _pick(metadata.version.protocol_version, metadata.version.protocol_version,
                            PROTOCOL_VERSIONS, "protocol")
            peer = context.peer()
            loop = asyncio.get_running_loop()
            owner = (await loop.run_in_executor(None, peers.peer_owner, peer, self.port)
                     if peer.startswith("ipv") else None)  # a unix socket tells nothing
            session, stream = self._open(peer, owner, version, metadata)
        except ResourceExhaustedError as error:
            _log.info("refused a session of %s: %s", context.peer(), error)
            await _refuse(requests, context, error)
        except IfrtError as error:
            await _abort(context, error)
        writer = loop.create_task(stream.write(context))
        broken: IfrtError | None = None
        iterator = requests.__aiter__()
        try:
            while True:
                if self.limits.idle_timeout_s is None:
                    raw = await iterator.__anext__()
                else:
                    raw = await self._next_or_idle(iterator, session, stream)
                if self.stopping.is_set():
                    break
                session.last_active = time.monotonic()
                try:
                    request = wire.parse(m.IfrtRequest, raw, "a request of the session stream")
                except InvalidArgumentError as error:
                    broken = error
                    break
                stream.take(request, len(raw))
                if stream.full():
                    await stream.room()
        except StopAsyncIteration:  # the client half-closed: answer what it sent
            await stream.drained()
        except UnavailableError as error:  # idle past idle_timeout_s
            broken = error
        finally:
            stream.close()  # the session counts until its worker has released it
            writer.cancel()
        if broken is not None:
            _log.debug("session %d: %s", session.id, broken)
            await _abort(context, broken)

    async def _next_or_idle(self, iterator: Any, session: Session, stream: _Stream) -> bytes:
        """The next request of the stream; UnavailableError once the session has been
        idle (no request, no host-buffer RPC, nothing running) for ``idle_timeout_s``."""
        timeout = self.limits.idle_timeout_s
        assert timeout is not None
        reading = asyncio.ensure_future(iterator.__anext__())
        try:
            while True:
                done, _ = await asyncio.wait({reading}, timeout=timeout)
                if done:
                    return reading.result()
                since = session.idle_since()
                if stream.pending or since is None or time.monotonic() - since < timeout:
                    continue
                raise UnavailableError(
                    f"session {session.id} was idle for {timeout:g} s, the server's "
                    "idle_timeout_s: the server ended it and dropped its arrays")
        finally:
            if not reading.done():
                reading.cancel()
            elif not reading.cancelled():
                reading.exception()  # retrieved: the stream may end as the handler does

    def _open(self, peer: str, owner: str | None, version: int,
              metadata: Any) -> tuple[Session, _Stream]:
        """A new session of ``peer`` (a connection of ``owner``, see
        :func:`~ifrtpy.proxy.peers.peer_owner`), its stream started; ResourceExhaustedError
        past the session limits."""
        limits = self.limits
        with self.lock:
            if len(self.sessions) >= limits.max_sessions:
                raise ResourceExhaustedError(
                    f"the server is at its limit of {limits.max_sessions} sessions "
                    "(max_sessions); try again when a client has disconnected")
            if owner is not None:
                held = sum(1 for o in self.owners.values() if o == owner)
                if held >= limits.max_sessions_per_process:
                    raise ResourceExhaustedError(
                        f"{owner} holds {held} sessions, the limit of one peer process "
                        "(max_sessions_per_process)")
            same = sum(1 for s in self.sessions.values() if s.peer == peer)
            if not peer.startswith("unix") and same >= limits.max_sessions_per_connection:
                raise ResourceExhaustedError(
                    f"the connection {peer} holds {same} sessions, the limit of one "
                    f"connection (max_sessions_per_connection)")
            session_id = 0
            while not session_id or session_id in self.sessions:
                session_id = secrets.randbits(63)  # unguessable: other RPCs name it
            self._count += 1
            stream = _Stream(asyncio.get_running_loop(), limits,
                             f"ifrtpy-proxy-session-{self._count}", self._ended)
            session = Session(session_id, peer, self.client, limits, version, stream.send,
                              self.total, self._transfer_directory(metadata), self.executions)
            self.sessions[session_id] = session
            self.streams[session_id] = stream
            self.owners[session_id] = owner
        stream.start(session)
        return session, stream

    def _transfer_directory(self, metadata: Any) -> str | None:
        """The put-file directory the session names in its initialization data (see
        ifrtpy_jax_plugin), if it is one the server may read from for it."""
        if self.transfers is None:
            return None
        value = metadata.initialization_data.attributes.get(ifrtpy_jax_plugin.TRANSFER_KEY)
        if value is None or value.WhichOneof("value") != "string_value":
            return None
        try:
            name = value.string_value.decode()
        except UnicodeDecodeError:
            return None
        return self.transfers.bind(name)

    def _ended(self, session: Session) -> None:
        """The session's worker has ended (its last item, on its thread): the session no
        longer counts, and its put files go."""
        with self.lock:
            self.sessions.pop(session.id, None)
            self.streams.pop(session.id, None)
            self.owners.pop(session.id, None)
        if session.transfer_directory is not None and self.transfers is not None:
            self.transfers.unbind(session.transfer_directory)

    def session(self, session_id: int, context: Any) -> Session:
        """The live session ``session_id``, for a host-buffer RPC of ``context``'s peer."""
        with self.lock:
            found = self.sessions.get(session_id)
        if found is None or found.closed or _host(found.peer) != _host(context.peer()):
            raise NotFoundError(f"no live session {session_id}")
        found.last_active = time.monotonic()
        return found

    # -- host buffers ---------------------------------------------------------------------

    async def host_buffer_store(self, chunks: AsyncIterator[bytes], context: Any) -> bytes:
        try:
            metadata = wire.parse(messages().GrpcHostBufferStoreMetadata,
                               _header(context, _STORE_HEADER), f"the {_STORE_HEADER} header")
            session = self.session(metadata.session_id, context)
            with session.rpc():
                await _store(session, metadata, chunks)
        except IfrtError as error:
            await _abort(context, error)
        return b""

    async def host_buffer_lookup(self, raw: bytes, context: Any) -> AsyncIterator[bytes]:
        try:
            request = wire.parse(messages().GrpcHostBufferLookupRequest, raw,
                              "the HostBufferLookup request")
            session = self.session(request.session_id, context)
            session.open_rpc()
        except IfrtError as error:
            await _abort(context, error)
        try:
            steps.LOG.mark(session.id, request.handle, "lookup arrived")
            try:
                data = session.stored_host_buffer(request.handle)
                if data is None:  # its copy out is still running
                    data = await _stored(session, request.handle)
            except IfrtError as error:
                await _abort(context, error)
            view = memoryview(data).cast("B")
            if not view:
                yield b""
            start = 0
            while start < len(view):
                # the piece in flight (its message and gRPC's copy of it) is counted
                # against the limits until gRPC has taken it: a piece smaller than
                # _CHUNK where less room is left, none (RESOURCE_EXHAUSTED) where not even
                # LEAST_PIECE fits (unread lookups cannot pin memory outside the limits)
                left = len(view) - start
                try:
                    held = session.reserve_host_bytes_up_to(
                        in_flight(left, _CHUNK), in_flight(left, LEAST_PIECE))
                except IfrtError as error:
                    await _abort(context, error)
                try:
                    piece = held // 2
                    yield _chunk_message(view[start:start + piece])
                    start += piece
                finally:
                    session.release_host_bytes(held)
                if start == piece:
                    steps.LOG.mark(session.id, request.handle, "first piece written", len(view))
            steps.LOG.mark(session.id, request.handle, "last piece written", len(view))
        finally:
            session.close_rpc()

    async def host_buffer_delete(self, raw: bytes, context: Any) -> Any:
        try:
            request = wire.parse(messages().GrpcHostBufferDeleteRequest, raw,
                              "the HostBufferDelete request")
            self.session(request.session_id, context).delete_host_buffer(request.handle)
        except IfrtError as error:
            await _abort(context, error)
        return messages().GrpcHostBufferDeleteResponse()

    async def host_buffer_read_from_disk(self, raw: bytes, context: Any) -> Any:
        try:
            metadata = wire.parse(messages().GrpcHostBufferReadFromDiskRequest, raw,
                               "the HostBufferReadFromDisk request").metadata
            session = self.session(metadata.session_id, context)
            directory = session.transfer_directory
            if self.transfers is None:
                raise UnimplementedError(
                    "HostBufferReadFromDisk: this server takes no puts through files (it "
                    "listens on no local address)")
            if directory is None:
                raise FailedPreconditionError(
                    f"HostBufferReadFromDisk: session {session.id} named no directory of its "
                    "own for puts through files (ifrtpy_jax_plugin names one); without it, "
                    f"unset {ifrtpy_jax_plugin.TRANSFER_DIRECTORY} to put over gRPC")
            stream = self.streams.get(session.id)
            if stream is None:
                raise FailedPreconditionError(f"session {session.id} is closed")
            with session.rpc():
                steps.LOG.mark(session.id, metadata.handle, "file arrived", metadata.buffer_size)
                session.reserve_host_bytes(metadata.buffer_size)
                try:
                    async with stream.file_reads:
                        data = await _handed_over(
                            self.files, local.read_put_file,
                            os.path.join(directory, f"lt_{_c_int(metadata.handle)}"),
                            metadata.buffer_size)
                except BaseException:
                    session.release_host_bytes(metadata.buffer_size)
                    raise
                steps.LOG.mark(session.id, metadata.handle, "file read", metadata.buffer_size)
                session.store_host_buffer(metadata.handle, data, reserved=True)
        except IfrtError as error:
            await _abort(context, error)
        return messages().GrpcHostBufferReadFromDiskResponse()


async def _handed_over(executor: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` run on ``executor``, its result the caller's alone: the executor's
    future (and the loop's future chained to it) would hold it until the executor's thread
    runs again after setting it, however long the system takes to schedule that thread,
    and a host buffer something else refers to is not reused (:mod:`ifrtpy.proxy.pool`)."""
    box: list[Any] = []
    await asyncio.get_running_loop().run_in_executor(executor, lambda: box.append(fn(*args)))
    return box.pop()


async def _store(session: Session, metadata: Any, chunks: AsyncIterator[bytes]) -> None:
    """Receive a HostBufferStore's chunks into a buffer grown as they arrive, each counted
    against the limits before it is kept; store it once whole."""
    size, reserved = metadata.buffer_size, 0
    steps.LOG.mark(session.id, metadata.handle, "store arrived", size)
    data = bytearray()
    try:
        async for raw in chunks:
            chunk = _chunk_of(raw)
            if len(data) + len(chunk) > size:
                raise InvalidArgumentError(
                    f"HostBufferStore: the header says {size} bytes, the stream sent "
                    f"{len(data) + len(chunk)} or more")
            session.reserve_host_bytes(len(chunk))
            reserved += len(chunk)
            data += chunk
        if len(data) != size:
            raise InvalidArgumentError(
                f"HostBufferStore: the header says {size} bytes, the stream sent {len(data)}")
    except BaseException:
        session.release_host_bytes(reserved)
        raise
    steps.LOG.mark(session.id, metadata.handle, "store received", size)
    session.store_host_buffer(metadata.handle, data, reserved=True)


async def _stored(session: Session, handle: int) -> Any:
    """The host buffer ``handle`` once stored (waited for on the loop, without a thread):
    as long as its copy out runs, else at most HOST_BUFFER_WAIT_S."""
    loop = asyncio.get_running_loop()
    while True:
        stored = asyncio.Event()

        def wake() -> None:
            _on_loop(loop, stored.set)

        session.notify_when_stored(handle, wake)
        try:
            pending = session.host_buffer_pending(handle)
            await asyncio.wait_for(stored.wait(), None if pending else HOST_BUFFER_WAIT_S)
        except asyncio.TimeoutError:
            raise NotFoundError(
                f"session {session.id} has no host buffer with handle {handle} (waited "
                f"{HOST_BUFFER_WAIT_S:g} s)") from None
        finally:
            session.forget_waiter(handle, wake)
        data = session.stored_host_buffer(handle)  # the copy's error, if it failed
        if data is not None:
            return data
        if session.closed:
            raise FailedPreconditionError(f"session {session.id} is closed")
        # woken for another reason (the handle deleted while its copy ran): look again


async def _refuse(requests: AsyncIterator[bytes], context: Any, error: IfrtError) -> NoReturn:
    """End a session stream refused at a limit: its first request (jaxlib's InitRequest,
    awaited a moment) is answered with ``error``, which jaxlib's client reports (it does not
    report a stream's own status), then the stream ends with it."""
    try:
        raw = await asyncio.wait_for(requests.__anext__(), _REFUSAL_WAIT_S)
        op_id = messages().IfrtRequest.FromString(raw).request_metadata.op_id
        await context.write(_error_response(op_id, error))
    except Exception:  # noqa: BLE001 - no request came, or not a readable one
        pass
    await _abort(context, error)


def _error_response(op_id: int, error: BaseException) -> bytes:
    m = messages()
    return m.IfrtResponse(response_metadata=m.ResponseMetadata(
        op_id=op_id, status=wire.status_proto(error))).SerializeToString()


def _c_int(handle: int) -> int:
    """``handle`` as the client names its file: converted to a 32-bit C int."""
    return (handle + (1 << 31)) % (1 << 32) - (1 << 31)


def _header(context: Any, key: str) -> bytes:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value if isinstance(value, bytes) else value.encode()
    raise InvalidArgumentError(f"the RPC needs the {key} header")


_GRPC_CODES: dict[int, Any] = {}


async def _abort(context: Any, error: BaseException) -> NoReturn:
    import grpc  # type: ignore[import-untyped]

    if not _GRPC_CODES:
        _GRPC_CODES.update({c.value[0]: c for c in grpc.StatusCode})
    code = wire.status_proto(error).code
    await context.abort(_GRPC_CODES.get(code, grpc.StatusCode.UNKNOWN), str(error))
    raise AssertionError("unreachable: abort raises")


# Host-buffer chunks are ``bytes data = 1`` messages; they are read and written here
# without a message object, so a chunk is not copied once more on the way.

def _chunk_of(raw: bytes) -> Any:
    """The ``data`` of a serialized ``GrpcHostBufferStoreRequest`` (a view, not a copy)."""
    if raw[:1] == b"\x0a":
        try:
            length, start = varint(raw, 1)
        except IndexError:
            length, start = -1, 0
        if start + length == len(raw):
            return memoryview(raw)[start:]
    return wire.parse(messages().GrpcHostBufferStoreRequest, raw,
                   "a HostBufferStore chunk").data


def _chunk_message(chunk: Any) -> bytes:
    """A serialized ``GrpcHostBufferLookupResponse`` holding ``chunk``."""
    return b"".join((b"\x0a", varint_bytes(len(chunk)), chunk)) if len(chunk) else b""
def _handlers(service: _Service) -> Any:
    """The service's method handlers. Requests arrive as bytes and are decoded by the
    handlers (a malformed one is answered INVALID_ARGUMENT, naming what was wrong); the
    session stream's answers and the lookup's chunks leave as the bytes made for them."""
    import grpc  # type: ignore[import-untyped]

    def unary(fn: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            fn, response_serializer=lambda message: message.SerializeToString())

    return grpc.method_handlers_generic_handler(_SERVICE, {
        "GetVersion": unary(service.get_version),
        "IfrtSession": grpc.stream_stream_rpc_method_handler(service.ifrt_session),
        "HostBufferStore": grpc.stream_unary_rpc_method_handler(service.host_buffer_store),
        "HostBufferLookup": grpc.unary_stream_rpc_method_handler(service.host_buffer_lookup),
        "HostBufferDelete": unary(service.host_buffer_delete),
        "HostBufferReadFromDisk": unary(service.host_buffer_read_from_disk),
    })


class ProxyServer:
    """A running IFRT Proxy server over one ifrtpy Client (see :func:`serve`).

    ``address`` is where it listens (``"unix:PATH"`` or ``"HOST:PORT"``); ``who`` says who
    can connect there. :meth:`stop` ends it (live streams get an error); a context manager
    stops it on exit. Its RPCs run on one asyncio event loop in a thread of its own, each
    session's requests on a worker thread of the session's own.
    """

    def __init__(self, client: Any, address: str | None, limits: Limits):
        self.client = client
        self.limits = limits
        local.sweep_stale()
        self._socket_dir: str | None = None
        if address is None:
            address = local.default_socket()
            self._socket_dir = os.path.dirname(address[len("unix:"):])
        elif address.startswith("unix:"):
            local.claim_unix_path(address[len("unix:"):])
        self._service = _Service(client, limits)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ifrtpy-proxy",
                                        daemon=True)
        self._thread.start()
        self._done = threading.Event()
        try:
            self.address = self._call(self._start(address))
            if not self.address.startswith("unix:"):
                self._service.port = int(self.address.rpartition(":")[2])
        except BaseException:
            self._end_loop()
            self._remove_socket_dir()
            raise
        if ifrtpy_jax_plugin.is_local(self.address):
            self._service.transfers = local.TransferRoot.make(self.address)
        self._stopped = False

    @property
    def who(self) -> str:
        """Who can connect to :attr:`address`, in words."""
        if self._socket_dir is not None:
            return (f"a unix socket in a directory only user {_user()} may enter: only that "
                    "user's processes (and root) can connect")
        if self.address.startswith("unix:"):
            return ("a unix socket: whoever may enter its directory and write to it can "
                    "connect (keep it in a directory only you may enter)")
        if ifrtpy_jax_plugin.is_local(self.address):
            return ("a loopback TCP port: every user of this machine can connect (TCP has no "
                    "permissions); serve without --address for a private unix socket")
        return ("a network address: whoever reaches it can connect, over plain text (no "
                "authentication, no TLS)")

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _start(self, address: str) -> str:
        import grpc  # type: ignore[import-untyped]

        limits = self.limits
        self._server = grpc.aio.server(
            handlers=[_handlers(self._service)],
            options=[("grpc.max_receive_message_length", limits.max_message_bytes),
                     ("grpc.max_send_message_length", -1),
                     ("grpc.so_reuseport", 0)],
            # a backstop: sessions and their host-buffer RPCs are counted by the service
            maximum_concurrent_rpcs=limits.max_sessions * (2 + limits.max_host_buffer_rpcs))
        try:
            port = self._server.add_insecure_port(address)
        except RuntimeError as error:
            raise InvalidArgumentError(f"cannot listen at {address!r}: {error}") from None
        await self._server.start()
        return address if address.startswith("unix:") else f"{address.rsplit(':', 1)[0]}:{port}"

    def _end_loop(self) -> None:
        try:  # the RPCs the stop cancelled end first, so none is left pending
            asyncio.run_coroutine_threadsafe(_cancel_tasks(), self._loop).result(_END_WAIT_S)
        except Exception as error:  # noqa: BLE001 - a task that will not end
            _log.debug("tasks left running at the stop: %s", error)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        # a put file still being read (a regular file's bytes: it ends) ends before the stop
        self._service.files.shutdown(wait=True, cancel_futures=True)
        self._done.set()

    def _remove_socket_dir(self) -> None:
        if self._socket_dir is not None:
            import shutil

            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def sessions(self) -> list[SessionInfo]:
        """The sessions the server counts, oldest first: the live ones, and those whose
        client has gone while their worker finishes the request it runs."""
        with self._service.lock:
            live = [(s, self._service.streams[i]) for i, s in self._service.sessions.items()]
        return [SessionInfo(s.id, s.peer, s.protocol_version, s.handle_counts(), s.host_bytes(),
                            stream.pending, stream.closed) for s, stream in live]

    @property
    def host_buffer_bytes(self) -> int:
        """Bytes of host buffers every session holds together (the server-wide count)."""
        return self._service.total.used

    def stop(self, grace: float | None = None) -> None:
        """Stop serving: wait up to ``grace`` seconds for RPCs in flight (None: none), end
        every stream with an error and drop every session's handles. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._service.stopping.set()
        self._call(self._server.stop(grace))
        with self._service.lock:
            streams = list(self._service.streams.values())
        for stream in streams:
            stream.close()
        deadline = time.monotonic() + _END_WAIT_S
        for stream in streams:  # a worker in a program that cannot be stopped runs on
            stream.join(max(0.0, deadline - time.monotonic()))
        self._end_loop()
        with self._service.lock:  # a session opened as the RPCs were cancelled
            late = [s for s in self._service.streams.values() if s not in streams]
        for stream in late:
            stream.close()
            stream.join(max(0.0, deadline - time.monotonic()))
        with self._service.lock:
            running = len(self._service.streams)
        if running:
            _log.warning("the server stopped with %d session workers still in programs "
                         "the backend cannot stop", running)
        if self._service.transfers is not None:
            self._service.transfers.remove()
        if self.address.startswith("unix:"):
            try:
                os.unlink(self.address[len("unix:"):])
            except OSError:
                pass
        self._remove_socket_dir()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (or ``timeout`` passes); True once stopped."""
        return self._done.wait(timeout)

    def __enter__(self) -> ProxyServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else f"{len(self.sessions())} sessions"
        return f"<ProxyServer {self.client!r} at {self.address}, {state}>"


async def _cancel_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def serve(client: Any = None, address: str | None = None, *, allow_remote: bool = False,
          **limits: Any) -> ProxyServer:
    """Serve ``client`` (None: ``ifrtpy.get_client()``) to IFRT Proxy clients and return
    the running server.

    ``address`` None (the default) listens on a unix socket in a new directory only this
    user may enter (``server.address`` says where); ``unix:PATH`` on that socket (refused
    if a server listens there already); ``HOST:PORT`` on TCP (port 0 picks a free one),
    where every user of the machine can connect. A non-loopback address raises
    PermissionDeniedError unless ``allow_remote``: whoever reaches it can run programs on
    the client's devices, and the protocol has no TLS. ``limits`` are the fields of
    :class:`~ifrtpy.proxy.session.Limits` (``max_sessions``, ``max_host_buffer_bytes``, ...).
    """
    if address is not None:
        address = local.check_address(address)
        if not allow_remote and not ifrtpy_jax_plugin.is_local(address):
            raise PermissionDeniedError(
                f"{address} is not a loopback address: anyone who reaches it can run programs "
                "on these devices and the protocol has no TLS; pass allow_remote=True to serve "
                "it anyway (and reach it through an SSH tunnel)")
    try:
        checked = Limits(**limits)
    except TypeError as error:
        raise InvalidArgumentError(f"serve: {error}") from None
    if client is None:
        from ifrtpy.backends import get_client

        client = get_client()
    messages().IfrtRequest  # the descriptors are read now, not in the first session
    return ProxyServer(client, address, checked)
