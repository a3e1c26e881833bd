"""Device layouts of the PjRt backend: the plugin's default layouts and the layout of a
buffer, as :class:`ifrtpy.Layout` values that compare equal where the memory is the same.

The plugin says both through its layouts extension (XLA's layout text). Without it, the
default is row-major (what PJRT's own C API client assumes) and a buffer's layout comes
from ``PJRT_Buffer_GetMemoryLayout``. Memory of kind ``unpinned_host`` is plain host
memory: its default layout is row-major, untiled, on every plugin (IFRT's PjRt client
says the same). A sub-byte dtype's elements are packed (its bit size is the layout's
``element_size_in_bits``) whether or not the plugin's text says so: the CPU plugin
reports ``{1,0:E(4)}`` for an int4 buffer and ``{1,0}`` as the default it gets.
"""

from __future__ import annotations

import math

from ifrtpy.device import Device, MemoryKind, canonicalize_memory_kind
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError, UnimplementedError
from ifrtpy.layout import Layout
from ifrtpy.shape import Shape

__all__ = ["default_layout", "buffer_layout", "packed", "check_byte_size", "MAX_BYTES"]

UNPINNED_HOST = MemoryKind("unpinned_host")
MAX_BYTES = 2**63 - 1  # the byte size of an array is an int64 in XLA


def check_byte_size(dtype: DType, dims, what: str) -> None:
    """InvalidArgumentError naming ``what`` unless an array of ``dtype`` and ``dims`` (a
    valid Shape) takes at most :data:`MAX_BYTES` bytes: the plugin aborts beyond."""
    bits = (dtype.bit_size or 8) * math.prod(Shape(dims))
    if bits > 8 * MAX_BYTES:
        raise InvalidArgumentError(
            f"{what} takes {-(-bits // 8)} bytes; an array takes at most {MAX_BYTES} "
            f"(2**63 - 1) bytes")


def packed(layout: Layout, dtype: DType) -> Layout:
    """``layout`` with a sub-byte ``dtype``'s bit size as its element size where it has none."""
    bits = dtype.bit_size
    if layout.element_size_in_bits or bits is None or bits >= 8:
        return layout
    return Layout(layout.minor_to_major, layout.tiles, bits)


def default_layout(client, dtype: DType, dims, device: Device,
                   memory_kind: MemoryKind | str | None = None) -> Layout:
    """The layout an array of ``dtype`` and ``dims`` gets on ``device`` in ``memory_kind``
    when none is asked for (cached per client, dtype, dims and whether the memory is plain
    host memory)."""
    dims = tuple(dims)
    check_byte_size(dtype, dims, f"{dtype}{list(dims)}")
    host = canonicalize_memory_kind(memory_kind, device) == UNPINNED_HOST
    key = (dtype, dims, host)
    layout = client._default_layouts.get(key)
    if layout is None:
        if host:
            layout = Layout.row_major(len(dims))
        else:
            try:
                layout = Layout.parse(client._handle.default_layout(dtype.pjrt_buffer_type, dims))
            except UnimplementedError:  # no layouts extension: PJRT's row-major default
                layout = Layout.row_major(len(dims))
        layout = client._default_layouts[key] = packed(layout, dtype)
    return layout


def buffer_layout(buffer, dtype: DType) -> Layout:
    """The device layout of a ``_pjrt.BufferHandle`` holding ``dtype`` elements."""
    try:
        layout = Layout.parse(buffer.layout_text())
    except UnimplementedError:  # no layouts extension: the core API's tiled layout
        layout = Layout(*buffer.memory_layout)
    return packed(layout, dtype)
