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


def await_events(events: Sequence[Any]) -> bool:
    """Block (GIL released) until every EventHandle in ``events`` fired, errors left for
    the caller to read; False if one cannot be awaited (it raised and has not fired: a
    zero-copy buffer's done-with-host-buffer event)."""
    for e in events:
        try:
            e.await_()
        except Exception:  # noqa: BLE001 - the event's own error is the caller's to read
            if not e.is_ready():
                return False
    return True


class _EventsFuture(Future):
    """A future of pending PJRT events that asks the plugin for no callback until one is
    needed: ``done()`` asks whether the events fired; ``result()`` without a timeout blocks
    in the plugin (``PJRT_Event_Await``, the GIL released: nothing polls, and nothing
    needs the GIL until the events fired); a wait with a timeout, or a callback, registers
    the events' ready callbacks (each of which takes the GIL on a plugin thread)."""

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
        if self.done():
            return
        events = self._events
        if timeout is None and events is not None and await_events(events):
            self._settle(events)
            return
        self._arm()
        super()._wait(timeout)

    def add_done_callback(self, fn: Callable[[Future[Any]], Any]) -> None:
        if not self.done():
            self._arm()
        super().add_done_callback(fn)

    def _settle(self, events: list[Any]) -> None:
        """Complete with the first error among ``events`` (all fired), else the value."""
        exc = next((x for x in (e.error() for e in events) if x is not None), None)
        self._complete(None if exc is not None else self._result, exc)
        self._events = None

    def _arm(self) -> None:
        """Register the events' ready callbacks (once): the last one completes the future;
        one the plugin refuses fails it."""
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
            try:
                e.on_ready(fired)
            except Exception as exc:  # noqa: BLE001 - the future fails with it
                self._complete(None, exc)
                return
