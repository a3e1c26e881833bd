"""Op metadata: name scopes, explicit op_type/op_name and source overrides reach the
compiled module (the optimized HLO's ``metadata={...}``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.builder import Builder, OpMetadata, source_metadata
from ifrtpy.errors import InvalidArgumentError

from builder_helpers import optimized_hlo, pjrt_client

THIS_FILE = __file__


def _compiled_hlo(program) -> str:
    return optimized_hlo(pjrt_client().compile(program, ifrt.CompileOptions()))


def _metadata(hlo: str, opcode: str) -> dict:
    """The metadata fields of the (first) instruction with ``opcode``. Newer XLA moves the
    source location to the module's stack frame tables (``stack_frame_id``): it is read
    back from there as ``source_file`` and ``source_line``."""
    line = next(l for l in hlo.splitlines() if re.search(rf"\b{opcode}\(", l) and "metadata=" in l)
    fields = dict(re.findall(r'(\w+)=("[^"]*"|\d+)', line.split("metadata={", 1)[1]))
    if "stack_frame_id" in fields:
        frame = _table(hlo, "StackFrames")[fields["stack_frame_id"]]
        location = _table(hlo, "FileLocations")[frame["file_location_id"]]
        fields["source_file"] = _table(hlo, "FileNames")[location["file_name_id"]]
        fields["source_line"] = location["line"]
    return fields


def _table(hlo: str, name: str) -> dict:
    """A table of the module's header (``FileNames``, ``StackFrames``, ...): id -> entry
    (a quoted name, or the ``{key=value ...}`` fields)."""
    section = hlo.split(f"\n{name}\n", 1)[1].split("\n\n", 1)[0]
    rows = (row.split(" ", 1) for row in section.splitlines())
    return {key: (dict(re.findall(r"(\w+)=(\d+)", rest)) if rest.startswith("{") else rest)
            for key, rest in rows}


def _dense(b, x, w, name):
    """A library helper: its ops are attributed to its caller's line."""
    with b.name_scope(name), b.op_metadata(source_metadata(op_type="Dense", skip_frames=2)):
        return b.tanh(b.dot(x, w, precision="HIGHEST"))


def test_name_scopes_op_names_and_types_in_the_compiled_module():
    b = Builder("scoped")
    x = b.parameter((4, 8), np.float32)
    w = b.parameter((8, 3), np.float32)
    line = _line_of_next_statement()
    with b.name_scope("model"):
        h = _dense(b, x, w, "layer1")
        with b.op_metadata(op_name="total", op_type="Sum"):
            total = b.reduce(h, dimensions=(0, 1))
        y = b.exp(total)
    hlo = _compiled_hlo(b.build(y))
    tanh = _metadata(hlo, "tanh")
    assert tanh["op_name"] == '"model/layer1/tanh"'
    assert tanh["op_type"] == '"Dense"'
    assert tanh["source_file"] == f'"{THIS_FILE}"' and int(tanh["source_line"]) == line + 1
    reduce = _metadata(hlo, "reduce")
    assert reduce["op_name"] == '"model/total"' and reduce["op_type"] == '"Sum"'
    exp = _metadata(hlo, "exponential")
    assert exp["op_name"] == '"model/exponential"' and "op_type" not in exp
    assert int(exp["source_line"]) == line + 4


def test_explicit_source_and_no_scope():
    b = Builder()
    x = b.parameter((3,), np.float32)
    with b.op_metadata(OpMetadata(source_file="model.py", source_line=42), op_type="Activation"):
        y = b.exp(x)
    z = b.sqrt(y)
    hlo = _compiled_hlo(b.build(z))
    exp = _metadata(hlo, "exponential")
    assert exp["source_file"] == '"model.py"' and exp["source_line"] == "42"
    assert exp["op_type"] == '"Activation"' and "op_name" not in exp
    sqrt = _metadata(hlo, "sqrt")
    assert sqrt["source_file"] == f'"{THIS_FILE}"' and "op_type" not in sqrt


def test_metadata_scopes_end_with_their_block():
    b = Builder()
    x = b.parameter((2,), np.float32)
    with pytest.raises(RuntimeError):
        with b.name_scope("a"), b.op_metadata(op_type="T"):
            raise RuntimeError
    b.neg(x)
    text = b.text(debug_info=True)
    assert '"a/' not in text and '"T:"' not in text


@pytest.mark.parametrize("call,message", [
    (lambda b: b.name_scope("a/b").__enter__(), "name_scope: a scope name must be non-empty, without '/'"),
    (lambda b: b.op_metadata(source_line="3").__enter__(), "op_metadata: source_line must be an int"),
    (lambda b: b.op_metadata(op_type=3).__enter__(), "op_metadata: op_type must be a str"),
    (lambda b: b.op_metadata({"op_type": "x"}).__enter__(), "op_metadata: expected an OpMetadata"),
    (lambda b: source_metadata(skip_frames=0), "source_metadata: skip_frames must be at least 1"),
])
def test_metadata_errors(call, message):
    with pytest.raises(InvalidArgumentError, match=message):
        call(Builder())


def _line_of_next_statement() -> int:
    import sys
    return sys._getframe(1).f_lineno + 1
