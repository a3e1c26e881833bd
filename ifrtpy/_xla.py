"""XLA's protos as ifrtpy fills and reads them: the ``CompileOptionsProto`` of a compile
(with layouts and debug options), the layouts of a compiled module's entry computation,
and length-delimited fields read by hand. Neutral: the PjRt and jax backends both use it."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ifrtpy import _jaxlib
from ifrtpy.device import DeviceList
from ifrtpy.errors import InvalidArgumentError, UnimplementedError, invalid_argument
from ifrtpy.executable_options import CompileOptions, program_layouts
from ifrtpy.layout import Layout
from ifrtpy.program import HloProgram, TensorType

__all__ = [
    "compile_options_proto", "layout_shapes", "entry_shapes", "module_layouts", "layout_of",
    "proto_field", "without_debug_options", "varint", "varint_bytes",
]


def compile_options_proto(options: CompileOptions, program: HloProgram, devices: DeviceList | None,
                         platform: str) -> bytes:
    """Serialized ``xla.CompileOptionsProto`` of ``options``: never empty, with at least one
    replica and one partition (what ``_pjrt.compile`` requires of its caller and does not
    check). ``options`` were checked once, when made (``CompileOptions.__post_init__``);
    here only what needs the proto is: debug option names and value types, and the
    values of the flag overrides."""
    xla_client = _jaxlib.xla_client()
    argument_layouts, result_layouts = program_layouts(options, program.parameters, program.results)

    proto = xla_client.CompileOptions()
    build = proto.executable_build_options
    build.num_replicas = options.num_replicas
    build.num_partitions = options.num_partitions
    spmd = options.use_spmd_partitioning
    build.use_spmd_partitioning = options.num_partitions > 1 if spmd is None else spmd
    shardy = options.use_shardy_partitioner
    build.use_shardy_partitioner = program.uses_shardy if shardy is None else shardy
    if devices is not None:
        ids = np.array([d.id for d in devices]).reshape(options.num_replicas, options.num_partitions)
        build.device_assignment = xla_client.DeviceAssignment.create(ids)
    proto.compile_portable_executable = options.compile_portable_executable
    if argument_layouts is not None or result_layouts is not None:
        # Both are set: XLA drops a result layout that comes without argument layouts.
        proto.argument_layouts = layout_shapes(program.parameters, argument_layouts, platform)
        results = layout_shapes(program.results, result_layouts, platform)
        build.result_layout = results[0] if len(results) == 1 else xla_client.Shape.tuple_shape(results)
    for name, value in options.debug_options.items():
        if name.startswith("_") or not hasattr(build.debug_options, name):
            raise InvalidArgumentError(f"unknown XLA debug option {name!r}")
        expected = type(getattr(build.debug_options, name))
        try:
            setattr(build.debug_options, name, value)
        except (TypeError, ValueError, OverflowError, AttributeError):
            raise invalid_argument(f"CompileOptions.debug_options[{name!r}]",
                                   f"a {expected.__name__}", value) from None
    if options.env_option_overrides:
        try:
            proto.env_option_overrides = list(options.env_option_overrides.items())
        except (TypeError, ValueError, OverflowError):
            raise invalid_argument("CompileOptions.env_option_overrides",
                                   "XLA flag names with str, bool, int or float values",
                                   options.env_option_overrides) from None
    serialized: bytes = proto.SerializeAsString()
    return serialized


def layout_shapes(values: Sequence[TensorType], layouts: Sequence[Layout | None] | None,
                  platform: str) -> list[Any]:
    """jaxlib Shapes of ``values`` in ``layouts`` (row-major where None).

    UnimplementedError for a tiled layout (a jaxlib Shape takes only the dimension order)
    and, on the CPU platform, for any layout but row-major: the CPU plugin compiles a
    column-major parameter or result but reads and writes host buffers in row-major order,
    so the values would come out transposed (measured on PJRT 0.81, tests/core/test_layout.py).
    """
    xla_client = _jaxlib.xla_client()
    shapes = []
    for i, value in enumerate(values):
        rank = len(value.shape.dims)
        asked = layouts[i] if layouts is not None else None
        layout = asked if asked is not None else Layout.row_major(rank)
        if layout.tiles:
            raise UnimplementedError(f"a compile layout cannot be tiled, got {layout} for {value}")
        if platform == "cpu" and layout != Layout.row_major(rank):
            raise UnimplementedError(
                f"cannot compile for layout {layout} ({value}) on the CPU platform: XLA's CPU "
                f"client reads and writes host buffers in row-major order whatever the "
                f"compiled layout, so the values would be transposed")
        shapes.append(xla_client.Shape.array_shape(value.dtype.to_numpy(), tuple(value.shape.dims),
                                                   layout.minor_to_major))
    return shapes


def entry_shapes(module: Any) -> tuple[list[Any], list[Any]]:
    """The parameter and result shapes (jaxlib Shapes) of a jaxlib HloModule's entry
    computation, read through jaxlib's XlaComputation program shape; after SPMD
    partitioning, one device's."""
    shape = _jaxlib.xla_client().XlaComputation(module.as_serialized_hlo_module_proto()).program_shape()
    result = shape.result_shape()
    return list(shape.parameter_shapes()), list(result.tuple_shapes() if result.is_tuple() else [result])


