"""The gRPC service (``xla.ifrt.proxy.GrpcIfrtService``) and :class:`ProxyServer`.

``GetVersion`` picks a protocol and serdes version inside both the client's range and the
server's; each ``IfrtSession`` stream is a :class:`~ifrtpy.proxy.session.Session`, whose
requests one thread handles in order while the stream's own thread sends the answers;
``HostBufferStore`` / ``HostBufferLookup`` / ``HostBufferDelete`` move bulk bytes of a
session. A stream that ends (the client closed, crashed or was killed) closes its session,
which drops everything it held.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import threading
from concurrent import futures
from typing import Any, Iterator

import ifrtpy_jax_plugin
from ifrtpy.errors import InvalidArgumentError, IfrtError, PermissionDeniedError
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

_CHUNK = 1 << 20  # HostBufferLookup answers in 1 MiB pieces, as the client reads them
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


class _Service:
    """The RPC handlers over the server's sessions."""

    def __init__(self, client: Any, limits: Limits):
        self.client = client
        self.limits = limits
        self.sessions: dict[int, Session] = {}
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self.stopping = threading.Event()

    # -- GetVersion -----------------------------------------------------------------------

    def get_version(self, request: Any, context: Any) -> Any:
        m = messages()
        try:
            protocol = _pick(request.min_version.protocol_version,
                             request.max_version.protocol_version, PROTOCOL_VERSIONS, "protocol")
            serdes = _pick(request.min_version.ifrt_serdes_version_number,
                           request.max_version.ifrt_serdes_version_number, SERDES_VERSIONS,
                           "IFRT serdes")
        except IfrtError as error:
            _abort(context, error)
        return m.GrpcGetVersionResponse(version=m.IfrtProxyVersion(
            protocol_version=protocol, ifrt_serdes_version_number=serdes))

    # -- IfrtSession ----------------------------------------------------------------------

    def ifrt_session(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
        m = messages()
        header = _header(context, _SESSION_HEADER)
        if header is None:
            _abort(context, InvalidArgumentError(f"IfrtSession needs the {_SESSION_HEADER} header"))
        try:
            metadata = m.GrpcIfrtSessionMetadata.FromString(header)
            version = _pick(metadata.version.protocol_version, metadata.version.protocol_version,
                            PROTOCOL_VERSIONS, "protocol")
        except Exception as error:  # noqa: BLE001 - a malformed header
            _abort(context, InvalidArgumentError(f"bad {_SESSION_HEADER} header: {error}"))
        outbox: queue.Queue = queue.Queue()
        with self.lock:
            session = Session(next(self._ids), context.peer(), self.client, self.limits,
                              version, outbox.put)
            self.sessions[session.id] = session
        context.add_callback(lambda: outbox.put(_END))
        reader = threading.Thread(target=self._read, args=(session, requests, outbox),
                                  name=f"ifrtpy-proxy-session-{session.id}", daemon=True)
        reader.start()
        try:
            while True:
                response = outbox.get()
                if response is _END:
                    break
                yield response
        finally:
            self._close(session)

    def _read(self, session: Session, requests: Iterator[Any], outbox: queue.Queue) -> None:
        try:
            for request in requests:
                if self.stopping.is_set():
                    break
                session.handle(request)
        except Exception as error:  # noqa: BLE001 - the stream broke: the client is gone
            _log.debug("session %d: stream ended: %s", session.id, error)
        finally:
            outbox.put(_END)

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

    def host_buffer_store(self, chunks: Iterator[Any], context: Any) -> Any:
        m = messages()
        try:
            header = _header(context, _STORE_HEADER)
            if header is None:
                raise InvalidArgumentError(f"HostBufferStore needs the {_STORE_HEADER} header")
            metadata = m.GrpcHostBufferStoreMetadata.FromString(header)
            session = self.session(metadata.session_id)
            size = metadata.buffer_size
            if size < 0:
                raise InvalidArgumentError(f"HostBufferStore: buffer_size {size} is negative")
            session.reserve_host_bytes(size)
            pieces, received = [], 0
            for chunk in chunks:
                pieces.append(chunk.data)
                received += len(chunk.data)
                if received > size:
                    break
            if received != size:
                raise InvalidArgumentError(
                    f"HostBufferStore: the header says {size} bytes, the stream sent "
                    f"{received}{' or more' if received > size else ''}")
            session.store_host_buffer(metadata.handle,
                                      pieces[0] if len(pieces) == 1 else b"".join(pieces))
        except IfrtError as error:
            _abort(context, error)
        return m.GrpcHostBufferStoreResponse()

    def host_buffer_lookup(self, request: Any, context: Any) -> Iterator[Any]:
        m = messages()
        try:
            data = self.session(request.session_id).host_buffer(request.handle)
        except IfrtError as error:
            _abort(context, error)
        view = memoryview(data)
        if not view:
            yield m.GrpcHostBufferLookupResponse()
        for start in range(0, len(view), _CHUNK):
            yield m.GrpcHostBufferLookupResponse(data=bytes(view[start:start + _CHUNK]))

    def host_buffer_delete(self, request: Any, context: Any) -> Any:
        try:
            self.session(request.session_id).delete_host_buffer(request.handle)
        except IfrtError as error:
            _abort(context, error)
        return messages().GrpcHostBufferDeleteResponse()

    def host_buffer_read_from_disk(self, request: Any, context: Any) -> Any:
        from ifrtpy.errors import UnimplementedError

        _abort(context, UnimplementedError(
            "HostBufferReadFromDisk: the ifrtpy proxy moves host buffers over gRPC only"))


def _header(context: Any, key: str) -> bytes | None:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value if isinstance(value, bytes) else value.encode()
    return None


_GRPC_CODES: dict[int, Any] = {}


def _abort(context: Any, error: BaseException) -> None:
    import grpc  # type: ignore[import-untyped]

    if not _GRPC_CODES:
        _GRPC_CODES.update({c.value[0]: c for c in grpc.StatusCode})
    code = wire.status_proto(error).code
    context.abort(_GRPC_CODES.get(code, grpc.StatusCode.UNKNOWN), str(error))


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
            service.host_buffer_store, request_deserializer=m.GrpcHostBufferStoreRequest.FromString,
            response_serializer=m.GrpcHostBufferStoreResponse.SerializeToString),
        "HostBufferLookup": grpc.unary_stream_rpc_method_handler(
            service.host_buffer_lookup,
            request_deserializer=m.GrpcHostBufferLookupRequest.FromString,
            response_serializer=m.GrpcHostBufferLookupResponse.SerializeToString),
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
    """

    def __init__(self, client: Any, address: str, limits: Limits, max_sessions: int):
        import grpc  # type: ignore[import-untyped]

        self.client = client
        self._service = _Service(client, limits)
        # Each session holds one worker for its stream; the rest serve host buffers.
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2 * max_sessions + 8,
                                       thread_name_prefix="ifrtpy-proxy"),
            handlers=[_handlers(self._service)],
            options=[("grpc.max_receive_message_length", -1),
                     ("grpc.max_send_message_length", -1),
                     ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=4 * max_sessions + 16)
        try:
            port = self._server.add_insecure_port(address)
        except RuntimeError as error:
            raise InvalidArgumentError(f"cannot listen at {address!r}: {error}") from None
        if not address.startswith("unix:"):
            address = f"{address.rsplit(':', 1)[0]}:{port}"
        self.address = address
        self._server.start()
        self._stopped = False

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
        self._server.stop(grace).wait()
        with self._service.lock:
            live = list(self._service.sessions.values())
            self._service.sessions.clear()
        for session in live:
            session.close()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (or ``timeout`` passes); True once stopped."""
        return self._server.wait_for_termination(timeout)

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
