"""The join of a multi-process job, before jaxlib's coordination service starts.

jaxlib's coordination client ends the process (SIGABRT) when its ``connect()`` fails, for
instance when a process of the job never comes: the service's registration barrier times
out and the client's error handler terminates every process waiting at it. So the
processes first meet here, over a plain TCP socket at the coordinator's address: the
coordinator (:mod:`ifrtpy.distributed._coordinator`, a process of its own) listens there, every
process announces itself (``num_processes``, ``process_id``), and once all have come the
coordinator stops listening, starts the service on that port and answers ``GO`` to each.
When they do not all come within the timeout, every waiting process raises
DeadlineExceededError naming the missing ones; nothing of jaxlib has started yet, so
nothing aborts.

The connections stay open for the life of the job (:class:`Membership`): a process that
leaves closes its own after its coordination client has left the service, and the
system closes it when the process dies. That is how the coordinator knows when every
process is gone, so that it stops the service only then (jaxlib aborts a process whose
service disappears); jaxlib's service itself does not say when a client has left.

The protocol is one line each way: ``IFRTPY-JOIN 1 <num_processes> <process_id>\\n``,
answered by ``GO\\n`` or ``FAIL <CODE> <message>\\n``. Like the service, it has no
authentication.
"""

from __future__ import annotations

import ipaddress
import selectors
import socket
import time
from typing import Callable

from ifrtpy.errors import (
    Code, DeadlineExceededError, IfrtError, UnavailableError, error_from_code,
)

__all__ = ["serve", "join", "Membership", "numeric_address"]

_HELLO = "IFRTPY-JOIN 1"
_MAX_LINE = 512
_HELLO_TIMEOUT_S = 5.0  # how long the coordinator waits for one connection's hello line
_RETRY_S = 0.1  # the pause between a process's attempts to reach the coordinator
#: How long past its own deadline a process that has joined waits for the coordinator's
#: answer (the coordinator, started a little earlier or later, says why at its own).
_ANSWER_GRACE_S = 2.0


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def numeric_address(address: str, timeout_s: float) -> str:
    """``address`` (``host:port``) with its host as one IP address, the same in every
    process of the job: IPv4 before IPv6, the lowest of several (a name's addresses may
    come in another order on each host). A name that does not resolve is asked again
    until ``timeout_s`` seconds have passed (a cluster's DNS may publish a pod's name
    after the pod has started); then UnavailableError."""
    host, port = _host_port(address)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            break
        except socket.gaierror as e:
            if time.monotonic() + _RETRY_S >= deadline:
                raise UnavailableError(
                    f"the coordinator's host {host!r} did not resolve within {timeout_s:g} s "
                    f"({e})") from None
            time.sleep(_RETRY_S)
    ip = min((ipaddress.ip_address(entry[4][0]) for entry in found),
             key=lambda ip: (ip.version, int(ip)))
    return f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}"


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
        conn.sendall(line.replace("\n", " ").encode("ascii", "replace") + b"\n")
    except OSError:
        pass  # that peer is gone; it finds out by itself


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


