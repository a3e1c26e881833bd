"""Every private jax/jaxlib name the jax backend uses, in one place (jax 0.10).

The rest of :mod:`ifrtpy.backends.jax` reaches jaxlib only through these functions, so a
new jaxlib version needs changes here alone.
"""

from __future__ import annotations

from typing import Any, Sequence


def backends_are_initialized() -> bool:
    """Whether jax has created its runtime clients (after that the CPU device count is fixed)."""
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def runtime_client(platform: str | None) -> Any:
    """jax's runtime client (``jaxlib._jax.Client``) of ``platform`` (None: jax's default)."""
    from jax.extend import backend

    return backend.get_backend(platform)


def device_list(jax_devices: Sequence[Any]) -> Any:
    """A ``jaxlib._jax.DeviceList`` (what compile and deserialize take)."""
    from jaxlib import _jax

    return _jax.DeviceList(tuple(jax_devices))


def compile_options(serialized: bytes) -> Any:
    """A ``jaxlib`` CompileOptions from a serialized ``xla.CompileOptionsProto``."""
    from jaxlib import xla_client

    return xla_client.CompileOptions.ParseFromString(serialized)


def result_handler(dtype: Any, dims: tuple[int, ...], jax_sharding: Any) -> Any:
    """What turns one output of ``execute_sharded`` into a ``jax.Array`` (as jax's jit does)."""
    from jaxlib import _jax
    from jax.core import ShapedArray

    return _jax.array_result_handler(ShapedArray(dims, dtype), jax_sharding, True, True)


def runtime_error_type() -> type[Exception]:
    """The exception jaxlib raises for a failed runtime status (``XlaRuntimeError``)."""
    from jax.errors import JaxRuntimeError

    error: type[Exception] = JaxRuntimeError
    return error
