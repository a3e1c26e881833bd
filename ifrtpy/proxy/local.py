"""A server's places on this machine: where it listens (by default a unix socket in a
directory only its user may enter), the shared directory where clients on this machine
leave large puts as files (each client process in a subdirectory of its own, which its
session names), and the clean-up of what a killed server left behind.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
from typing import Any

import ifrtpy_jax_plugin
import numpy as np

from ifrtpy import _host_memory
from ifrtpy.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError
from ifrtpy.proxy.pool import POOL

__all__ = ["check_address", "default_socket", "claim_unix_path", "sweep_stale",
           "TransferRoot", "read_put_file", "SOCKET_NAME"]

_log = logging.getLogger("ifrtpy.proxy")

#: The socket's name in the private directory of a server started without an address.
SOCKET_NAME = "proxy.sock"
#: The file naming the process of the server that made a directory (for the clean-up).
_PID_FILE = "server.pid"
#: The longest unix socket path the kernel takes (``sun_path`` less its terminating NUL).
_MAX_SOCKET_PATH = 107
#: The subdirectories ifrtpy_jax_plugin makes (``client-<pid>-<hex>``).
_CLIENT_NAME = re.compile(r"client-(\d+)-[0-9a-f]{16}")
#: Bytes read from a put file per system call.
_READ_PIECE = 16 << 20


def _prefix() -> str:
    return f"ifrtpy-proxy-{os.getuid()}-"


def check_address(address: Any) -> str:
    """``address`` if it is ``HOST:PORT`` (port 0-65535) or ``unix:PATH`` (a path a unix
    socket can have), else InvalidArgumentError saying what is wrong."""
    if not isinstance(address, str) or ":" not in address:
        raise InvalidArgumentError(
            f"address must be 'HOST:PORT' or 'unix:PATH', got {address!r}")
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        if not path:
            raise InvalidArgumentError(f"address {address!r} names no socket path ('unix:PATH')")
        if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
            raise InvalidArgumentError(
                f"the socket path of {address!r} is {len(os.fsencode(path))} bytes long; a unix "
                f"socket path has at most {_MAX_SOCKET_PATH}")
        return address
    if address.startswith("unix-abstract:"):
        raise InvalidArgumentError(
            f"{address!r}: an abstract unix socket lets every user of the machine connect; "
            "serve on 'unix:PATH' (a path in a private directory) instead")
    host, _, port = address.rpartition(":")
    if not host or "/" in host:
        raise InvalidArgumentError(f"address must be 'HOST:PORT' or 'unix:PATH', got {address!r}")
    if not port.isdigit() or int(port) > 65535:
        raise InvalidArgumentError(
            f"the port of {address!r} is {port!r}, not a port number 0-65535")
    return address


def default_socket() -> str:
    """``unix:DIR/proxy.sock`` in a new directory only this user may enter (under
    ``$XDG_RUNTIME_DIR``, else the temporary directory); a file there names this process,
    for :func:`sweep_stale`."""
    roots = [os.environ.get("XDG_RUNTIME_DIR", ""), tempfile.gettempdir(), "/tmp"]
    for root in roots:
        if root and os.path.isdir(root) and len(os.fsencode(root)) < _MAX_SOCKET_PATH - 48:
            break
    directory = tempfile.mkdtemp(prefix=_prefix(), dir=root)  # mode 0700
    _write_pid(directory)
    return f"unix:{os.path.join(directory, SOCKET_NAME)}"


def claim_unix_path(path: str) -> None:
    """Make ``path`` free for a new socket: nothing there, or a socket no one listens on
    (a stopped server's, removed). AlreadyExistsError if a server listens there or
    something else is in the way."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(found.st_mode):
        raise AlreadyExistsError(f"cannot listen at unix:{path}: it exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            _unlink(path)  # nobody listens: a stopped server's socket
            return
        except OSError as error:
            raise AlreadyExistsError(
                f"cannot listen at unix:{path}: its socket is in the way ({error.strerror})") from None
    raise AlreadyExistsError(
        f"cannot listen at unix:{path}: a server listens there already (stop it, or choose "
        "another path)")


def sweep_stale() -> None:
    """Remove the directories (default sockets, shared directories) of this user's servers
    whose process is gone: a killed server cannot remove its own."""
    roots = {os.environ.get("XDG_RUNTIME_DIR", ""), tempfile.gettempdir(), "/tmp",
             os.path.dirname(ifrtpy_jax_plugin.shared_directory("unix:x"))}
    for root in filter(None, roots):
        try:
            names = [n for n in os.listdir(root) if n.startswith(_prefix())]
        except OSError:
            continue
        for name in names:
            path = os.path.join(root, name)
            if ifrtpy_jax_plugin.is_private_directory(path) and _owner_gone(path):
                _log.info("removing %s, left by a server that is gone", path)
                shutil.rmtree(path, ignore_errors=True)


def _write_pid(directory: str) -> None:
    with open(os.path.join(directory, _PID_FILE), "w") as f:
        f.write(str(os.getpid()))


def _owner_gone(directory: str) -> bool:
    try:
        with open(os.path.join(directory, _PID_FILE)) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return False  # not made by a server of ours, or being made now
    return pid != os.getpid() and not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TransferRoot:
    """The server's shared directory (:func:`ifrtpy_jax_plugin.shared_directory`): a
    client process on this machine makes a subdirectory there, and its session names it;
    the server reads a session's put files from that subdirectory only.

    Directories are used through descriptors opened without following a link, checked
    when opened: a link put in place of a directory later is never followed, neither to
    read a session's files nor to empty its directory at its end.
    """

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd = fd  # the shared directory, as checked when made
        self._lock = threading.Lock()  # bind on the loop, unbind on a session's worker
        #: the directory of each bound session: its name, its descriptor
        self._bound: dict[str, tuple[str, int]] = {}

    @classmethod
    def make(cls, address: str) -> TransferRoot | None:
        """The shared directory of the server at ``address``, made empty; None (with a
        warning: puts then go over gRPC) where another user's or a link holds its name."""
        path = ifrtpy_jax_plugin.shared_directory(address)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # a server before this one on the same address left it
            pass
        except OSError as error:
            _log.warning("cannot make %s (%s): puts go over gRPC", path, error)
            return None
        fd = _open_private_directory(path)
        if fd is None:
            _log.warning("%s is not this user's private directory: puts go over gRPC", path)
            return None
        _empty(fd)
        _write_pid(path)
        return cls(path, fd)

    def bind(self, name: str) -> str | None:
        """The path through which the session that names ``name`` reads its files, if
        ``name`` is a client's private subdirectory that no live session has named; else
        None. The path names the directory's descriptor (``/proc/self/fd/N``) where the
        system has one: what it names cannot be swapped under the session."""
        if not _CLIENT_NAME.fullmatch(name):
            return None
        with self._lock:
            if name in (bound for bound, _ in self._bound.values()) or self._fd < 0:
                return None
            fd = _open_private_directory(name, self._fd)
            if fd is None:
                return None
            path = f"/proc/self/fd/{fd}"
            if not os.path.isdir(path):  # no /proc: the path, checked just now
                path = os.path.join(self.path, name)
            self._bound[path] = (name, fd)
        return path

    def unbind(self, path: str) -> None:
        """The session of ``path`` ended: its files go (through the descriptor opened at
        :meth:`bind`), and so do the directories of client processes that are gone."""
        with self._lock:
            _, fd = self._bound.pop(path, ("", -1))
            bound = {name for name, _ in self._bound.values()}
            # a descriptor of its own: remove() may close the root's meanwhile
            root = os.dup(self._fd) if self._fd >= 0 else -1
        if fd >= 0:
            _empty(fd)
            os.close(fd)
        if root < 0:
            return
        try:
            for name in os.listdir(root):  # the directories of client processes that are gone
                match = _CLIENT_NAME.fullmatch(name)
                if match and name not in bound and _client_gone(int(match.group(1))):
                    _remove(name, root)
        except OSError:
            pass
        finally:
            os.close(root)

    def remove(self) -> None:
        with self._lock:
            fds = [fd for _, fd in self._bound.values()] + [self._fd]
            self._bound.clear()
            self._fd = -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(self.path, ignore_errors=True)  # its fd-based walk follows no link


def _client_gone(pid: int) -> bool:
    """Whether client process ``pid`` has ended: gone, or a zombie (killed, and not yet
    reaped by its parent: it will never put again)."""
    if not _alive(pid):
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"Z", b"X")


def _open_private_directory(path: str, dir_fd: int | None = None) -> int | None:
    """A descriptor of the directory ``path`` (relative to ``dir_fd``), opened without
    following a link, if it is this user's and no one else may enter it; else None."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError:
        return None
    found = os.fstat(fd)
    if found.st_uid != os.getuid() or found.st_mode & 0o077:
        os.close(fd)
        return None
    return fd


def _empty(directory: int) -> None:
    """Remove what the directory open as ``directory`` holds (put files, client
    subdirectories, the pid file), through descriptors: a link is removed, not followed."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        _remove(name, directory)


def _remove(name: str, dir_fd: int) -> None:
    """Remove ``name`` in the directory open as ``dir_fd``: a directory with what it
    holds, anything else (a link included) itself."""
    try:
        os.unlink(name, dir_fd=dir_fd)
        return
    except IsADirectoryError:
        pass
    except OSError:
        return
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return
    try:
        _empty(fd)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        pass


def read_put_file(path: str, size: int) -> Any:
    """The ``size`` bytes of the put file at ``path``, read into memory (a file mapped
    instead could be shrunk under the server: SIGBUS), as a 64-byte aligned flat uint8
    array; the file is removed. Opening never blocks (a FIFO there is refused); a file
    with a hole (sparse: its writer paid nothing for those bytes) is refused before it
    is read, and one that shrinks while it is read too; bytes it grows by are not read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        _unlink(path)  # a link in its place
        raise NotFoundError(
            f"HostBufferReadFromDisk: cannot open {path}: {error.strerror}") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            if not stat.S_ISDIR(found.st_mode):
                _unlink(path)
            raise InvalidArgumentError(f"HostBufferReadFromDisk: {path} is not a regular file")
        _unlink(path)
        if found.st_size != size:
            raise InvalidArgumentError(
                f"HostBufferReadFromDisk: {path} holds {found.st_size} bytes; the request "
                f"says {size}")
        hole = _first_hole(fd, size)
        if hole < size:  # a hole costs its writer nothing, and the server its size
            raise InvalidArgumentError(
                f"HostBufferReadFromDisk: {path} has a hole at byte {hole} of {size} (a "
                "sparse file): a put file must hold every byte it claims")
        data = _put_memory(size)
        view = memoryview(data)
        threads = _host_memory.PREFAULT_THREADS if size >= _host_memory.FRESH_BYTES else 0
        if threads > 1:
            # where the kernel cannot map pages without writing them (the TPU machine's
            # sandbox: 64 MiB read into fresh memory in 72 ms, into mapped in 26 ms), the
            # slices of a large file are read on several threads, each taking its page faults
            slices = _slices(size, threads)
            with concurrent.futures.ThreadPoolExecutor(len(slices)) as pool:
                ends = list(pool.map(lambda s: _read_range(fd, view, *s), slices))
        else:
            ends = [_read_range(fd, view, 0, size)]
        for start, got in ends:
            if got is not None:
                raise InvalidArgumentError(
                    f"HostBufferReadFromDisk: {path} shrank to {start + got} bytes while it "
                    f"was read; the request says {size}")
        return data
    finally:
        os.close(fd)


def _slices(size: int, count: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of ``count`` page-aligned slices of ``size`` bytes (fewer if small)."""
    per = -(-size // count)
    step = -(-per // 4096) * 4096
    return [(start, min(start + step, size)) for start in range(0, size, step)]


def _read_range(fd: int, view: Any, start: int, stop: int) -> tuple[int, int | None]:
    """Read bytes ``start:stop`` of ``fd`` into ``view``: ``(start, None)``, or ``(start,
    bytes read)`` where the file ended first (it shrank)."""
    got = start
    while got < stop:
        read = os.preadv(fd, [view[got:min(got + _READ_PIECE, stop)]], got)
        if not read:
            return start, got - start
        got += read
    return start, None


def _first_hole(fd: int, size: int) -> int:
    """Where the file ``fd`` (``size`` bytes) has its first hole, ``size`` if none: every
    file system answers SEEK_HOLE, those without holes with the file's end."""
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:  # a system without SEEK_HOLE: no hole it could tell
        return size


def _put_memory(size: int) -> Any:
    """64-byte aligned memory for a put file of ``size`` bytes: an earlier put's that the
    backend copied and let go (:mod:`ifrtpy.proxy.pool`: its pages mapped, the read at the
    floor of a read into mapped memory), else fresh memory."""
    block = POOL.take(size + 64)  # what aligned_bytes(size) allocates
    if block is None:
        return aligned_bytes(size)
    start = -block.ctypes.data % 64
    return block[start:start + size]


def aligned_bytes(size: int) -> Any:
    """An uninitialised flat uint8 array of ``size`` bytes starting at a 64-byte boundary
    (a device may alias such memory instead of copying it)."""
    raw = np.empty(size + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + size]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        pass
