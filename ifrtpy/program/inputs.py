"""Every front end of :class:`ifrtpy.HloProgram`, turned into StableHLO text.

What a program can be made from, and how it becomes StableHLO text:

* StableHLO (MLIR) text: taken as it is.
* a ``jaxlib.mlir.ir.Module``: printed.
* a jax ``Lowered`` stage (anything with ``as_text()`` returning StableHLO): its text.
* a jaxlib ``XlaComputation``: its HloModuleProto, converted by jaxlib (``hlo_to_stablehlo``).
* a ``jax.export.Exported``: its serialized module (bytes, see below).
* a jax ``Compiled`` stage: its optimized HLO text (see below).
* a TensorFlow ``tf.function(jit_compile=True)``: see :func:`from_tensorflow`.
* bytes: MLIR bytecode, a StableHLO portable artifact, a serialized HloModuleProto (as
  TensorFlow's ``experimental_get_compiler_ir(...)(stage="hlo_serialized")`` gives) or a
  serialized ``jax.export.Exported``; and HLO text (``HloModule ...``).

Bytes and HLO text are converted in a short-lived child process (:func:`convert_isolated`):
jaxlib's bytecode and HloModuleProto readers trust their input, and a changed byte can
abort the process or corrupt its heap. The child hands back StableHLO text, which the
MLIR text parser reads safely here; a child that crashes means the input is refused.
Results are memoized by SHA-256 digest, so each distinct input costs one child (about
half a second) per process; :func:`stablehlo_texts` reads many inputs in one child.
"""

from __future__ import annotations

import collections
import hashlib
import os
import re
import struct
import subprocess
import sys
import threading
from typing import Any, Sequence

from ifrtpy import _jaxlib
from ifrtpy.program import mlir
from ifrtpy.errors import InvalidArgumentError, UnimplementedError

__all__ = ["stablehlo_text", "stablehlo_texts", "host_callbacks", "tensorflow_hlo",
           "convert_isolated"]

MLIR_BYTECODE_MAGIC = b"ML\xefR"
_MEMO_ENTRIES = 64
_memo: collections.OrderedDict[bytes, str] = collections.OrderedDict()
_memo_lock = threading.Lock()
_CHILD_TIMEOUT_S = 120
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def stablehlo_text(program: Any) -> str:
    """StableHLO text of ``program`` (any input listed in the module docstring);
    InvalidArgumentError naming the input's type for anything else or for garbage."""
    source = _source(program)
    return source if isinstance(source, str) else convert_isolated(*source)


def stablehlo_texts(programs: Sequence[Any]) -> list[str]:
    """:func:`stablehlo_text` of each program, the bytes among them (and HLO text) read in
    one child process rather than one each (an input the batch cannot read, or one that
    ends the child, is read again alone, for its own error)."""
    sources = [_source(p) for p in programs]
    _convert_batch([s for s in sources if not isinstance(s, str)])
    return [s if isinstance(s, str) else convert_isolated(*s) for s in sources]


def _source(program: Any) -> str | tuple[bytes, str]:
    """StableHLO text of ``program``, or ``(data, kind)`` for :func:`convert_isolated`."""
    if isinstance(program, (str, bytes, bytearray, memoryview)) and len(program) == 0:
        raise InvalidArgumentError("the program is empty")
    if isinstance(program, str):
        if program.lstrip().startswith("HloModule"):
            return program.encode(), "hlo_text"
        return program
    if isinstance(program, (bytes, bytearray, memoryview)):
        data = bytes(program)
        text = _as_text(data)
        return _source(text) if text is not None else (data, "bytes")
    kind = type(program).__name__
    module = type(program).__module__ or ""
    if kind == "Module" and hasattr(program, "operation"):  # jaxlib.mlir.ir.Module
        return str(program.operation.get_asm(enable_debug_info=True))
    if kind == "XlaComputation" and hasattr(program, "as_serialized_hlo_module_proto"):
        return _computation_text(program)
    if kind == "Exported" and hasattr(program, "mlir_module_serialized"):
        return bytes(program.mlir_module_serialized), "bytes"
    if kind == "Compiled" and module.startswith("jax"):
        return program.as_text().encode(), "hlo_text"
    if module.startswith("tensorflow") or hasattr(program, "experimental_get_compiler_ir"):
        raise InvalidArgumentError(
            "a TensorFlow function needs example arguments: use "
            "ifrtpy.program.from_tensorflow(function, *args)")
    if hasattr(program, "as_text"):  # a jax Lowered stage, or alike
        text = program.as_text()
        if isinstance(text, str):
            return _source(text)
    raise InvalidArgumentError(
        f"HloProgram takes StableHLO or HLO text, MLIR bytecode, a serialized HloModuleProto "
        f"or jax Exported, an MLIR module, an XlaComputation, or a jax Lowered/Compiled/"
        f"Exported object, not {type(program).__name__}")


