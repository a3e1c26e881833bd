"""IFRT serdes on the wire: dtypes, shapes, shardings, layouts, statuses and attributes,
between the protocol's messages and ifrtpy's value types.

Shardings arrive as ``Serialized{type_name, data}``; the server reads IFRT's single-device,
HLO, opaque, concrete and concrete-even forms and answers in the single-device or HLO
form (tile-assignment OpShardings: the 0.12 client aborts on mesh-based ones).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ifrtpy import _jaxlib
from ifrtpy.device import DeviceList
from ifrtpy.dtypes import DType
from ifrtpy.errors import Code, IfrtError, InvalidArgumentError, UnimplementedError
from ifrtpy.layout import Layout
from ifrtpy.proxy._protocol import message_class, messages
from ifrtpy.sharding import (ConcreteEvenSharding, ConcreteSharding, HloSharding,
                             OpaqueSharding, Sharding, SingleDeviceSharding)

__all__ = ["dtype_from_proto", "dtype_to_proto", "dims_of", "sharding_from_proto",
           "sharding_to_proto", "op_sharding_bytes", "status_proto", "error_of_status",
           "attribute_map", "layout_text", "xla_layout_proto"]

_HLO = "xla::ifrt::HloSharding"
_SINGLE = "xla::ifrt::SingleDeviceSharding"
_OPAQUE = "xla::ifrt::OpaqueSharding"
_CONCRETE = "xla::ifrt::ConcreteSharding"
_CONCRETE_EVEN = "xla::ifrt::ConcreteEvenSharding"

# OpSharding.Type (xla_data.proto)
_REPLICATED, _OTHER = 0, 3


# -- dtypes and shapes ------------------------------------------------------------------

def dtype_from_proto(proto: Any) -> DType:
    """The DType of a ``DTypeProto`` (kinds are matched by name: the numbers differ)."""
    name = messages().DTypeProto.Kind.Name(proto.kind) if _known_kind(proto.kind) else None
    kind = getattr(DType.Kind, name[5:], None) if name else None
    if kind is None or kind == DType.Kind.INVALID:
        raise InvalidArgumentError(f"unsupported dtype kind {proto.kind} ({name or 'unknown'})")
    return DType(kind)


def _known_kind(number: int) -> bool:
    return number in messages().DTypeProto.Kind.values()


def dtype_to_proto(dtype: DType) -> Any:
    m = messages()
    return m.DTypeProto(kind=m.DTypeProto.Kind.Value("KIND_" + dtype.kind.name))


def dims_of(shape_proto: Any) -> tuple[int, ...]:
    """The dims of a ``ShapeProto``, each checked to be >= 0."""
    dims = tuple(int(d) for d in shape_proto.dims)
    if any(d < 0 for d in dims):
        raise InvalidArgumentError(f"shape dims must be >= 0, got {list(dims)}")
    return dims


# -- shardings ---------------------------------------------------------------------------

def _devices(client: Any, ids: Sequence[int]) -> DeviceList:
    if not ids:
        raise InvalidArgumentError("a sharding names no devices")
    return DeviceList([client.lookup_device(int(i)) for i in ids])


def _memory_kind(proto: Any) -> str | None:
    return proto.memory_kind if proto.HasField("memory_kind") and proto.memory_kind else None


def sharding_from_proto(client: Any, proto: Any) -> Sharding:
    """The ifrtpy Sharding of a ``ShardingProto`` over ``client``'s devices."""
    m = messages()
    serialized = proto.serialized_sharding
    kind = serialized.type_name
    if kind == _SINGLE:
        p = m.SingleDeviceShardingProto.FromString(serialized.data)
        return SingleDeviceSharding(client.lookup_device(p.device_id), _memory_kind(p))
    if kind == _HLO:
        p = m.HloShardingProto.FromString(serialized.data)
        op = _jaxlib.xla_client().OpSharding()
        op.ParseFromString(p.xla_op_sharding.SerializeToString())
        sharding = HloSharding(_devices(client, p.devices.device_ids), op, _memory_kind(p))
        _check_reduction(sharding, p.xla_op_sharding)
        return sharding
    if kind == _OPAQUE:
        p = m.OpaqueShardingProto.FromString(serialized.data)
        return OpaqueSharding(_devices(client, p.devices.device_ids), _memory_kind(p))
    if kind == _CONCRETE_EVEN:
        p = m.ConcreteEvenShardingProto.FromString(serialized.data)
        return ConcreteEvenSharding(_devices(client, p.devices.device_ids), dims_of(p.shape),
                                    dims_of(p.shard_shape), is_fully_replicated=p.is_fully_replicated,
                                    memory_kind=_memory_kind(p))
    if kind == _CONCRETE:
        p = m.ConcreteShardingProto.FromString(serialized.data)
        if not p.HasField("shape"):
            raise UnimplementedError("ConcreteSharding with dynamic shapes is not served")
        return ConcreteSharding(_devices(client, p.devices.device_ids), dims_of(p.shape),
                                [dims_of(s) for s in p.shard_shapes], memory_kind=_memory_kind(p))
    raise UnimplementedError(f"sharding type {kind!r} is not served (served: {_SINGLE}, "
                             f"{_HLO}, {_OPAQUE}, {_CONCRETE}, {_CONCRETE_EVEN})")


