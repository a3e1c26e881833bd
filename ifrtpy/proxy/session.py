"""One client's session: its handle tables and the dispatch of its requests.

A session owns every array, executable, future and host buffer its client made (its host
buffers through :class:`~ifrtpy.proxy.host_buffers.HostBuffers`). Its requests are
handled one at a time in arrival order by the session's own worker thread
(:mod:`ifrtpy.proxy.processor`), never on the server's event loop. Each request is
handled with its own context (its ``op_id`` and kind): a handler returns its answer, or a
:class:`~ifrtpy.proxy.kind.Later` that the session answers that request with when its
future completes. A request that fails answers its error and binds it to the result
handles the client minted for it, so a later request naming one of them fails with that
error.

A session's end has one owner, its processor: when its client has gone,
:meth:`Session.stop` (any thread) refuses new host-buffer work, wakes the requests that
wait for a host buffer and cancels the running request's program where the backend can
stop it; the worker then finishes the request it is running, drops the queued ones and
calls :meth:`Session.release` as its last item, which drops everything the session holds.
"""

from __future__ import annotations

import functools
import itertools
import struct
import threading
from typing import Any, Callable

from ifrtpy._xla import varint_bytes
from ifrtpy.cancellation import Cancellation, cancellation_scope
from ifrtpy.errors import (InvalidArgumentError, NotFoundError, ResourceExhaustedError,
                           UnimplementedError)
from ifrtpy.proxy import wire
from ifrtpy.proxy._protocol import messages
from ifrtpy.proxy.host_buffers import HOST_BUFFER_WAIT_S, HostBuffers, bare
from ifrtpy.proxy.kind import Handler, Kind, Later
from ifrtpy.proxy.limits import Budget, Limits
from ifrtpy.proxy.tokens import Token

__all__ = ["Limits", "Budget", "Session", "Handler", "Kind", "Later", "kinds",
           "HOST_BUFFER_WAIT_S"]

# Handles the server mints start here, far from the client's counter (which starts low).
_SERVER_HANDLES = 1 << 62