def host_callbacks(program: Any) -> tuple[Any, ...]:
    """The Python callables of ``program``'s host callbacks, by index: those a jax
    ``Lowered`` stage hands its compiler; () for every other input (text and bytes cannot
    carry callables)."""
    if type(program).__name__ == "Lowered" and (type(program).__module__ or "").startswith("jax"):
        return _jaxlib.lowered_host_callbacks(program)
    return ()


def _as_text(data: bytes) -> str | None:
    """``data`` as a str when it is UTF-8 text (no control characters but whitespace)."""
    if data.startswith(MLIR_BYTECODE_MAGIC):
        return None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    return None if _CONTROL.search(text) else text


def _computation_text(computation: Any) -> str:
    """StableHLO text of a jaxlib XlaComputation (an object jaxlib built in this process)."""
    return str(_jaxlib.xla_computation_to_mlir_module(computation))


def tensorflow_hlo(function: Any, *args: Any, **kwargs: Any) -> bytes:
    """The serialized HloModuleProto of a ``tf.function(jit_compile=True)`` traced for
    ``args`` (TensorFlow's ``experimental_get_compiler_ir``, stage ``hlo_serialized``);
    InvalidArgumentError for other functions."""
    get_ir = getattr(function, "experimental_get_compiler_ir", None)
    if get_ir is None:
        raise InvalidArgumentError(
            f"from_tensorflow takes a tf.function(jit_compile=True), not {type(function).__name__}")
    try:
        proto = get_ir(*args, **kwargs)(stage="hlo_serialized")
    except Exception as e:  # noqa: BLE001 - TensorFlow's own error types
        raise InvalidArgumentError(f"TensorFlow could not export the function's HLO: {e}") from None
    return bytes(proto)


def _key(data: bytes, kind: str) -> bytes:
    return hashlib.sha256(kind.encode() + b"\0" + data).digest()


def _memoized(key: bytes) -> str | None:
    with _memo_lock:
        text = _memo.get(key)
        if text is not None:
            _memo.move_to_end(key)
        return text


def _memoize(key: bytes, text: str) -> None:
    with _memo_lock:
        _memo[key] = text
        while len(_memo) > _MEMO_ENTRIES:
            _memo.popitem(last=False)


def _run_child(mode: str, data: bytes) -> subprocess.CompletedProcess:
    """The child of :func:`convert_isolated` in ``mode``, fed ``data``."""
    # `-c` puts the working directory first on sys.path: it is dropped before the import,
    # so the child runs this ifrtpy (from package_root), never a package found there.
    code = ("import sys; sys.path[:] = [p for p in sys.path if p]; "
            "from ifrtpy.program.inputs import _child_main; _child_main()")
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-c", code, mode], input=data, capture_output=True,
                          timeout=_CHILD_TIMEOUT_S, env=env)


def convert_isolated(data: bytes, kind: str) -> str:
    """StableHLO text of untrusted ``data`` ("bytes": bytecode, portable artifact,
    HloModuleProto or serialized jax Exported; "hlo_text": HLO text), converted by jaxlib in
    a child process; memoized by digest. InvalidArgumentError when the child fails or dies."""
    key = _key(data, kind)
    text = _memoized(key)
    if text is not None:
        return text
    if not data:
        raise InvalidArgumentError("the program is empty (0 bytes)")
    try:
        done = _run_child(kind, data)
    except subprocess.TimeoutExpired:
        raise InvalidArgumentError(
            f"reading the program ({len(data)} bytes) took over {_CHILD_TIMEOUT_S} s; refused") from None
    if done.returncode == 0:
        text = done.stdout.decode()
        _memoize(key, text)
        return text
    what = "HLO text" if kind == "hlo_text" else f"program bytes ({len(data)} bytes, starting {data[:8]!r})"
    if done.returncode == 1 and done.stdout:
        raise InvalidArgumentError(f"not a valid program: {what}: {done.stdout.decode(errors='replace')}")
    last = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
    raise InvalidArgumentError(
        f"not a valid program: {what} made jaxlib's reader fail in a child process (exit "
        f"status {done.returncode}{': ' + last[0][:200] if last else ''}); refused before it "
        f"reached this process")


_KINDS = ("bytes", "hlo_text")
_FRAME = struct.Struct("<BQ")  # (kind index or status, length) before each item


