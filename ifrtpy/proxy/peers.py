"""Who is at the other end of a session's connection, where the socket can tell.

A loopback TCP connection's client socket is listed in ``/proc/net/tcp`` (``tcp6``) with
its owner's uid and its inode; the process holding that inode is found among the
processes whose descriptors this process may read (its user's; every one for root). A
unix socket would tell its peer's credentials (``SO_PEERCRED``), but grpcio gives a
handler neither the connection's descriptor nor any address that tells two unix
connections apart (every peer is ``unix:``), so there the server cannot tell.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any

__all__ = ["peer_owner"]

#: ``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000`` (gRPC may write the brackets as %5B %5D).
_TCP_PEER = re.compile(r"ipv[46]:(?:\[|%5B)?(?P<host>[^\]%]+?)(?:\]|%5D)?:(?P<port>\d+)")


def peer_owner(peer: str, server_port: int | None = None) -> str | None:
    """A name for the process at the other end of the connection ``peer`` (a gRPC peer
    string) to this server's ``server_port``: ``process PID`` when it is found, ``user
    UID`` when only its owner is (a process of another user); None when the socket tells
    nothing (a unix socket, a host that is not this one, a connection already gone)."""
    found = _TCP_PEER.fullmatch(peer)
    if found is None:
        return None
    try:
        host = ipaddress.ip_address(found.group("host"))
    except ValueError:
        return None
    if isinstance(host, ipaddress.IPv6Address) and host.ipv4_mapped is not None:
        host = host.ipv4_mapped
    if not host.is_loopback:
        return None
    socket = _tcp_socket(host, int(found.group("port")), server_port)
    if socket is None:
        return None
    uid, inode = socket
    pid = _holder(inode, uid)
    if pid is not None:
        return f"process {pid}"
    return f"user {uid}"


def _tcp_socket(host: Any, port: int, server_port: int | None) -> tuple[int, int] | None:
    """(owner uid, inode) of this machine's TCP socket bound to ``host:port`` and
    connected to ``server_port`` (where given: one local port may serve connections to
    several destinations)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local_host, _, local_port = fields[1].partition(":")
            if int(local_port, 16) != port or _address(local_host) != host:
                continue
            if server_port is not None and int(fields[2].rpartition(":")[2], 16) != server_port:
                continue
            return int(fields[7]), int(fields[9])
    return None


def _address(text: str) -> Any:
    """An address as ``/proc/net/tcp*`` writes it (32-bit words in host order, here
    little-endian), IPv4-mapped ones as IPv4."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    found = ipaddress.ip_address(words)
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped
    return found


def _holder(inode: int, uid: int) -> int | None:
    """The process (of user ``uid``) holding the socket ``inode``, among those whose
    descriptors this process may read; None if none is."""
    if uid != os.getuid() and os.getuid() != 0:
        return None
    target = f"socket:[{inode}]"
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in sorted(pids, key=lambda p: p != os.getpid()):  # this process first: tests
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            try:
                if os.readlink(f"/proc/{pid}/fd/{name}") == target:
                    return pid
            except OSError:
                continue
    return None
