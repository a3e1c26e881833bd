"""jax's plugin hook for ifrtpy's IFRT Proxy server (docs/proxy.md).

jax imports this module through the ``jax_plugins`` entry point and calls :func:`initialize`
when it starts its backends. Only when ``JAX_PLATFORMS`` names ``proxy`` does it register
jax's own IFRT Proxy client as the backend ``proxy``, for the server at
``JAX_BACKEND_TARGET`` (first setting glibc's allocator for large transfers,
:func:`tune_allocator`); otherwise it does nothing and imports nothing. It is a
top-level module, apart from the ``ifrtpy`` package, so that jax's start never pays for
importing ifrtpy.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import socket
import stat
import sys
import threading
import time
from typing import Any

__all__ = ["initialize", "register", "is_local", "shared_directory", "is_private_directory",
           "transfer_subdirectory", "check_server", "normalized_target", "NoServer", "PLATFORM",
           "TRANSFER_KEY"]

#: The name of the jax backend (and platform) the server's devices appear under.
PLATFORM = "proxy"

#: jaxlib's proxy client uses ALTS credentials unless this variable is ``true``.
INSECURE_CREDENTIALS = "IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS"

#: jaxlib's proxy client writes a put of at least THRESHOLD bytes to a file in DIRECTORY
#: and has the server read it there, instead of streaming it over gRPC. It reads both
#: variables once per process.
TRANSFER_DIRECTORY = "IFRT_PROXY_GRPC_LARGE_TRANSFER_OPTIMIZATION_DIRECTORY"
TRANSFER_THRESHOLD = "IFRT_PROXY_GRPC_LARGE_TRANSFER_OPTIMIZATION_THRESHOLD_BYTES"
#: The threshold set with the directory: smaller puts cost less over gRPC than a file.
SHARED_THRESHOLD_BYTES = 1 << 20

#: The key of the session's initialization data that names the process's directory for
#: puts through files (a subdirectory of the server's :func:`shared_directory`).
TRANSFER_KEY = "ifrtpy.transfer_directory"

#: How long jaxlib's client tries to reach the server before it fails (seconds); the
#: variable of that name overrides it.
CONNECT_TIMEOUT_S = 30
CONNECT_TIMEOUT_VARIABLE = "IFRTPY_PROXY_CONNECT_TIMEOUT_S"

#: This process's directory for puts through files: (server's directory, its name).
_transfer: tuple[str, str] | None = None


def initialize() -> None:
    """Register the ``proxy`` backend if ``JAX_PLATFORMS`` names it and
    ``JAX_BACKEND_TARGET`` is set, first setting glibc's allocator for transfers
    (:func:`tune_allocator`); do nothing otherwise. With ``proxy`` named but no target, it
    says on stderr what to set and registers nothing: a backend the program registers
    itself (``ifrtpy.proxy.connect_jax``, jax's own ``register_backend_factory``) stays,
    and without one jax stops, saying it has no backend ``proxy``."""
    platforms = [p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",")]
    if PLATFORM not in platforms:
        return
    target = os.environ.get("JAX_BACKEND_TARGET", "").strip()
    if not target:
        print(f"{NO_TARGET}\n{START}", file=sys.stderr, flush=True)
        return
    tune_allocator()  # before jaxlib's client starts its threads
    register(target)


def normalized_target(target: str) -> str:
    """``target`` as jaxlib's client takes it: ``grpc://`` before the address ``python -m
    ifrtpy serve`` takes and prints (``unix:PATH``, ``HOST:PORT``), and a socket's path
    alone as ``grpc://unix:PATH``."""
    target = target.strip()
    if not target or target.startswith("grpc://"):
        return target
    if target.startswith(("/", "./", "../", "~")):
        return f"grpc://unix:{os.path.abspath(os.path.expanduser(target))}"
    return f"grpc://{target}"


def register(target: str, priority: int = -1) -> None:
    """Register jax's IFRT Proxy client for ``target`` (``grpc://HOST:PORT`` or
    ``grpc://unix:PATH``) as the jax backend ``proxy``.

    For a loopback or unix-socket target it sets ``IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS``
    (unless already set), since the server speaks plain gRPC; other targets keep the client's
    default (ALTS) credentials. When jax connects, where the server has made its
    :func:`shared_directory` (this user's, private), puts of 1 MiB or more go through files
    in a directory of this process's own there (unless
    ``IFRT_PROXY_GRPC_LARGE_TRANSFER_OPTIMIZATION_DIRECTORY`` is already set), which the
    session names to the server. The connection is made when jax first uses the backend,
    after :func:`check_server`: where nothing can serve at ``target`` the process stops
    with :class:`NoServer`'s lines (at once, or after waiting for a server that may still
    be starting); while a server does not answer it says so on stderr, and it fails after
    ``IFRTPY_PROXY_CONNECT_TIMEOUT_S`` seconds (30 by default). ``target`` may also be
    given as :func:`normalized_target` takes it.
    """
    target = normalized_target(target)
    if is_local(target):
        os.environ.setdefault(INSECURE_CREDENTIALS, "true")
    # Through jax.extend: importing jaxlib's proxy extension before jax's own crashes.
    from jax.extend import backend

    def make_client():  # type: ignore[no-untyped-def]
        from ifrtpy import _log  # quiet as ifrtpy is: jaxlib's client logs at its threshold

        _log.apply_to_jaxlib()
        check_server(target)
        options = backend.ifrt_proxy.ClientConnectionOptions()
        options.connection_timeout_in_seconds = _connect_timeout()
        progress = _Progress(target, options.connection_timeout_in_seconds)
        options.on_connection_update = progress
        name = transfer_subdirectory(target) if is_local(target) else None
        if name is not None:
            options.initialization_data = {TRANSFER_KEY: name.encode()}
        client = backend.ifrt_proxy.get_client(target, options)
        atexit.register(progress.drain)
        return client

    backend.register_backend_factory(PLATFORM, make_client, priority=priority)


#: glibc's allocator parameters for a process that moves large arrays through the proxy
#: (the jax process, the server): (name, mallopt's number for it, value), in the order set.
#: One arena (every thread allocates from the main heap), no ``mmap`` for large blocks, and
#: up to 256 MiB of free memory kept at the heap's top: a transfer's buffers (jaxlib's
#: client flattens each get into a fresh 64 MiB block) reuse the memory the last one freed
#: instead of taking page faults on freshly mapped pages (docs/proxy.md, "The jax
#: process's allocator").
MALLOPT = (("M_ARENA_MAX", -8, 1), ("M_MMAP_MAX", -4, 0), ("M_TRIM_THRESHOLD", -1, 256 << 20))
#: ``0`` in this variable leaves glibc's allocator as it is.
MALLOPT_VARIABLE = "IFRTPY_MALLOPT"

#: What :func:`tune_allocator` set in this process (None before its first call).
_tuned: dict[str, int] | None = None


def tune_allocator() -> dict[str, int]:
    """Set :data:`MALLOPT` with glibc's ``mallopt``, once per process; the parameters set,
    by name. Nothing is set (``{}``) where ``IFRTPY_MALLOPT`` is ``0`` or the C library is
    not glibc. Set before the process's threads first allocate: an arena limit does not
    move threads that already have an arena of their own."""
    global _tuned
    if _tuned is None:
        _tuned = {}
        libc = None if os.environ.get(MALLOPT_VARIABLE, "").strip() == "0" else _glibc()
        if libc is not None:
            for name, number, value in MALLOPT:
                if libc.mallopt(number, value) == 1:
                    _tuned[name] = value
    return dict(_tuned)


def _glibc() -> Any:
    """glibc's C library, or None where the process runs on another one."""
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return None
    except (ValueError, OSError):  # no such name: not glibc
        return None
    import ctypes

    return ctypes.CDLL(None)


#: How long :func:`check_server` waits for a TCP connection (seconds); a server that does
#: not answer by then is left to jaxlib's client and its timeout.
PROBE_S = 3.0


class NoServer(SystemExit):
    """Nothing serves at jax's proxy address: the process stops with this message (exit
    status 1, no traceback), as a command-line error does; jax cannot start without it."""


#: What a process that names ``proxy`` with no target is told (with :data:`START`).
NO_TARGET = "ifrtpy_jax_plugin: JAX_PLATFORMS names proxy, but JAX_BACKEND_TARGET is not set."
#: The second line of every :class:`NoServer`: what to do.
START = ("Start one with `python -m ifrtpy serve` and set JAX_BACKEND_TARGET to the address "
         "it prints (docs/proxy.md).")


def check_server(target: str, wait_s: float | None = None) -> None:
    """Raise :class:`NoServer` where nothing can serve at ``target``: none given, a unix
    socket path that is not a socket, a host name that does not resolve; or, after
    ``wait_s`` seconds (default: ``IFRTPY_PROXY_CONNECT_TIMEOUT_S``, 30) of trying again,
    a socket path that does not exist or has no server behind it, a TCP port that refuses
    (a server may still be starting: said on stderr at once). A server that does not
    answer within :data:`PROBE_S` is left to jaxlib's client, which retries until its
    timeout."""
    if not target:
        raise NoServer(f"{NO_TARGET}\n{START}")
    address = target.removeprefix("grpc://")
    problem, may_start = _problem(address)
    if problem is not None and may_start:
        wait_s = _connect_timeout() if wait_s is None else wait_s
        print(f"ifrtpy_jax_plugin: no IFRT Proxy server at {target} yet ({problem}); "
              f"waiting up to {wait_s:g} s for one to start ({CONNECT_TIMEOUT_VARIABLE} sets "
              "another number of seconds)", file=sys.stderr, flush=True)
        deadline = time.monotonic() + wait_s
        while problem is not None and time.monotonic() < deadline:
            time.sleep(0.1)
            problem, _ = _problem(address)
    if problem is not None:
        raise NoServer(f"ifrtpy_jax_plugin: no IFRT Proxy server at {target}: {problem}.\n"
                       f"{START}")


def _problem(address: str) -> tuple[str | None, bool]:
    """What keeps a client from ``address`` (None: nothing known), and whether a server
    starting there would mend it."""
    if address.startswith("unix:"):
        return _unix_problem(address[5:])
    problem = _tcp_problem(address)
    return problem, problem is not None and "refuses" in problem


def _unix_problem(path: str) -> tuple[str | None, bool]:
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        return f"{path}: {error.strerror.lower() if error.strerror else error}", True
    if not stat.S_ISSOCK(mode):
        return f"{path} is not a socket", False
    return _refused(socket.AF_UNIX, path, f"nothing listens on the socket {path} (its server "
                                          "is gone)"), True


def _tcp_problem(address: str) -> str | None:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return None  # jaxlib's to judge
    try:
        found = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        return f"the host {host!r} is not found ({error.strerror})"
    problem = f"{host}:{port} refuses connections (no server on that port)"
    # every address the name has (localhost: ::1 and 127.0.0.1): gRPC tries each of them
    if all(_refused(family, where, problem) for family, _, _, _, where in found):
        return problem
    return None


def _refused(family: int, where: Any, problem: str) -> str | None:
    """``problem`` if a connection to ``where`` is refused; None if it is made, or if it
    is not made within :data:`PROBE_S` (a server may be slow to answer)."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(PROBE_S)
        try:
            probe.connect(where)
        except ConnectionRefusedError:
            return problem
        except OSError:
            return None
    return None


def _connect_timeout() -> int:
    text = os.environ.get(CONNECT_TIMEOUT_VARIABLE, "")
    try:
        return max(1, int(text)) if text else CONNECT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{CONNECT_TIMEOUT_VARIABLE}={text!r} is not a number of seconds") from None


#: How long a process that connected waits at exit for jaxlib's "Connected" update, and
#: then for a pause of PAUSE_S in the updates (seconds).
CONNECTED_UPDATE_WAIT_S = 5.0
UPDATES_PAUSE_S = 0.05


class _Progress:
    """jaxlib's connection updates: the first failed attempt is said on stderr (jaxlib
    retries quietly until its timeout).

    jaxlib hands each update to a thread of its own, which takes the GIL to call this; the
    last ones ("Connected ...", and earlier ones of the same attempt out of order) can
    come after ``get_client`` has returned. A thread that takes the GIL while the
    interpreter finalizes aborts the process (``terminate called ... FATAL: exception not
    rethrown``), so a process that connected waits at exit (:meth:`drain`) until those
    updates have been delivered."""

    def __init__(self, target: str, timeout_s: int):
        self.target = target
        self.timeout_s = timeout_s
        self.said = False
        self.connected = threading.Event()
        self.last_update = time.monotonic()

    def drain(self) -> None:
        """Wait for the "Connected" update, then until no update has come for
        :data:`UPDATES_PAUSE_S` (at most a second): the ``atexit`` hook of a process whose
        client connected."""
        self.connected.wait(CONNECTED_UPDATE_WAIT_S)
        end = time.monotonic() + 1.0
        while time.monotonic() < min(end, self.last_update + UPDATES_PAUSE_S):
            time.sleep(UPDATES_PAUSE_S / 5)

    def __call__(self, update: str) -> None:
        self.last_update = time.monotonic()
        if "Connected to IFRT proxy server" in update:
            self.connected.set()
            return
        if self.said or "failed" not in update:
            return
        self.said = True
        detail = update.split("failed:", 1)[-1].strip()
        if "RESOURCE_EXHAUSTED" in detail:  # jaxlib retries every status alike
            print(f"ifrtpy_jax_plugin: the IFRT Proxy server at {self.target} refused a "
                  f"session ({detail}); jaxlib tries again every second for up to "
                  f"{self.timeout_s} s", file=sys.stderr, flush=True)
            return
        print(f"ifrtpy_jax_plugin: cannot connect to an IFRT Proxy server at {self.target} "
              f"({detail}); trying for up to {self.timeout_s} s (is one serving there? "
              "`python -m ifrtpy serve` prints the address to set as JAX_BACKEND_TARGET)",
              file=sys.stderr, flush=True)


def transfer_subdirectory(target: str) -> str | None:
    """The name of this process's directory for puts through files, in the shared
    directory of the server at ``target``; None where there is none to use.

    jaxlib reads the directory once per process: the first call makes the subdirectory
    (this user's, private) and points ``IFRT_PROXY_GRPC_LARGE_TRANSFER_OPTIMIZATION_DIRECTORY``
    at it (with a threshold of 1 MiB), unless the variable is set already; later calls
    name the same one. The server reads only files of the session that named it.
    """
    import secrets

    global _transfer
    root = shared_directory(target)
    if _transfer is None:
        if TRANSFER_DIRECTORY in os.environ or not is_private_directory(root):
            return None
        name = f"client-{os.getpid()}-{secrets.token_hex(8)}"
        try:
            os.mkdir(os.path.join(root, name), 0o700)
        except OSError:
            return None
        _transfer = (root, name)
        os.environ[TRANSFER_DIRECTORY] = os.path.join(root, name)
        atexit.register(_remove_empty, os.path.join(root, name))
        os.environ.setdefault(TRANSFER_THRESHOLD, str(SHARED_THRESHOLD_BYTES))
    used_root, name = _transfer
    if used_root != root or os.environ.get(TRANSFER_DIRECTORY) != os.path.join(root, name):
        return None  # jaxlib writes this process's files for another server
    return name


def _remove_empty(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:  # gone with the server, or a file the server did not read is left
        pass


def is_local(target: str) -> bool:
    """Whether ``target`` (with or without ``grpc://``) is a unix socket or a loopback host."""
    address = target.removeprefix("grpc://")
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0] if ":" in address else address
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def shared_directory(target: str) -> str:
    """The directory where the server at the local ``target`` takes large puts as files
    (in ``/dev/shm``, memory, where there is one): named after this user, the address and
    a hash of it (two addresses never share one)."""
    import hashlib

    address = target.removeprefix("grpc://")
    digest = hashlib.sha256(address.encode()).hexdigest()[:16]
    name = "".join(c if c.isalnum() or c in "-." else "_" for c in address)[-48:]
    root = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
    return os.path.join(root, f"ifrtpy-proxy-{os.getuid()}-{name}-{digest}")


def is_private_directory(path: str) -> bool:
    """Whether ``path`` is a directory (not a link) of this user that no one else may enter."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid()
            and not found.st_mode & 0o077)
