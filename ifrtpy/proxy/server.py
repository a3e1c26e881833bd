"""The gRPC service (``xla.ifrt.proxy.GrpcIfrtService``) and :class:`ProxyServer`.

Every RPC runs on one grpc.aio event loop in a thread of the server. ``GetVersion`` picks
a protocol and serdes version inside both the client's range and the server's; each
``IfrtSession`` stream is a :class:`~ifrtpy.proxy.session.Session`, whose requests are
handled in order (on the loop, or behind a compile or a put waiting for its bytes in the
session's worker thread). ``HostBufferStore`` / ``HostBufferLookup`` /
``HostBufferDelete`` move bulk bytes of a session, and ``HostBufferReadFromDisk`` takes a
large put that a client on this machine left as a file in the server's private shared
directory. A stream that ends (the client closed, crashed or was killed) closes its
session, which drops everything it held.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import mmap
import os
import queue
import threading
from typing import Any, AsyncIterator, NoReturn

import ifrtpy_jax_plugin
from ifrtpy._xla import varint, varint_bytes
from ifrtpy.errors import (InvalidArgumentError, IfrtError, NotFoundError,
                           PermissionDeniedError, UnimplementedError)
from ifrtpy.proxy import wire
from ifrtpy.proxy._protocol import messages
from ifrtpy.proxy.session import Limits, Session

__all__ = ["ProxyServer", "SessionInfo", "serve", "PROTOCOL_VERSIONS", "SERDES_VERSIONS"]

_log = logging.getLogger("ifrtpy.proxy")

_SERVICE = "xla.ifrt.proxy.GrpcIfrtService"
_SESSION_HEADER = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
_STORE_HEADER = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"

#: Protocol versions the server speaks (jaxlib 0.10 and 0.12 clients send 16-25).
PROTOCOL_VERSIONS = (16, 25)
#: IFRT serdes versions the server reads and writes (0.10 clients send 0-3, 0.12 2-6).
SERDES_VERSIONS = (0, 3)

#: HostBufferLookup answers in pieces of this size (the client joins messages of any size; of
#: 0.25, 1, 4 and 16 MiB, 4 MiB pieces made a 64 MiB get fastest: docs/proxy.md)
_CHUNK = 4 << 20
_END = object()


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """A live session: its id, the client's address and how many handles it holds."""

    id: int
    peer: str
    protocol_version: int
    handles: dict[str, int]


def _pick(client_min: int, client_max: int, ours: tuple[int, int], what: str) -> int:
    low, high = max(client_min, ours[0]), min(client_max, ours[1])
    if low > high:
        raise InvalidArgumentError(
            f"the client speaks {what} versions {client_min}-{client_max}; this server "
            f"{ours[0]}-{ours[1]}")
    return high


#: Requests that may wait long (a compile, a put waiting for its host buffer to arrive over
#: another RPC): a session's worker thread handles them, the others run on the event loop.
_WORKER_KINDS = frozenset({
    "compile_request", "make_array_from_host_buffer_request",
    "make_arrays_from_host_buffer_shards_request",
})


