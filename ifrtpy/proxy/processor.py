"""A session's in-order processor: the one thread that runs a session's requests, and the
owner of the session's end.

The server's event loop only moves bytes: for each message of an ``IfrtSession`` stream
it counts the message and hands its raw bytes to the session's :class:`Processor`
(:meth:`Processor.take`, a constant amount of work, whatever the message holds). The
processor's worker thread decodes each request, resolves its handles and runs it on the
backend, one at a time, in arrival order (XLA's C++ server has the same in-order processor
per session); no backend code and no walk over a request runs on the loop. The answers
it (or a completing future) makes are written on the loop in the order they were made,
by one writer task woken once per batch.

The hop is cheap: the loop hands a request over by appending it to a queue (no lock the
worker holds, no asyncio future per request); the worker hands its answers back by
waking the writer only when it is not already awake, so a burst of answers costs one
wake-up.

The stream's end (:meth:`Processor.close`: the client has gone, the server stops, or
the session was idle too long) stops the session at once; the worker finishes the
request it runs, drops those queued, releases the session and calls ``ended(session)``
as its last item. A worker that cannot go on (a malformed request, a handler raising
what is not an ``Exception``) ends the stream with an error
(:attr:`Processor.broken`), so the client's later requests never go unanswered.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from typing import Any, Callable

from ifrtpy.errors import IfrtError, InternalError, InvalidArgumentError
from ifrtpy.proxy import wire
from ifrtpy.proxy._protocol import messages
from ifrtpy.proxy.limits import Limits

__all__ = ["Processor", "on_loop"]

_log = logging.getLogger("ifrtpy.proxy")

#: Put files one session reads at once, each in a thread of the server's pool (which has
#: room for this many per session: a session's reads never wait for another's).
FILE_READS = 2


def on_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """Call ``fn(*args)`` on ``loop`` from another thread; nothing once the loop is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the server stopped: nobody is left to answer
        pass


class Processor:
    """The in-order processor of one session (see the module docstring).

    The loop stops reading the client's stream while ``max_pending_requests`` requests are
    unanswered or answered but not yet written (a client that does not read its answers
    holds at most that many), or while the queued requests hold ``max_message_bytes``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: Limits, name: str,
                 ended: Callable[[Any], None]):
        self.loop = loop
        self.session: Any = None
        self._ended = ended
        self._max_pending = limits.max_pending_requests
        self._max_queued = limits.max_message_bytes
        self._lock = threading.Lock()
        #: raw requests for the worker; None ends it
        self._inbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._queued = 0            # bytes of the requests in the inbox (under the lock)
        self._outbox: collections.deque[bytes] = collections.deque()
        self._signalled = False     # the writer was told of answers (under the lock)
        self._closed = False
        #: why the worker ended the stream (None: it did not)
        self.broken: IfrtError | None = None
        #: the task reading the stream, cancelled when the worker breaks it
        self.reader: asyncio.Task[Any] | None = None
        self.pending = 0            # requests read whose answers are not written (loop only)
        self.answered = 0           # answers made (under the lock)
        self.taken = 0              # requests read (loop only)
        self._reader_waiting = False
        self._room = asyncio.Event()
        self._answers = asyncio.Event()
        self._drained = asyncio.Event()
        #: the session's put files being read (see FILE_READS)
        self.file_reads = asyncio.Semaphore(FILE_READS)
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)

    def start(self, session: Any) -> None:
        self.session = session
        self._thread.start()

    # -- the loop's side ---------------------------------------------------------------------

    def take(self, raw: bytes) -> None:
        """Queue a request's raw bytes for the worker (constant work, on the loop)."""
        self.pending += 1
        self.taken += 1
        self._drained.clear()
        with self._lock:
            self._queued += len(raw)
        self._inbox.put(raw)

    def full(self) -> bool:
        """Whether the reader must wait for :meth:`room` before reading on."""
        return self.pending >= self._max_pending or self._queued >= self._max_queued

    def working(self) -> bool:
        """Whether a request read is not yet answered (queued, running, or waiting for
        the future its answer waits on): the server owes the client an answer."""
        with self._lock:
            return self.answered < self.taken

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

    async def write(self, context: Any, written: Callable[[], None]) -> None:
        """Write the answers in the order they were made, until the stream closes;
        ``written()`` after each."""
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
                written()
                self.pending -= 1
                if not self.pending:
                    self._drained.set()
                if self._reader_waiting and not self.full():
                    self._room.set()

    def close(self) -> None:
        """Drop the queued requests and answers and stop the session (idempotent, any
        thread); the worker ends after the request it is handling, releasing the
        session."""
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
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()

    # -- any thread --------------------------------------------------------------------------

    def send(self, answer: bytes) -> None:
        """Queue the serialized answer of one request to be written (the session's
        ``send``): each request is answered exactly once."""
        with self._lock:
            self.answered += 1
            if self._closed:
                return
            self._outbox.append(answer)
            if self._signalled:
                return
            self._signalled = True
        on_loop(self.loop, self._answers.set)

    # -- the worker --------------------------------------------------------------------------

    def _work(self) -> None:
        session = self.session
        request_type = messages().IfrtRequest
        try:
            while True:
                raw = self._inbox.get()
                if raw is None or self._closed:
                    break
                with self._lock:
                    self._queued -= len(raw)
                if self._reader_waiting:
                    on_loop(self.loop, self._room.set)
                try:
                    request = wire.parse(request_type, raw, "a request of the session stream")
                except InvalidArgumentError as error:
                    self._break(error)
                    break
                del raw
                session.handle(request)
                del request
        except BaseException as error:  # a handler raising what is not an Exception
            _log.warning("session %d: its worker stopped on %r", session.id, error)
            self._break(InternalError(
                f"session {session.id} ended: handling a request raised {type(error).__name__}"))
        finally:  # the session's end, its worker's last item
            while not self._inbox.empty():  # what the stream queued goes unrun
                self._inbox.get_nowait()
            try:
                session.release()
            finally:
                self._ended(session)

    def _break(self, error: IfrtError) -> None:
        """End the stream with ``error``: the reader (on the loop) aborts it."""
        if self._closed:
            return
        self.broken = error
        self.close()
        if self.reader is not None:
            on_loop(self.loop, self.reader.cancel)