class Session(HostBuffers):
    """The state of one IfrtSession stream (see the module docstring).

    ``send`` takes each request's serialized ``IfrtResponse`` (exactly one per request);
    it is called from the session's worker or, for an answer that waits on a future, from
    the thread that completes it. ``total`` is the server's budget of host-buffer bytes,
    shared by every session; ``transfer_directory`` the directory where this session's
    client leaves its puts as files (None: it puts over gRPC only).
    """

    def __init__(self, session_id: int, peer: str, client: Any, limits: Limits,
                 protocol_version: int, send: Callable[[bytes], None], total: Budget,
                 transfer_directory: str | None = None):
        super().__init__(session_id, limits, total)
        self.peer = peer
        self.client = client
        self.protocol_version = protocol_version
        self.transfer_directory = transfer_directory
        self._send = send
        self.arrays: dict[int, Any] = {}
        self.executables: dict[int, Any] = {}
        self.futures: dict[int, Any] = {}
        self.failed: dict[int, BaseException] = {}
        self._handles = itertools.count(_SERVER_HANDLES)
        self._seq = itertools.count(1)
        #: numbers the OK answers in the order they are sent (two threads answer: the
        #: worker, and those completing the futures an answer waits on)
        self._answering = threading.Lock()
        #: cancelled when the session stops: the backend may stop the running program
        self.cancellation = Cancellation(f"a request of session {session_id}")

    # -- handles -------------------------------------------------------------------------

    def handle_counts(self) -> dict[str, int]:
        return {"arrays": len(self.arrays), "executables": len(self.executables),
                "futures": len(self.futures), "host_buffers": self.host_buffer_count()}

    def other_handles(self) -> int:
        return len(self.arrays) + len(self.executables) + len(self.futures)

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

    # -- requests ---------------------------------------------------------------------------

    def handle(self, request: Any) -> None:
        """Handle one ``IfrtRequest`` and send its answer (now, or when the future of the
        :class:`~ifrtpy.proxy.kind.Later` its handler returned completes). Never raises
        an ``Exception``: every failure is answered as a status."""
        op_id = request.request_metadata.op_id
        kind = request.WhichOneof("request")
        try:
            if kind is None:
                raise InvalidArgumentError("the request sets none of IfrtRequest's requests")
            found = kinds().get(kind)
            if found is None:
                raise UnimplementedError(f"{kind} is not served by the ifrtpy proxy")
            with cancellation_scope(self.cancellation):
                inner = found.handler(self, getattr(request, kind))
        except Exception as error:  # noqa: BLE001 - every failure becomes the answer
            self._bind_failure(kind, request, bare(error))  # before the answer: see send
            self.answer_error(op_id, error)
            return
        if isinstance(inner, Later):
            self._answer_later(op_id, kind, inner)
        else:
            self.answer(op_id, kind, inner)

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

    def answer(self, op_id: int, kind: str, inner: Any) -> None:
        """Send the OK answer ``inner`` (a message or its serialized bytes) to the request
        ``op_id`` of ``kind``: the response is written around it, not copied into one."""
        body = inner if isinstance(inner, bytes) else inner.SerializeToString()
        head = b"\x09" + _U64.pack(op_id) + b"\x18"
        tail = b"".join((_response_tag(kind), _varint(len(body)), body))
        with self._answering:  # the numbers go out in the order they are taken
            metadata = head + _varint(next(self._seq))
            self._send(b"".join((b"\x0a", _varint(len(metadata)), metadata, tail)))

    def answer_error(self, op_id: int, error: BaseException) -> None:
        metadata = messages().ResponseMetadata(op_id=op_id, status=wire.status_proto(error))
        serialized = metadata.SerializeToString()
        self._send(b"\x0a" + _varint(len(serialized)) + serialized)

    def _answer_later(self, op_id: int, kind: str, later: Later) -> None:
        """Answer the request ``op_id`` of ``kind`` when ``later.future`` completes."""

        def done(f: Any) -> None:
            error = f.exception()
            if error is None:
                try:
                    inner = later.make()
                except Exception as failure:  # noqa: BLE001 - e.g. over the host-buffer limit
                    error = failure
                else:
                    self.answer(op_id, kind, inner)
                    return
            self.answer_error(op_id, error)

        later.future.add_done_callback(done)

    # -- end --------------------------------------------------------------------------------

    def stop(self) -> None:
        """The client is gone (any thread; idempotent): host-buffer work is refused from
        now on, requests waiting for a host buffer fail, and the running request's program
        is cancelled where the backend can stop it. What the session holds stays, and
        stays counted, until :meth:`release`."""
        self.stop_host_buffers()
        self.cancellation.cancel()

    def release(self) -> None:
        """Drop every handle of the session and uncount its host bytes: the last item of
        its worker, once no request of it runs."""
        self.stop()
        self.release_host_buffers()
        self.arrays.clear()
        self.executables.clear()
        self.futures.clear()
        self.failed.clear()

    def close(self) -> None:
        """:meth:`stop` and :meth:`release` at once, for a session that no worker runs."""
        self.release()


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


_KINDS: dict[str, Kind] | None = None
_KINDS_LOCK = threading.Lock()


def kinds() -> dict[str, Kind]:
    """Every kind of request a session serves, by its field name in ``IfrtRequest``: the
    table is built whole, then published at once (no caller sees part of it)."""
    global _KINDS
    table = _KINDS
    if table is None:
        with _KINDS_LOCK:
            if _KINDS is None:
                from ifrtpy.proxy import arrays, executables, topology

                built: dict[str, Kind] = {}
                for module in (topology, arrays, executables):
                    built.update(module.KINDS)
                fields = messages().IfrtRequest.DESCRIPTOR.fields_by_name
                for module in (arrays, executables):  # those the installed jaxlib speaks
                    built.update({name: kind for name, kind in module.NEWER_KINDS.items()
                                  if name in fields})
                _KINDS = built
            table = _KINDS
    return table