def module_layouts(module: Any) -> tuple[list[Layout], list[Layout]]:
    """The parameter and result layouts of a jaxlib HloModule's entry computation, of its
    arrays only: tokens, which executables' parameters and outputs leave out, have none
    (and jaxlib's ``Shape.layout()`` of one aborts the process)."""
    params, results = entry_shapes(module)
    return ([layout_of(s) for s in params if s.is_array()],
            [layout_of(s) for s in results if s.is_array()])


def layout_of(shape: Any) -> Layout:
    layout = shape.layout()
    return Layout(layout.minor_to_major(), layout.tiling(), layout.element_size_in_bits())


_LENGTH_DELIMITED = 2  # the wire type of bytes and messages
#: Field numbers: CompileOptionsProto.executable_build_options and
#: ExecutableBuildOptionsProto.debug_options (xla.proto).
_BUILD_OPTIONS, _DEBUG_OPTIONS = 3, 3


def proto_field(data: bytes, number: int) -> bytes:
    """The bytes of length-delimited field ``number`` of a serialized protobuf message."""
    for found, wire, start, end in _fields(data):
        if found == number and wire == _LENGTH_DELIMITED:
            return data[start:end]
    raise InvalidArgumentError(f"field {number} missing from the plugin's optimized program")


def without_debug_options(serialized: bytes) -> bytes:
    """A serialized ``CompileOptionsProto`` without its build options' ``debug_options``:
    the plugin then compiles with its own XLA's defaults, not those of the jaxlib that
    filled the proto (another XLA build, whose defaults can differ: jaxlib 0.12's
    ``xla_enable_hlo_sharding_v3`` makes a PJRT 0.106 plugin partition a mesh with
    ``device_ids`` wrongly)."""
    out = bytearray()
    for number, wire, start, end in _fields(serialized):
        if number == _BUILD_OPTIONS and wire == _LENGTH_DELIMITED:
            build = serialized[start:end]
            kept = b"".join(_field_bytes(build, *f) for f in _fields(build)
                            if f[0] != _DEBUG_OPTIONS)
            out += _field_bytes(kept, _BUILD_OPTIONS, _LENGTH_DELIMITED, 0, len(kept))
        else:
            out += _field_bytes(serialized, number, wire, start, end)
    return bytes(out)


def _fields(data: bytes) -> list[tuple[int, int, int, int]]:
    """``(number, wire type, start, end)`` of each field of a serialized message; for a
    length-delimited field, start and end bound its bytes, else its value."""
    fields, i = [], 0
    while i < len(data):
        key, i = varint(data, i)
        wire, start = key & 7, i
        if wire == _LENGTH_DELIMITED:
            size, start = varint(data, i)
            i = start + size
        elif wire == 0:
            _, i = varint(data, i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise InvalidArgumentError(f"wire type {wire} in a serialized message")
        fields.append((key >> 3, wire, start, i))
    return fields


def _field_bytes(data: bytes, number: int, wire: int, start: int, end: int) -> bytes:
    """The serialized field again: its key, its length (length-delimited) and its bytes."""
    head = varint_bytes(number << 3 | wire)
    size = varint_bytes(end - start) if wire == _LENGTH_DELIMITED else b""
    return head + size + data[start:end]


def varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def varint_bytes(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
