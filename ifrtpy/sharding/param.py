"""IFRT's ShardingParam (dims split over a device mesh) and the sharding made of one."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Optional

import numpy as np

from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import Shape, int_tuple, trusted_shape
from ifrtpy.sharding._common import (
    ALL_SHARDS, _compact, _semantics,
    _static_shape, _tiled_index_domains,
)
from ifrtpy.sharding.base import Sharding

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
        self._dim_shards = int_tuple(dim_shards, "ShardingParam dim_shards")
        self._permutation = int_tuple(permutation, "ShardingParam permutation")
        self._axis_sizes = int_tuple(axis_sizes, "ShardingParam axis_sizes")
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
        for axis, (dim, shards) in enumerate(zip(shape, dim_shards)):
            if dim % shards:
                raise InvalidArgumentError(
                    f"Uneven shard is not supported. dim: {dim}, dim_shards: {shards} "
                    f"(dimension {axis} of shape {shape.debug_string()} is split into {shards} "
                    f"shards: its size must be a multiple of {shards})")
        return trusted_shape(tuple(d // s for d, s in zip(shape, dim_shards)))

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
