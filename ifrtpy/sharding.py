"""Shardings: how an array's elements are laid out over a list of devices.

Mirrors IFRT's ``sharding.h`` and ``ir/sharding_param.h``. A :class:`Sharding` is an
immutable value holding a :class:`~ifrtpy.device.DeviceList` and a memory kind (always
canonicalized against the first device). Shard ``i`` lives on ``devices[i]``; every list
returned by :meth:`Sharding.disassemble` and :meth:`Sharding.index_domains` is in that
device order, restricted to addressable devices for ``ADDRESSABLE_SHARDS``.

All the math is pure Python + NumPy and backend-independent. Errors are
:class:`~ifrtpy.errors.InvalidArgumentError` with IFRT's messages.
"""

from __future__ import annotations

import abc
import enum
import functools
import itertools
import math
import re
from collections.abc import Iterable, Sequence
from typing import Optional, Union

import numpy as np

from ifrtpy.device import Device, DeviceList, MemoryKind
from ifrtpy.errors import IfrtError, InvalidArgumentError, check_type
from ifrtpy.shape import DynamicShape, IndexDomain, Shape, _ints, _shape_unchecked

__all__ = [
    "SingleDeviceShardSemantics", "Sharding", "SingleDeviceSharding", "OpaqueSharding",
    "ConcreteSharding", "ConcreteEvenSharding", "ShardingParam", "ShardingParamSharding",
]

AnyShape = Union[Shape, DynamicShape, Sequence[int]]
_make_index_domain = functools.partial(tuple.__new__, IndexDomain)  # from (origin, Shape)


class SingleDeviceShardSemantics(enum.Enum):
    """Which shards an operation returns: only this process's, or all of them."""

    ADDRESSABLE_SHARDS = 0
    ALL_SHARDS = 1


ADDRESSABLE_SHARDS = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
ALL_SHARDS = SingleDeviceShardSemantics.ALL_SHARDS


def _as_device_list(devices: Union[DeviceList, Iterable[Device]]) -> DeviceList:
    return devices if isinstance(devices, DeviceList) else DeviceList(devices)


def _as_memory_kind(memory_kind: Union[MemoryKind, str, None]) -> MemoryKind:
    return memory_kind if isinstance(memory_kind, MemoryKind) else MemoryKind(memory_kind)


def _as_shape(shape: AnyShape) -> Union[Shape, DynamicShape]:
    if type(shape) is Shape or isinstance(shape, DynamicShape):
        return shape  # type: ignore[return-value]
    return Shape(shape)  # type: ignore[arg-type]


def _static_shape(shape: AnyShape, who: str) -> Shape:
    shape = _as_shape(shape)
    if isinstance(shape, DynamicShape):
        raise InvalidArgumentError(
            f"{who} can only disassemble static shape, but was asked to disassemble dynamic "
            f"shape {shape.debug_string()}")
    return shape


def _semantics(semantics: SingleDeviceShardSemantics) -> bool:
    """True for ALL_SHARDS; validates the argument."""
    if semantics is ALL_SHARDS:
        return True
    if semantics is ADDRESSABLE_SHARDS:
        return False
    raise TypeError(f"expected a SingleDeviceShardSemantics, got {semantics!r}")


def _compact(tile_of_device: list[int]) -> Sequence[int]:
    """``range(n)`` if the list is ``[0, 1, ..., n-1]``, else the list."""
    identity = range(len(tile_of_device))
    return identity if tile_of_device == list(identity) else tile_of_device