#: The OpMetadata op_type of the reduction of an OpSharding's unreduced axes (jax 0.12).
_REDUCTION_OP = "sdy::reduction_op"


def _check_reduction(sharding: HloSharding, proto: Any) -> None:
    """UnimplementedError when ``proto`` (an xla.OpSharding message) names a reduction of its
    unreduced axes that ``sharding`` (read by this server's jaxlib) does not carry: a jaxlib
    without reduction ops reads a max or a min as a sum, which would be silently wrong."""
    named = [m.op_name.lower() for m in proto.metadata if m.op_type == _REDUCTION_OP]
    if sharding.has_unreduced_axes and named and named[0] != sharding.reduction:
        raise UnimplementedError(
            f"the sharding {sharding.xla_hlo_sharding} reduces its unreduced axes by "
            f"{named[0]}, which this server's jaxlib {_jaxlib.version_text()} reads as a "
            f"{sharding.reduction} (jaxlib 0.12 reads it)")


def _tile_form(proto: Any) -> Any:
    """``proto`` (an xla.OpSharding message) with an iota tile assignment spelled out."""
    if proto.iota_reshape_dims:
        order = np.arange(math.prod(proto.iota_reshape_dims)).reshape(
            tuple(proto.iota_reshape_dims)).transpose(tuple(proto.iota_transpose_perm)).ravel()
        del proto.iota_reshape_dims[:]
        del proto.iota_transpose_perm[:]
        proto.tile_assignment_devices.extend(int(d) for d in order)
    for sub in proto.tuple_shardings:
        _tile_form(sub)
    return proto


def op_sharding_bytes(sharding: Sharding, dims: Sequence[int]) -> Any:
    """An xla.OpSharding message (tile-assignment form) of ``sharding`` for an array of
    ``dims``: positions are indices into ``sharding.devices``."""
    m = messages()
    if isinstance(sharding, HloSharding):
        proto = m.OpSharding.FromString(sharding.op_sharding.SerializeToString())
        return _tile_form(proto)
    if sharding.is_fully_replicated:
        return m.OpSharding(type=_REPLICATED)
    return _tiled_from_domains(sharding, dims)


