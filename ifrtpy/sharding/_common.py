"""What the shardings of this package share: the shard semantics enum, argument
coercions and the tile math of even and uneven tilings."""

from __future__ import annotations

import enum
import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import Optional, Union

from ifrtpy.device import Device, DeviceList, MemoryKind
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import DynamicShape, IndexDomain, Shape, trusted_shape

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
        pairs = zip(itertools.product(*origins), itertools.repeat(trusted_shape(tuple(sizes))))
    else:
        extents = [[min(s, d - o) for o in os] for d, s, os in zip(dims, sizes, origins)]
        pairs = zip(itertools.product(*origins),
                    map(trusted_shape, itertools.product(*extents)))
    unique = list(map(_make_index_domain, pairs))  # C-level loop: this is the hot path
    if mask is None:
        if tile_of_device == range(len(unique)):  # tile i on device i: no reordering
            return unique
        return list(map(unique.__getitem__, tile_of_device))
    return [unique[t] for t, keep in zip(tile_of_device, mask) if keep]

