"""The join of a multi-process job, before jaxlib's coordination service starts.

jaxlib's coordination client ends the process (SIGABRT) when its ``connect()`` fails, for
instance when a process of the job never comes: the service's registration barrier times
out and the client's error handler terminates every process waiting at it. So
:func:`ifrtpy.distributed.initialize` first lets the processes meet here, over a plain TCP
socket on the coordinator's own address: process 0 listens there, the others announce
themselves (``num_processes``, ``process_id``), and once all have come process 0 answers
``GO`` to each, stops listening and starts the service on that port. When they do not all
come within the timeout, every waiting process raises DeadlineExceededError (process 0
names the missing processes and tells the ones that came); nothing of jaxlib has started
yet, so nothing aborts.

The connections stay open for the life of the job (:class:`Membership`): a process that
leaves closes its own after its coordination client has left the service, and the
system closes it when the process dies. That is how process 0 knows when the others are
gone, so that it stops the service only then (jaxlib aborts a process whose service
disappears, or whose client's shutdown finds none); jaxlib's service itself does not say
when a client has left.

The protocol is one line each way: ``IFRTPY-JOIN 1 <num_processes> <process_id>\\n``,
answered by ``GO\\n`` or ``FAIL <CODE> <message>\\n``. Like the service, it has no
authentication.
"""

from __future__ import annotations

import select
import socket
import time

from ifrtpy.errors import (
    Code, DeadlineExceededError, IfrtError, UnavailableError, error_from_code,
)

__all__ = ["join", "Membership"]

_HELLO = "IFRTPY-JOIN 1"
_MAX_LINE = 512
#: How long process 0 waits for one connection's hello line (a peer sends it at once).
_HELLO_TIMEOUT_S = 5.0
#: The pause between a peer's attempts to reach process 0.
_RETRY_S = 0.1


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _read_line(conn: socket.socket, deadline: float) -> str | None:
    """One ``\\n``-ended line (without it); what came before the connection closed when no
    line did (not our protocol); None when nothing came (closed, timed out)."""
    data = b""
    while not data.endswith(b"\n") and len(data) <= _MAX_LINE:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(left)
        try:
            chunk = conn.recv(_MAX_LINE)
        except OSError:  # a timeout included
            return None
        if not chunk:
            break
        data += chunk
    if not data:
        return None
    return data.removesuffix(b"\n").decode("ascii", "replace")


def _send(conn: socket.socket, line: str) -> None:
    try:
        conn.settimeout(1.0)
        conn.sendall(line.encode("ascii", "replace") + b"\n")
    except OSError:
        pass  # that peer is gone; it finds out by itself


class Membership:
    """This process's open connections of the join, by the other process's id: process 0's
    to each other process, or another process's to process 0 (none in a job of one)."""

    def __init__(self, connections: dict[int, socket.socket]):
        self._connections = connections

    def wait_until_the_others_leave(self, timeout_s: float) -> list[int]:
        """Process 0: wait until every other process has closed its connection (it left
        the job, or died), at most ``timeout_s`` seconds; the ids of the processes whose
        connections are still open then (empty: all gone)."""
        deadline = time.monotonic() + timeout_s
        still_open = dict(self._connections)
        while still_open:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            readable, _, _ = select.select(list(still_open.values()), [], [], left)
            for pid, conn in list(still_open.items()):
                if conn in readable and _gone(conn):
                    del still_open[pid]
        return sorted(still_open)

    def close(self) -> None:
        """Close the connections (for another process: tells process 0 it has left)."""
        for conn in self._connections.values():
            conn.close()
        self._connections = {}


def join(address: str, num_processes: int, process_id: int, timeout_s: float) -> Membership:
    """Return once all ``num_processes`` processes have joined at ``address`` (process 0
    listens there until then), with this process's open connections of the join;
    DeadlineExceededError after ``timeout_s`` seconds when they have not, UnavailableError
    when process 0 cannot listen at ``address``, and InvalidArgumentError when process 0
    refuses this process (another ``num_processes``, or its ``process_id`` already
    joined)."""
    if num_processes == 1:
        return Membership({})
    deadline = time.monotonic() + timeout_s
    if process_id == 0:
        return _lead(address, num_processes, deadline, timeout_s)
    return _follow(address, num_processes, process_id, deadline, timeout_s)


