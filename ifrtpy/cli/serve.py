"""``python -m ifrtpy serve [--backend NAME] [--device-count N] [--address unix:PATH|HOST:PORT]
[--allow-remote]``: an IFRT Proxy server over one ifrtpy client (docs/proxy.md).

When it is ready it prints one line, ``ifrtpy proxy: serving <client> at grpc://ADDRESS``,
then who can connect there and how to point jax at it. Without ``--address`` it listens on
a unix socket in a new directory only this user may enter. SIGINT (Ctrl-C) and SIGTERM stop
it: the server stops, the command exits 0. The address must be a loopback host or a unix
socket unless ``--allow-remote`` says otherwise; with it, a warning says what that means.
"""

from __future__ import annotations

import argparse
import importlib.util
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
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")


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
    server = proxy.serve(client, args.address, allow_remote=args.allow_remote)
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
