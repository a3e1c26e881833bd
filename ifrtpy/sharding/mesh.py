"""Mesh, PartitionSpec and NamedSharding: JAX-style shardings over named mesh axes.

A :class:`NamedSharding` is a convenience over :class:`~ifrtpy.sharding.ShardingParamSharding`:
for an array of rank ``r`` it lowers to one (:meth:`NamedSharding.lower`), and every
operation is delegated to that lowering. Its devices are ``mesh.devices`` in row-major
order, and the index domains are the ones ``jax.sharding.NamedSharding`` gives for the
same mesh and spec.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Optional, Union

import numpy as np

from ifrtpy.device import Device, DeviceList, MemoryKind, device_tuple
from ifrtpy.errors import InvalidArgumentError, invalid_argument
from ifrtpy.sharding._common import ALL_SHARDS, _static_shape
from ifrtpy.sharding.base import Sharding
from ifrtpy.sharding.param import ShardingParam, ShardingParamSharding
from ifrtpy.shape import Shape

__all__ = ["Mesh", "PartitionSpec", "NamedSharding", "named_sharding_like"]


class Mesh:
    """An n-d array of devices with one name per axis.

    ``devices`` is anything ``np.array`` turns into an object array of devices;
    ``axis_names`` has one distinct string per dimension. ``shape`` maps names to sizes;
    ``device_list`` is the devices in row-major order.
    """

    __slots__ = ("_devices", "_axis_names", "_device_list", "_hash")

    def __init__(self, devices: Union[np.ndarray, Sequence], axis_names: Union[str, Iterable[str]]):
        if isinstance(devices, DeviceList):
            devices = list(devices)
        try:
            arr = np.empty(np.shape(devices), dtype=object) if not isinstance(devices, np.ndarray) \
                else np.empty(devices.shape, dtype=object)
            arr[...] = devices
        except ValueError:  # ragged nesting
            raise invalid_argument("Mesh devices", "an n-d array of Devices", devices) from None
        names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        if any(not isinstance(n, str) for n in names):
            raise InvalidArgumentError(f"Mesh axis names must be strings, got {names!r}")
        if arr.ndim != len(names):
            raise InvalidArgumentError(
                f"Mesh devices have {arr.ndim} dimensions {arr.shape} but {len(names)} axis "
                f"names {names} were given")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"Mesh axis names must be distinct, got {names}")
        if arr.size == 0:
            raise InvalidArgumentError(f"Mesh needs at least one device, got shape {arr.shape}")
        arr.flags.writeable = False
        self._devices = arr
        self._axis_names = names
        self._device_list = DeviceList(device_tuple(arr.flat, "Mesh devices"))
        self._device_list.check_distinct("Mesh devices")
        self._hash: Optional[int] = None

    @property
    def devices(self) -> np.ndarray:
        """The read-only object array of devices."""
        return self._devices

    @property
    def axis_names(self) -> tuple[str, ...]:
        return self._axis_names

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        return self._devices.shape

    @property
    def shape(self) -> dict[str, int]:
        """Axis name -> size, in axis order."""
        return dict(zip(self._axis_names, self._devices.shape))

    @property
    def size(self) -> int:
        return self._devices.size

    @property
    def device_list(self) -> DeviceList:
        """The devices in row-major order (the NamedSharding's devices)."""
        return self._device_list

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Mesh):
            return NotImplemented
        return (self._axis_names == other._axis_names
                and self._devices.shape == other._devices.shape
                and self._device_list == other._device_list)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((Mesh, self._axis_names, self._devices.shape, self._device_list))
        return self._hash

    def __repr__(self) -> str:
        return f"Mesh({self._devices.tolist()!r}, {self._axis_names!r})"

    def __reduce__(self):
        return (Mesh, (self._devices.tolist(), self._axis_names))


class PartitionSpec(tuple):
    """Per array dimension: ``None`` (not sharded), a mesh axis name, or a tuple of names
    (sharded over their product, the first name major). Missing trailing entries mean
    ``None``. ``PartitionSpec("x", None, ("y", "z"))``.
    """

    __slots__ = ()

    def __new__(cls, *partitions: Union[None, str, Sequence[str]]) -> PartitionSpec:
        return tuple.__new__(cls, map(_normalize_entry, partitions))

    def __repr__(self) -> str:
        return f"PartitionSpec({', '.join(map(repr, self))})"

    def __reduce__(self):
        return (PartitionSpec, tuple(self))


def _normalize_entry(entry):
    if entry is None or isinstance(entry, str):
        return entry
    if isinstance(entry, (tuple, list)) and all(isinstance(e, str) for e in entry):
        return tuple(entry) if entry else None
    raise TypeError(f"PartitionSpec entries must be None, a str or a tuple of str, got {entry!r}")


