"""Exchange of ifrtpy arrays with other libraries, zero-copy where the memory allows.

* :func:`from_dlpack` takes any DLPack producer (NumPy, jax, PyTorch, cupy, TensorFlow);
  single-device arrays are DLPack producers themselves (``__dlpack__``) and NumPy views
  (``np.asarray``). See ``docs/interop.md`` for what is copied when, and lifetimes.
* :mod:`ifrtpy.interop.jax` bridges to ``jax.Array`` with its shardings (jax is imported
  only when one of its functions runs).
"""

from __future__ import annotations

from typing import Any

from ifrtpy import backends
from ifrtpy.array import Array
from ifrtpy.client import Client
from ifrtpy.device import Device
from ifrtpy.errors import InvalidArgumentError

__all__ = ["from_dlpack"]


#: DLPack device types (DLDeviceType) -> the backend or plugin whose default client
#: takes a tensor there: host memory to the default (CPU) client.
_PLATFORM_OF_DLPACK_DEVICE = {1: "pjrt", 3: "pjrt", 11: "pjrt", 13: "pjrt", 2: "cuda",
                              10: "rocm"}


def from_dlpack(x: Any, /, device: Device | Client | None = None,
                copy: bool | None = None) -> Array:
    """A single-device ifrtpy array holding ``x``, a DLPack producer or capsule (the array
    API's ``from_dlpack``).

    ``device`` is the ifrtpy device to land on, or a client (then the device the tensor
    is on: the accelerator with its local hardware id, or the first device for host
    memory); None is the producer's device (``x.__dlpack_device__()``) on the process's
    default client for that platform (``ifrt.get_client()`` for host memory,
    ``get_client("cuda")`` for a CUDA device; a bare capsule counts as host memory).
    Zero-copy where the plugin can alias the memory, else one copy; ``copy=True`` always
    copies, ``copy=False`` raises ValueError where a copy is needed. See
    :meth:`ifrtpy.Client.from_dlpack`.
    """
    if device is None:
        kind = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else 1
        platform = _PLATFORM_OF_DLPACK_DEVICE.get(int(kind))
        if platform is None:
            raise InvalidArgumentError(
                f"from_dlpack: no ifrtpy platform takes a tensor on DLPack device type "
                f"{int(kind)}; pass device= an ifrtpy Device or Client")
        device = backends.default_client(platform)
    if isinstance(device, Client):
        return device.from_dlpack(x, None, copy)
    if isinstance(device, Device):
        return device.client.from_dlpack(x, device, copy)
    raise InvalidArgumentError(
        f"from_dlpack: device must be an ifrtpy Device, Client or None, got {device!r}")
