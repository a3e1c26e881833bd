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

Bytes and HLO text are converted in a child process, the reader (:func:`convert_isolated`):
jaxlib's bytecode and HloModuleProto readers trust their input, and a changed byte can
abort the process or corrupt its heap. The reader hands back StableHLO text, which the
MLIR text parser reads safely here. One reader, started on first use, serves the inputs
of a process one at a time (threads wait their turn); a reader that dies on an input, or
takes over the time bound, means that input is refused and the next one starts a fresh
reader. A reader that refuses an input is replaced too: having read hostile bytes, its
heap may be damaged, so it is not trusted with the next input. The reader exits when its
stdin ends (this process exits), and a forked child starts its own. Results are memoized
by SHA-256 digest, so each distinct input is read once per process. The reader starts in
about 2 s on a loaded 2-core machine, then reads a small program in a few milliseconds:
50 distinct small ``HloProgram(bytes)`` took about 2 s in all, against about 180 s
with a child per input.
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import os
import re
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
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
    """:func:`stablehlo_text` of each program, in order (the bytes among them, and HLO text,
    read one after another by the one reader process); the first refused input's error."""
    return [stablehlo_text(p) for p in programs]


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
        if kind == "Lowered" and module.startswith("jax"):
            _refuse_unreduced_lowering(program)
        text = program.as_text()
        if isinstance(text, str):
            return _source(text)
    raise InvalidArgumentError(
        f"HloProgram takes StableHLO or HLO text, MLIR bytecode, a serialized HloModuleProto "
        f"or jax Exported, an MLIR module, an XlaComputation, or a jax Lowered/Compiled/"
        f"Exported object, not {type(program).__name__}")


def _refuse_unreduced_lowering(lowered: Any) -> None:
    """UnimplementedError for a jax ``Lowered`` stage whose jax lowered unreduced values as
    arrays with a leading axis per unreduced mesh axis (jax 0.12.1 and later): the program's
    signature is not the arrays its caller has, and ifrtpy cannot map one to the other."""
    found = _jaxlib.lowered_unreduced_values(lowered)
    if found:
        raise UnimplementedError(
            f"jax {_jaxlib.version_text()} lowers unreduced values as arrays with a leading "
            f"axis per unreduced mesh axis, which ifrtpy cannot run from a Lowered stage "
            f"({'; '.join(found)}): reduce them inside the function (jax.sharding.reshard), or "
            f"give the program as StableHLO whose shardings say unreduced={{...}}")


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


_KINDS = ("bytes", "hlo_text")
_FRAME = struct.Struct("<BQ")  # (kind index or status, length) before each request and answer