def _axes(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else entry


def lower_to_sharding_param(axis_names: Sequence[str], axis_sizes: Sequence[int],
                            spec: Sequence, ndim: int) -> ShardingParam:
    """The ShardingParam that places tiles as ``spec`` does on a row-major mesh.

    Tiles are enumerated over the sharded mesh axes in spec order (the first one major),
    the unused mesh axes become replication (minor). The ShardingParam's mesh axis ``j``
    is mesh axis ``k - 1 - j``, so the device index is the row-major mesh position.
    """
    position = {name: i for i, name in enumerate(axis_names)}
    entries = tuple(spec) + (None,) * (ndim - len(spec))
    dim_shards, major_to_minor = [], []
    for entry in entries:
        axes = [position[a] for a in _axes(entry)]
        dim_shards.append(math.prod(axis_sizes[a] for a in axes))
        major_to_minor.extend(axes)
    used = set(major_to_minor)
    major_to_minor.extend(i for i in range(len(axis_sizes)) if i not in used)
    k = len(axis_sizes)
    if k == 0:
        return ShardingParam(dim_shards, [0], [1])
    return ShardingParam(dim_shards, [k - 1 - i for i in reversed(major_to_minor)],
                         list(axis_sizes)[::-1])


class NamedSharding(Sharding):
    """A :class:`PartitionSpec` over a :class:`Mesh`. Devices: ``mesh.device_list``.

    Raises InvalidArgumentError when the spec names an axis that is not in the mesh or
    uses an axis twice, or (at use) when the array has fewer dims than the spec.
    ``has_same_partitioning`` (and so ``==``) holds only between NamedShardings, and
    treats ``P("x")`` and ``P("x", None)`` alike; compare with a ShardingParamSharding
    through :meth:`lower`.
    """

    __slots__ = ("_mesh", "_spec", "_lowered")

    def __init__(self, mesh: Mesh, spec: Union[PartitionSpec, Sequence] = PartitionSpec(),
                 memory_kind: Union[MemoryKind, str, None] = None):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"expected a Mesh, got {mesh!r}")
        spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec(*spec)
        seen: set[str] = set()
        for entry in spec:
            for axis in _axes(entry):
                if axis not in mesh.axis_names:
                    raise InvalidArgumentError(
                        f"PartitionSpec {spec!r} names axis {axis!r}, which is not in the mesh "
                        f"axes {mesh.axis_names}")
                if axis in seen:
                    raise InvalidArgumentError(
                        f"PartitionSpec {spec!r} uses mesh axis {axis!r} more than once")
                seen.add(axis)
        sizes = mesh.shape
        super().__init__(mesh.device_list, memory_kind, all(sizes[a] == 1 for a in seen))
        self._mesh = mesh
        self._spec = spec
        self._lowered: dict[int, ShardingParamSharding] = {}

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def spec(self) -> PartitionSpec:
        return self._spec

    def lower(self, ndim: Optional[int] = None) -> ShardingParamSharding:
        """The equivalent ShardingParamSharding for arrays of rank ``ndim`` (default: the
        spec's length). Cached."""
        ndim = len(self._spec) if ndim is None else ndim
        lowered = self._lowered.get(ndim)
        if lowered is None:
            if ndim < len(self._spec):
                raise InvalidArgumentError(
                    f"PartitionSpec {self._spec!r} has {len(self._spec)} entries, but the array "
                    f"has rank {ndim}")
            param = lower_to_sharding_param(self._mesh.axis_names, self._mesh.axis_sizes,
                                            self._spec, ndim)
            lowered = ShardingParamSharding(param, self._devices, self._memory_kind)
            self._lowered[ndim] = lowered
        return lowered

    @property
    def sharding_param(self) -> ShardingParam:
        """The ShardingParam for rank ``len(spec)``."""
        return self.lower().sharding_param

    def shard_shape(self, shape):
        return self._on_lowered("shard_shape", shape)

    def disassemble(self, shape, semantics=ALL_SHARDS):
        return self._on_lowered("disassemble", shape, semantics)

    def index_domains(self, shape, semantics=ALL_SHARDS):
        return self._on_lowered("index_domains", shape, semantics)

    def _on_lowered(self, method: str, shape, *args):
        """The lowered sharding's ``method`` for ``shape``; its errors about the shape
        said in this sharding's terms (:meth:`_explained`)."""
        shape = _static_shape(shape, "NamedSharding")
        lowered = self.lower(len(shape))
        try:
            return getattr(lowered, method)(shape, *args)
        except InvalidArgumentError as e:
            raise self._explained(shape, e) from None

    def _explained(self, shape: Shape, error: InvalidArgumentError) -> InvalidArgumentError:
        """``error`` of the lowered sharding, said in this sharding's terms where a
        dimension does not divide into its shards: which one, over which mesh axes, and
        the fix."""
        dim_shards = self.lower(len(shape)).sharding_param.dim_shards
        for axis, (dim, shards) in enumerate(zip(shape, dim_shards)):
            if dim % shards:
                sizes = self._mesh.shape
                entry = self._spec[axis]
                over = " x ".join(f"{a!r} ({sizes[a]})" for a in _axes(entry))
                return InvalidArgumentError(
                    f"{self!r} splits dimension {axis} of an array of shape "
                    f"{shape.debug_string()} over mesh axes {over} (spec entry {axis}: "
                    f"{entry!r}) into {shards} shards, but {dim} is not a multiple of "
                    f"{shards}: pad the array to a multiple of {shards} along dimension "
                    f"{axis}, or split it over other axes (None leaves it whole)")
        return error

    def has_same_partitioning(self, other):
        return self is other or (isinstance(other, NamedSharding)
                                 and self._partitioning_key() == other._partitioning_key())

    def with_device_assignment(self, devices: Union[DeviceList, Iterable[Device], None] = None,
                               memory_kind=None) -> NamedSharding:
        devices = self._check_device_count(devices)
        mesh = self._mesh
        if devices is not None:
            arr = np.empty(len(devices), dtype=object)
            arr[:] = list(devices)
            mesh = Mesh(arr.reshape(mesh.axis_sizes), mesh.axis_names)
        return NamedSharding(mesh, self._spec,
                             self._memory_kind if memory_kind is None else memory_kind)

    def _partitioning_key(self):
        param = self.sharding_param
        dims = list(param.dim_shards)
        while dims and dims[-1] == 1:  # P("x") and P("x", None) partition alike
            dims.pop()
        return (tuple(dims), param.permutation, param.axis_sizes)

    def debug_string(self) -> str:
        return (f"NamedSharding(mesh={self._mesh.shape}, spec={self._spec!r}, "
                f"memory_kind={self._memory_kind})")

    def __reduce__(self):
        return (NamedSharding, (self._mesh, self._spec, self._memory_kind))


