"""``python -m ifrtpy serve [--backend NAME] [--device-count N] [--address unix:PATH|HOST:PORT]
[--allow-remote] [--max-sessions N ...] [--idle-timeout SECONDS]``: an IFRT Proxy server
over one ifrtpy client (docs/proxy.md).

When it is ready it prints one line, ``ifrtpy proxy: serving <client> at grpc://ADDRESS``,
then who can connect there and how to point jax at it. Without ``--address`` it listens on
a unix socket in a new directory only this user may enter. SIGINT (Ctrl-C) and SIGTERM stop
it: the server stops, the command exits 0. The address must be a loopback host or a unix
socket unless ``--allow-remote`` says otherwise; with it, a warning says what that means.
Each field of :class:`ifrtpy.proxy.Limits` is an option (``--max-sessions``,
``--max-host-buffer-bytes 8G``, ...; byte counts take K, M, G, T, powers of 1024), and
``--idle-timeout SECONDS`` ends sessions idle that long (default: never).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import signal
import sys
import threading
from typing import Any

import ifrtpy_jax_plugin

import ifrtpy as ifrt

__all__ = ["configure", "serve"]

#: How long clients get to finish their requests when the server stops (seconds).
STOP_GRACE_S = 2.0
#: How often the main thread wakes to run a signal's handler (seconds).
SIGNAL_POLL_S = 0.2

REMOTE_WARNING = (
    "warning: {address} is not a loopback address: whoever can connect to it can run programs "
    "on these devices and read their data. jax's proxy client speaks no TLS, so prefer serving "
    "on this machine only (the default unix socket, or 127.0.0.1:PORT) and an SSH tunnel (ssh -N -L PORT:127.0.0.1:PORT THIS_HOST); "
    "a client connecting directly needs IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS=true.")


def configure(parser: argparse.ArgumentParser) -> None:
    """The options of ``serve`` on its subcommand's ``parser``."""
    parser.add_argument("--backend", default="pjrt", metavar="NAME",
                        help="pjrt (default), reference, jax, another registered backend, a PJRT "
                             "plugin name, or module:function (a factory returning a Client)")
    parser.add_argument("--device-count", type=int, metavar="N",
                        help="the backend's device_count option (default: the backend's own)")
    parser.add_argument("--address", metavar="unix:PATH|HOST:PORT",
                        help="where to listen (default: a unix socket in a new directory only "
                             "this user may enter; HOST:PORT listens on TCP, port 0 picks a "
                             "free one)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow an address other than loopback or a unix socket")
    limits = parser.add_argument_group(
        "limits", "what clients may make the server hold (docs/proxy.md, \"Limits and errors\")")
    for name, help_text in _LIMITS.items():
        limits.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="N",
                            type=_bytes if name.endswith("_bytes") else _count,
                            help=help_text)
    limits.add_argument("--idle-timeout", dest="idle_timeout_s", metavar="SECONDS",
                        type=_seconds, help="end a session that has had nothing to do for "
                        "this long, and drop its arrays (default: never; an idle notebook "
                        "keeps its arrays)")
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")


#: The options of the limits, by field of ifrtpy.proxy.Limits.
_LIMITS = {
    "max_sessions": "sessions at once, those whose client has gone while their last "
                    "request runs included (default 32)",
    "max_sessions_per_process": "sessions of one peer process, where the socket tells it "
                                "(loopback TCP; default 8)",
    "max_sessions_per_connection": "sessions of one TCP connection (default 8)",
    "max_total_host_buffer_bytes": "host-buffer bytes of all sessions together",
    "max_host_buffer_bytes": "host-buffer bytes of one session",
    "max_handles": "arrays, executables, futures and host buffers of one session",
    "max_pending_requests": "requests of one session read and not yet answered",
    "max_host_buffer_rpcs": "host-buffer RPCs of one session in flight",
    "max_message_bytes": "one gRPC message",
}

_SIZE = re.compile(r"(\d+)([KMGT]?)(?:i?B)?", re.IGNORECASE)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def _bytes(text: str) -> int:
    """A byte count: digits, then K, M, G or T (powers of 1024) if any."""
    found = _SIZE.fullmatch(text.strip())
    if found is None or int(found.group(1)) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a byte count >= 1 (digits, then K, M, G or T if any)")
    return int(found.group(1)) << 10 * " KMGT".index(found.group(2).upper() or " ")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


def limits_of(args: argparse.Namespace) -> dict[str, Any]:
    """The limits the options set (the others keep their defaults)."""
    names = [*_LIMITS, "idle_timeout_s"]
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def require_proxy_extra() -> None:
    """Raise ModuleNotFoundError saying how to install the server's packages when grpcio or
    protobuf is missing."""
    for module in ("grpc", "google.protobuf"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a missing parent package (google)
            found = False
        if not found:
            raise ModuleNotFoundError(
                "serve needs grpcio and protobuf (the proxy extra): pip install \"ifrtpy[proxy]\" "
                "(in a checkout: pip install -e \".[proxy]\")")


def serve(args: argparse.Namespace) -> int:
    """Serve ``args.backend``'s client until SIGINT or SIGTERM; the exit status."""
    require_proxy_extra()  # before the backend starts, not after
    if args.address is not None:
        from ifrtpy.proxy.local import check_address

        check_address(args.address)
    if args.address is not None and not ifrtpy_jax_plugin.is_local(args.address):
        if not args.allow_remote:
            print(f"serve: error: {args.address} is not a loopback address or a unix socket; "
                  "whoever can connect to it can run programs on these devices: pass "
                  "--allow-remote to serve there anyway (docs/proxy.md)", file=sys.stderr)
            return 2
        print(REMOTE_WARNING.format(address=args.address), file=sys.stderr, flush=True)
    from ifrtpy import proxy  # needs grpcio and protobuf, the [proxy] extra
    from ifrtpy.proxy.jax_client import jax_target

    stop = _stop_on_signals()
    client = _client(args.backend, args.device_count)
    server = proxy.serve(client, args.address, allow_remote=args.allow_remote,
                         **limits_of(args))
    try:
        target = jax_target(server.address)
        print(f"ifrtpy proxy: serving {client!r} at {target}", flush=True)
        print(f"who can connect: {server.who}", flush=True)
        print(f"point jax at it: JAX_PLATFORMS=proxy JAX_BACKEND_TARGET={target} python train.py\n"
              "Ctrl-C stops the server.", flush=True)
        # Timed waits: the kernel may hand the signal to another thread, and Python runs
        # its handler only when the main thread next wakes.
        while not stop.wait(SIGNAL_POLL_S):
            pass
    finally:
        server.stop(grace=STOP_GRACE_S)
    return 0


def _client(backend: str, device_count: int | None) -> ifrt.Client:
    """The client of ``backend``: a registered name, a PJRT plugin name or ``module:function``."""
    if ":" in backend and backend not in ifrt.registered_backends():
        ifrt.register_backend(backend, backend)
    options: dict[str, Any] = {} if device_count is None else {"device_count": device_count}
    return ifrt.get_client(backend, **options)


def _stop_on_signals() -> threading.Event:
    """An event that SIGINT and SIGTERM set (instead of KeyboardInterrupt or death)."""
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    return stop