def _convert_batch(items: Sequence[tuple[bytes, str]]) -> None:
    """Memoize the StableHLO text of the ``(data, kind)`` items that a single child reads
    (the others are left to :func:`convert_isolated`)."""
    todo = {}
    for data, kind in items:
        key = _key(data, kind)
        if data and _memoized(key) is None:
            todo[key] = (data, kind)
    if len(todo) < 2:
        return
    stream = b"".join(_FRAME.pack(_KINDS.index(kind), len(data)) + data for data, kind in todo.values())
    try:
        out = _run_child("batch", stream).stdout
    except subprocess.TimeoutExpired:
        return
    offset = 0
    for key in todo:
        if offset + _FRAME.size > len(out):
            return  # the child ended here
        status, size = _FRAME.unpack_from(out, offset)
        offset += _FRAME.size
        if offset + size > len(out):
            return
        if status == 0:
            _memoize(key, out[offset:offset + size].decode())
        offset += size


def _convert(data: bytes, kind: str) -> str:
    return _hlo_text_to_stablehlo(data.decode()) if kind == "hlo_text" else _bytes_to_stablehlo(data)


def _child_main() -> None:
    """The child of :func:`convert_isolated`: input on stdin, StableHLO text on stdout
    (exit 0), or a message on stdout (exit 1). In mode "batch" (:func:`_convert_batch`),
    framed items in and, item by item, framed results out (status 0: the text; 1: the
    reason it was refused)."""
    mode = sys.argv[1]
    data = sys.stdin.buffer.read()
    if mode == "batch":
        out = sys.stdout.buffer
        offset = 0
        while offset < len(data):
            kind, size = _FRAME.unpack_from(data, offset)
            offset += _FRAME.size
            try:
                status, text = 0, _convert(data[offset:offset + size], _KINDS[kind])
            except _Refused as e:
                status, text = 1, str(e)
            offset += size
            encoded = text.encode()
            out.write(_FRAME.pack(status, len(encoded)) + encoded)
            out.flush()
        return
    try:
        text = _convert(data, mode)
    except _Refused as e:
        sys.stdout.write(str(e))
        sys.stdout.flush()
        sys.exit(1)
    sys.stdout.write(text)
    sys.stdout.flush()


class _Refused(Exception):
    pass


def _bytes_to_stablehlo(data: bytes) -> str:
    if data.startswith(MLIR_BYTECODE_MAGIC):
        return _bytecode_text(data)
    errors = []
    try:
        return _hlo_proto_text(data)
    except _Refused as e:
        errors.append(str(e))
    try:
        return _exported_text(data)
    except _Refused as e:
        errors.append(str(e))
    raise _Refused("neither MLIR bytecode, a serialized HloModuleProto nor a serialized jax "
                   "Exported (" + "; ".join(errors) + ")")


def _bytecode_text(data: bytes) -> str:
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    context = mlir.context()
    with context:
        try:  # a StableHLO portable artifact (versioned bytecode), read in the context
            # that has every dialect a program may use (Shardy's among them)
            module = stablehlo.deserialize_portable_artifact(context, data)
        except Exception:  # noqa: BLE001 - then plain MLIR bytecode
            try:
                module = ir.Module.parse(data)
            except Exception as e:  # noqa: BLE001 - MLIR raises its own error types
                raise _Refused(f"MLIR bytecode that does not parse: {e}") from None
        versioned = sorted({op.operation.name for op in module.body.operations
                            if op.operation.name.startswith("vhlo.")})
        if versioned:
            raise _Refused(f"a StableHLO portable artifact that jaxlib could not convert back "
                           f"from versioned VHLO (its module holds {', '.join(versioned)})")
        return str(module.operation.get_asm(enable_debug_info=True))


def _hlo_proto_text(data: bytes) -> str:
    try:
        return _bytecode_text(_jaxlib.hlo_to_stablehlo(data))
    except (_Refused, UnimplementedError):  # UnimplementedError: jaxlib moved the name
        raise
    except Exception as e:  # noqa: BLE001 - jaxlib's runtime error
        raise _Refused(f"not a HloModuleProto: {str(e).splitlines()[0]}") from None


def _hlo_text_to_stablehlo(text: str) -> str:
    try:
        module = _jaxlib.hlo_module_from_text(text)
    except UnimplementedError:  # jaxlib moved the name: not the input's fault
        raise
    except Exception as e:  # noqa: BLE001 - jaxlib's runtime error
        raise _Refused(f"HLO text that does not parse: {e}") from None
    return _hlo_proto_text(module.as_serialized_hlo_module_proto())


def _exported_text(data: bytes) -> str:
    try:
        from jax import export
    except ImportError:
        raise _Refused("not a jax Exported: jax is not installed") from None
    try:
        exported = export.deserialize(bytearray(data))
        module = bytes(exported.mlir_module_serialized)
    except Exception as e:  # noqa: BLE001 - flatbuffers raise plain errors
        raise _Refused(f"not a serialized jax Exported: {type(e).__name__}: {e}") from None
    return _bytecode_text(module)
