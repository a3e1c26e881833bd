"""HloSharding: an XLA ``HloSharding`` (or ``OpSharding`` proto) over a device list.

Mirrors PjRt-IFRT's ``xla_sharding.h``; this is what compiled executables report for
their parameters and outputs. Tile-assignment values are indices into ``devices``.
The XLA object comes from jaxlib (``jaxlib.xla_client.HloSharding`` / ``OpSharding``);
it is read once at construction into plain tuples, and all shard math is pure Python.

Supported kinds: replicated, maximal, manual, unknown, unreduced and tiled (iota or
explicit tile assignments, partial replication via ``last_tile_dim_replicate`` and
subgroups in ``last_tile_dims``, replicated and unreduced). Uneven tiles are
``ceil(dim / tiles)`` long with the last ones clipped, as XLA does. Tuple shardings are
refused.

Unreduced axes (jax's ``P(..., unreduced={...})``, XLA's ``{unreduced}`` and
``last_tile_dims={unreduced}``): each device of an unreduced group holds a buffer of its
tile's shape, but a partial value; the array is the reduction (a sum, or with jaxlib 0.12
a max or min, the OpSharding's ``sdy::reduction_op`` metadata) of the group's buffers. So
for shapes and index domains an unreduced axis is like a replicated one, and such a
sharding is never fully replicated: :attr:`HloSharding.has_unreduced_axes` tells the
operations that read values by index domain (a copy to the host, a put, a reshard) to
refuse it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from ifrtpy import _jaxlib
from ifrtpy.device import Device
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import IndexDomain, Shape, trusted_shape
from ifrtpy.sharding._common import (
    ALL_SHARDS, _as_device_list, _compact, _semantics, _static_shape, _tiled_index_domains,
)
from ifrtpy.sharding.base import Sharding

__all__ = ["HloSharding", "as_xla_hlo_sharding", "check_op_sharding", "check_reduced",
           "same_unreduced"]

# OpSharding.Type numbers (xla_data.proto).
_REPLICATED, _MAXIMAL, _TUPLE, _OTHER, _MANUAL, _UNKNOWN, _UNREDUCED = 0, 1, 2, 3, 4, 5, 6
_TYPE_NAMES = {_REPLICATED: "replicated", _MAXIMAL: "maximal", _MANUAL: "manual",
               _UNKNOWN: "unknown", _OTHER: "tiled", _UNREDUCED: "unreduced"}
#: The types a subgroup of a tiled sharding may have (``last_tile_dims``).
_SUBGROUP_TYPES = (_REPLICATED, _MANUAL, _UNREDUCED)
#: The most tiles a tile assignment may have (XLA counts them in int64).
_MAX_TILES = 2**63 - 1
#: The reductions of unreduced axes, by jaxlib's ``HloSharding.reduction_op()`` number.
REDUCTIONS = ("sum", "max", "min")


def _xla_client():
    return _jaxlib.xla_client()  # jaxlib is imported only when an HloSharding needs it


def as_xla_hlo_sharding(value: Any) -> Any:
    """``value`` (a jaxlib HloSharding, OpSharding or HLO sharding text) as a jaxlib
    HloSharding in tile-assignment form, the form ifrtpy's sharding math reads; TypeError
    for anything else, XLA's own error for text it cannot parse."""
    xc = _xla_client()
    if isinstance(value, xc.HloSharding):
        sharding = value
    elif isinstance(value, xc.OpSharding):
        check_op_sharding(value)
        sharding = xc.HloSharding.from_proto(value)
    elif isinstance(value, str):
        sharding = xc.HloSharding.from_string(value)
    else:
        raise TypeError(f"expected an xla HloSharding, OpSharding or sharding string, got {value!r}")
    return _jaxlib.tile_form(sharding)


