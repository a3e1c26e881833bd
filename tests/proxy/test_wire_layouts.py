"""Layouts on the wire as jax's proxy client reads them: GetDefaultLayout's text (parsed by
jaxlib's PjRtLayout) and executables' ``xla.LayoutProto``s carry the same fields, tiles
and packed element sizes included (what a TPU reports; see docs/tpu.md). A mismatch made
jax think every TPU executable wanted a non-default layout (RecursionError in its jit)."""

import pytest

from ifrtpy.layout import Layout
from ifrtpy.proxy import wire

pytest.importorskip("grpc")

# Default layouts libtpu 0.0.42 reports on a TPU v5e, and the CPU's.
TEXTS = ["{}", "{0}", "{1,0}", "{:T(128)}", "{0:T(128)}", "{1,0:T(2,128)}", "{1,0:T(8,128)}",
         "{0:T(512)(128)(4,1)}", "{2,0,1:T(4,128)(2,1)}", "{1,0:T(8,128)(8,1)E(4)}",
         "{0:T(2048)(128)(16,1)E(2)}"]


def _jaxlib_layout(text: bytes):
    from jax._src.lib import _jax

    layout = _jax.PjRtLayout.__new__(_jax.PjRtLayout)
    layout.__setstate__((text,))  # PjRtLayout::Deserialize, as the proxy client does
    return layout._xla_layout()


@pytest.mark.parametrize("text", TEXTS)
def test_default_layout_text_reads_the_same_in_jaxlib(text):
    layout = Layout.parse(text)
    xla = _jaxlib_layout(wire.layout_text(layout))
    assert tuple(xla.minor_to_major()) == layout.minor_to_major
    assert tuple(map(tuple, xla.tiling())) == layout.tiles
    assert xla.element_size_in_bits() == layout.element_size_in_bits


@pytest.mark.parametrize("text", TEXTS)
def test_executable_layout_protos_hold_the_same_fields(text):
    layout = Layout.parse(text)
    proto = wire.xla_layout_proto(layout, layout.rank)
    assert tuple(proto.minor_to_major) == layout.minor_to_major
    assert tuple(tuple(t.dimensions) for t in proto.tiles) == layout.tiles
    assert proto.element_size_in_bits == layout.element_size_in_bits
