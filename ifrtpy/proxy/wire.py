"""IFRT serdes on the wire: dtypes, shapes, shardings, layouts, statuses and attributes,
between the protocol's messages and ifrtpy's value types.

Every value a request carries is decoded here, and checked here before it reaches a
backend or jaxlib (whose readers trust their input): a serialized message that does not
parse, a shape with negative dims or more elements or bytes than an array can hold, an
unknown dtype or device, an OpSharding jaxlib would abort on or that does not place its
tiles on its devices, each gets InvalidArgumentError naming the field; a form the server
does not serve (a sharding, layout or program type it does not know, a mesh-based
OpSharding) gets UnimplementedError.

Shardings arrive as ``Serialized{type_name, data}``; the server reads IFRT's single-device,
HLO, opaque, concrete and concrete-even forms and answers in the single-device or HLO
form (tile-assignment OpShardings: the 0.12 client aborts on mesh-based ones).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ifrtpy import _jaxlib
from ifrtpy.array import ArraySpec
from ifrtpy.device import Device, DeviceList
from ifrtpy.dtypes import DType
from ifrtpy.errors import Code, IfrtError, InvalidArgumentError, NotFoundError, UnimplementedError
from ifrtpy.layout import Layout
from ifrtpy.proxy._protocol import message_class, messages
from ifrtpy.shape import Shape
from ifrtpy.sharding import (ConcreteEvenSharding, ConcreteSharding, HloSharding,
                             OpaqueSharding, Sharding, SingleDeviceSharding)
from ifrtpy.sharding.hlo import check_op_sharding

__all__ = ["parse", "dtype_from_proto", "dtype_to_proto", "shape_of", "array_shape",
           "array_spec_from_proto", "device_of", "devices_of", "sharding_from_proto",
           "layout_from_proto", "sharding_to_proto", "op_sharding_bytes", "status_proto",
           "error_of_status", "attribute_map", "layout_text", "xla_layout_proto",
           "MAX_ARRAY_BYTES"]

_HLO = "xla::ifrt::HloSharding"
_SINGLE = "xla::ifrt::SingleDeviceSharding"
_OPAQUE = "xla::ifrt::OpaqueSharding"
_CONCRETE = "xla::ifrt::ConcreteSharding"
_CONCRETE_EVEN = "xla::ifrt::ConcreteEvenSharding"
_LAYOUTS = ("xla::ifrt::PjRtLayout", "xla::PjRtLayout")

# OpSharding.Type (xla_data.proto)
_REPLICATED, _MAXIMAL, _TUPLE, _OTHER = 0, 1, 2, 3

#: The most bytes an array named in a request may hold: far beyond any machine's memory,
#: and far below where XLA's int64 byte counts (a tiled layout pads an array) overflow.
MAX_ARRAY_BYTES = 1 << 52


def parse(cls: Any, data: bytes, what: str) -> Any:
    """The message of class ``cls`` serialized in ``data``; InvalidArgumentError naming
    ``what`` (the field that carried it) when the bytes do not parse."""
    try:
        return cls.FromString(data)
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError, or a RuntimeError
        raise InvalidArgumentError(
            f"{what} is not a serialized {cls.DESCRIPTOR.full_name} ({len(data)} bytes): "
            f"{error}") from None


# -- dtypes and shapes ------------------------------------------------------------------

def dtype_from_proto(proto: Any) -> DType:
    """The DType of a ``DTypeProto`` (kinds are matched by name: the numbers differ): an
    array element type (not a token or an opaque value)."""
    name = messages().DTypeProto.Kind.Name(proto.kind) if _known_kind(proto.kind) else None
    kind = getattr(DType.Kind, name[5:], None) if name else None
    if kind is None or kind in (DType.Kind.INVALID, DType.Kind.TOKEN, DType.Kind.OPAQUE):
        raise InvalidArgumentError(
            f"dtype kind {proto.kind} ({name or 'unknown'}) is not an array element type")
    return DType(kind)


def _known_kind(number: int) -> bool:
    return number in messages().DTypeProto.Kind.values()


def dtype_to_proto(dtype: DType) -> Any:
    m = messages()
    return m.DTypeProto(kind=m.DTypeProto.Kind.Value("KIND_" + dtype.kind.name))


def shape_of(dims: Any, what: str = "shape") -> Shape:
    """The Shape of a ``ShapeProto`` (or of a sequence of dims): dims >= 0, at most 2**63 - 1
    elements; InvalidArgumentError naming ``what`` otherwise."""
    dims = getattr(dims, "dims", dims)
    try:
        return Shape(dims)
    except InvalidArgumentError as error:
        raise InvalidArgumentError(f"{what}: {error}") from None


def array_shape(dtype: DType, dims: Any, what: str = "shape") -> Shape:
    """:func:`shape_of`, for an array of ``dtype``, which must hold at most
    :data:`MAX_ARRAY_BYTES` bytes."""
    shape = shape_of(dims, what)
    size = -(-shape.num_elements() * (dtype.bit_size or 8) // 8)
    if size > MAX_ARRAY_BYTES:
        raise InvalidArgumentError(
            f"{what}: {dtype}{list(shape)} holds {size} bytes; an array named in a request "
            f"holds at most {MAX_ARRAY_BYTES} (2**52)")
    return shape


def array_spec_from_proto(client: Any, proto: Any, what: str = "array spec") -> ArraySpec:
    """The ArraySpec of an ``ArraySpecProto`` (its layout is not read: IFRT's default)."""
    dtype = dtype_from_proto(proto.dtype)
    return ArraySpec(dtype, array_shape(dtype, proto.shape, f"{what} shape"),
                     sharding_from_proto(client, proto.sharding))


# -- devices and shardings ---------------------------------------------------------------

def device_of(client: Any, device_id: int, what: str = "the request") -> Device:
    """``client``'s device ``device_id``; InvalidArgumentError naming ``what`` for an id it
    does not have."""
    try:
        return client.lookup_device(int(device_id))
    except NotFoundError as error:
        raise InvalidArgumentError(f"{what} names device {device_id}: {error}") from None


def devices_of(client: Any, ids: Sequence[int], what: str) -> DeviceList:
    """A DeviceList of ``client``'s devices ``ids`` (one or more)."""
    if not ids:
        raise InvalidArgumentError(f"{what} names no devices")
    return DeviceList([device_of(client, i, what) for i in ids])


def _memory_kind(proto: Any) -> str | None:
    return proto.memory_kind if proto.HasField("memory_kind") and proto.memory_kind else None


def sharding_from_proto(client: Any, proto: Any) -> Sharding:
    """The ifrtpy Sharding of a ``ShardingProto`` over ``client``'s devices."""
    m = messages()
    serialized = proto.serialized_sharding
    kind, data = serialized.type_name, serialized.data
    if kind == _SINGLE:
        p = parse(m.SingleDeviceShardingProto, data, "a SingleDeviceSharding")
        return SingleDeviceSharding(device_of(client, p.device_id, "a SingleDeviceSharding"),
                                    _memory_kind(p))
    if kind == _HLO:
        p = parse(m.HloShardingProto, data, "an HloSharding")
        devices = devices_of(client, p.devices.device_ids, "an HloSharding")
        _check_hlo_form(p.xla_op_sharding, len(devices))
        op = _jaxlib.xla_client().OpSharding()
        op.ParseFromString(p.xla_op_sharding.SerializeToString())
        sharding = HloSharding(devices, op, _memory_kind(p))
        if p.xla_op_sharding.type == _OTHER:
            sharding.tile_of_device()  # every device holds one tile
        _check_reduction(sharding, p.xla_op_sharding)
        return sharding
    if kind == _OPAQUE:
        p = parse(m.OpaqueShardingProto, data, "an OpaqueSharding")
        return OpaqueSharding(devices_of(client, p.devices.device_ids, "an OpaqueSharding"),
                              _memory_kind(p))
    if kind == _CONCRETE_EVEN:
        p = parse(m.ConcreteEvenShardingProto, data, "a ConcreteEvenSharding")
        return ConcreteEvenSharding(
            devices_of(client, p.devices.device_ids, "a ConcreteEvenSharding"),
            shape_of(p.shape, "a ConcreteEvenSharding's shape"),
            shape_of(p.shard_shape, "a ConcreteEvenSharding's shard_shape"),
            is_fully_replicated=p.is_fully_replicated, memory_kind=_memory_kind(p))
    if kind == _CONCRETE:
        p = parse(m.ConcreteShardingProto, data, "a ConcreteSharding")
        if not p.HasField("shape"):
            raise UnimplementedError("ConcreteSharding with dynamic shapes is not served")
        return ConcreteSharding(devices_of(client, p.devices.device_ids, "a ConcreteSharding"),
                                shape_of(p.shape, "a ConcreteSharding's shape"),
                                [shape_of(s, "a ConcreteSharding's shard_shapes")
                                 for s in p.shard_shapes], memory_kind=_memory_kind(p))
    raise UnimplementedError(f"sharding type {kind!r} is not served (served: {_SINGLE}, "
                             f"{_HLO}, {_OPAQUE}, {_CONCRETE}, {_CONCRETE_EVEN})")


def _check_hlo_form(proto: Any, device_count: int) -> None:
    """The checks of an HloSharding's OpSharding before jaxlib reads it: the tile-assignment
    form (UnimplementedError for the mesh-based one), not a tuple, fields jaxlib reads safely
    (:func:`~ifrtpy.sharding.hlo.check_op_sharding`), no more tiles than devices, no device
    named twice, a maximal sharding's device among them (a tiled one's are checked once
    read: one tile each)."""
    if "named_sharding" in proto.DESCRIPTOR.fields_by_name and proto.HasField("named_sharding"):
        raise UnimplementedError(
            "an HloSharding in the mesh-based OpSharding form (named_sharding) is not served; "
            "send the tile-assignment form")
    if proto.type == _TUPLE:
        raise InvalidArgumentError("an HloSharding of an array is not a tuple OpSharding")
    check_op_sharding(proto, max_tiles=device_count)
    if proto.type == _OTHER:  # ifrtpy's own check: jaxlib 0.12.1 raises one of its own
        positions = list(proto.tile_assignment_devices)
        if len(set(positions)) != len(positions):
            repeated = sorted({p for p in positions if positions.count(p) > 1})
            raise InvalidArgumentError(
                f"an HloSharding's tile_assignment_devices {positions} name device position"
                f"{'s' if len(repeated) > 1 else ''} {', '.join(map(str, repeated))} more than "
                "once: each tile is one device's")
    if proto.type == _MAXIMAL and proto.tile_assignment_devices[0] >= device_count:
        raise InvalidArgumentError(
            f"a maximal HloSharding names device position {proto.tile_assignment_devices[0]} "
            f"of {device_count}")


def layout_from_proto(proto: Any) -> Layout | None:
    """The ifrtpy Layout of an ``xla.ifrt.LayoutProto`` (None: the default)."""
    serialized = proto.serialized_layout
    if not serialized.type_name and not serialized.data:
        return None
    if serialized.type_name not in _LAYOUTS:
        raise UnimplementedError(
            f"layout type {serialized.type_name!r} is not served (served: {', '.join(_LAYOUTS)})")
    xla = parse(messages().PjRtLayoutProto, serialized.data, "a layout").xla_layout
    return Layout(list(xla.minor_to_major), [list(t.dimensions) for t in xla.tiles],
                  xla.element_size_in_bits)


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


def error_of_status(status: Any, what: str = "the status") -> IfrtError:
    """The error of a ``StatusProto``; InvalidArgumentError naming ``what`` for an OK one."""
    from ifrtpy.errors import error_from_code

    if status.code == Code.OK:
        raise InvalidArgumentError(f"{what} is OK, not an error")
    return error_from_code(status.code, status.message)


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