def _tiled_from_domains(sharding: Sharding, dims: Sequence[int]) -> Any:
    """The tiled OpSharding of an even sharding, from its index domains."""
    m = messages()
    domains = sharding.index_domains(tuple(dims))
    shard = tuple(sharding.shard_shape(tuple(dims)).dims)
    tiles = [max(1, -(-d // s)) if s else 1 for d, s in zip(dims, shard)]
    count = len(sharding.devices)
    replicas, rest = divmod(count, math.prod(tiles))
    if rest:
        raise UnimplementedError(f"sharding {sharding!r} has no HLO form for shape {list(dims)}")
    grid = np.full(tiles + [replicas], -1, dtype=np.int64)
    filled: dict[tuple[int, ...], int] = {}
    for position, domain in enumerate(domains):
        tile = tuple(int(o) // s if s else 0 for o, s in zip(tuple(domain.origin), shard))
        slot = filled.get(tile, 0)
        if slot >= replicas:
            raise UnimplementedError(f"sharding {sharding!r} is uneven: no HLO form")
        filled[tile] = slot + 1
        grid[tile + (slot,)] = position
    proto = m.OpSharding(type=_OTHER, tile_assignment_dimensions=tiles + ([replicas] if replicas > 1 else []),
                         tile_assignment_devices=[int(d) for d in grid.ravel()],
                         replicate_on_last_tile_dim=replicas > 1)
    return proto


def sharding_to_proto(sharding: Sharding, dims: Sequence[int]) -> Any:
    """The ``ShardingProto`` of ``sharding`` (single-device or HLO form)."""
    m = messages()
    kind = sharding.memory_kind.value
    if isinstance(sharding, SingleDeviceSharding) or len(sharding.devices) == 1:
        inner = m.SingleDeviceShardingProto(device_id=sharding.devices[0].id)
        type_name = _SINGLE
    else:
        inner = m.HloShardingProto(devices=m.DeviceListProto(device_ids=[d.id for d in sharding.devices]),
                                   xla_op_sharding=op_sharding_bytes(sharding, dims))
        type_name = _HLO
    if kind:
        inner.memory_kind = str(kind)
    return m.ShardingProto(serialized_sharding=m.Serialized(type_name=type_name,
                                                             data=inner.SerializeToString()))


# -- statuses ----------------------------------------------------------------------------

def status_proto(error: BaseException) -> Any:
    """The ``tensorflow.StatusProto`` of an exception (an IfrtError keeps its code)."""
    code = error.code if isinstance(error, IfrtError) else _builtin_code(error)
    return messages().StatusProto(code=int(code), message=str(error) or type(error).__name__)


def _builtin_code(error: BaseException) -> Code:
    if isinstance(error, (ValueError, TypeError, KeyError, IndexError)):
        return Code.INVALID_ARGUMENT
    if isinstance(error, NotImplementedError):
        return Code.UNIMPLEMENTED
    if isinstance(error, MemoryError):
        return Code.RESOURCE_EXHAUSTED
    return Code.INTERNAL


def error_of_status(status: Any) -> IfrtError:
    from ifrtpy.errors import error_from_code

    return error_from_code(status.code or Code.UNKNOWN, status.message)


# -- attributes and layouts ---------------------------------------------------------------

def attribute_map(attributes: Any) -> Any:
    """An ``AttributeMapProto`` of a mapping (str/bytes, bool, int, float, int lists; other
    values are left out)."""
    m = messages()
    proto = m.AttributeMapProto()
    for key, value in dict(attributes or {}).items():
        entry = m.AttributeMapProto.Value()
        if isinstance(value, bool):
            entry.bool_value = value
        elif isinstance(value, int):
            entry.int64_value = value
        elif isinstance(value, float):
            entry.float_value = value
        elif isinstance(value, str):
            entry.string_value = value.encode()
        elif isinstance(value, bytes):
            entry.string_value = value
        elif isinstance(value, (list, tuple)) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            entry.int64_list_value.elements.extend(value)
        else:
            continue
        proto.attributes[str(key)].CopyFrom(entry)
    return proto


def layout_text(layout: Layout) -> bytes:
    """PjRt's text of a layout (XLA's, ``b"{1,0:T(8,128)}"``), what GetDefaultLayout answers."""
    return str(layout).encode()


def xla_layout_proto(layout: Layout | None, rank: int) -> Any:
    """An ``xla.LayoutProto`` (minor-to-major, tiles, element size) of a layout."""
    layout = layout or Layout.row_major(rank)
    proto = message_class("xla.LayoutProto")(minor_to_major=list(layout.minor_to_major),
                                             element_size_in_bits=layout.element_size_in_bits)
    for tile in layout.tiles:
        proto.tiles.add(dimensions=list(tile))
    return proto
