"""Futures: IFRT's ``Future<T>`` (the read side) and ``Promise<T>`` (the write side).

A :class:`Future` becomes ready exactly once, with a value or an exception. Everything is
thread-safe: a backend completes futures from its own threads (the PjRt backend from PJRT
event callbacks) through a :class:`Promise`, while users block on :meth:`Future.result`
(which releases the GIL) or attach callbacks. :func:`join_futures` is IFRT's
``JoinFutures``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Generic, Iterable, TypeVar

from ifrtpy.errors import DeadlineExceededError, FailedPreconditionError, InvalidArgumentError

__all__ = ["Future", "Promise", "join_futures", "then_value"]

T = TypeVar("T")

_log = logging.getLogger("ifrtpy")
_PENDING = object()
_DONE_LOCK = threading.Lock()  # shared by futures created ready; they never need their own


class Future(Generic[T]):
    """The read side of an asynchronous result; ready once, with a value or an exception.

    Thread-safe. Obtain one from :class:`Promise` (``Promise().future``), or already
    complete from :meth:`Future.ready` / :meth:`Future.failed`.
    """

    __slots__ = ("_lock", "_value", "_exc", "_callbacks", "_event", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: Any = _PENDING
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Future[T]], Any]] | None = []
        self._event: threading.Event | None = None  # made on the first blocking wait

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def ready(cls, value: T = None) -> Future[T]:  # type: ignore[assignment]
        """A future that is already ready with ``value``."""
        fut = cls.__new__(cls)
        fut._lock = _DONE_LOCK
        fut._value = value
        fut._exc = None
        fut._callbacks = None
        fut._event = None
        return fut

    @classmethod
    def failed(cls, exc: BaseException) -> Future[T]:
        """A future that has already failed with ``exc`` (an exception instance)."""
        _check_exception(exc)
        fut = cls.ready(None)
        fut._exc = exc
        return fut

    # -- completion (used by Promise) ------------------------------------------------------

    def _complete(self, value: Any, exc: BaseException | None) -> bool:
        """Make the future ready; False (and no change) if it already was."""
        with self._lock:
            callbacks = self._callbacks
            if callbacks is None:
                return False
            self._value = value
            self._exc = exc
            self._callbacks = None
            event = self._event
        if event is not None:
            event.set()
        for fn in callbacks:
            self._run_callback(fn)
        return True

    def _run_callback(self, fn: Callable[[Future[T]], Any]) -> None:
        try:
            fn(self)
        except Exception:  # a failing callback must not stop the others, nor the completer
            _log.exception("exception in Future callback %r", fn)

    # -- queries --------------------------------------------------------------------------

    def done(self) -> bool:
        """Whether the future is ready (with a value or an exception). Never blocks."""
        return self._callbacks is None

    is_ready = done

    def _wait(self, timeout: float | None) -> None:
        if self._callbacks is None:
            return
        with self._lock:
            if self._callbacks is None:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if not event.wait(timeout):  # Event.wait releases the GIL
            raise DeadlineExceededError(f"Future not ready after {timeout} s")

    def result(self, timeout: float | None = None) -> T:
        """Block until ready; return the value or raise the stored exception.

        ``timeout`` in seconds (None waits forever); DeadlineExceededError (a
        TimeoutError) when it expires first.
        """
        self._wait(timeout)
        if self._exc is not None:
            raise self._exc
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Block until ready; return the stored exception, or None if it succeeded."""
        self._wait(timeout)
        return self._exc

    def add_done_callback(self, fn: Callable[[Future[T]], Any]) -> None:
        """Call ``fn(self)`` exactly once when the future is ready.

        If it is already ready, ``fn`` runs now, in this thread; otherwise it runs in the
        thread that completes the future. Exceptions raised by ``fn`` are logged and
        otherwise ignored. Callbacks should be quick and must not block on other futures
        completed by the same thread.
        """
        if self._callbacks is None:
            self._run_callback(fn)
            return
        with self._lock:
            callbacks = self._callbacks
            if callbacks is not None:
                callbacks.append(fn)
                return
        self._run_callback(fn)

    def __await__(self):
        """Await from asyncio: ``value = await future``."""
        import asyncio

        if not self.done():
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()

            def wake(_: Future) -> None:
                loop.call_soon_threadsafe(lambda: waiter.done() or waiter.set_result(None))

            self.add_done_callback(wake)
            yield from waiter.__await__()
        return self.result()

    def __repr__(self) -> str:
        if not self.done():
            state = "pending"
        elif self._exc is not None:
            state = f"failed: {type(self._exc).__name__}: {self._exc}"
        else:
            state = "ready"
        return f"<Future {state}>"


class Promise(Generic[T]):
    """The write side of a :class:`Future`: set it exactly once, from any thread.

    A second ``set_result``/``set_exception`` raises FailedPreconditionError.
    """

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: Future[T] = Future()

    def set_result(self, value: T = None) -> None:  # type: ignore[assignment]
        """Make the future ready with ``value``; runs its callbacks in this thread."""
        if not self.future._complete(value, None):
            raise FailedPreconditionError("Promise is already set")

    def set_exception(self, exc: BaseException) -> None:
        """Make the future fail with ``exc``; runs its callbacks in this thread."""
        _check_exception(exc)
        if not self.future._complete(None, exc):
            raise FailedPreconditionError("Promise is already set")

    def is_set(self) -> bool:
        return self.future.done()

    def __repr__(self) -> str:
        return f"<Promise {'set' if self.is_set() else 'unset'}>"


def _check_exception(exc: object) -> None:
    if not isinstance(exc, BaseException):
        raise InvalidArgumentError(
            f"a future can only fail with an exception instance, not {exc!r}"
        )


def join_futures(futures: Iterable[Future[Any]]) -> Future[None]:
    """A future that is ready once **all** ``futures`` are ready (IFRT ``JoinFutures``).

    It succeeds with None if every input succeeded; otherwise it fails with the error of a
    failing input (the first failing one in input order). Joining nothing is ready at once.
    """
    futures = list(futures)
    if not futures:
        return Future.ready(None)
    if all(f.done() for f in futures):
        return _joined(futures)
    promise: Promise[None] = Promise()
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            exc = _first_exception(futures)
            if exc is None:
                promise.set_result(None)
            else:
                promise.set_exception(exc)

    for f in futures:
        f.add_done_callback(one_done)
    return promise.future


def _first_exception(futures: list[Future[Any]]) -> BaseException | None:
    for f in futures:
        if f._exc is not None:
            return f._exc
    return None


def _joined(futures: list[Future[Any]]) -> Future[None]:
    exc = _first_exception(futures)
    return Future.ready(None) if exc is None else Future.failed(exc)


def then_value(done: Future[Any], value: T) -> Future[T]:
    """A future that fails as ``done`` does, or else is ready with ``value``."""
    if done.done():
        exc = done.exception()
        return Future.ready(value) if exc is None else Future.failed(exc)
    promise: Promise[T] = Promise()

    def forward(f: Future[Any]) -> None:
        exc = f.exception()
        if exc is None:
            promise.set_result(value)
        else:
            promise.set_exception(exc)

    done.add_done_callback(forward)
    return promise.future