def check_op_sharding(proto: Any, max_tiles: Optional[int] = None) -> None:
    """InvalidArgumentError naming the field unless ``proto`` (an ``xla.OpSharding``) is a
    sharding jaxlib's reader takes safely: it trusts these fields, and an out-of-range
    transpose permutation, subgroup type or tile count aborts the process, reads out of
    bounds or allocates without bound. ``max_tiles``: the most tiles its tile assignment
    may have (a server passes the number of devices it was given).

    The mesh-based form (``named_sharding``, which jaxlib 0.12 writes into compiled
    modules) is not checked here: ifrtpy reads it only from jaxlib's own objects."""
    try:
        kind = int(proto.type)
        subgroups = [int(t) for t in proto.last_tile_dims]
    except ValueError as error:  # jaxlib's OpSharding cannot even read an unknown enum value
        raise InvalidArgumentError(f"an OpSharding holds a type XLA does not have: {error}") from None
    if kind == _TUPLE:
        for element in proto.tuple_shardings:
            check_op_sharding(element, max_tiles)
        return
    if kind not in _TYPE_NAMES:
        raise InvalidArgumentError(
            f"OpSharding type {kind} is none of XLA's ({_TUPLE} tuple, "
            f"{', '.join(f'{t} {name}' for t, name in sorted(_TYPE_NAMES.items()))})")
    devices = [int(d) for d in proto.tile_assignment_devices]
    if kind == _MAXIMAL and (len(devices) != 1 or devices[0] < 0):
        raise InvalidArgumentError(
            f"a maximal OpSharding names one device in tile_assignment_devices, not {devices}")
    if kind != _OTHER:
        return
    dims = [int(d) for d in proto.tile_assignment_dimensions]
    if not dims or min(dims) < 1:
        raise InvalidArgumentError(
            f"OpSharding tile_assignment_dimensions {dims} must be one or more positive ints")
    tiles = math.prod(dims)
    limit = _MAX_TILES if max_tiles is None else min(max_tiles, _MAX_TILES)
    if tiles > limit:
        raise InvalidArgumentError(
            f"OpSharding tile_assignment_dimensions {dims} make {tiles} tiles; at most {limit}")
    reshape = [int(d) for d in proto.iota_reshape_dims]
    perm = [int(p) for p in proto.iota_transpose_perm]
    if reshape:
        if devices:
            raise InvalidArgumentError(
                "an OpSharding sets both iota_reshape_dims and tile_assignment_devices")
        if sorted(perm) != list(range(len(reshape))):
            raise InvalidArgumentError(
                f"OpSharding iota_transpose_perm {perm} is not a permutation of the "
                f"{len(reshape)} iota_reshape_dims {reshape}")
        if min(reshape) < 1 or math.prod(reshape) != tiles:
            raise InvalidArgumentError(
                f"OpSharding iota_reshape_dims {reshape} must be positive and make the {tiles} "
                f"tiles of tile_assignment_dimensions {dims}")
    elif perm:
        raise InvalidArgumentError("an OpSharding sets iota_transpose_perm without iota_reshape_dims")
    elif len(devices) != tiles or min(devices) < 0:
        raise InvalidArgumentError(
            f"OpSharding tile_assignment_devices must name {tiles} devices (>= 0) for "
            f"tile_assignment_dimensions {dims}, not {len(devices)}: {devices[:16]}")
    if subgroups and proto.replicate_on_last_tile_dim:
        raise InvalidArgumentError(
            "an OpSharding sets both last_tile_dims and replicate_on_last_tile_dim")
    if len(subgroups) > len(dims) or any(t not in _SUBGROUP_TYPES for t in subgroups):
        raise InvalidArgumentError(
            f"OpSharding last_tile_dims {subgroups} must be at most {len(dims)} types (one per "
            f"tile_assignment_dimension) of "
            f"{', '.join(f'{t} {_TYPE_NAMES[t]}' for t in _SUBGROUP_TYPES)}")


