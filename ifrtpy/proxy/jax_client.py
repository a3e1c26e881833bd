"""Point jax at an IFRT Proxy server from code (docs/proxy.md).

``JAX_PLATFORMS=proxy JAX_BACKEND_TARGET=grpc://unix:PATH`` (or ``grpc://HOST:PORT``, the
address ``python -m ifrtpy serve`` prints) does this without code, through
jax's plugin discovery (the top-level module ``ifrtpy_jax_plugin``); :func:`connect_jax` is
the same registration, made by a program before jax starts its backends.
"""

from __future__ import annotations

import ifrtpy_jax_plugin

from ifrtpy import _jaxlib
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError

__all__ = ["connect_jax", "jax_target"]


def connect_jax(address: str) -> None:
    """Make jax run on the IFRT Proxy server at ``address`` (``grpc://HOST:PORT``,
    ``HOST:PORT``, ``unix:PATH`` or ``grpc://unix:PATH``).

    Registers jax's proxy client as the backend ``proxy`` and makes it jax's only platform
    (``jax_platforms="proxy"``); the connection is made when jax first needs a device (while
    no server answers, ifrtpy_jax_plugin says so on stderr; jax fails after
    ``IFRTPY_PROXY_CONNECT_TIMEOUT_S`` seconds, 30 by default). Call it
    before jax starts its backends (its first ``jax.devices()``, ``jit`` or ``device_put``):
    afterwards it raises :class:`~ifrtpy.errors.FailedPreconditionError`. A loopback or unix
    address sets ``IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS=true`` (the server speaks plain
    gRPC).
    """
    target = jax_target(address)
    import jax

    if _jaxlib.backends_are_initialized():
        raise FailedPreconditionError(
            f"connect_jax({address!r}): jax has already started its backends; call it before "
            "the first jax.devices(), jit or device_put, or set JAX_PLATFORMS=proxy and "
            f"JAX_BACKEND_TARGET={target} before the program starts")
    ifrtpy_jax_plugin.register(target)
    jax.config.update("jax_platforms", ifrtpy_jax_plugin.PLATFORM)


def jax_target(address: str) -> str:
    """The ``grpc://...`` target jax's proxy client takes for ``address``."""
    if not isinstance(address, str) or not address.removeprefix("grpc://"):
        raise InvalidArgumentError(
            f"an IFRT Proxy address is 'grpc://HOST:PORT', 'HOST:PORT' or 'unix:PATH', "
            f"not {address!r}")
    return ifrtpy_jax_plugin.normalized_target(address)
