"""PjRt arrays made from DLPack tensors (NumPy, jax, torch, cupy, TensorFlow, or bare
capsules): aliased where the plugin can use the tensor's memory, else copied once."""

from __future__ import annotations

from typing import Any

import numpy as np

from ifrtpy import _pjrt
from ifrtpy._pjrt import _dlpack
from ifrtpy.backends.pjrt.array import PjrtArray
from ifrtpy.backends.pjrt.copies import device_views
from ifrtpy.backends.pjrt.dlpack import (
    HOST_TYPES, alignment, capsule_of, same_device, source_device, stream_for,
    target_device,
)
from ifrtpy.backends.pjrt.put import _device_memories, _dtype_of
from ifrtpy.array_plans import dlpack_devices
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import Shape
from ifrtpy.sharding import SingleDeviceSharding

__all__ = ["from_dlpack", "assemble_from_dlpack"]


def from_dlpack(client: Any, x: Any, device: Any = None, copy: bool | None = None) -> Any:
    """``client.from_dlpack``: a single-device array holding ``x`` (a DLPack producer, or a
    capsule), zero-copy where the plugin can alias its memory, else with one copy."""
    if copy not in (None, True, False):
        raise InvalidArgumentError(f"copy must be None, True or False, got {copy!r}")
    source = source_device(x)
    target = target_device(client, source, device)
    memory = target.default_memory()
    on_host = source[0] in HOST_TYPES
    if not on_host and not same_device(client, source, target):
        raise InvalidArgumentError(
            f"the tensor is on DLPack device {source}, which is not {target} of this client; "
            "move it there first")
    # Host memory is aliased only by a plugin whose memories are host memory; device
    # memory only on its own device (checked above); either only by a plugin that can.
    view = (copy is not True and (client._host_platform or not on_host)
            and device_views(client._handle.plugin))
    element_type = -1
    if isinstance(x, np.ndarray) and x.dtype.num >= 256:  # a user-defined (ml_dtypes) type
        # NumPy exports no extension type (bfloat16, float8): its bytes, typed here
        element_type = _dtype_of(x.dtype).pjrt_buffer_type
        x = x.view(f"u{x.dtype.itemsize}")
    stream = stream_for(client, target, source)
    capsule = capsule_of(x, stream)
    buffer, host = _dlpack.import_capsule(
        client._handle, capsule, memory._handle, target._handle, view,
        alignment(client), stream or 0,
        element_type)
    sharding = SingleDeviceSharding(target)
    if buffer is not None:
        dtype = _dtype_of(buffer.dtype)
        return PjrtArray(client, dtype, Shape(buffer.dims), sharding, (buffer,))
    if copy is False and host.size:  # an empty tensor has no memory to copy
        raise ValueError(
            "from_dlpack(copy=False): the tensor cannot be aliased (it must be dense, row-major "
            f"and {alignment(client)}-byte aligned); "
            "a copy is needed")
    return client.make_array_from_host_buffer(host, sharding)


def assemble_from_dlpack(client: Any, shape: Any, sharding: Any, capsules: list, dtype: Any
                         ) -> PjrtArray:
    """One array of ``sharding`` from one host-memory DLPack capsule (or producer) per
    addressable device, in order: aliased where the plugin can, else copied."""
    memories = _device_memories(client, sharding)
    devices = dlpack_devices(sharding, capsules)
    handle = client._handle
    boundary = alignment(client)
    buffers = []
    for device, memory, capsule in zip(devices, memories, capsules):
        source = source_device(capsule)
        if source[0] not in HOST_TYPES:
            raise InvalidArgumentError(f"a tensor on DLPack device {source} is not host memory")
        buffer, host = _dlpack.import_capsule(handle, capsule, memory._handle, device._handle,
                                              True, boundary, 0)
        if buffer is None:
            buffer = _pjrt.buffer_from_host_buffer(handle, host, None, memory._handle, 0)[0]
        buffers.append(buffer)
    if dtype is None:
        if not buffers:
            raise InvalidArgumentError("assemble_array_from_dlpack of no tensors needs a dtype")
        dtype = _dtype_of(buffers[0].dtype)
    elif not isinstance(dtype, DType):
        dtype = _dtype_of(np.dtype(dtype))
    return PjrtArray(client, dtype, Shape(shape), sharding, tuple(buffers))