class HloSharding(Sharding):
    """An XLA HloSharding over ``devices`` (``xla_hlo_sharding`` may also be an OpSharding
    or the HLO text form, e.g. ``"{devices=[2,3]<=[6]}"``).

    Fully replicated for replicated shardings, maximal shardings on one device, and tiled
    shardings whose data dims are all 1 with only replicated subgroups. Index domains of
    maximal shardings are the whole array on every device (as in IFRT); manual and unknown
    shardings have none. Unreduced axes are like replicated ones for shapes and index
    domains (see the module's docstring); ``reduction`` ("sum", "max" or "min") names how
    their partial values combine where the HLO text cannot say it (it has no form for it),
    e.g. ``HloSharding(devices, "{unreduced}", reduction="max")`` (jaxlib 0.12); by default
    it is the one ``xla_hlo_sharding`` carries (a sum from text).
    """

    __slots__ = ("_xla", "_kind", "_tile_dims", "_data_rank", "_subgroup_types",
                 "_assignment", "_text", "_tile_of_device", "_reduction")

    def __init__(self, devices, xla_hlo_sharding: Any, memory_kind=None, *,
                 reduction: Optional[str] = None):
        devices = _as_device_list(devices)
        xla = as_xla_hlo_sharding(xla_hlo_sharding)
        proto = xla.to_proto()
        kind = int(proto.type)
        if kind not in _TYPE_NAMES:
            raise InvalidArgumentError(f"HloSharding does not support the sharding {xla}")
        tile_dims: tuple[int, ...] = ()
        subgroups: tuple[int, ...] = ()
        assignment: tuple[int, ...] = ()
        if kind in (_OTHER, _MAXIMAL):
            assignment = tuple(xla.tile_assignment_devices())
        if kind == _OTHER:
            tile_dims = tuple(xla.tile_assignment_dimensions())
            if xla.replicate_on_last_tile_dim():
                subgroups = (_REPLICATED,)
            else:
                subgroups = tuple(int(t) for t in xla.subgroup_types())
        self._xla = xla
        self._kind = kind
        self._tile_dims = tile_dims
        self._data_rank = len(tile_dims) - len(subgroups)
        self._subgroup_types = subgroups
        self._assignment = assignment
        self._text = str(xla)
        self._tile_of_device: Optional[Sequence[int]] = None
        self._reduction: Optional[str] = None
        if kind == _UNREDUCED or _UNREDUCED in subgroups:
            self._set_reduction(reduction)
        elif reduction is not None:
            raise InvalidArgumentError(
                f"HloSharding reduction={reduction!r} needs unreduced axes; the sharding "
                f"{self._text} has none")
        super().__init__(devices, memory_kind, self._compute_fully_replicated(len(devices)))

    def _set_reduction(self, reduction: Optional[str]) -> None:
        """The reduction of the unreduced axes: ``reduction`` (checked, and written into
        the jaxlib sharding), else the one the jaxlib sharding carries."""
        if reduction is None:
            op = _jaxlib.reduction_op(self._xla) or 0
            if op >= len(REDUCTIONS):
                raise InvalidArgumentError(
                    f"HloSharding {self._text} has reduction op {op}; ifrtpy knows "
                    f"{', '.join(f'{i} ({r})' for i, r in enumerate(REDUCTIONS))}")
            self._reduction = REDUCTIONS[op]
            return
        if reduction not in REDUCTIONS:
            raise InvalidArgumentError(
                f"HloSharding reduction must be one of {', '.join(map(repr, REDUCTIONS))}, "
                f"got {reduction!r}")
        self._xla = _jaxlib.with_reduction_op(self._xla, REDUCTIONS.index(reduction))
        self._reduction = reduction

    @property
    def unreduced_group_size(self) -> int:
        """How many devices hold partial values of each element (1 without unreduced
        axes)."""
        if self._kind == _UNREDUCED:
            return len(self._devices)
        return self._unreduced_group_size()

    def _unreduced_group_size(self) -> int:
        """Of a tiled sharding: how many devices hold the partial values of each element
        (1 without unreduced subgroups)."""
        return math.prod(n for n, t in zip(self._tile_dims[self._data_rank:], self._subgroup_types)
                         if t == _UNREDUCED)

    def _compute_fully_replicated(self, num_devices: int) -> bool:
        if self._kind == _REPLICATED:
            return True
        if self._kind in (_MAXIMAL, _UNREDUCED):
            return num_devices == 1  # an unreduced group of one device holds the whole value
        if self._kind == _OTHER:
            return (math.prod(self._tile_dims[:self._data_rank]) == 1
                    and all(t == _REPLICATED or (t == _UNREDUCED and n == 1)
                            for n, t in zip(self._tile_dims[self._data_rank:],
                                            self._subgroup_types)))
        return False

    @property
    def has_unreduced_axes(self) -> bool:
        """Whether the devices of some group (more than one device) each hold a partial
        value of the same elements, which ``reduction`` combines."""
        if self._kind == _UNREDUCED:
            return len(self._devices) > 1
        return self._reduction is not None and self._unreduced_group_size() > 1

    def unreduced_groups(self) -> frozenset[frozenset[Device]]:
        """The groups of devices whose partial values ``reduction`` combines (each holds
        the same index domain); empty without unreduced axes."""
        if not self.has_unreduced_axes:
            return frozenset()
        if self._kind == _UNREDUCED:
            return frozenset([frozenset(self._devices)])
        grid = np.asarray(self._assignment, dtype=np.int64).reshape(self._tile_dims)
        axes = [self._data_rank + i for i, t in enumerate(self._subgroup_types) if t == _UNREDUCED]
        rows = np.moveaxis(grid, axes, range(grid.ndim - len(axes), grid.ndim)).reshape(
            -1, self._unreduced_group_size())
        devices = self._devices
        return frozenset(frozenset(devices[int(p)] for p in row) for row in rows)

    @property
    def reduction(self) -> Optional[str]:
        """How the partial values of unreduced axes combine ("sum", "max", "min"); None
        for a sharding without unreduced axes."""
        return self._reduction

    @property
    def xla_hlo_sharding(self):
        """The jaxlib ``HloSharding``."""
        return self._xla

    @property
    def op_sharding(self):
        """The jaxlib ``OpSharding`` proto."""
        return self._xla.to_proto()

    # -- shapes --------------------------------------------------------------------------

    def _is_tiled(self) -> bool:
        return self._kind == _OTHER

    def _data_tiles(self) -> tuple[int, ...]:
        return self._tile_dims[:self._data_rank]

    def shard_shape(self, shape) -> Shape:
        shape = _static_shape(shape, "HloSharding")
        if not self._is_tiled():
            return shape
        num_tiles = math.prod(self._tile_dims)
        if num_tiles != len(self._devices):
            raise InvalidArgumentError(
                f"sharding's tile count and device count does not match: {num_tiles} vs. "
                f"{len(self._devices)}; shape={shape.debug_string()}, sharding={self._text}")
        if len(shape) != self._data_rank:
            raise InvalidArgumentError(
                f"Numbers of dimensions don't match. From Shape {len(shape)} vs from "
                f"HloSharding {self._data_rank}")
        return trusted_shape(tuple(-(-d // t) for d, t in zip(shape, self._data_tiles())))

    def _check_rank(self, shape: Shape) -> None:
        if len(shape) != self._data_rank:
            raise InvalidArgumentError(
                f"shape must have {self._data_rank} dimensions, but has {len(shape)} "
                f"dimensions: shape={shape.debug_string()}, sharding={self._text}")

    def disassemble(self, shape, semantics=ALL_SHARDS):
        all_shards = _semantics(semantics)
        shape = _static_shape(shape, "HloSharding")
        if self._is_tiled():
            self._check_rank(shape)
            if any(d % t for d, t in zip(shape, self._data_tiles())):
                domains = self.index_domains(shape, ALL_SHARDS)
                shards = self._single_device_shardings(True)
                mask = self._mask(all_shards) or (True,) * len(shards)
                return [(dom.shape, s) for dom, s, keep in zip(domains, shards, mask) if keep]
        return self._even_disassemble(self.shard_shape(shape), all_shards)

    def tile_of_device(self) -> Sequence[int]:
        """For each device position, the (row-major) data tile it holds (cached)."""
        if self._tile_of_device is None:
            n = len(self._devices)
            if len(self._assignment) != n:
                raise InvalidArgumentError(
                    "sharding's tile_assignment_devices and device count does not match: "
                    f"{len(self._assignment)} vs. {n}; sharding={self._text}")
            assignment = np.asarray(self._assignment, dtype=np.int64)
            bad = assignment[(assignment < 0) | (assignment >= n)]
            if bad.size:
                raise InvalidArgumentError(
                    f"Out of range device id in device_assignment: {int(bad[0])}; valid range: "
                    f"[0, {n})")
            replicas = math.prod(self._tile_dims[self._data_rank:])
            tiles = np.full(n, -1, dtype=np.int64)
            tiles[assignment] = np.arange(n) // replicas
            if (tiles < 0).any():
                raise InvalidArgumentError(
                    f"tile assignment {self._text} does not use every one of the {n} devices")
            self._tile_of_device = _compact(tiles.tolist())
        return self._tile_of_device

    def index_domains(self, shape, semantics=ALL_SHARDS):
        all_shards = _semantics(semantics)
        shape = _static_shape(shape, "HloSharding")
        if self._kind in (_MANUAL, _UNKNOWN):
            raise InvalidArgumentError(
                f"{_TYPE_NAMES[self._kind].capitalize()} sharding does not support IndexDomains")
        if not self._is_tiled():  # replicated or maximal: the whole array everywhere
            devices = self._devices if all_shards else self._devices.addressable_device_list()
            count = len(devices)
            return [IndexDomain(shape)] * count
        tile_of_device = self.tile_of_device()
        self._check_rank(shape)
        return _tiled_index_domains(shape, self._data_tiles(), tile_of_device,
                                    self._mask(all_shards))

    # -- identity ------------------------------------------------------------------------

    def has_same_partitioning(self, other):
        return self is other or (isinstance(other, HloSharding)
                                 and len(self._devices) == len(other._devices)
                                 and self._partitioning_key() == other._partitioning_key())

    def with_device_assignment(self, devices=None, memory_kind=None) -> HloSharding:
        devices = self._check_device_count(devices)
        return HloSharding(self._devices if devices is None else devices, self._xla,
                           self._memory_kind if memory_kind is None else memory_kind)

    def _partitioning_key(self):
        return (self._kind, self._tile_dims, self._data_rank, self._subgroup_types,
                self._assignment, self._reduction)

    def debug_string(self) -> str:
        reduction = "" if self._reduction in (None, "sum") else f", reduction: {self._reduction}"
        return (f"HloSharding(memory_kind: {self._memory_kind}, hlo_sharding: "
                f"{self._text}{reduction})")

    def __reduce__(self):
        return (_hlo_sharding_from_text,
                (self._devices, self._text, self._memory_kind, self._reduction))


def _hlo_sharding_from_text(devices, text: str, memory_kind, reduction=None) -> HloSharding:
    return HloSharding(devices, text, memory_kind, reduction=reduction)


def check_reduced(sharding: Sharding, what: str,
                  instead: str = "Reduce them in a program first (jax: jax.sharding.reshard(x, "
                                 "P(...)) inside jit, or an output sharding without unreduced "
                                 "axes)") -> None:
    """InvalidArgumentError naming ``what`` (an operation that reads or writes shards as
    the array's values, by index domain) when ``sharding`` has unreduced axes: its shards
    hold partial values, and taking one as the array's would be silently wrong. The
    message ends with ``instead``, what to do."""
    if not sharding.has_unreduced_axes:
        return
    size = sharding.unreduced_group_size if isinstance(sharding, HloSharding) else "several"
    reduction = sharding.reduction if isinstance(sharding, HloSharding) else None
    raise InvalidArgumentError(
        f"{what}: {sharding!r} has unreduced axes: each group of {size} of its "
        f"{len(sharding.devices)} devices holds partial values of the same elements (the "
        f"array is their {reduction or 'reduction'}), which cannot be read or written as "
        f"the array's values. {instead}")


def same_unreduced(a: Sharding, b: Sharding) -> bool:
    """Whether arrays of shardings ``a`` and ``b`` that put the same index domains on each
    device also hold the same values there: neither has unreduced axes, or both reduce
    the same groups of devices the same way. (A replicated array passed where a program
    takes unreduced partial values would be summed over each group: silently wrong.)"""
    if not (a.has_unreduced_axes or b.has_unreduced_axes):
        return True
    return (isinstance(a, HloSharding) and isinstance(b, HloSharding)
            and a.has_unreduced_axes and b.has_unreduced_axes and a.reduction == b.reduction
            and a.unreduced_groups() == b.unreduced_groups())
