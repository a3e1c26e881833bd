"""An interpreter worker: a process that runs the reference backend's prepared programs,
one at a time, for the process that started it (:mod:`.pool`): in the NumPy evaluator
(:mod:`.numpy_eval`) where it implements every op of the program (decided once, when the
program is first parsed), else in jaxlib's StableHLO interpreter (``stablehlo.eval_module``).

It is run as a script (:data:`BOOT`) and imports only the standard library, NumPy,
jaxlib's MLIR bindings and the evaluator's file beside it: nothing else of ifrtpy, so it
starts in a fraction of a second and holds none of ifrtpy's state. Its arguments: where
jaxlib's ``register_dialects`` lives ("module:attribute", as ``ifrtpy._jaxlib`` knows it
for the installed version), and the file descriptor of its lifeline ("-" for none).

Requests come on stdin, answers go out on the original stdout (anything else written to
stdout goes to stderr), each a message of byte strings (:func:`send`, :func:`receive`). A
request is the program's key, its text, a JSON header (``args``: each argument's tensor
type; ``outs``: each result's dims) and each argument's bytes; the answer is ``ok``, a
JSON list of the results' NumPy dtypes and each result's bytes, or ``error`` and the
interpreter's message. Parsed modules (and their headers) are kept by key (the last
:data:`MODULES_KEPT`).

It ends when stdin ends (its parent closed it, or ended). On Linux it also ends in the
middle of a program when its parent ends (the interpreter holds the GIL, so no Python code
could notice): the lifeline is a pipe the parent never writes to, set to raise SIGIO when
the parent's end closes, and SIGIO's default action ends the process. Ctrl-C is for the
parent: SIGINT is ignored.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
from typing import Any, Sequence

import numpy as np

__all__ = ["BOOT", "EVALUATOR_VARIABLE", "FALLBACK_LOG_VARIABLE", "MODULES_KEPT", "numpy_chosen",
           "send", "receive"]

#: The environment variable that chooses how workers run programs: ``numpy`` (the default:
#: :mod:`.numpy_eval` where it implements every op of the program, else the interpreter)
#: or ``interpreter`` (always the interpreter).
EVALUATOR_VARIABLE = "IFRTPY_REFERENCE_EVALUATOR"
#: Where set, a file to which workers append a line for each program the NumPy evaluator
#: leaves to the interpreter: its name and the first thing it lacks (to see what to add).
FALLBACK_LOG_VARIABLE = "IFRTPY_REFERENCE_FALLBACK_LOG"


def numpy_chosen() -> bool:
    """Whether :data:`EVALUATOR_VARIABLE` lets the NumPy evaluator run programs."""
    return os.environ.get(EVALUATOR_VARIABLE, "numpy") != "interpreter"

#: The command line's code: runs this file as ``__main__`` (``runpy.run_path``), without
#: its folder (or the working directory) on ``sys.path``, where the package's own modules
#: (``array.py``) would shadow the standard library's.
BOOT = ("import sys; sys.path[:] = [p for p in sys.path if p]; import runpy; "
        "runpy.run_path(sys.argv.pop(1), run_name='__main__')")

#: How many parsed modules a worker keeps.
MODULES_KEPT = 32

_HEADER = struct.Struct("<QI")  # the bytes after it, the number of byte strings


def send(fd: int, parts: Sequence[bytes]) -> None:
    """Writes one message of ``parts`` to ``fd``."""
    lengths = struct.pack(f"<{len(parts)}Q", *map(len, parts))
    data = memoryview(b"".join([_HEADER.pack(len(lengths) + sum(map(len, parts)), len(parts)),
                                lengths, *parts]))
    while data:
        data = data[os.write(fd, data):]


def receive(fd: int, limit: int) -> list[memoryview]:
    """The byte strings of the next message on ``fd``. EOFError when ``fd`` ends first;
    ValueError when the message is malformed or over ``limit`` bytes."""
    size, count = _HEADER.unpack(_read(fd, _HEADER.size))
    if size > limit:
        raise ValueError(f"a message of {size} bytes, over the limit of {limit}")
    if count * 8 > size:
        raise ValueError(f"a message of {size} bytes cannot hold {count} parts")
    body = memoryview(_read(fd, size))
    lengths = struct.unpack_from(f"<{count}Q", body)
    if sum(lengths) != size - count * 8:
        raise ValueError(f"a message of {size} bytes holds parts of {sum(lengths)}")
    parts, offset = [], count * 8
    for length in lengths:
        parts.append(body[offset:offset + length])
        offset += length
    return parts


def _read(fd: int, size: int) -> bytearray:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError(f"the pipe ended {size - got} bytes short of a message")
        got += n
    return buffer


# -- the worker process --------------------------------------------------------------------

_ATTR_DTYPES = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
                "i64": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
                "ui64": np.uint64, "f16": np.float16, "f32": np.float32, "f64": np.float64}


def _context(register_dialects: str) -> Any:
    """An MLIR context with the dialects of StableHLO programs (as ifrtpy's own)."""
    import importlib

    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import chlo, mhlo, sdy, stablehlo

    module, _, name = register_dialects.partition(":")
    context = ir.Context()
    registry = ir.DialectRegistry()
    getattr(importlib.import_module(module), name)(registry)
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()
    stablehlo.register_dialect(context)
    chlo.register_dialect(context)
    sdy.register_dialect(context)
    mhlo.register_mhlo_dialect(context)
    return context


def _numpy_evaluator() -> Any:
    """The module :mod:`.numpy_eval`, loaded from its file beside this one, with the
    :mod:`.bit_generators` and :mod:`.per_device` it takes (the worker imports nothing of ifrtpy); None where
    ``IFRTPY_REFERENCE_EVALUATOR`` is ``interpreter`` (every program in the interpreter)."""
    if not numpy_chosen():
        return None
    _load_beside("bit_generators")
    evaluator = _load_beside("numpy_eval")
    _load_beside("per_device")  # it takes the evaluator's helpers
    return evaluator


def _load_beside(stem: str) -> Any:
    """The file ``stem``.py beside this one, loaded as the module
    ``_ifrtpy_reference_<stem>`` (numpy_eval finds its bit generators under that name)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), stem + ".py")
    spec = importlib.util.spec_from_file_location("_ifrtpy_reference_" + stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _answer(context: Any, modules: dict[bytes, tuple[Any, Any, Any]], parts: list[memoryview],
            evaluator: Any = None) -> list[bytes]:
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    key, text, header, *args = parts
    try:
        with context, ir.Location.unknown():
            kept = modules.pop(bytes(key), None)
            if kept is None:
                module = ir.Module.parse(str(text, "utf-8"))
                why: list[str] = []
                program = None if evaluator is None else evaluator.compile_module(module, why)
                if why and os.environ.get(FALLBACK_LOG_VARIABLE):
                    _log_fallback(os.environ[FALLBACK_LOG_VARIABLE], module, why[0])
                kept = module, json.loads(bytes(header)), program
                if len(modules) >= MODULES_KEPT:
                    del modules[next(iter(modules))]
            modules[bytes(key)] = kept  # the most recently used last
            module, wanted, program = kept
            outs = None
            if program is not None:
                outs = _run_numpy(program, args)
            if outs is None:
                values = [ir.Attribute.parse(f'dense<"0x{data.hex()}"> : {type_text}')
                          for data, type_text in zip(args, wanted["args"])]
                outs = [_numpy(out, tuple(dims)) for out, dims in
                        zip(stablehlo.eval_module(module, values), wanted["outs"])]
    except Exception as e:  # noqa: BLE001 - the interpreter raises RuntimeError, MLIRError
        return [b"error", str(e).encode(errors="replace")]
    return [b"ok", json.dumps([out.dtype.str for out in outs]).encode(),
            *(out.tobytes() for out in outs)]


def _log_fallback(path: str, module: Any, why: str) -> None:
    """Appends a line to ``path``: the module's name, and what the evaluator lacks."""
    from jaxlib.mlir import ir

    name = (ir.StringAttr(module.operation.attributes["sym_name"]).value
            if "sym_name" in module.operation.attributes else "?")
    with open(path, "a") as log:
        log.write(f"{name}: {why}\n")


def _run_numpy(program: Any, args: list[memoryview]) -> list[np.ndarray] | None:
    """``program``'s results on the arguments' bytes; None (the interpreter runs it then)
    where the NumPy evaluator fails, which it should not: a line on stderr says so."""
    try:
        values = [np.frombuffer(data, dtype).reshape(shape)
                  for data, (shape, dtype) in zip(args, program.params)]
        return program(values)
    except program.ProgramError:  # the program's own fault: the execute fails
        raise
    except Exception as e:  # noqa: BLE001 - a bug of the evaluator: the interpreter decides
        print(f"ifrtpy reference worker: the NumPy evaluator failed ({type(e).__name__}: {e}); "
              "running the program in the interpreter", file=sys.stderr, flush=True)
        return None


def _numpy(attr: Any, dims: tuple) -> np.ndarray:
    from jaxlib.mlir import ir

    if 0 in dims:
        element = str(ir.RankedTensorType(attr.type).element_type)
        return np.zeros(dims, _ATTR_DTYPES.get(element, np.float32))
    value = np.array(attr)
    if value.shape != dims:  # a splat holds one element
        value = np.broadcast_to(value.reshape(-1)[:1].reshape(()), dims)
    return np.ascontiguousarray(value)


def _hold_lifeline(fd: int) -> bool:
    """Arms SIGIO on the lifeline ``fd``; False when its other end has closed already."""
    import fcntl
    import select

    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    hang_up = select.poll()
    hang_up.register(fd, select.POLLIN)
    return not hang_up.poll(0)  # closed before SIGIO was armed: no SIGIO comes


def main(register_dialects: str, lifeline: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if lifeline != "-" and not _hold_lifeline(int(lifeline)):
        return
    answers = os.dup(1)
    os.dup2(2, 1)  # what jaxlib prints cannot mix into the answers
    sys.stdout = sys.stderr
    context = _context(register_dialects)
    evaluator = _numpy_evaluator()
    modules: dict[bytes, tuple[Any, Any, Any]] = {}
    while True:
        try:
            request = receive(0, sys.maxsize)
        except EOFError:
            return
        try:
            send(answers, _answer(context, modules, request, evaluator))
        except OSError:  # the parent has gone
            return


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
