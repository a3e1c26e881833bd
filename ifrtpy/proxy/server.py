"""The IFRT Proxy server: :class:`ProxyServer` and :func:`serve`.

A server is one grpc.aio event loop in a thread of its own, serving
:class:`~ifrtpy.proxy.service.Service` (the RPC handlers), and one worker thread per
session (:class:`~ifrtpy.proxy.processor.Processor`). The loop runs no backend code, so a
program that runs for ever in one session delays no other session's requests, and
:meth:`ProxyServer.stop` ends within its bounds whatever runs. Every resource a client
can make the server hold is bounded (:class:`~ifrtpy.proxy.limits.Limits`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from typing import Any

import ifrtpy_jax_plugin
from ifrtpy.errors import InvalidArgumentError, PermissionDeniedError
from ifrtpy.proxy import local
from ifrtpy.proxy._protocol import messages
from ifrtpy.proxy.limits import Limits
from ifrtpy.proxy.service import PROTOCOL_VERSIONS, SERDES_VERSIONS, Service, handlers

__all__ = ["ProxyServer", "SessionInfo", "serve", "PROTOCOL_VERSIONS", "SERDES_VERSIONS"]

_log = logging.getLogger("ifrtpy.proxy")

#: How long a stopping server waits, past its grace, for its sessions' workers and its
#: cancelled RPCs to end (seconds).
_END_WAIT_S = 5.0


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
        self._service = Service(client, limits)
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
        self._clean = True

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

    def _call(self, coroutine: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _start(self, address: str) -> str:
        import grpc  # type: ignore[import-untyped]

        limits = self.limits
        self._server = grpc.aio.server(
            handlers=[handlers(self._service)],
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

    def _end_loop(self, deadline: float | None = None) -> None:
        wait = _END_WAIT_S if deadline is None else max(0.0, deadline - time.monotonic())
        try:  # the RPCs the stop cancelled end first, so none is left pending
            asyncio.run_coroutine_threadsafe(_cancel_tasks(), self._loop).result(wait)
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

    def stop(self, grace: float | None = None, timeout: float = _END_WAIT_S) -> bool:
        """Stop serving: wait up to ``grace`` seconds for RPCs in flight (None: none), end
        every stream with an error, and wait up to ``timeout`` seconds more for each
        session's worker to release what the session holds. Whether every worker ended:
        False where one still runs a program the backend cannot stop (its thread is left
        running; a process that must end now exits without it, as ``serve`` does).
        Idempotent."""
        if self._stopped:
            return self._clean
        self._stopped = True
        start = time.monotonic()
        deadline = start + (grace or 0.0) + timeout
        self._service.stopping.set()
        try:
            self._call(self._server.stop(grace), max(0.0, deadline - start))
        except Exception as error:  # noqa: BLE001 - gRPC's stop did not end in time
            _log.debug("gRPC's stop: %r", error)
        with self._service.lock:
            streams = list(self._service.streams.values())
        for stream in streams:
            stream.close()
        for stream in streams:  # a worker in a program that cannot be stopped runs on
            stream.join(deadline - time.monotonic())
        self._end_loop(deadline)
        with self._service.lock:  # a session opened as the RPCs were cancelled
            late = [s for s in self._service.streams.values() if s not in streams]
        for stream in late:
            stream.close()
            stream.join(deadline - time.monotonic())
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
        self._clean = not running
        return self._clean

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