class _Reader:
    """One child process that converts inputs sent on its stdin, one at a time: a request
    is ``_FRAME(kind index, length)`` and the input; the answer ``_FRAME(status,
    length)`` and the text (status 0: StableHLO; 1: why the input was refused). Its stderr
    goes to a file, read for the last line when it dies."""

    def __init__(self) -> None:
        # `-c` puts the working directory first on sys.path: it is dropped before the import,
        # so the child runs this ifrtpy (from package_root), never a package found there.
        code = ("import sys; sys.path[:] = [p for p in sys.path if p]; "
                "from ifrtpy.program.inputs import _reader_main; _reader_main()")
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        self.owner = os.getpid()
        self._stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        assert self._process.stdout is not None
        # epoll or kqueue where there is one: select() takes no descriptor above 1023
        self._answers = selectors.DefaultSelector()
        self._answers.register(self._process.stdout, selectors.EVENT_READ)

    @property
    def pid(self) -> int:
        return self._process.pid

    def alive(self) -> bool:
        return self.owner == os.getpid() and self._process.poll() is None

    def convert(self, data: bytes, kind: str, timeout: float) -> tuple[int, str]:
        """``(status, text)`` of the reader's answer for ``data``; _Died when the reader
        ends before it answers, _Overran when it takes over ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(_FRAME.pack(_KINDS.index(kind), len(data)) + data)
            self._process.stdin.flush()
        except OSError:  # the reader has ended: its pipe is closed
            raise _Died(self._end()) from None
        status, size = _FRAME.unpack(self._receive(_FRAME.size, deadline))
        return status, self._receive(size, deadline).decode(errors="replace")

    def _receive(self, size: int, deadline: float) -> bytes:
        assert self._process.stdout is not None
        fd, chunks, left = self._process.stdout.fileno(), [], size
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not self._answers.select(wait):
                raise _Overran()
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise _Died(self._end())
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _end(self) -> str:
        """Why the (ended) reader ended: its exit status, or signal, and last stderr line."""
        code = self._process.wait()
        how = f"exit status {code}"
        if code < 0:
            try:
                how += f", {signal.Signals(-code).name}"
            except ValueError:
                pass
        self._stderr.seek(max(0, self._stderr.seek(0, os.SEEK_END) - 4096))
        last = self._stderr.read().decode(errors="replace").strip().splitlines()[-1:]
        return how + (": " + last[0][:200] if last else "")

    def close(self) -> None:
        """Ends the reader (SIGKILL: it holds nothing worth a clean exit) and reaps it."""
        self.abandon()
        if self.owner == os.getpid():
            self._process.kill()
            self._process.wait()

    def abandon(self) -> None:
        """Closes this process's ends of the pipes (all a forked child may do: the reader
        is not its child)."""
        self._answers.close()
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        self._stderr.close()


class _Died(Exception):
    """The reader ended before it answered (message: how it ended)."""


class _Overran(Exception):
    """The reader did not answer within the time bound."""


_reader: _Reader | None = None
_reader_lock = threading.Lock()


def _read(data: bytes, kind: str) -> tuple[int, str]:
    """``(status, text)`` of the reader for ``data``. A reader is started on first use, in
    each process (a forked child does not share its parent's); it is replaced after any
    answer but StableHLO text, and after it dies or overruns (:meth:`_Reader.convert`)."""
    global _reader
    with _reader_lock:
        if _reader is not None and not _reader.alive():
            _reader.close()
            _reader = None
        if _reader is None:
            _reader = _Reader()
        try:
            status, text = _reader.convert(data, kind, _CHILD_TIMEOUT_S)
        except BaseException:  # _Died, _Overran, or an interrupt that leaves an answer unread
            _reader.close()
            _reader = None
            raise
        if status != 0:  # it has read a hostile input: its heap may be damaged
            _reader.close()
            _reader = None
        return status, text


def _reader_pid() -> int | None:
    """The pid of this process's reader (None before the first input or after it ended)."""
    with _reader_lock:
        return _reader.pid if _reader is not None and _reader.alive() else None


def _close_reader() -> None:
    global _reader
    with _reader_lock:
        if _reader is not None:
            _reader.close()
            _reader = None


def _forget_reader_after_fork() -> None:
    global _reader, _reader_lock
    _reader_lock = threading.Lock()  # another thread may have held it at the fork
    if _reader is not None:
        _reader.abandon()
        _reader = None


atexit.register(_close_reader)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_reader_after_fork)


def convert_isolated(data: bytes, kind: str) -> str:
    """StableHLO text of untrusted ``data`` ("bytes": bytecode, portable artifact,
    HloModuleProto or serialized jax Exported; "hlo_text": HLO text), converted by jaxlib in
    the reader process; memoized by digest. InvalidArgumentError when the reader refuses the
    input, dies on it, or takes over the time bound."""
    key = _key(data, kind)
    text = _memoized(key)
    if text is not None:
        return text
    if not data:
        raise InvalidArgumentError("the program is empty (0 bytes)")
    what = "HLO text" if kind == "hlo_text" else f"program bytes ({len(data)} bytes, starting {data[:8]!r})"
    try:
        status, text = _read(data, kind)
    except _Overran:
        raise InvalidArgumentError(
            f"reading the program ({len(data)} bytes) took over {_CHILD_TIMEOUT_S} s; refused") from None
    except _Died as e:
        raise InvalidArgumentError(
            f"not a valid program: {what} made jaxlib's reader fail in a child process "
            f"({e.args[0]}); refused before it reached this process") from None
    if status != 0:
        raise InvalidArgumentError(f"not a valid program: {what}: {text}")
    _memoize(key, text)
    return text


def _convert(data: bytes, kind: str) -> str:
    return _hlo_text_to_stablehlo(data.decode()) if kind == "hlo_text" else _bytes_to_stablehlo(data)


def _reader_main() -> None:
    """The reader process (:class:`_Reader`): answers requests until its stdin ends."""
    source = sys.stdin.buffer
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # what jaxlib prints cannot mix in
    sys.stdout = sys.stderr
    while True:
        header = source.read(_FRAME.size)
        if len(header) < _FRAME.size:
            return  # the parent has gone (or closed the pipe)
        kind, size = _FRAME.unpack(header)
        data = source.read(size)
        try:
            status, text = 0, _convert(data, _KINDS[kind])
        except _Refused as e:
            status, text = 1, str(e)
        except Exception as e:  # noqa: BLE001 - jaxlib moved a name, or alike
            status, text = 1, f"{type(e).__name__}: {e}"
        encoded = text.encode()
        out.write(_FRAME.pack(status, len(encoded)) + encoded)
        out.flush()


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