def _lead(address: str, num_processes: int, deadline: float, timeout_s: float) -> Membership:
    host, port = _host_port(address)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server = socket.create_server((host, port), family=family)
    except OSError as e:
        raise UnavailableError(f"process 0 cannot listen at {address}: {e}") from None
    joined: dict[int, socket.socket] = {}

    def forget_the_departed() -> None:  # one that gave up waiting is not there
        for pid, conn in list(joined.items()):
            if _gone(conn):
                conn.close()
                del joined[pid]

    try:
        while True:
            forget_the_departed()
            if len(joined) == num_processes - 1:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except OSError:  # the timeout included
                continue
            line = _read_line(conn, min(deadline, time.monotonic() + _HELLO_TIMEOUT_S))
            forget_the_departed()
            refusal = _refusal(line, num_processes, joined)
            if refusal is None:
                assert line is not None
                joined[int(line.split()[-1])] = conn
            else:
                _send(conn, f"FAIL INVALID_ARGUMENT {refusal}")
                conn.close()
        missing = sorted(set(range(1, num_processes)) - set(joined))
        if missing:
            message = (f"process(es) {missing} of {num_processes} did not join at {address} "
                       f"within {timeout_s:g} s")
            for conn in joined.values():
                _send(conn, f"FAIL DEADLINE_EXCEEDED {message}")
            raise DeadlineExceededError(message)
        for conn in joined.values():
            _send(conn, "GO")
        membership, joined = Membership(joined), {}
    finally:
        for conn in joined.values():  # all of them when it raised
            conn.close()
        server.close()
    return membership


def _gone(conn: socket.socket) -> bool:
    """Whether the peer of ``conn`` has closed it (or the connection broke); what it sent
    is read and dropped (nothing is sent after the join)."""
    timeout = conn.gettimeout()
    conn.setblocking(False)
    try:
        for _ in range(64):
            if not conn.recv(_MAX_LINE):
                return True
        return False
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        conn.settimeout(timeout)


def _refusal(line: str | None, num_processes: int, joined: dict[int, socket.socket]) -> str | None:
    """Why process 0 refuses the hello ``line`` (None: it accepts it)."""
    parts = (line or "").split()
    if len(parts) != 4 or " ".join(parts[:2]) != _HELLO or not all(p.isdigit() for p in parts[2:]):
        return f"not an ifrtpy join request: {(line or '')[:80]!r}"
    count, pid = int(parts[2]), int(parts[3])
    if count != num_processes:
        return f"process 0 runs a job of {num_processes} processes, not {count}"
    if not 0 < pid < num_processes:
        return f"process_id {pid} is not in 1..{num_processes - 1}"
    if pid in joined:
        return f"process_id {pid} has already joined"
    return None


def _follow(address: str, num_processes: int, process_id: int, deadline: float,
            timeout_s: float) -> Membership:
    host, port = _host_port(address)
    last_error = "no answer"
    while time.monotonic() < deadline:
        try:
            conn = socket.create_connection(
                (host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic())))
        except OSError as e:
            last_error = str(e)
            time.sleep(min(_RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        _send(conn, f"{_HELLO} {num_processes} {process_id}")
        line = _read_line(conn, deadline)
        if line == "GO":
            conn.settimeout(None)
            return Membership({0: conn})
        conn.close()
        if line is None:  # process 0 went away, or is busy with other joins: try again
            last_error = "process 0 did not answer"
            time.sleep(min(_RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        code, _, message = line.removeprefix("FAIL ").partition(" ")
        if line.startswith("FAIL ") and code in Code.__members__:
            error: IfrtError = error_from_code(Code[code], message)
            raise error
        raise UnavailableError(f"{address} answered the join of process {process_id} with "
                               f"{line[:80]!r}: not an ifrtpy coordinator")
    raise DeadlineExceededError(
        f"process {process_id} could not join the job of {num_processes} processes at "
        f"{address} within {timeout_s:g} s ({last_error})")