class _InOrder:
    """Handles one session's requests in arrival order: on the event loop while its worker
    thread has nothing queued, else behind the queued ones in the worker (started on the
    first such request)."""

    def __init__(self, session: Session, loop: asyncio.AbstractEventLoop):
        self.session = session
        self.loop = loop
        self.queued = 0  # touched on the loop only
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.worker: threading.Thread | None = None

    def submit(self, request: Any) -> None:
        if not self.queued and request.WhichOneof("request") not in _WORKER_KINDS:
            self.session.handle(request)
            return
        if self.worker is None:
            self.worker = threading.Thread(target=self._work, daemon=True,
                                           name=f"ifrtpy-proxy-session-{self.session.id}")
            self.worker.start()
        self.queued += 1
        self.inbox.put(request)

    def _work(self) -> None:
        while (request := self.inbox.get()) is not _END:
            self.session.handle(request)
            _on_loop(self.loop, self._done)

    def _done(self) -> None:
        self.queued -= 1

    def close(self) -> threading.Thread | None:
        """Let the worker finish what is queued and end; the worker, if there is one."""
        self.inbox.put(_END)
        return self.worker


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """Call ``fn(*args)`` on ``loop`` from another thread; nothing once the loop is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the server stopped: nobody is left to answer
        pass


class _Service:
    """The RPC handlers over the server's sessions (coroutines on the server's loop)."""

    def __init__(self, client: Any, limits: Limits):
        self.client = client
        self.limits = limits
        self.sessions: dict[int, Session] = {}
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self.stopping = threading.Event()
        #: where clients on this machine leave large puts as files (None: nowhere)
        self.transfer_dir: str | None = None

    # -- GetVersion -----------------------------------------------------------------------

    async def get_version(self, request: Any, context: Any) -> Any:
        m = messages()
        try:
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

    async def ifrt_session(self, requests: AsyncIterator[Any], context: Any) -> None:
        m = messages()
        header = _header(context, _SESSION_HEADER)
        if header is None:
            await _abort(context, InvalidArgumentError(
                f"IfrtSession needs the {_SESSION_HEADER} header"))
        try:
            metadata = m.GrpcIfrtSessionMetadata.FromString(header)
            version = _pick(metadata.version.protocol_version, metadata.version.protocol_version,
                            PROTOCOL_VERSIONS, "protocol")
        except Exception as error:  # noqa: BLE001 - a malformed header
            await _abort(context, InvalidArgumentError(f"bad {_SESSION_HEADER} header: {error}"))
        loop = asyncio.get_running_loop()
        outbox: asyncio.Queue = asyncio.Queue()
        here = threading.get_ident()

        def send(response: Any) -> None:
            if threading.get_ident() == here:
                outbox.put_nowait(response)
            else:
                _on_loop(loop, outbox.put_nowait, response)

        with self.lock:
            session = Session(next(self._ids), context.peer(), self.client, self.limits,
                              version, send)
            self.sessions[session.id] = session
        in_order = _InOrder(session, loop)
        writer = loop.create_task(_write(outbox, context))
        broken = None
        try:
            async for request in requests:
                if self.stopping.is_set():
                    break
                in_order.submit(request)
            worker = in_order.close()
            if worker is not None:  # the client half-closed: answer what it sent
                await asyncio.to_thread(worker.join)
            outbox.put_nowait(_END)
            await writer
        except Exception as error:  # noqa: BLE001 - an undecodable message, a lost client
            broken = error
        finally:
            in_order.close()
            writer.cancel()
            self._close(session)
        if broken is not None:
            _log.debug("session %d: stream broke: %s", session.id, broken)
            await _abort(context, InvalidArgumentError(
                f"session {session.id} ended: the stream broke ({broken})"))

    def _close(self, session: Session) -> None:
        with self.lock:
            self.sessions.pop(session.id, None)
        session.close()

    def session(self, session_id: int) -> Session:
        with self.lock:
            found = self.sessions.get(session_id)
        if found is None:
            raise InvalidArgumentError(f"no live session {session_id}")
        return found

    # -- host buffers ---------------------------------------------------------------------

    async def host_buffer_store(self, chunks: AsyncIterator[Any], context: Any) -> Any:
        try:
            header = _header(context, _STORE_HEADER)
            if header is None:
                raise InvalidArgumentError(f"HostBufferStore needs the {_STORE_HEADER} header")
            metadata = messages().GrpcHostBufferStoreMetadata.FromString(header)
            session = self.session(metadata.session_id)
            size = metadata.buffer_size
            if size < 0:
                raise InvalidArgumentError(f"HostBufferStore: buffer_size {size} is negative")
            session.reserve_host_bytes(size)
            data, received = bytearray(size), 0
            async for chunk in chunks:
                end = received + len(chunk)
                if end > size:
                    received = end
                    break
                data[received:end] = chunk
                received = end
            if received != size:
                raise InvalidArgumentError(
                    f"HostBufferStore: the header says {size} bytes, the stream sent "
                    f"{received}{' or more' if received > size else ''}")
            session.store_host_buffer(metadata.handle, data)
        except IfrtError as error:
            await _abort(context, error)
        return _EMPTY

    async def host_buffer_lookup(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            session = self.session(request.session_id)
            data: Any = session.stored_host_buffer(request.handle)
            if data is None:  # its copy out is still running
                data = await asyncio.to_thread(session.host_buffer, request.handle)
        except IfrtError as error:
            await _abort(context, error)
        view = memoryview(data).cast("B")
        if not view:
            yield b""
        for start in range(0, len(view), _CHUNK):
            yield view[start:start + _CHUNK]

    async def host_buffer_delete(self, request: Any, context: Any) -> Any:
        try:
            self.session(request.session_id).delete_host_buffer(request.handle)
        except IfrtError as error:
            await _abort(context, error)
        return messages().GrpcHostBufferDeleteResponse()

    async def host_buffer_read_from_disk(self, request: Any, context: Any) -> Any:
        metadata = request.metadata
        try:
            if self.transfer_dir is None:
                raise UnimplementedError(
                    "HostBufferReadFromDisk: this server takes no puts through files (it "
                    "made no shared directory: it does not listen on a local address)")
            data = _read_transfer_file(
                os.path.join(self.transfer_dir, f"lt_{_c_int(metadata.handle)}"),
                metadata.buffer_size)
            # storing checks the session's host-buffer limit (the bytes are already here)
            self.session(metadata.session_id).store_host_buffer(metadata.handle, data)
        except IfrtError as error:
            await _abort(context, error)
        return messages().GrpcHostBufferReadFromDiskResponse()


def _c_int(handle: int) -> int:
    """``handle`` as the client names its file: converted to a 32-bit C int."""
    return (handle + (1 << 31)) % (1 << 32) - (1 << 31)


def _read_transfer_file(path: str, size: int) -> Any:
    """The ``size`` bytes of the client's file at ``path``, mapped (not copied); the file
    is removed (its mapping lives on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        _unlink(path)  # a link in its place
        raise NotFoundError(f"HostBufferReadFromDisk: cannot open {path}: {error.strerror}") from None
    try:
        _unlink(path)
        found = os.fstat(fd).st_size
        if found != size:
            raise InvalidArgumentError(
                f"HostBufferReadFromDisk: {path} holds {found} bytes; the request says {size}")
        return mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else b""
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _make_shared_directory(address: str) -> str | None:
    """This server's private directory for puts through files (see ifrtpy_jax_plugin);
    None where another user's or a link holds its name."""
    path = ifrtpy_jax_plugin.shared_directory(address)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:  # a server before this one on the same address left it
        if not ifrtpy_jax_plugin.is_private_directory(path):
            _log.warning("%s is not this user's private directory: puts go over gRPC", path)
            return None
    except OSError as error:
        _log.warning("cannot make %s (%s): puts go over gRPC", path, error)
        return None
    _remove_files(path)
    return path


def _remove_files(path: str) -> None:
    for name in os.listdir(path):
        if name.startswith("lt_"):
            _unlink(os.path.join(path, name))


async def _write(outbox: asyncio.Queue, context: Any) -> None:
    """Send the session's answers in the order they were queued, until ``_END``."""
    while (response := await outbox.get()) is not _END:
        await context.write(response)


def _header(context: Any, key: str) -> bytes | None:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value if isinstance(value, bytes) else value.encode()
    return None


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
_EMPTY = b""


def _chunk_of(raw: bytes) -> Any:
    """The ``data`` of a serialized ``GrpcHostBufferStoreRequest`` (a view, not a copy)."""
    if raw[:1] == b"\x0a":
        length, start = varint(raw, 1)
        if start + length == len(raw):
            return memoryview(raw)[start:]
    return messages().GrpcHostBufferStoreRequest.FromString(raw).data


def _chunk_message(chunk: Any) -> bytes:
    """A serialized ``GrpcHostBufferLookupResponse`` holding ``chunk``."""
    return b"".join((b"\x0a", varint_bytes(len(chunk)), chunk)) if len(chunk) else b""


def _handlers(service: _Service) -> Any:
    import grpc  # type: ignore[import-untyped]

    m = messages()

    def unary(fn: Any, req: Any, resp: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString)

    return grpc.method_handlers_generic_handler(_SERVICE, {
        "GetVersion": unary(service.get_version, m.GrpcGetVersionRequest, m.GrpcGetVersionResponse),
        "IfrtSession": grpc.stream_stream_rpc_method_handler(
            service.ifrt_session, request_deserializer=m.IfrtRequest.FromString,
            response_serializer=m.IfrtResponse.SerializeToString),
        "HostBufferStore": grpc.stream_unary_rpc_method_handler(
            service.host_buffer_store, request_deserializer=_chunk_of,
            response_serializer=bytes),
        "HostBufferLookup": grpc.unary_stream_rpc_method_handler(
            service.host_buffer_lookup,
            request_deserializer=m.GrpcHostBufferLookupRequest.FromString,
            response_serializer=_chunk_message),
        "HostBufferDelete": unary(service.host_buffer_delete, m.GrpcHostBufferDeleteRequest,
                                  m.GrpcHostBufferDeleteResponse),
        "HostBufferReadFromDisk": unary(service.host_buffer_read_from_disk,
                                        m.GrpcHostBufferReadFromDiskRequest,
                                        m.GrpcHostBufferReadFromDiskResponse),
    })


class ProxyServer:
    """A running IFRT Proxy server over one ifrtpy Client (see :func:`serve`).

    ``address`` is where it listens (``"127.0.0.1:PORT"`` or ``"unix:PATH"``);
    :meth:`stop` ends it (live streams get an error); a context manager stops it on exit.
    Its RPCs run on one asyncio event loop in a thread of its own.
    """

    def __init__(self, client: Any, address: str, limits: Limits, max_sessions: int):
        self.client = client
        self._service = _Service(client, limits)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ifrtpy-proxy",
                                        daemon=True)
        self._thread.start()
        self._done = threading.Event()
        try:
            self.address = self._call(self._start(address, max_sessions))
        except BaseException:
            self._end_loop()
            raise
        if ifrtpy_jax_plugin.is_local(self.address):
            self._service.transfer_dir = _make_shared_directory(self.address)
        self._stopped = False

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _start(self, address: str, max_sessions: int) -> str:
        import grpc  # type: ignore[import-untyped]

        self._server = grpc.aio.server(
            handlers=[_handlers(self._service)],
            options=[("grpc.max_receive_message_length", -1),
                     ("grpc.max_send_message_length", -1),
                     ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=4 * max_sessions + 16)
        try:
            port = self._server.add_insecure_port(address)
        except RuntimeError as error:
            raise InvalidArgumentError(f"cannot listen at {address!r}: {error}") from None
        await self._server.start()
        return address if address.startswith("unix:") else f"{address.rsplit(':', 1)[0]}:{port}"

    def _end_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._done.set()

    def sessions(self) -> list[SessionInfo]:
        """The live sessions, oldest first."""
        with self._service.lock:
            live = list(self._service.sessions.values())
        return [SessionInfo(s.id, s.peer, s.protocol_version, s.handle_counts()) for s in live]

    def stop(self, grace: float | None = None) -> None:
        """Stop serving: wait up to ``grace`` seconds for RPCs in flight (None: none), end
        every stream with an error and drop every session's handles. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._service.stopping.set()
        self._call(self._server.stop(grace))
        with self._service.lock:
            live = list(self._service.sessions.values())
            self._service.sessions.clear()
        for session in live:
            session.close()
        self._end_loop()
        if self._service.transfer_dir is not None:
            _remove_files(self._service.transfer_dir)
            try:
                os.rmdir(self._service.transfer_dir)
            except OSError as error:  # someone put other files there
                _log.warning("cannot remove %s: %s", self._service.transfer_dir, error)

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


def serve(client: Any = None, address: str = "127.0.0.1:0", *, allow_remote: bool = False,
          max_sessions: int = 32, **limits: Any) -> ProxyServer:
    """Serve ``client`` (None: ``ifrtpy.get_client()``) to IFRT Proxy clients at ``address``
    (``HOST:PORT``, port 0 picks a free one, or ``unix:PATH``) and return the running server.

    ``limits`` are the per-session :class:`~ifrtpy.proxy.session.Limits`
    (``max_host_buffer_bytes``, ``max_handles``). A non-loopback address raises
    PermissionDeniedError unless ``allow_remote``: whoever reaches it can run programs on
    the client's devices, and the protocol has no TLS.
    """
    if not isinstance(address, str) or (":" not in address):
        raise InvalidArgumentError(f"address must be 'HOST:PORT' or 'unix:PATH', got {address!r}")
    if not allow_remote and not ifrtpy_jax_plugin.is_local(address):
        raise PermissionDeniedError(
            f"{address} is not a loopback address: anyone who reaches it can run programs on "
            "these devices and the protocol has no TLS; pass allow_remote=True to serve it "
            "anyway (and reach it through an SSH tunnel)")
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise InvalidArgumentError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
    try:
        session_limits = Limits(**limits)
    except TypeError as error:
        raise InvalidArgumentError(f"serve: {error}") from None
    if client is None:
        from ifrtpy.backends import get_client

        client = get_client()
    messages().IfrtRequest  # the descriptors are read now, not in the first session
    return ProxyServer(client, address, session_limits, max_sessions)