def named_sharding_like(sharding: Sharding, mesh: Mesh, shape: Sequence[int]
                        ) -> Optional[NamedSharding]:
    """The NamedSharding over ``mesh`` that puts every element of an array of ``shape`` on
    the devices ``sharding`` puts it on (its memory kind too), or None where there is
    none (other devices, a tiling no spec over ``mesh`` gives, uneven or empty dims,
    unreduced axes: a spec here has no form for partial values).

    How jax names a compiled program's output shardings after its inputs' mesh: the spec is
    read from the index domains (each mesh axis, stepped once, moves the shards along one
    dimension by a whole number of shards, or not at all) and then checked domain by
    domain.
    """
    shape = _static_shape(shape, "named_sharding_like")
    if sharding.has_unreduced_axes:
        return None
    if set(sharding.devices) != set(mesh.device_list) or len(sharding.devices) != mesh.size:
        return None
    try:
        held = dict(zip(sharding.devices, sharding.index_domains(shape, ALL_SHARDS)))
    except InvalidArgumentError:
        return None
    grid = mesh.devices
    origin, extent = held[grid[(0,) * grid.ndim]]
    if any(origin) or 0 in extent:
        return None
    strides: dict[int, list[tuple[int, str]]] = {}  # dim -> (stride in shards, axis)
    for k, (name, size) in enumerate(zip(mesh.axis_names, mesh.axis_sizes)):
        if size == 1:
            continue
        step = [0] * grid.ndim
        step[k] = 1
        moved = [o for o in held[grid[tuple(step)]][0]]
        dims = [i for i, o in enumerate(moved) if o]
        if not dims:
            continue  # a replicating axis
        if len(dims) > 1 or moved[dims[0]] % extent[dims[0]]:
            return None
        strides.setdefault(dims[0], []).append((moved[dims[0]] // extent[dims[0]], name))
    spec: list = [None] * len(shape)
    for dim, axes in strides.items():
        axes.sort(reverse=True)  # the major axis takes the largest stride
        names = tuple(name for _, name in axes)
        spec[dim] = names[0] if len(names) == 1 else names
    try:
        named = NamedSharding(mesh, PartitionSpec(*spec), sharding.memory_kind)
        same = dict(zip(named.devices, named.index_domains(shape, ALL_SHARDS))) == held
    except InvalidArgumentError:
        return None
    return named if same else None
