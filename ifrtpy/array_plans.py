"""The preconditions of the Client's array operations, written once for every backend.

IFRT's ``AssembleArrayFromSingleDeviceArrays``, ``CopyArrays``, ``ReshardArrays`` and
``MakeErrorArrays`` (and an array's ``DisassembleIntoSingleDeviceArrays``) refuse the
same inputs whatever the runtime: arrays of another client, mismatched counts, devices,
dtypes, shapes and memory kinds, deleted inputs.
Each ``plan_*`` function checks a call completely (raising the IFRT error for the first
problem) and returns what the backend then carries out, so that a backend moves no data
and deletes no input before every argument is known to be good. The backends keep their
own data movement and their own extra limits (a sharding jax cannot express, a copy
across processes PJRT cannot make). The plans the interfaces' own defaults use as well
live below this module, which imports :mod:`ifrtpy.array`: ``plan_fully_replicated_shard``
and the copy-semantics taking of data (``StoredArray._take``) in :mod:`ifrtpy.array`,
``distinct_shards`` (what a print or a whole read takes) in :mod:`ifrtpy.array_text`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ifrtpy.array import (
    Array, ArrayCopySemantics, ArraySpec, array_sequence, check_of_client, deleted_error,
)
from ifrtpy.device import DeviceList, MemoryKind
from ifrtpy.dtypes import DType
from ifrtpy.errors import (
    InvalidArgumentError, UnimplementedError, check_enum,
    invalid_argument,
)
from ifrtpy.shape import IndexDomain, Shape
from ifrtpy.sharding import (
    OpaqueSharding, Sharding, SingleDeviceSharding, SingleDeviceShardSemantics, check_reduced,
)

__all__ = [
    "AssemblePlan", "CopyPlan", "DisassemblePlan", "ReshardPlan", "plan_assemble", "plan_copy",
    "plan_disassemble", "plan_reshard", "plan_error_arrays", "arrays_of",
    "check_placement", "check_live", "check_shard_semantics",
    "addressable_domains", "canonical_kind", "dlpack_devices", "default_shard_layout",
]

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
ALL_SHARDS = SingleDeviceShardSemantics.ALL_SHARDS
DONATE_INPUT = ArrayCopySemantics.DONATE_INPUT


# -- the checks the plans share ---------------------------------------------------------------

def arrays_of(client: Any, arrays: Any, parameter: str, array_type: Any) -> list[Any]:
    """``arrays`` (any sequence, not one array) as a list, each an array of ``client``."""
    checked = array_sequence(arrays, parameter)
    for i, array in enumerate(checked):
        check_of_client(client, array, f"{parameter}[{i}]", array_type)
    return checked


def check_placement(client: Any, sharding: Any) -> Sharding:
    """``sharding`` if it is a Sharding over devices of ``client`` whose addressable ones
    have its memory kind; InvalidArgumentError otherwise."""
    if not isinstance(sharding, Sharding):
        raise invalid_argument("sharding", "a Sharding", sharding)
    for device in sharding.devices:
        if device.client is not client:
            raise InvalidArgumentError(f"device {device} belongs to another client")
        if device.is_addressable:
            device.memory(sharding.memory_kind)  # InvalidArgumentError naming the kinds
    return sharding


def check_live(array: Array) -> None:
    """FailedPreconditionError if ``array`` was deleted or donated (an error array is
    never live, and is not refused here: operations pass its error on)."""
    if array.error is None and array.is_deleted():
        raise deleted_error(array)


def check_shard_semantics(sharding: Sharding, semantics: Any, what: str
                          ) -> SingleDeviceShardSemantics:
    """``semantics`` as a SingleDeviceShardSemantics; InvalidArgumentError naming ``what``
    for ALL_SHARDS when some device of ``sharding`` is not addressable."""
    checked: SingleDeviceShardSemantics = check_enum(
        SingleDeviceShardSemantics, semantics, "single_device_shard_semantics")
    if checked == ALL_SHARDS and not sharding.devices.is_fully_addressable:
        raise InvalidArgumentError(
            f"{what} with SingleDeviceShardSemantics.ALL_SHARDS needs every device "
            f"addressable; {sharding!r} has non-addressable devices")
    return checked


def addressable_domains(sharding: Sharding, shape: Shape) -> list[IndexDomain]:
    """The box of an array of ``shape`` that each addressable shard of ``sharding`` holds
    (the whole array where it replicates), to move data by: InvalidArgumentError when
    ``sharding`` cannot hold such an array (:meth:`Sharding.check_array_shape`), has
    unreduced axes (its shards hold partial values, not slices), gives another count of
    shards than of addressable devices, or a shard outside ``shape``."""
    sharding.check_array_shape(shape)
    check_reduced(sharding, "placing data by index domain")
    count = len(sharding.devices.addressable_device_list())
    if sharding.is_fully_replicated:
        return [IndexDomain(shape)] * count
    domains = list(sharding.index_domains(shape, ADDRESSABLE))
    if len(domains) != count:
        raise InvalidArgumentError(
            f"{sharding!r} gives {len(domains)} shards for {count} addressable devices")
    for domain in domains:
        origin, extent = domain
        if len(extent) != len(shape) or any(
                o < 0 or o + e > d for o, e, d in zip(origin, extent, shape)):
            raise InvalidArgumentError(
                f"{sharding!r} does not fit an array of shape {shape.debug_string()}: it has a "
                f"shard {domain.debug_string()}")
    return domains


def canonical_kind(sharding: Sharding) -> MemoryKind:
    """The memory kind of ``sharding``, the default named (as IFRT compares kinds)."""
    return sharding.memory_kind.canonicalize(sharding.devices[0])


def default_shard_layout(client: Any, dtype: DType, shape: Shape, sharding: Sharding) -> Any:
    """The client's default layout of a shard of an array of ``dtype`` and ``shape`` in
    ``sharding`` (on its first addressable device, in its memory kind); None where the
    sharding has no addressable device."""
    devices = sharding.devices.addressable_device_list()
    if not devices:
        return None
    return client.get_default_layout(dtype, sharding.shard_shape(shape).dims, devices[0],
                                     sharding.memory_kind)


def dlpack_devices(sharding: Sharding, tensors: Sequence[Any]) -> list[Any]:
    """The addressable devices of ``sharding``, one for each of ``tensors`` (an
    ``assemble_array_from_dlpack`` call); InvalidArgumentError when the counts differ."""
    devices = list(sharding.devices.addressable_device_list())
    if len(tensors) != len(devices):
        raise InvalidArgumentError(
            f"assemble_array_from_dlpack needs one tensor per addressable device of the "
            f"sharding: {len(devices)} devices, got {len(tensors)} tensors")
    return devices


def _shape(shape: Any) -> Shape:
    return shape if isinstance(shape, Shape) else Shape(shape)


# -- disassemble -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DisassemblePlan:
    """A checked ``disassemble_into_single_device_arrays``: ``pieces[i]`` is the shape and
    single-device sharding of addressable shard ``i``, in device order."""

    pieces: Sequence[tuple[Shape, Sharding]]
    copy_semantics: ArrayCopySemantics


def plan_disassemble(array: Array, copy_semantics: Any, shard_semantics: Any,
                     shard_shapes: Sequence[Any] | None = None) -> DisassemblePlan:
    """Check a disassemble of ``array``: known semantics (ALL_SHARDS needs every device
    addressable), a live array (or an error array), and shard shapes: the sharding's, or
    ``shard_shapes`` (one per addressable device) where it has none (an OpaqueSharding,
    InvalidArgumentError without them)."""
    sharding = array.sharding
    check_shard_semantics(sharding, shard_semantics, "disassemble")
    copy_semantics = check_enum(ArrayCopySemantics, copy_semantics, "copy_semantics")
    check_live(array)
    if isinstance(sharding, OpaqueSharding):
        if shard_shapes is None:
            raise InvalidArgumentError(
                "an array with an OpaqueSharding cannot be disassembled: its shard shapes "
                "are unknown")
        kind = sharding.memory_kind
        pieces = [(_shape(s), SingleDeviceSharding(d, kind))
                  for s, d in zip(shard_shapes, sharding.devices.addressable_device_list())]
    else:
        pieces = [(_shape(s), piece) for s, piece in sharding.disassemble(array.shape, ADDRESSABLE)]
    return DisassemblePlan(pieces, copy_semantics)


# -- assemble ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AssemblePlan:
    """A checked ``assemble_array_from_single_device_arrays``: ``arrays[i]`` holds shard
    ``i`` (in the sharding's addressable device order); ``error`` is the first input's
    error, which the result takes instead of data."""

    shape: Shape
    sharding: Sharding
    arrays: list[Any]
    dtype: DType
    copy_semantics: ArrayCopySemantics
    error: BaseException | None


def plan_assemble(client: Any, shape: Any, sharding: Any, arrays: Any, copy_semantics: Any,
                  shard_semantics: Any, dtype: Any, array_type: Any) -> AssemblePlan:
    """Check an assemble: one single-device array of ``client`` per addressable shard of
    ``sharding`` (every shard with ALL_SHARDS, which needs every device addressable), each
    on its shard's device and memory kind, with the shard's shape and one dtype (``dtype``,
    needed when there are no arrays), live, and no array twice when donated."""
    shape = _shape(shape)
    check_placement(client, sharding)
    arrays = arrays_of(client, arrays, "assemble arrays", array_type)
    copy_semantics = check_enum(ArrayCopySemantics, copy_semantics, "copy_semantics")
    check_shard_semantics(sharding, shard_semantics, "assemble")
    devices = sharding.devices.addressable_device_list()
    if len(arrays) != len(devices):
        raise InvalidArgumentError(
            f"assemble needs one array per addressable device of the sharding: "
            f"{len(devices)} devices, got {len(arrays)} arrays")
    if dtype is None:
        if not arrays:
            raise InvalidArgumentError("assemble of no arrays needs a dtype")
        dtype = arrays[0].dtype
    dtype = dtype if isinstance(dtype, DType) else DType.from_numpy(dtype)
    if copy_semantics == DONATE_INPUT and len({id(a) for a in arrays}) != len(arrays):
        raise InvalidArgumentError("assemble with DONATE_INPUT got the same array more than once")
    shard_shapes = (None if isinstance(sharding, OpaqueSharding)
                    else [_shape(s) for s, _ in sharding.disassemble(shape, ADDRESSABLE)])
    sharding.check_array_shape(shape)
    kind = canonical_kind(sharding)
    for i, (array, device) in enumerate(zip(arrays, devices)):
        if len(array.sharding.devices) != 1:
            raise InvalidArgumentError(
                f"array {i} is not a single-device array: it is on "
                f"{len(array.sharding.devices)} devices")
        if array.dtype != dtype:
            raise InvalidArgumentError(f"array {i} has dtype {array.dtype}, expected {dtype}")
        if shard_shapes is not None and array.shape != shard_shapes[i]:
            raise InvalidArgumentError(
                f"array {i} has shape {array.shape}, shard {i} of {shape} is {shard_shapes[i]}")
        held = array.sharding.devices[0]
        if held is not device:
            raise InvalidArgumentError(
                f"array {i} is on device {held}, shard {i} of the sharding is on {device}")
        if canonical_kind(array.sharding) != kind:
            raise InvalidArgumentError(
                f"array {i} is in memory kind {canonical_kind(array.sharding)}, the sharding "
                f"puts shard {i} in {kind}")
        check_live(array)
    error = next((a.error for a in arrays if a.error is not None), None)
    return AssemblePlan(shape, sharding, arrays, dtype, copy_semantics, error)


# -- copy ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CopyPlan:
    """A checked ``copy_arrays``: ``targets[i]`` is the sharding of the copy of
    ``arrays[i]`` (its partitioning over the new devices and memory kind)."""

    arrays: list[Any]
    targets: list[Sharding]
    semantics: ArrayCopySemantics


def plan_copy(client: Any, arrays: Any, devices: Any, memory_kind: Any, semantics: Any,
              array_type: Any) -> CopyPlan:
    """Check a copy: live arrays of ``client``, all on one device list and memory kind;
    ``devices`` (as many) and ``memory_kind`` of ``client``; every shard staying in its
    process (UnimplementedError otherwise: copies move shards device to device)."""
    arrays = arrays_of(client, arrays, "copy_arrays arrays", array_type)
    semantics = check_enum(ArrayCopySemantics, semantics, "semantics")
    if not arrays:
        return CopyPlan([], [], semantics)
    first = arrays[0].sharding
    first_kind = canonical_kind(first)
    for i, array in enumerate(arrays):
        if array.sharding.devices != first.devices:
            raise InvalidArgumentError(
                f"copy_arrays needs every input on the same devices: array {i} is on "
                f"{array.sharding.devices.to_string()}, array 0 on {first.devices.to_string()}")
        kind = canonical_kind(array.sharding)
        if kind != first_kind:
            raise InvalidArgumentError(
                f"copy_arrays needs every input in the same memory kind: array {i} is in "
                f"{kind}, array 0 in {first_kind}")
        check_live(array)
    if devices is not None and not isinstance(devices, DeviceList):
        devices = DeviceList(devices)
    if devices is not None and len(devices) != len(first.devices):
        raise InvalidArgumentError(
            f"copy_arrays: the new device list has {len(devices)} devices, the arrays are on "
            f"{len(first.devices)}")
    targets = []
    for i, array in enumerate(arrays):
        target = check_placement(client, array.sharding.with_device_assignment(devices, memory_kind))
        if target.devices.addressable_mask() != array.sharding.devices.addressable_mask():
            raise UnimplementedError(
                f"copy_arrays: array {i}'s shards would move between processes (copies move "
                "each shard to the device in its place); reshard_arrays moves data across "
                "processes where the backend can")
        targets.append(target)
    return CopyPlan(arrays, targets, semantics)


# -- reshard -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ReshardPlan:
    """A checked ``reshard_arrays``: ``arrays[i]`` goes to ``specs[i]``."""

    arrays: list[Any]
    specs: list[ArraySpec]
    semantics: ArrayCopySemantics


def plan_reshard(client: Any, arrays: Any, specs: Any, semantics: Any,
                 array_type: Any) -> ReshardPlan:
    """Check a reshard: one spec per live array of ``client``, each of its dtype and shape
    (a reshard moves data, it does not convert it), the default layout, and a sharding of
    ``client`` with shard information, neither it nor the array's with unreduced axes
    (partial values: a reshard would take one for the whole); ALWAYS_COPY or
    DONATE_INPUT."""
    arrays = arrays_of(client, arrays, "reshard_arrays arrays", array_type)
    specs = list(specs)
    semantics = check_enum(ArrayCopySemantics, semantics, "semantics")
    if len(arrays) != len(specs):
        raise InvalidArgumentError(f"reshard_arrays got {len(arrays)} arrays and {len(specs)} specs")
    if semantics == ArrayCopySemantics.REUSE_INPUT:
        raise InvalidArgumentError(
            "reshard_arrays does not allow REUSE_INPUT; use ALWAYS_COPY or DONATE_INPUT")
    for i, (array, spec) in enumerate(zip(arrays, specs)):
        if not isinstance(spec, ArraySpec):
            raise InvalidArgumentError(f"spec {i} is not an ArraySpec: {spec!r}")
        if spec.dtype != array.dtype or _shape(spec.shape) != array.shape:
            raise InvalidArgumentError(
                f"reshard_arrays keeps dtype and shape: array {i} is {array.dtype}{array.shape}, "
                f"spec {i} is {spec.dtype}{spec.shape}")
        if spec.layout is not None:
            raise InvalidArgumentError("reshard_arrays supports only the default layout")
        check_placement(client, spec.sharding)
        if isinstance(spec.sharding, OpaqueSharding):
            raise InvalidArgumentError(f"spec {i}: cannot reshard to an OpaqueSharding")
        spec.sharding.check_array_shape(array.shape)
        check_live(array)
        check_reduced(array.sharding, f"reshard_arrays of array {i}")
        check_reduced(spec.sharding, f"reshard_arrays to spec {i}")
    return ReshardPlan(arrays, specs, semantics)


# -- error arrays ---------------------------------------------------------------------------------

def plan_error_arrays(client: Any, error: Any, specs: Sequence[Any]) -> list[ArraySpec]:
    """Check ``make_error_arrays``: an exception, and ArraySpecs placed on ``client``."""
    if not isinstance(error, BaseException):
        raise InvalidArgumentError(f"make_error_arrays needs an exception, got {error!r}")
    specs = list(specs)
    for i, spec in enumerate(specs):
        if not isinstance(spec, ArraySpec):
            raise InvalidArgumentError(f"spec {i} is not an ArraySpec: {spec!r}")
        check_placement(client, spec.sharding)
    return specs
