"""Futures over PJRT events."""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from ifrtpy.future import Future


def future_of_events(events: Sequence[Any], value: Any = None) -> Future:
    """A future ready with ``value`` once every EventHandle in ``events`` has fired, or
    failed with the first error seen. Holds the events until then."""
    if all(e.is_ready() for e in events):
        for e in events:
            exc = e.error()
            if exc is not None:
                return Future.failed(exc)
        return Future.ready(value)
    return _EventsFuture(events, value)


class _EventsFuture(Future):
    """A future of pending PJRT events that asks the plugin for no callback until one is
    needed. ``result()`` / ``exception()`` without a timeout await the events in C with
    the GIL released, and ``done()`` asks whether they fired; only callbacks (and waits
    with a timeout) register the events' ready callbacks, each of which has to take the
    GIL on a plugin thread: for the shards of an array read at once that costs more than
    the copies themselves."""

    __slots__ = ("_events", "_result", "_armed")

    def __init__(self, events: Sequence[Any], value: Any):
        super().__init__()
        self._events: list[Any] | None = list(events)
        self._result = value
        self._armed = False

    def done(self) -> bool:
        if self._callbacks is None:
            return True
        events = self._events
        if events is not None and all(e.is_ready() for e in events):
            self._settle(events)
        return self._callbacks is None

    is_ready = done

    def _wait(self, timeout: float | None) -> None:
        events = self._events
        if self._callbacks is None or events is None:
            return
        if timeout is None:
            for e in events:
                if not e.is_ready():
                    try:
                        e.await_()  # the GIL released; an event's own error is read below
                    except Exception:
                        pass  # e.g. a done event that fires only when its buffer goes
            if all(e.is_ready() for e in events):
                self._settle(events)
                return
        self._arm()
        super()._wait(timeout)

    def add_done_callback(self, fn: Callable[[Future[Any]], Any]) -> None:
        if self._callbacks is not None:
            self._arm()
        super().add_done_callback(fn)

    def _settle(self, events: list[Any]) -> None:
        """Complete with the first error among ``events`` (all fired), else the value."""
        exc = next((x for x in (e.error() for e in events) if x is not None), None)
        self._complete(None if exc is not None else self._result, exc)
        self._events = None

    def _arm(self) -> None:
        """Register the events' ready callbacks (once): the last one completes the future."""
        with self._lock:
            events = self._events
            if self._armed or events is None:
                return
            self._armed = True
        left = [len(events)]
        lock = threading.Lock()

        def fired(_: BaseException | None) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            self._settle(events)

        for e in events:
            e.on_ready(fired)
