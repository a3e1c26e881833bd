"""The Sharding interface and the shardings without partition math: one device, or
an unknown layout."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Optional, Union

from ifrtpy.device import Device, DeviceList, MemoryKind
from ifrtpy.errors import IfrtError, InvalidArgumentError, check_type
from ifrtpy.shape import DynamicShape, IndexDomain, Shape
from ifrtpy.sharding._common import (
    ALL_SHARDS, AnyShape, SingleDeviceShardSemantics, _as_device_list, _as_memory_kind,
    _as_shape, _semantics, _static_shape,
)

class Sharding(abc.ABC):
    """Abstract sharding: ``devices``, ``memory_kind`` and how shards map to devices.

    Subclasses implement :meth:`shard_shape`, :meth:`has_same_partitioning`,
    :meth:`with_device_assignment`, :meth:`disassemble`, :meth:`index_domains`,
    :meth:`debug_string` and :meth:`_partitioning_key` (a hashable value consistent with
    ``has_same_partitioning``). Two shardings are equal when they have the same
    partitioning, devices and memory kind.
    """

    __slots__ = ("_devices", "_memory_kind", "_is_fully_replicated", "_hash", "_shards",
                 "__weakref__")

    def __init__(self, devices: Union[DeviceList, Iterable[Device]],
                 memory_kind: Union[MemoryKind, str, None], is_fully_replicated: bool):
        devices = _as_device_list(devices)
        if len(devices) == 0:
            raise InvalidArgumentError(f"{type(self).__name__} requires a non-empty device list")
        devices.check_distinct(f"the devices of a {type(self).__name__}")
        self._devices = devices
        self._memory_kind = _canonicalize(_as_memory_kind(memory_kind), devices[0])
        self._is_fully_replicated = bool(is_fully_replicated)
        self._hash: Optional[int] = None
        self._shards: Optional[tuple[SingleDeviceSharding, ...]] = None

    @property
    def devices(self) -> DeviceList:
        """The devices, one per shard, in shard order."""
        return self._devices

    @property
    def device_set(self) -> frozenset[Device]:
        """The devices, as a set (as jax's ``Sharding.device_set``)."""
        return frozenset(self._devices)

    @property
    def memory_kind(self) -> MemoryKind:
        """The memory kind of every shard (canonicalized against ``devices[0]``)."""
        return self._memory_kind

    @property
    def is_fully_replicated(self) -> bool:
        """True when every shard holds the whole array."""
        return self._is_fully_replicated

    @property
    def has_unreduced_axes(self) -> bool:
        """Whether some devices hold partial values of the same elements (XLA's and jax's
        unreduced axes: the array is their sum, or another reduction), which no read of a
        shard as the array's values may take as whole. False but for an HloSharding with
        unreduced axes."""
        return False

    @abc.abstractmethod
    def shard_shape(self, shape: AnyShape) -> Shape:
        """The shape of every shard of an array of ``shape``; raises if shards are uneven."""

    @abc.abstractmethod
    def has_same_partitioning(self, other: Sharding) -> bool:
        """Same sharding type and partitioning scheme; devices and memory kind are ignored."""

    @abc.abstractmethod
    def with_device_assignment(self, devices: Union[DeviceList, Iterable[Device], None] = None,
                               memory_kind: Union[MemoryKind, str, None] = None) -> Sharding:
        """The same partitioning over other ``devices`` (same count) and/or memory kind."""

    @abc.abstractmethod
    def disassemble(self, shape: AnyShape, semantics: SingleDeviceShardSemantics = ALL_SHARDS
                    ) -> list[tuple[Union[Shape, DynamicShape], SingleDeviceSharding]]:
        """``(shard shape, SingleDeviceSharding)`` per shard, in device order."""

    @abc.abstractmethod
    def index_domains(self, shape: AnyShape, semantics: SingleDeviceShardSemantics = ALL_SHARDS
                      ) -> list[IndexDomain]:
        """The box of the global array each shard holds, in device order."""

    @abc.abstractmethod
    def debug_string(self) -> str:
        """A description of the sharding."""

    def check_array_shape(self, shape: AnyShape) -> None:
        """InvalidArgumentError unless an array of ``shape`` can be made with this sharding
        (a put, an assemble, a reshard target). Shardings that derive their shards from
        the shape always can; those given by shard shapes (ConcreteSharding,
        ConcreteEvenSharding) check them here, as they are taken as given when built."""

    @abc.abstractmethod
    def _partitioning_key(self) -> object:
        """A hashable value; equal for shardings where ``has_same_partitioning`` is true."""

    # -- shared helpers ------------------------------------------------------------------

    def _check_device_count(self, devices) -> Optional[DeviceList]:
        if devices is None:
            return None
        devices = _as_device_list(devices)
        if len(devices) != len(self._devices):
            raise InvalidArgumentError(
                f"{type(self).__name__} should have the same number of devices as the current "
                f"sharding, but was asked to have {len(devices)} devices")
        return devices

    def _single_device_shardings(self, all_shards: bool) -> Sequence[SingleDeviceSharding]:
        """One SingleDeviceSharding per device (cached), all or the addressable ones."""
        if self._shards is None:
            kind = self._memory_kind
            self._shards = tuple(SingleDeviceSharding(d, kind) for d in self._devices)
        if all_shards:
            return self._shards
        return [s for s, a in zip(self._shards, self._devices.addressable_mask()) if a]

    def _even_disassemble(self, shard_shape, all_shards: bool):
        return [(shard_shape, s) for s in self._single_device_shardings(all_shards)]

    def _mask(self, all_shards: bool) -> Optional[tuple[bool, ...]]:
        return None if all_shards else self._devices.addressable_mask()

    # -- value protocol ------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Sharding):
            return NotImplemented
        return (self.has_same_partitioning(other) and self._memory_kind == other._memory_kind
                and self._devices == other._devices)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((type(self).__name__, self._devices, self._memory_kind,
                               self._partitioning_key()))
        return self._hash

    def __repr__(self) -> str:
        return self.debug_string()


def _canonicalize(memory_kind: MemoryKind, device: Device) -> MemoryKind:
    try:
        return memory_kind.canonicalize(device)
    except (IfrtError, NotImplementedError):
        return memory_kind  # a device without memories keeps the default kind


class SingleDeviceSharding(Sharding):
    """The whole array on one device. Always fully replicated."""

    __slots__ = ()

    def __init__(self, device: Device, memory_kind: Union[MemoryKind, str, None] = None):
        check_type(device, Device, "SingleDeviceSharding device", "a Device")
        super().__init__(DeviceList((device,)), memory_kind, True)

    @property
    def device(self) -> Device:
        return self._devices[0]

    def shard_shape(self, shape: AnyShape) -> Shape:
        return _as_shape(shape)  # type: ignore[return-value]

    def has_same_partitioning(self, other: Sharding) -> bool:
        return isinstance(other, SingleDeviceSharding)

    def with_device_assignment(self, devices=None, memory_kind=None) -> SingleDeviceSharding:
        if devices is not None:
            devices = _as_device_list(devices)
            if len(devices) != 1:
                raise InvalidArgumentError(
                    "SingleDeviceSharding can only have one device, but was asked to have "
                    f"{len(devices)} devices")
        device = self._devices[0] if devices is None else devices[0]
        return SingleDeviceSharding(
            device, self._memory_kind if memory_kind is None else memory_kind)

    def _included(self, semantics) -> bool:
        return _semantics(semantics) or self._devices[0].is_addressable

    def disassemble(self, shape, semantics=ALL_SHARDS):
        return [(_as_shape(shape), self)] if self._included(semantics) else []

    def index_domains(self, shape, semantics=ALL_SHARDS):
        shape = _static_shape(shape, "SingleDeviceSharding")
        return [IndexDomain(shape)] if self._included(semantics) else []

    def debug_string(self) -> str:
        return (f"SingleDeviceSharding({self._devices[0].debug_string()}, "
                f"memory_kind: {self._memory_kind})")

    def _partitioning_key(self):
        return ()

    def __reduce__(self):
        return (SingleDeviceSharding, (self._devices[0], self._memory_kind))


class OpaqueSharding(Sharding):
    """A sharding whose shard layout is unknown (no shard shapes or index domains).

    Not fully replicated; ``has_same_partitioning`` is true only for the identical object,
    so an unpickled copy is not equal to the original.
    """

    __slots__ = ()

    def __init__(self, devices, memory_kind=None):
        super().__init__(devices, memory_kind, False)

    def shard_shape(self, shape):
        raise InvalidArgumentError("OpaqueSharding does not have shard shape information")

    def has_same_partitioning(self, other):
        return self is other

    def with_device_assignment(self, devices=None, memory_kind=None) -> OpaqueSharding:
        devices = self._check_device_count(devices)
        return OpaqueSharding(self._devices if devices is None else devices,
                              self._memory_kind if memory_kind is None else memory_kind)

    def disassemble(self, shape, semantics=ALL_SHARDS):
        raise InvalidArgumentError("OpaqueSharding does not have shard shape information")

    def index_domains(self, shape, semantics=ALL_SHARDS):
        raise InvalidArgumentError("OpaqueSharding does not have index domain information")

    def debug_string(self) -> str:
        return (f"OpaqueSharding(devices: {self._devices.to_string()}, "
                f"memory_kind: {self._memory_kind})")

    def _partitioning_key(self):
        return ()

    def __reduce__(self):
        return (OpaqueSharding, (self._devices, self._memory_kind))