def _tiled_index_domains(dims: Sequence[int], tiles: Sequence[int], tile_of_device: Sequence[int],
                         mask: Optional[Sequence[bool]]) -> list[IndexDomain]:
    """Index domains of an array of ``dims`` cut into ``tiles[i]`` pieces along dim ``i``.

    Tiles are numbered major-to-minor (row-major over ``tiles``); device position ``j``
    holds tile ``tile_of_device[j]`` (a ``range`` when that is the identity). Tiles are
    ``ceil(dim / tiles)`` long; the last ones are clipped (possibly to 0) when the division
    is uneven, as XLA does. ``mask`` keeps
    only the positions where it is true. Each distinct domain is built once and shared.
    """
    sizes = [-(-d // t) for d, t in zip(dims, tiles)]
    origins = [[min(i * s, d) for i in range(t)] for d, s, t in zip(dims, sizes, tiles)]
    if all(d % t == 0 for d, t in zip(dims, tiles)):
        pairs = zip(itertools.product(*origins), itertools.repeat(_shape_unchecked(tuple(sizes))))
    else:
        extents = [[min(s, d - o) for o in os] for d, s, os in zip(dims, sizes, origins)]
        pairs = zip(itertools.product(*origins),
                    map(_shape_unchecked, itertools.product(*extents)))
    unique = list(map(_make_index_domain, pairs))  # C-level loop: this is the hot path
    if mask is None:
        if tile_of_device == range(len(unique)):  # tile i on device i: no reordering
            return unique
        return list(map(unique.__getitem__, tile_of_device))
    return [unique[t] for t, keep in zip(tile_of_device, mask) if keep]


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
    def memory_kind(self) -> MemoryKind:
        """The memory kind of every shard (canonicalized against ``devices[0]``)."""
        return self._memory_kind

    @property
    def is_fully_replicated(self) -> bool:
        """True when every shard holds the whole array."""
        return self._is_fully_replicated

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


def _check_shard_shape(shape: Union[Shape, DynamicShape], shard_shape: Union[Shape, DynamicShape],
                       parameter: str) -> None:
    """A shard of ``shape`` has its rank and no dim beyond the array's."""
    bounds = shape.shape if isinstance(shape, DynamicShape) else shape
    dims = shard_shape.shape if isinstance(shard_shape, DynamicShape) else shard_shape
    if len(dims) != len(bounds) or any(d > b for d, b in zip(dims, bounds)):
        raise InvalidArgumentError(
            f"{parameter} {shard_shape.debug_string()} does not fit in the array's shape "
            f"{shape.debug_string()} (same rank, no dim larger)")


def _check_index_domains(shape: Shape, shard_shapes: Sequence[Shape],
                         domains: Sequence[IndexDomain], covering: bool) -> None:
    """Each domain lies inside ``shape`` and has its shard's shape; distinct domains do not
    overlap (equal ones are replicas); with ``covering`` (every device addressable) they
    cover ``shape``, so no element of an array is left without a shard."""
    if len(domains) != len(shard_shapes):
        raise InvalidArgumentError(
            f"ConcreteSharding has {len(shard_shapes)} shard_shapes but {len(domains)} "
            "index_domains")
    for i, (domain, shard_shape) in enumerate(zip(domains, shard_shapes)):
        origin, extent = domain
        if (len(origin) != len(shape) or any(o < 0 for o in origin)
                or any(o + e > d for o, e, d in zip(origin, extent, shape))):
            raise InvalidArgumentError(
                f"ConcreteSharding index_domains[{i}] {domain.debug_string()} lies outside "
                f"the shape {shape.debug_string()}")
        if extent != shard_shape:
            raise InvalidArgumentError(
                f"ConcreteSharding index_domains[{i}] {domain.debug_string()} does not have "
                f"the shape of shard_shapes[{i}] {shard_shape.debug_string()}")
    # Sweep along dim 0: a box is compared only with those whose rows reach its own.
    distinct = sorted(set(domains), key=lambda d: tuple(d[0]))
    active: list = []
    for b in distinct:
        if len(shape):
            active = [a for a in active if a[0][0] + a[1][0] > b[0][0]]
        for a in active:
            if all(max(oa, ob) < min(oa + ea, ob + eb)
                   for oa, ea, ob, eb in zip(a[0], a[1], b[0], b[1])):
                raise InvalidArgumentError(
                    f"ConcreteSharding index domains {a.debug_string()} and "
                    f"{b.debug_string()} overlap (shards hold either the same box or "
                    "disjoint ones)")
        active.append(b)
    covered = sum(d[1].num_elements() for d in distinct)
    if covering and covered != shape.num_elements():
        raise InvalidArgumentError(
            f"ConcreteSharding index domains cover {covered} of the {shape.num_elements()} "
            f"elements of {shape.debug_string()}: every element needs a shard")


class ConcreteSharding(Sharding):
    """Explicit, possibly uneven, shard shapes: ``shard_shapes[i]`` is the shape of the
    shard on the i-th *addressable* device. ``shape`` and ``shard_shapes`` are either all
    static or all :class:`DynamicShape`. Optional ``index_domains`` (static shapes only)
    give each addressable shard's box. Never fully replicated.
    """

    __slots__ = ("_shape", "_shard_shapes", "_index_domains", "_fixed_shard_shape")

    def __init__(self, devices, shape: AnyShape, shard_shapes: Iterable[AnyShape],
                 index_domains: Optional[Iterable[IndexDomain]] = None, memory_kind=None):
        super().__init__(devices, memory_kind, False)
        shape = _as_shape(shape)
        shard_shapes = tuple(map(_as_shape, shard_shapes))
        dynamic = isinstance(shape, DynamicShape)
        if any(isinstance(s, DynamicShape) != dynamic for s in shard_shapes):
            raise InvalidArgumentError(
                "ConcreteSharding needs shape and shard_shapes all static or all dynamic")
        if index_domains is not None:
            if dynamic:
                raise InvalidArgumentError("ConcreteSharding index_domains need a static shape")
            index_domains = tuple(d if type(d) is IndexDomain else IndexDomain(*d)
                                  for d in index_domains)
        for i, shard_shape in enumerate(shard_shapes):
            _check_shard_shape(shape, shard_shape, f"ConcreteSharding shard_shapes[{i}]")
        if index_domains is not None:
            _check_index_domains(shape, shard_shapes, index_domains,
                                 self._devices.is_fully_addressable)
        self._shape = shape
        self._shard_shapes = shard_shapes
        self._index_domains = index_domains
        same = not dynamic and shard_shapes and all(s == shard_shapes[0] for s in shard_shapes)
        self._fixed_shard_shape = shard_shapes[0] if same else None

    @property
    def shape(self) -> Union[Shape, DynamicShape]:
        return self._shape

    @property
    def shard_shapes(self) -> tuple[Union[Shape, DynamicShape], ...]:
        return self._shard_shapes

    @property
    def index_domains_info(self) -> Optional[tuple[IndexDomain, ...]]:
        """The index domains given at construction, or None."""
        return self._index_domains

    def shard_shape(self, shape):
        if self._fixed_shard_shape is None:
            raise InvalidArgumentError("ConcreteSharding does not have a fixed shard shape")
        return self._fixed_shard_shape

    def has_same_partitioning(self, other):
        return self is other or (isinstance(other, ConcreteSharding)
                                 and self._partitioning_key() == other._partitioning_key())

    def with_device_assignment(self, devices=None, memory_kind=None) -> ConcreteSharding:
        devices = self._check_device_count(devices)
        return ConcreteSharding(self._devices if devices is None else devices, self._shape,
                                self._shard_shapes, self._index_domains,
                                self._memory_kind if memory_kind is None else memory_kind)

    def _check_addressable_count(self, count: int, what: str, all_shards: bool) -> None:
        num_addressable = len(self._devices.addressable_device_list())
        if all_shards and len(self._devices) != count:
            detail = "index domains from non-addressable devices" if what == "index domains" \
                else "non-addressable devices"
            raise InvalidArgumentError(
                "SingleDeviceShardSemantics::kAllShards was requested, but the ConcreteSharding "
                f"contains {detail}. Saw {len(self._devices)} devices, with {count} "
                "addressable devices.")
        if count != num_addressable:
            raise InvalidArgumentError(
                f"ConcreteSharding must have the same number of {what} and addressable "
                f"devices. Saw {count} {what}, with {num_addressable} addressable devices.")

    def disassemble(self, shape, semantics=ALL_SHARDS):
        all_shards = _semantics(semantics)
        shape = _as_shape(shape)
        held_dynamic = isinstance(self._shape, DynamicShape)
        if isinstance(shape, DynamicShape) != held_dynamic:
            held, asked = ("dynamic", "static") if held_dynamic else ("static", "dynamic")
            raise InvalidArgumentError(
                f"ConcreteSharding holds {held} shape, but was asked to disassemble {asked} "
                f"shape {shape.debug_string()}")
        if shape != self._shape:
            kind = "dynamic shape" if held_dynamic else "shape"
            raise InvalidArgumentError(
                f"ConcreteSharding can only disassemble {kind} {self._shape.debug_string()}, "
                f"but was asked to disassemble {kind} {shape.debug_string()}")
        self._check_addressable_count(len(self._shard_shapes), "shard shapes", all_shards)
        return list(zip(self._shard_shapes, self._single_device_shardings(False)))

    def index_domains(self, shape, semantics=ALL_SHARDS):
        all_shards = _semantics(semantics)
        if self._index_domains is None:
            raise InvalidArgumentError("ConcreteSharding does not have index domain information")
        self._check_addressable_count(len(self._index_domains), "index domains", all_shards)
        return list(self._index_domains)

    def debug_string(self) -> str:
        domains = ("<nullopt>" if self._index_domains is None else
                   "[" + ",".join(d.debug_string() for d in self._index_domains) + "]")
        return (f"ConcreteSharding(devices: {self._devices.to_string()}, shape: "
                f"{self._shape.debug_string()}, shard_shapes: "
                f"[{','.join(s.debug_string() for s in self._shard_shapes)}], "
                f"index_domains: {domains}, memory_kind: {self._memory_kind})")

    def _partitioning_key(self):
        # Unlike IFRT, the index domains are part of the partitioning.
        return (self._shape, self._shard_shapes, self._index_domains)

    def __reduce__(self):
        return (ConcreteSharding, (self._devices, self._shape, self._shard_shapes,
                                   self._index_domains, self._memory_kind))


class ConcreteEvenSharding(Sharding):
    """Every shard of an array of exactly ``shape`` has ``shard_shape``. Carries no index
    domains; ``is_fully_replicated`` is given by the creator."""

    __slots__ = ("_shape", "_shard_shape")

    def __init__(self, devices, shape: AnyShape, shard_shape: AnyShape,
                 is_fully_replicated: bool = False, memory_kind=None):
        super().__init__(devices, memory_kind, is_fully_replicated)
        self._shape = Shape(shape)
        self._shard_shape = Shape(shard_shape)
        _check_shard_shape(self._shape, self._shard_shape, "ConcreteEvenSharding shard_shape")
        if self._is_fully_replicated and self._shard_shape != self._shape:
            raise InvalidArgumentError(
                f"a fully replicated ConcreteEvenSharding needs shard_shape == shape, got "
                f"shard_shape {self._shard_shape.debug_string()} for shape "
                f"{self._shape.debug_string()}")
        if self._shard_shape.num_elements() * len(self._devices) < self._shape.num_elements():
            raise InvalidArgumentError(
                f"ConcreteEvenSharding: {len(self._devices)} shards of "
                f"{self._shard_shape.debug_string()} cannot hold an array of "
                f"{self._shape.debug_string()}")

    @property
    def shape(self) -> Shape:
        return self._shape

    def shard_shape(self, shape):
        shape = _as_shape(shape)
        if shape != self._shape:
            raise InvalidArgumentError(
                f"ConcreteEvenSharding has a shard shape for shape {self._shape.debug_string()}, "
                f"but was asked to get a shard shape for shape {shape.debug_string()}")
        return self._shard_shape

    def has_same_partitioning(self, other):
        return self is other or (isinstance(other, ConcreteEvenSharding)
                                 and len(self._devices) == len(other._devices)
                                 and self._partitioning_key() == other._partitioning_key())

    def with_device_assignment(self, devices=None, memory_kind=None) -> ConcreteEvenSharding:
        devices = self._check_device_count(devices)
        return ConcreteEvenSharding(self._devices if devices is None else devices, self._shape,
                                    self._shard_shape, self._is_fully_replicated,
                                    self._memory_kind if memory_kind is None else memory_kind)

    def disassemble(self, shape, semantics=ALL_SHARDS):
        all_shards = _semantics(semantics)
        shape = _static_shape(shape, "ConcreteEvenSharding")
        if shape != self._shape:
            raise InvalidArgumentError(
                f"ConcreteEvenSharding can only disassemble shape {self._shape.debug_string()}, "
                f"but was asked to disassemble shape {shape.debug_string()}")
        return self._even_disassemble(self._shard_shape, all_shards)

    def index_domains(self, shape, semantics=ALL_SHARDS):
        raise InvalidArgumentError("ConcreteEvenSharding does not have index domain information")

    def debug_string(self) -> str:
        return (f"ConcreteEvenSharding(devices: {self._devices.to_string()}, shape: "
                f"{self._shape.debug_string()}, shard_shape: {self._shard_shape.debug_string()}, "
                f"memory_kind: {self._memory_kind}, is_fully_replicated: "
                f"{str(self._is_fully_replicated).lower()})")

    def _partitioning_key(self):
        return (len(self._devices), self._shape, self._shard_shape, self._is_fully_replicated)

    def __reduce__(self):
        return (ConcreteEvenSharding, (self._devices, self._shape, self._shard_shape,
                                       self._is_fully_replicated, self._memory_kind))


#: The most devices a ShardingParam's mesh may have (its device order is held in memory).
MAX_MESH_DEVICES = 2**24


class ShardingParam:
    """IFRT's ``ShardingParam``: ``dim_shards`` spread over a device mesh.

    The mesh has axes of ``axis_sizes`` (axis 0 varies fastest in the device index);
    ``permutation`` lists mesh axes from minor to major in the order they are assigned to
    the array's shards. Tiles are numbered major-to-minor over ``dim_shards``; mesh axes
    left over after the tiles become replication, which is the most minor. Written
    ``"2x1x3 to [1,0] on 2x3"`` (:meth:`debug_string`, :meth:`parse`).
    """

    __slots__ = ("_dim_shards", "_permutation", "_axis_sizes", "_order")

    def __init__(self, dim_shards: Iterable[int], permutation: Iterable[int],
                 axis_sizes: Iterable[int]):
        self._dim_shards = _ints(dim_shards, "ShardingParam dim_shards")
        self._permutation = _ints(permutation, "ShardingParam permutation")
        self._axis_sizes = _ints(axis_sizes, "ShardingParam axis_sizes")
        if math.prod(self._axis_sizes) > MAX_MESH_DEVICES:
            raise InvalidArgumentError(
                f"ShardingParam axis_sizes {_xs(self._axis_sizes)} make a mesh of "
                f"{math.prod(self._axis_sizes)} devices; the limit is {MAX_MESH_DEVICES}")
        self._order: Optional[np.ndarray] = None

    @property
    def dim_shards(self) -> tuple[int, ...]:
        return self._dim_shards

    @property
    def permutation(self) -> tuple[int, ...]:
        return self._permutation

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        return self._axis_sizes

    @property
    def num_devices(self) -> int:
        return math.prod(self._axis_sizes)

    @property
    def num_shards(self) -> int:
        """The number of distinct tiles: the product of ``dim_shards``."""
        return math.prod(self._dim_shards)

    def verify(self) -> None:
        """Raise InvalidArgumentError unless the parameter is well formed and the tiles can
        be laid over the mesh (IFRT's ``ShardingParam::verify``)."""
        perm, sizes, dims = self._permutation, self._axis_sizes, self._dim_shards
        if len(perm) != len(sizes) or not sizes:
            raise InvalidArgumentError(
                "Expect same non-zero size for `permutation` and `axis_sizes`. Actual "
                f"{len(perm)} vs {len(sizes)}")
        if len(set(perm)) != len(perm):
            raise InvalidArgumentError(f"`permutation` [{_commas(perm)}] has duplicate values")
        for axis in perm:
            if not 0 <= axis < len(sizes):
                raise InvalidArgumentError(
                    f"Out of range axis {axis} to the mesh of [{_commas(perm)}] on {_xs(sizes)}")
        if any(s < 1 for s in sizes) or any(d < 1 for d in dims):
            raise InvalidArgumentError(
                f"dim_shards and axis_sizes must be positive, got {_xs(dims)} on {_xs(sizes)}")
        dim, cum = 0, 1
        for axis in perm:
            while dim < len(dims) and dims[dim] == 1:
                dim += 1
            if dim == len(dims):
                break
            cum *= sizes[axis]
            while dim < len(dims) and cum % dims[dim] == 0:
                cum //= dims[dim]
                dim += 1
        while dim < len(dims) and dims[dim] == 1:
            dim += 1
        if dim != len(dims):
            raise InvalidArgumentError(
                f"Can't shard the dims {_xs(dims)} to the mesh of [{_commas(perm)}] on "
                f"{_xs(sizes)}")

    def device_order(self) -> np.ndarray:
        """IFRT's ``MinorToMajor::ToDeviceList``: the mesh device index at each position.

        Position ``p`` holds tile ``p // replication`` (replication is minor). Read-only.
        """
        if self._order is None:
            k = len(self._axis_sizes)
            ids = np.arange(self.num_devices, dtype=np.int64).reshape(self._axis_sizes[::-1])
            order = ids.transpose([k - 1 - a for a in reversed(self._permutation)]).ravel()
            order.flags.writeable = False
            self._order = order
        return self._order

    def to_device_list(self) -> list[int]:
        """:meth:`device_order` as a list of ints."""
        return self.device_order().tolist()

    def debug_string(self) -> str:
        return (f"{_xs(self._dim_shards)} to [{_commas(self._permutation)}] on "
                f"{_xs(self._axis_sizes)}")

    __str__ = debug_string

    @classmethod
    def parse(cls, text: str) -> ShardingParam:
        """Parse ``"2x1x3 to [1,0] on 2x3"`` (``debug_string`` form)."""
        m = re.fullmatch(r"\s*([\dx]*)\s+to\s+\[([\d,\s]*)\]\s+on\s+([\dx]+)\s*", text)
        if m is None:
            raise InvalidArgumentError(f"Cannot parse ShardingParam from {text!r}")
        dims, perm, sizes = m.groups()
        ints = lambda s, sep: [int(v) for v in s.split(sep) if v.strip()]  # noqa: E731
        return cls(ints(dims, "x"), ints(perm, ","), ints(sizes, "x"))

    def _key(self):
        return (self._dim_shards, self._permutation, self._axis_sizes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardingParam):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((ShardingParam,) + self._key())

    def __repr__(self) -> str:
        return (f"ShardingParam(dim_shards={list(self._dim_shards)}, "
                f"permutation={list(self._permutation)}, axis_sizes={list(self._axis_sizes)})")

    def __reduce__(self):
        return (ShardingParam, self._key())


def _xs(values: Iterable[int]) -> str:
    return "x".join(map(str, values))


def _commas(values: Iterable[int]) -> str:
    return ",".join(map(str, values))


class ShardingParamSharding(Sharding):
    """A :class:`ShardingParam` over devices: ``devices[i]`` is mesh device ``i``.

    Fully replicated iff every ``dim_shards`` entry is 1. Shards must divide the array
    evenly. Raises InvalidArgumentError when the param's device count differs from
    ``len(devices)`` or when ``sharding_param.verify()`` fails.
    """

    __slots__ = ("_param", "_tile_of_device")

    def __init__(self, sharding_param: ShardingParam, devices, memory_kind=None):
        if not isinstance(sharding_param, ShardingParam):
            raise TypeError(f"expected a ShardingParam, got {sharding_param!r}")
        super().__init__(devices, memory_kind, all(s == 1 for s in sharding_param.dim_shards))
        if sharding_param.num_devices != len(self._devices):
            raise InvalidArgumentError(
                f"Device counts don't match. From ShardingParam {sharding_param.num_devices} "
                f"vs from DeviceList {len(self._devices)}")
        sharding_param.verify()
        self._param = sharding_param
        self._tile_of_device: Optional[Sequence[int]] = None

    @property
    def sharding_param(self) -> ShardingParam:
        return self._param

    def shard_shape(self, shape) -> Shape:
        shape = _static_shape(shape, "ShardingParamSharding")
        dim_shards = self._param.dim_shards
        if len(shape) != len(dim_shards):
            raise InvalidArgumentError(
                f"Numbers of dimensions don't match. From Shape {len(shape)} vs from "
                f"ShardingParam {len(dim_shards)}")
        for dim, shards in zip(shape, dim_shards):
            if dim % shards:
                raise InvalidArgumentError(
                    f"Uneven shard is not supported. dim: {dim}, dim_shards: {shards}")
        return _shape_unchecked(tuple(d // s for d, s in zip(shape, dim_shards)))

    def has_same_partitioning(self, other):
        return self is other or (isinstance(other, ShardingParamSharding)
                                 and self._param == other._param)

    def with_device_assignment(self, devices=None, memory_kind=None) -> ShardingParamSharding:
        devices = self._check_device_count(devices)
        return ShardingParamSharding(self._param, self._devices if devices is None else devices,
                                     self._memory_kind if memory_kind is None else memory_kind)

    def disassemble(self, shape, semantics=ALL_SHARDS):
        all_shards = _semantics(semantics)
        return self._even_disassemble(self.shard_shape(shape), all_shards)

    def tile_of_device(self) -> Sequence[int]:
        """For each device position, the index of the tile it holds (cached; a ``range``
        when device ``i`` holds tile ``i``)."""
        if self._tile_of_device is None:
            order = self._param.device_order()
            position = np.empty_like(order)
            position[order] = np.arange(order.size)
            replication = order.size // self._param.num_shards
            self._tile_of_device = _compact((position // replication).tolist())
        return self._tile_of_device

    def index_domains(self, shape, semantics=ALL_SHARDS):
        all_shards = _semantics(semantics)
        shape = _static_shape(shape, "ShardingParamSharding")
        self.shard_shape(shape)  # validates rank and divisibility
        return _tiled_index_domains(shape, self._param.dim_shards, self.tile_of_device(),
                                    self._mask(all_shards))

    def debug_string(self) -> str:
        return (f"ShardingParamSharding({self._param.debug_string()}, devices: "
                f"{self._devices.to_string()}, memory_kind: {self._memory_kind})")

    def _partitioning_key(self):
        return self._param

    def __reduce__(self):
        return (ShardingParamSharding, (self._param, self._devices, self._memory_kind))
