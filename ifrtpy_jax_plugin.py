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

__all__ = ["initialize", "register", "is_local", "PLATFORM"]

#: The name of the jax backend (and platform) the server's devices appear under.
PLATFORM = "proxy"

#: jaxlib's proxy client uses ALTS credentials unless this variable is ``true``.
INSECURE_CREDENTIALS = "IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS"


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
    default (ALTS) credentials. The connection is made when jax first uses the backend.
    """
    if is_local(target):
        os.environ.setdefault(INSECURE_CREDENTIALS, "true")
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
