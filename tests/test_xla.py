"""ifrtpy._xla: the CompileOptionsProto a PjRt compile sends, read back with the message
definitions the installed jaxlib carries (an independent reader of the same bytes)."""

import pytest

import ifrtpy as ifrt
from ifrtpy import _xla
from ifrtpy.program import HloProgram

pytest.importorskip("google.protobuf")
from ifrtpy.proxy._protocol import message_class  # noqa: E402

PROGRAM = HloProgram("""module @m {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    return %a : tensor<4xf32>
  }
}""")


def _read(serialized):
    return message_class("xla.CompileOptionsProto").FromString(serialized)


def test_without_debug_options_drops_them_and_keeps_every_other_field():
    options = ifrt.CompileOptions(num_partitions=2,
                                  env_option_overrides={"xla_cpu_enable_fast_math": True})
    full = _xla.compile_options_proto(options, PROGRAM, None, "cpu")
    assert _read(full).executable_build_options.HasField("debug_options")
    stripped = _read(_xla.without_debug_options(full))
    assert not stripped.executable_build_options.HasField("debug_options")
    expected = _read(full)
    expected.executable_build_options.ClearField("debug_options")
    assert stripped == expected
    assert stripped.executable_build_options.num_partitions == 2
    assert len(stripped.env_option_overrides) == 1


def test_varint_bytes_reads_back():
    for value in (0, 1, 127, 128, 300, 2**31, 2**63 - 1):
        assert _xla.varint(_xla.varint_bytes(value), 0) == (value, len(_xla.varint_bytes(value)))
