"""Futures over PJRT events."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from ifrtpy.future import Future

#: How long a wait asks whether the events fired before it registers their callbacks.
_POLL_S = 0.001


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
    needed: ``done()`` asks whether the events fired; a wait asks for up to 1 ms, then,
    like a callback, registers the events' ready callbacks (each of which takes the GIL on
    a plugin thread: for the shards of one array read at once, that cost more than the
    copies). Waits stay interruptible (``threading.Event``)."""

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
        # Most waits are short (the copies of small shards): ask first, yielding the GIL,
        # for up to _POLL_S; then have the plugin call back.
        start = time.monotonic()
        poll_until = start + (_POLL_S if timeout is None else min(_POLL_S, timeout))
        while not self.done():
            if time.monotonic() >= poll_until:
                self._arm()
                left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
                super()._wait(left)
                return
            time.sleep(0)

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
