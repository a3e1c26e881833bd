"""Cancellation: how a caller stops the work it started when nobody waits for its result
any more (the proxy server's session whose client has gone).

A :class:`Cancellation` is cancelled once, from any thread (:meth:`Cancellation.cancel`).
While :func:`cancellation_scope` holds one open on a thread (or asyncio task), a backend
that can stop its work asks :func:`current_cancellation` around a blocking call and
registers how to stop it (:meth:`Cancellation.stopping`); a backend that cannot stop its
work ignores it, and the work runs to its end. The reference backend stops a running
program by killing the interpreter worker process that runs it; the call then raises
:class:`~ifrtpy.errors.CancelledError`.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import threading
from typing import Callable, Iterator

from ifrtpy.errors import CancelledError

__all__ = ["Cancellation", "cancellation_scope", "current_cancellation"]

_log = logging.getLogger("ifrtpy")

_CURRENT: contextvars.ContextVar[Cancellation | None] = contextvars.ContextVar(
    "ifrtpy_cancellation", default=None)


class Cancellation:
    """A flag raised once, and the ways to stop the work running under it."""

    def __init__(self, what: str = "the work"):
        self.what = what
        self._lock = threading.Lock()
        self._cancelled = False
        self._stops: dict[int, Callable[[], None]] = {}
        self._keys = itertools.count()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Raise the flag and stop the work registered now (idempotent, any thread)."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            stops = list(self._stops.values())
            self._stops.clear()
        for stop in stops:
            try:
                stop()
            except Exception as error:  # noqa: BLE001 - one stop that fails stops no other
                _log.debug("stopping %s failed: %s", self.what, error)

    def check(self) -> None:
        """CancelledError if the flag is raised."""
        if self._cancelled:
            raise CancelledError(f"{self.what} was cancelled")

    @contextlib.contextmanager
    def stopping(self, stop: Callable[[], None]) -> Iterator[None]:
        """While the block runs, :meth:`cancel` calls ``stop()`` (from its own thread);
        CancelledError before the block if the flag is raised already."""
        with self._lock:
            self.check()
            key = next(self._keys)
            self._stops[key] = stop
        try:
            yield
        finally:
            with self._lock:
                self._stops.pop(key, None)


def current_cancellation() -> Cancellation | None:
    """The cancellation of the innermost open :func:`cancellation_scope`, or None."""
    return _CURRENT.get()


class cancellation_scope:  # noqa: N801 - a context manager, named as a function
    """Make ``cancellation`` current on this thread (or task) while the block runs (a
    class, not a generator: the proxy opens one around every request it handles)."""

    __slots__ = ("_cancellation", "_token")

    def __init__(self, cancellation: Cancellation):
        self._cancellation = cancellation

    def __enter__(self) -> Cancellation:
        self._token = _CURRENT.set(self._cancellation)
        return self._cancellation

    def __exit__(self, *exc_info: object) -> None:
        _CURRENT.reset(self._token)
