"""Per-step timestamps of the server's transfers, for benchmarks and diagnosis.

Off by default: :data:`LOG` then costs one attribute test per step. ``LOG.start()`` keeps
the latest :data:`KEPT` steps, each ``(time.perf_counter(), session id, handle, step,
bytes)``; ``LOG.take()`` returns and forgets them. A get's steps are keyed by its host
buffer's handle, a put's by its host buffer's handle too (the put file's or the store's):

* a get: ``copy arrived`` (CopyToHostBuffer on the session's worker), ``copy answered``,
  ``copy done`` (the bytes in host memory), ``lookup arrived``, ``first piece written``
  and ``last piece written`` (handed to gRPC);
* a put: ``file arrived`` / ``store arrived`` (HostBufferReadFromDisk, HostBufferStore),
  ``file read`` / ``store received``, ``put arrived`` (MakeArrayFromHostBuffer on the
  worker), ``put made`` (the backend's call returned) and ``put ready`` (the array's
  ready future completed).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

__all__ = ["LOG", "StepLog", "KEPT", "spans"]

#: Steps kept at most (the oldest go first).
KEPT = 1 << 16

Step = tuple[float, int, int, str, int]


class StepLog:
    """Timestamps of steps while started (see the module docstring)."""

    def __init__(self) -> None:
        self.on = False
        self._steps: collections.deque[Step] = collections.deque(maxlen=KEPT)
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            self._steps.clear()
            self.on = True

    def stop(self) -> None:
        self.on = False

    def mark(self, session_id: int, handle: int, step: str, nbytes: int = 0) -> None:
        if self.on:
            self._steps.append((time.perf_counter(), session_id, handle, step, nbytes))

    def take(self) -> list[Step]:
        with self._lock:
            steps = list(self._steps)
            self._steps.clear()
        return steps


LOG = StepLog()


def spans(steps: list[Step], first: str, last: str) -> list[tuple[int, float, dict[str, float]]]:
    """For each (session, handle) that has both ``first`` and ``last``, in the order of
    ``first``: ``(bytes, seconds from first to last, {step: seconds after first})``, the
    bytes being the largest any of its steps recorded. A handle used again (a client
    numbers its buffers anew in each session) starts a new span at its next ``first``."""
    open_: dict[tuple[int, int], dict[str, Any]] = {}
    done = []
    for at, session_id, handle, step, nbytes in steps:
        key = (session_id, handle)
        if step == first:
            open_[key] = {"at": at, "bytes": nbytes, "steps": {first: 0.0}}
            continue
        span = open_.get(key)
        if span is None:
            continue
        span["steps"].setdefault(step, at - span["at"])
        span["bytes"] = max(span["bytes"], nbytes)
        if step == last:
            done.append((span["at"], span["bytes"], at - span["at"], span["steps"]))
            del open_[key]
    return [(nbytes, seconds, marks) for _, nbytes, seconds, marks in sorted(done, key=lambda d: d[0])]
