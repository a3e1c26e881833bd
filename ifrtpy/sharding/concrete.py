"""Shardings given by their shard shapes: ConcreteSharding (any shapes and index
domains) and ConcreteEvenSharding (one shard shape for all)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Optional, Union


from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import DynamicShape, IndexDomain, Shape
from ifrtpy.sharding._common import (
    ADDRESSABLE_SHARDS, ALL_SHARDS, AnyShape, _as_shape, _semantics, _static_shape,
)
from ifrtpy.sharding.base import Sharding

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
                         domains: Sequence[IndexDomain]) -> None:
    """Each domain lies inside ``shape`` and has its shard's shape; distinct domains do not
    overlap (equal ones are replicas)."""
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


def _check_covered(shape: Shape, domains: Sequence[IndexDomain]) -> None:
    """Checked domains (inside ``shape``, equal or disjoint) leave no element of ``shape``
    without a shard."""
    covered = sum(d[1].num_elements() for d in set(domains))
    if covered != shape.num_elements():
        raise InvalidArgumentError(
            f"ConcreteSharding index domains cover {covered} of the {shape.num_elements()} "
            f"elements of {shape.debug_string()}: an array needs a shard for every element")


class ConcreteSharding(Sharding):
    """Explicit, possibly uneven, shard shapes: ``shard_shapes[i]`` is the shape of the
    shard on the i-th *addressable* device. ``shape`` and ``shard_shapes`` are either all
    static or all :class:`DynamicShape`. Optional ``index_domains`` (static shapes only)
    give each addressable shard's box. Never fully replicated.

    As in IFRT, the shapes and domains are taken as given when the sharding is built (it
    can be built, compared and given other devices whatever they say) and checked where
    data would follow them: :meth:`disassemble` checks that each shard shape fits
    ``shape``; :meth:`index_domains` that each domain lies inside ``shape``, has its
    shard's shape and is equal to or disjoint from the others; and
    :meth:`check_array_shape` (an array being made: a put, an assemble, a reshard
    target) also that, where every device is addressable, the domains cover ``shape``.
    """

    __slots__ = ("_shape", "_shard_shapes", "_index_domains", "_fixed_shard_shape",
                 "_domains_checked")

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
        self._shape = shape
        self._shard_shapes = shard_shapes
        self._index_domains = index_domains
        self._domains_checked = False
        same = not dynamic and shard_shapes and all(s == shard_shapes[0] for s in shard_shapes)
        self._fixed_shard_shape = shard_shapes[0] if same else None

    @property
    def shape(self) -> Union[Shape, DynamicShape]:
        return self._shape

    @property
    def shard_shapes(self) -> tuple[Union[Shape, DynamicShape], ...]:
        return self._shard_shapes

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
        self._check_shard_shapes()
        return list(zip(self._shard_shapes, self._single_device_shardings(False)))

    def index_domains(self, shape, semantics=ALL_SHARDS):
        all_shards = _semantics(semantics)
        if self._index_domains is None:
            raise InvalidArgumentError("ConcreteSharding does not have index domain information")
        self._check_addressable_count(len(self._index_domains), "index domains", all_shards)
        if not self._domains_checked:
            _check_index_domains(self._shape, self._shard_shapes, self._index_domains)
            self._domains_checked = True
        return list(self._index_domains)

    def check_array_shape(self, shape):
        self.disassemble(shape, ADDRESSABLE_SHARDS)
        if self._index_domains is not None and self._devices.is_fully_addressable:
            _check_covered(self._shape, self.index_domains(shape))

    def _check_shard_shapes(self) -> None:
        for i, shard_shape in enumerate(self._shard_shapes):
            _check_shard_shape(self._shape, shard_shape, f"ConcreteSharding shard_shapes[{i}]")

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
    domains (but for a fully replicated one: the whole array on every device);
    ``is_fully_replicated`` is given by the creator.

    As in IFRT, ``shape``, ``shard_shape`` and ``is_fully_replicated`` are taken as given
    when the sharding is built, and checked where data would follow them
    (:meth:`disassemble`, :meth:`index_domains`, :meth:`check_array_shape`): the shard
    fits ``shape``, a fully replicated shard is the whole ``shape``, and the shards
    together have room for every element.
    """

    __slots__ = ("_shape", "_shard_shape")

    def __init__(self, devices, shape: AnyShape, shard_shape: AnyShape,
                 is_fully_replicated: bool = False, memory_kind=None):
        super().__init__(devices, memory_kind, is_fully_replicated)
        self._shape = Shape(shape)
        self._shard_shape = Shape(shard_shape)

    def _check_consistent(self) -> None:
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

    def _checked_shape(self, shape: AnyShape) -> Shape:
        """``shape``, which must be the sharding's, once the sharding is consistent."""
        shape = _static_shape(shape, "ConcreteEvenSharding")
        if shape != self._shape:
            raise InvalidArgumentError(
                f"ConcreteEvenSharding can only disassemble shape {self._shape.debug_string()}, "
                f"but was asked to disassemble shape {shape.debug_string()}")
        self._check_consistent()
        return shape

    def disassemble(self, shape, semantics=ALL_SHARDS):
        all_shards = _semantics(semantics)
        self._checked_shape(shape)
        return self._even_disassemble(self._shard_shape, all_shards)

    def index_domains(self, shape, semantics=ALL_SHARDS):
        """The whole array on each device of a fully replicated sharding (as IFRT)."""
        all_shards = _semantics(semantics)
        if not self._is_fully_replicated:
            raise InvalidArgumentError(
                "ConcreteEvenSharding does not have index domain information")
        whole = IndexDomain(self._checked_shape(shape))
        return [whole] * len(self._single_device_shardings(all_shards))

    def check_array_shape(self, shape):
        self.disassemble(shape, ADDRESSABLE_SHARDS)

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


