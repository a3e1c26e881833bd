"""Futures over PJRT events."""

from __future__ import annotations

import threading
from typing import Any, Sequence

from ifrtpy.future import Future, Promise


def future_of_events(events: Sequence[Any], value: Any = None) -> Future:
    """A future ready with ``value`` once every EventHandle in ``events`` has fired, or
    failed with the first error seen. Holds the events until then."""
    if all(e.is_ready() for e in events):
        for e in events:
            exc = e.error()
            if exc is not None:
                return Future.failed(exc)
        return Future.ready(value)
    promise = Promise()
    lock = threading.Lock()
    state = {"left": len(events), "error": None, "events": list(events)}

    def fired(exc):
        with lock:
            if exc is not None and state["error"] is None:
                state["error"] = exc
            state["left"] -= 1
            if state["left"]:
                return
            state["events"] = None
        if state["error"] is not None:
            promise.set_exception(state["error"])
        else:
            promise.set_result(value)

    for e in events:
        e.on_ready(fired)
    return promise.future
