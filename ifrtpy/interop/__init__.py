"""Exchange of ifrtpy arrays with other libraries, zero-copy where the memory allows.

* :func:`from_dlpack` takes any DLPack producer (NumPy, jax, PyTorch, cupy, TensorFlow);
  single-device arrays are DLPack producers themselves (``__dlpack__``) and NumPy views
  (``np.asarray``). See ``docs/interop.md`` for what is copied when, and lifetimes.
* :mod:`ifrtpy.interop.jax` bridges to ``jax.Array`` with its shardings (jax is imported
  only when one of its functions runs).
"""

from __future__ import annotations

from typing import Any

from ifrtpy.array import Array
from ifrtpy.client import Client
from ifrtpy.device import Device
from ifrtpy.errors import InvalidArgumentError

__all__ = ["from_dlpack"]


def from_dlpack(x: Any, device: Device | Client | None = None, copy: bool | None = None) -> Array:
    """A single-device ifrtpy array holding ``x``, a DLPack producer or capsule.

    ``device`` is the ifrtpy device to land on, or a client (then the device the tensor
    is on: the accelerator with its local hardware id, or the first device for host
    memory). Zero-copy where the plugin can alias the memory, else one copy; ``copy=True``
    always copies, ``copy=False`` raises ValueError where a copy is needed. See
    :meth:`ifrtpy.Client.from_dlpack`.
    """
    if isinstance(device, Client):
        return device.from_dlpack(x, None, copy)
    if isinstance(device, Device):
        return device.client.from_dlpack(x, device, copy)
    raise InvalidArgumentError(
        f"from_dlpack needs device= an ifrtpy Device or Client to put the tensor on, got {device!r}")
