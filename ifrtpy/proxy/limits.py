"""What clients may make the server hold: :class:`Limits`, each checked against its range
when the server starts, and :class:`Budget`, bytes held against one limit."""

from __future__ import annotations

import dataclasses
import threading

from ifrtpy.errors import InvalidArgumentError, ResourceExhaustedError
from ifrtpy.proxy.pool import machine_memory

__all__ = ["Limits", "Budget", "RANGES", "IDLE_TIMEOUT_RANGE"]

_MEMORY = machine_memory()

#: The range of each count and byte limit (inclusive). None of them has a "no limit"
#: value: each bounds something a client can make the server hold. The bounds keep every
#: product the server hands to gRPC within its 32-bit ints (sessions times host-buffer
#: RPCs, message sizes).
RANGES: dict[str, tuple[int, int]] = {
    "max_sessions": (1, 4096),
    "max_sessions_per_process": (1, 4096),
    "max_sessions_per_connection": (1, 4096),
    "max_total_host_buffer_bytes": (1, 1 << 60),
    "max_message_bytes": (1, (1 << 31) - 1),
    "max_host_buffer_bytes": (1, 1 << 60),
    "max_handles": (1, 1 << 31),
    "max_pending_requests": (1, 1 << 20),
    "max_host_buffer_rpcs": (1, 1 << 16),
}
#: The range of ``idle_timeout_s`` in seconds; None (the default) means no idle timeout.
IDLE_TIMEOUT_RANGE = (1.0, 1e7)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What clients may make the server hold. A request over a limit is answered
    RESOURCE_EXHAUSTED, naming the limit; nothing is half done. A value outside its
    range (:data:`RANGES`, :data:`IDLE_TIMEOUT_RANGE`) is refused when the server starts,
    with InvalidArgumentError naming the limit and the range.

    For the whole server: ``max_sessions`` (sessions counted: live ones, and those whose
    client has gone while their worker finishes the request it runs; the next IfrtSession
    is refused), ``max_sessions_per_process`` (those of one peer process, where the socket
    can tell it: loopback TCP, see :mod:`ifrtpy.proxy.peers`; a process of another user
    that cannot be found counts as its user), ``max_sessions_per_connection`` (those of
    one TCP connection; a unix socket tells its connections apart to no one),
    ``max_total_host_buffer_bytes`` (host buffers of every session together, counted as
    their bytes arrive; by default half of :func:`~ifrtpy.proxy.pool.machine_memory`) and
    ``max_message_bytes`` (one gRPC message, a request or a chunk). ``idle_timeout_s``
    (None, the default: never) ends a session that has made no progress for that many
    seconds: no request read, no answer written, no host-buffer bytes moved, and no
    request of it running (see :mod:`ifrtpy.proxy.server`).

    Per session: ``max_host_buffer_bytes`` (host buffers held at once: stored by the
    client and not yet consumed, arriving, copied out and not yet deleted, and the pieces
    of lookups in flight, which gRPC has not taken yet; by default a quarter of
    :func:`~ifrtpy.proxy.pool.machine_memory`), ``max_handles`` (live arrays,
    executables, futures and host buffers together),
    ``max_pending_requests`` (requests received and not yet answered, or answered and not
    yet read by the client: past it the server stops reading the session's stream until
    the client reads its answers) and ``max_host_buffer_rpcs`` (host-buffer RPCs of the
    session in flight at once).
    """

    max_sessions: int = 32
    max_sessions_per_process: int = 8
    max_sessions_per_connection: int = 8
    max_total_host_buffer_bytes: int = min(_MEMORY // 2, 1 << 60)
    max_message_bytes: int = 1 << 30
    max_host_buffer_bytes: int = min(_MEMORY // 4, 1 << 60)
    max_handles: int = 1 << 20
    max_pending_requests: int = 1024
    max_host_buffer_rpcs: int = 256
    idle_timeout_s: float | None = None

    def __post_init__(self) -> None:
        idle = self.idle_timeout_s
        low, high = IDLE_TIMEOUT_RANGE
        if idle is not None and (not isinstance(idle, (int, float)) or isinstance(idle, bool)
                                 or not low <= idle <= high):
            raise InvalidArgumentError(
                f"proxy limit idle_timeout_s must be a number of seconds from {low:g} to "
                f"{high:g}, or None for no idle timeout; got {idle!r}")
        for name, (low_count, high_count) in RANGES.items():
            value = getattr(self, name)
            if (not isinstance(value, int) or isinstance(value, bool)
                    or not low_count <= value <= high_count):
                raise InvalidArgumentError(
                    f"proxy limit {name} must be an int from {low_count} to {high_count}, "
                    f"got {value!r}")


class Budget:
    """Bytes held against a limit, by any thread: :meth:`reserve` or ResourceExhaustedError."""

    def __init__(self, limit: int, what: str):
        self.limit = limit
        self.what = what
        self.used = 0
        self._lock = threading.Lock()

    def reserve(self, size: int) -> None:
        self.reserve_up_to(size, size)

    def reserve_up_to(self, want: int, least: int) -> int:
        """Reserve as many bytes of ``want`` as fit, at least ``least``; that count, or
        ResourceExhaustedError (nothing reserved) where not even ``least`` fits."""
        with self._lock:
            size = min(want, self.limit - self.used)
            if size < least:
                raise ResourceExhaustedError(
                    f"{self.what} would hold {self.used + least} bytes of host buffers, over "
                    f"its limit of {self.limit}")
            self.used += size
            return size

    def release(self, size: int) -> None:
        with self._lock:
            self.used -= size
