"""The gRPC service ``xla.ifrt.proxy.GrpcIfrtService``: its RPC handlers, coroutines on
the server's one event loop.

The loop reads, routes and writes; it runs no backend code and does a bounded amount of
work per message. ``GetVersion`` is answered on it. Each ``IfrtSession`` stream is a
:class:`~ifrtpy.proxy.session.Session` run by a
:class:`~ifrtpy.proxy.processor.Processor`: the loop hands each message's raw bytes to
the session's worker thread, which decodes and handles the requests in order, and writes
the answers the worker makes. ``HostBufferStore`` / ``HostBufferLookup`` /
``HostBufferDelete`` move a session's bulk bytes on the loop (a piece at a time), and
``HostBufferReadFromDisk`` reads a large put that a client on this machine left as a
file (in a thread of a small pool). A stream that ends (the client closed, crashed or was
killed, or it was idle past ``idle_timeout_s``) closes its session: its queued requests
are dropped, its host-buffer RPCs end, and everything it held is freed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import threading
import time
from typing import Any, AsyncIterator, Callable, Iterator, NoReturn

import ifrtpy_jax_plugin
from ifrtpy._xla import varint, varint_bytes
from ifrtpy.errors import (FailedPreconditionError, IfrtError, InvalidArgumentError,
                           NotFoundError, ResourceExhaustedError, UnavailableError,
                           UnimplementedError)
from ifrtpy.proxy import local, peers, steps, wire
from ifrtpy.proxy._protocol import messages
from ifrtpy.proxy.arrays import LEAST_PIECE, in_flight
from ifrtpy.proxy.host_buffers import HOST_BUFFER_WAIT_S
from ifrtpy.proxy.limits import Budget, Limits
from ifrtpy.proxy.processor import FILE_READS, Processor, on_loop
from ifrtpy.proxy.session import Session

__all__ = ["Service", "handlers", "PROTOCOL_VERSIONS", "SERDES_VERSIONS"]

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


def _pick(client_min: int, client_max: int, ours: tuple[int, int], what: str) -> int:
    low, high = max(client_min, ours[0]), min(client_max, ours[1])
    if low > high:
        raise InvalidArgumentError(
            f"the client speaks {what} versions {client_min}-{client_max}; this server "
            f"{ours[0]}-{ours[1]}")
    return high


def _host(peer: str) -> str:
    """The host part of a gRPC peer (``ipv4:127.0.0.1:5000`` -> ``ipv4:127.0.0.1``);
    ``unix`` for a unix socket, whose peers are all alike."""
    if peer.startswith("unix"):
        return "unix"
    return peer.rsplit(":", 1)[0]


class Service:
    """The RPC handlers over the server's sessions (coroutines on the server's loop)."""

    def __init__(self, client: Any, limits: Limits):
        self.client = client
        self.limits = limits
        self.total = Budget(limits.max_total_host_buffer_bytes, "the server")
        self.sessions: dict[int, Session] = {}
        self.streams: dict[int, Processor] = {}
        #: the host-buffer RPCs of each session in flight (ended with the session)
        self.rpc_tasks: dict[int, set[asyncio.Task[Any]]] = {}
        #: the peer process (or user) of each session, where the socket tells it
        self.owners: dict[int, str | None] = {}
        #: the server's TCP port (None on a unix socket), to find a peer's socket by
        self.port: int | None = None
        self.lock = threading.Lock()
        self._count = 0
        self.stopping = threading.Event()
        #: where clients on this machine leave large puts as files (None: nowhere)
        self.transfers: local.TransferRoot | None = None
        self.files = concurrent.futures.ThreadPoolExecutor(
            FILE_READS * limits.max_sessions, thread_name_prefix="ifrtpy-proxy-files")

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
        stream.reader = asyncio.current_task()
        writer = loop.create_task(stream.write(context, session.progressed))
        broken: IfrtError | None = None
        iterator = requests.__aiter__()
        try:
            try:
                while True:
                    if self.limits.idle_timeout_s is None:
                        raw = await iterator.__anext__()
                    else:
                        raw = await self._next_or_idle(iterator, session, stream)
                    if self.stopping.is_set():
                        break
                    session.progressed()
                    stream.take(raw)
                    if stream.full():
                        await stream.room()
            except StopAsyncIteration:  # the client half-closed: answer what it sent
                await stream.drained()
        except UnavailableError as error:  # idle past idle_timeout_s
            broken = error
        except asyncio.CancelledError:
            if stream.broken is None:  # the RPC itself was cancelled
                raise
            broken = stream.broken  # the worker could not go on
        finally:
            stream.close()  # the session counts until its worker has released it
            writer.cancel()
            self._end_rpcs(session.id)
        if broken is not None:
            _log.debug("session %d: %s", session.id, broken)
            await _abort(context, broken)

    async def _next_or_idle(self, iterator: Any, session: Session, stream: Processor) -> bytes:
        """The next request of the stream; UnavailableError once the session has made no
        progress (no request read, no answer written, no host-buffer bytes moved) for
        ``idle_timeout_s`` while nothing of it runs (a request unanswered, a copy out)."""
        timeout = self.limits.idle_timeout_s
        assert timeout is not None
        reading = asyncio.ensure_future(iterator.__anext__())
        try:
            while True:
                done, _ = await asyncio.wait({reading}, timeout=timeout)
                if done:
                    return reading.result()
                if (stream.working() or session.copies_running()
                        or time.monotonic() - session.last_active < timeout):
                    continue
                raise UnavailableError(
                    f"session {session.id} was idle for {timeout:g} s, the server's "
                    "idle_timeout_s: the server ended it and dropped its arrays")
        finally:
            if not reading.done():
                reading.cancel()
            elif not reading.cancelled():
                reading.exception()  # retrieved: the stream may end as the handler does

    def _end_rpcs(self, session_id: int) -> None:
        """End the host-buffer RPCs of a session that has ended (a stalled store or lookup
        holds nothing past its session)."""
        with self.lock:
            tasks = self.rpc_tasks.pop(session_id, set())
        for task in tasks:
            task.cancel()

    def _rpc_started(self, session: Session) -> None:
        """Count the running task as a host-buffer RPC of ``session`` (ended with it)."""
        task = asyncio.current_task()
        assert task is not None
        with self.lock:
            tasks = self.rpc_tasks.get(session.id)
            if tasks is None or session.closed:
                raise NotFoundError(f"no live session {session.id}")
            tasks.add(task)
        task.add_done_callback(lambda t: self._rpc_ended(session.id, t))

    def _rpc_ended(self, session_id: int, task: asyncio.Task[Any]) -> None:
        with self.lock:
            self.rpc_tasks.get(session_id, set()).discard(task)

    def _open(self, peer: str, owner: str | None, version: int,
              metadata: Any) -> tuple[Session, Processor]:
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
            stream = Processor(asyncio.get_running_loop(), limits,
                               f"ifrtpy-proxy-session-{self._count}", self._ended)
            session = Session(session_id, peer, self.client, limits, version, stream.send,
                              self.total, self._transfer_directory(metadata))
            self.sessions[session_id] = session
            self.streams[session_id] = stream
            self.rpc_tasks[session_id] = set()
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
        found.progressed()
        return found

    # -- host buffers ---------------------------------------------------------------------

    async def host_buffer_store(self, chunks: AsyncIterator[bytes], context: Any) -> bytes:
        try:
            metadata = wire.parse(messages().GrpcHostBufferStoreMetadata,
                               _header(context, _STORE_HEADER), f"the {_STORE_HEADER} header")
            session = self.session(metadata.session_id, context)
            self._rpc_started(session)
            with session.rpc(), _ends_with(session):
                await _store(session, metadata, chunks)
        except IfrtError as error:
            await _abort(context, error)
        return b""

    async def host_buffer_lookup(self, raw: bytes, context: Any) -> AsyncIterator[bytes]:
        try:
            request = wire.parse(messages().GrpcHostBufferLookupRequest, raw,
                              "the HostBufferLookup request")
            session = self.session(request.session_id, context)
            self._rpc_started(session)
            session.open_rpc()
        except IfrtError as error:
            await _abort(context, error)
        data: Any = None
        view: Any = None
        try:
            steps.LOG.mark(session.id, request.handle, "lookup arrived")
            try:
                found = session.stored_host_buffer(request.handle)
                if found is None:  # its copy out is still running
                    found = await _stored(session, request.handle)
            except IfrtError as error:
                await _abort(context, error)
            session.lease(found)  # its memory is not reused while this lookup streams it
            data = found
            del found
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
                    session.progressed()
                finally:
                    session.release_host_bytes(held)
                if start == piece:
                    steps.LOG.mark(session.id, request.handle, "first piece written", len(view))
            steps.LOG.mark(session.id, request.handle, "last piece written", len(view))
        finally:
            session.close_rpc()
            if data is not None:
                view = None  # noqa: F841 - no view of it is left
                session.end_lease(data)

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
            self._rpc_started(session)
            with session.rpc(), _ends_with(session):
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


@contextlib.contextmanager
def _ends_with(session: Session) -> Iterator[None]:
    """A host-buffer RPC cancelled because its session ended (see ``Service._end_rpcs``)
    fails with FailedPreconditionError, which ends the RPC with that status; other
    cancellations go on."""
    try:
        yield
    except asyncio.CancelledError:
        if not session.closed:
            raise
        raise FailedPreconditionError(
            f"session {session.id} ended (its client is gone, it was idle past the "
            "server's idle_timeout_s, or the server stops)") from None


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
            session.progressed()
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
            on_loop(loop, stored.set)

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
        await context.write(_error_response(_op_id_of(raw), error))
    except Exception:  # noqa: BLE001 - no request came, or not a readable one
        pass
    await _abort(context, error)


def _op_id_of(raw: bytes) -> int:
    """The op_id of a serialized ``IfrtRequest`` whose first field is its
    ``request_metadata`` (as every client writes it), read without decoding the rest (a
    bounded amount of work on the loop, whatever the request holds); 0 otherwise."""
    if raw[:1] != b"\x0a":
        return 0
    try:
        length, start = varint(raw, 1)
        metadata = messages().RequestMetadata.FromString(raw[start:start + length])
    except Exception:  # noqa: BLE001 - not a readable one
        return 0
    return int(metadata.op_id)


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


def handlers(service: Service) -> Any:
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