class Membership:
    """Open connections of the join, by process id: the coordinator's to every process, or
    a process's to the coordinator."""

    def __init__(self, connections: dict[int, socket.socket]):
        self._connections = connections

    def wait_until_all_leave(self, timeout_s: float | None = None) -> list[int]:
        """The coordinator: wait until every process has closed its connection (it left
        the job, or died), at most ``timeout_s`` seconds (None: no limit); the ids of the
        processes whose connections are still open then (empty: all gone)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        still_open = dict(self._connections)
        with selectors.DefaultSelector() as selector:  # no limit on descriptor numbers
            for pid, conn in still_open.items():
                selector.register(conn, selectors.EVENT_READ, pid)
            while still_open:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                for key, _ in selector.select(left):
                    if _gone(key.fileobj):  # type: ignore[arg-type]
                        selector.unregister(key.fileobj)
                        del still_open[key.data]
        return sorted(still_open)

    def close(self) -> None:
        """Close the connections (a process's: tells the coordinator it has left)."""
        for conn in self._connections.values():
            conn.close()
        self._connections = {}


def join(address: str, num_processes: int, process_id: int, timeout_s: float) -> Membership:
    """Return once all ``num_processes`` processes have joined at ``address`` (where the
    coordinator listens) and the coordinator has started the service, with this process's
    open connection of the join. DeadlineExceededError after ``timeout_s`` seconds (2 s
    more for the coordinator's word, once it has been reached) when they have not; InvalidArgumentError when the coordinator refuses this process (another
    ``num_processes``, or its ``process_id`` already joined); UnavailableError when
    something else answers at ``address``; the coordinator's error when the service could
    not start."""
    host, port = _host_port(address)
    deadline = time.monotonic() + timeout_s
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
        line = _read_line(conn, deadline + _ANSWER_GRACE_S)  # the coordinator's verdict
        if line == "GO":
            conn.settimeout(None)
            return Membership({process_id: conn})
        conn.close()
        if line is None:  # the coordinator went away, or is busy with other joins: again
            last_error = "the coordinator did not answer"
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


def serve(address: str, num_processes: int, timeout_s: float,
          on_listening: Callable[[], None] = lambda: None,
          start: Callable[[], None] = lambda: None) -> Membership:
    """The coordinator's side: listen at ``address`` (then call ``on_listening``) until
    processes ``0 .. num_processes-1`` have all joined, stop listening, call ``start`` (the
    service goes up on that port) and answer ``GO`` to each; return the open connections
    of them all. When they have not all joined within ``timeout_s`` seconds, each that
    came is told DEADLINE_EXCEEDED naming the missing ones and DeadlineExceededError is
    raised; when ``start`` raises an ifrtpy error, each is told it and it is raised.
    UnavailableError when the coordinator cannot listen at ``address``."""
    host, port = _host_port(address)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server = socket.create_server((host, port), family=family)
    except OSError as e:
        raise UnavailableError(f"the coordinator cannot listen at {address}: {e}") from None
    deadline = time.monotonic() + timeout_s
    joined: dict[int, socket.socket] = {}

    def forget_the_departed() -> None:  # one that gave up waiting is not there
        for pid, conn in list(joined.items()):
            if _gone(conn):
                conn.close()
                del joined[pid]

    try:
        try:
            on_listening()
            while True:
                forget_the_departed()
                left = deadline - time.monotonic()
                if len(joined) == num_processes or left <= 0:
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
        finally:
            server.close()  # the port is free (for the service) before anyone is answered
        missing = sorted(set(range(num_processes)) - set(joined))
        if missing:
            raise DeadlineExceededError(
                f"process(es) {missing} of {num_processes} did not join at {address} within "
                f"{timeout_s:g} s")
        start()
    except IfrtError as e:
        for conn in joined.values():
            _send(conn, f"FAIL {e.code.name} {e}")
            conn.close()
        raise
    except BaseException:
        for conn in joined.values():
            conn.close()
        raise
    for conn in joined.values():
        _send(conn, "GO")
    return Membership(joined)


def _refusal(line: str | None, num_processes: int, joined: dict[int, socket.socket]) -> str | None:
    """Why the coordinator refuses the hello ``line`` (None: it accepts it)."""
    parts = (line or "").split()
    if len(parts) != 4 or " ".join(parts[:2]) != _HELLO or not all(p.isdigit() for p in parts[2:]):
        return f"not an ifrtpy join request: {(line or '')[:80]!r}"
    count, pid = int(parts[2]), int(parts[3])
    if count != num_processes:
        return f"the coordinator runs a job of {num_processes} processes, not {count}"
    if not 0 <= pid < num_processes:
        return f"process_id {pid} is not in 0..{num_processes - 1}"
    if pid in joined:
        return f"process_id {pid} has already joined"
    return None
