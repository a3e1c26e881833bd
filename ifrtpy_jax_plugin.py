"""jax's plugin hook for ifrtpy's IFRT Proxy server (docs/proxy.md).

jax imports this module through the ``jax_plugins`` entry point and calls :func:`initialize`
when it starts its backends. Only when ``JAX_PLATFORMS`` names ``proxy`` and
``JAX_BACKEND_TARGET`` holds the server's address does it register jax's own IFRT Proxy
client as the backend ``proxy``; otherwise it does nothing and imports nothing. It is a
top-level module, apart from the ``ifrtpy`` package, so that jax's start never pays for
importing ifrtpy.
"""

from __future__ import annotations

import ipaddress
import os
import stat

__all__ = ["initialize", "register", "is_local", "shared_directory", "is_private_directory",
           "PLATFORM"]

#: The name of the jax backend (and platform) the server's devices appear under.
PLATFORM = "proxy"

#: jaxlib's proxy client uses ALTS credentials unless this variable is ``true``.
INSECURE_CREDENTIALS = "IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS"

#: jaxlib's proxy client writes a put of at least THRESHOLD bytes to a file in DIRECTORY
#: and has the server read it there, instead of streaming it over gRPC.
TRANSFER_DIRECTORY = "IFRT_PROXY_GRPC_LARGE_TRANSFER_OPTIMIZATION_DIRECTORY"
TRANSFER_THRESHOLD = "IFRT_PROXY_GRPC_LARGE_TRANSFER_OPTIMIZATION_THRESHOLD_BYTES"
#: The threshold set with the directory: smaller puts cost less over gRPC than a file.
SHARED_THRESHOLD_BYTES = 1 << 20


def initialize() -> None:
    """Register the ``proxy`` backend if ``JAX_PLATFORMS`` and ``JAX_BACKEND_TARGET`` ask
    for it; do nothing otherwise."""
    platforms = [p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",")]
    target = os.environ.get("JAX_BACKEND_TARGET", "").strip()
    if PLATFORM in platforms and target:
        register(target)


def register(target: str, priority: int = -1) -> None:
    """Register jax's IFRT Proxy client for ``target`` (``grpc://HOST:PORT`` or
    ``grpc://unix:PATH``) as the jax backend ``proxy``.

    For a loopback or unix-socket target it sets ``IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS``
    (unless already set), since the server speaks plain gRPC; other targets keep the client's
    default (ALTS) credentials. Where the server has made its :func:`shared_directory` (this
    user's, private), puts of 1 MiB or more go through files there (unless
    ``IFRT_PROXY_GRPC_LARGE_TRANSFER_OPTIMIZATION_DIRECTORY`` is already set). The connection
    is made when jax first uses the backend.
    """
    if is_local(target):
        os.environ.setdefault(INSECURE_CREDENTIALS, "true")
        directory = shared_directory(target)
        if TRANSFER_DIRECTORY not in os.environ and is_private_directory(directory):
            os.environ[TRANSFER_DIRECTORY] = directory
            os.environ.setdefault(TRANSFER_THRESHOLD, str(SHARED_THRESHOLD_BYTES))
    # Through jax.extend: importing jaxlib's proxy extension before jax's own crashes.
    from jax.extend import backend

    def make_client():  # type: ignore[no-untyped-def]
        return backend.ifrt_proxy.get_client(target, backend.ifrt_proxy.ClientConnectionOptions())

    backend.register_backend_factory(PLATFORM, make_client, priority=priority)


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
    (in ``/dev/shm``, memory, where there is one): named after the address and this user."""
    address = target.removeprefix("grpc://")
    name = "".join(c if c.isalnum() or c in "-." else "_" for c in address)[-160:]
    root = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
    return os.path.join(root, f"ifrtpy-proxy-{os.getuid()}-{name}")


def is_private_directory(path: str) -> bool:
    """Whether ``path`` is a directory (not a link) of this user that no one else may enter."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid()
            and not found.st_mode & 0o077)
