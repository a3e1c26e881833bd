"""Running a prepared program in jaxlib's StableHLO reference interpreter
(``stablehlo.eval_module``) in an interpreter worker (:mod:`.pool`): the arguments go as
bytes with their tensor types, the results come back as NumPy data (with the conversions
the rewriter's wrapper ``main`` made undone here). The wait for the answer holds neither
the GIL nor any lock, so other threads run meanwhile and two programs run at once."""

from __future__ import annotations

import hashlib
import json
import math
import threading
from typing import Sequence

import numpy as np

from ifrtpy.backends.reference import pool
from ifrtpy.errors import InternalError
from ifrtpy.program import HloProgram, mlir

__all__ = ["MLIR_LOCK", "Interpretable", "element_name"]

#: The MLIR context is shared: parse and rewrite one at a time (programs run in workers).
MLIR_LOCK = threading.RLock()

#: The NumPy dtypes of results as a worker reads them (before the conversions are undone).
_RAW_DTYPES = {np.dtype(t).str: np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, np.float32, np.float64)}
#: Room in an answer beyond its results' bytes (its header, or the interpreter's message).
_ANSWER_SLACK = 1 << 20


class Interpretable:
    """A program prepared for the interpreter: its (rewritten) text, and how to pass
    parameters and read results."""

    def __init__(self, text: str, encoders: list, decoders: list, program: HloProgram):
        self.text = text
        self.encoders = encoders
        self.decoders = decoders
        self.params = program.parameters
        self.results = program.results
        arg_types = []
        for param, how in zip(self.params, encoders):
            type_text = _tensor_text(param)
            if how == "complex":
                part = type_text.replace("complex<f32>", "f32").replace("complex<f64>", "f64")
                arg_types += [part, part]
            else:
                arg_types.append(type_text)
        outs = [list(r.shape.dims) for r, how in zip(self.results, decoders)
                for _ in range(2 if how == "complex" else 1)]
        self._head = [hashlib.sha256(text.encode()).digest(), text.encode(),
                      json.dumps({"args": arg_types, "outs": outs}).encode()]
        self._outs = [tuple(dims) for dims in outs]
        self._limit = sum(8 * math.prod(dims) for dims in outs) + _ANSWER_SLACK
        pool.warm()

    def run(self, values: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The results of the program on ``values``; InternalError when the interpreter
        fails or its worker dies."""
        args = []
        for value, how in zip(values, self.encoders):
            if how == "complex":
                args += [np.ascontiguousarray(value.real).tobytes(),
                         np.ascontiguousarray(value.imag).tobytes()]
            else:
                args.append(np.ascontiguousarray(value).tobytes())
        outs = self._read(pool.run(self._head + args, self._limit))
        results = []
        for result, how in zip(self.results, self.decoders):
            dims, dtype = tuple(result.shape.dims), result.dtype.to_numpy()
            if how == "complex":
                re, im = outs.pop(0), outs.pop(0)
                value = (re + 1j * im.astype(re.dtype)).astype(dtype)
            else:
                raw = outs.pop(0)
                value = (raw.view(dtype) if how == "bitcast" else raw.astype(dtype))
            results.append(np.ascontiguousarray(value).reshape(dims))
        return results

    def _read(self, answer: list[memoryview]) -> list[np.ndarray]:
        """The raw results of a worker's answer, each checked against what the program
        returns; InternalError with the interpreter's message, or for anything else."""
        status, parts = (bytes(answer[0]) if answer else b""), answer[1:]
        if status == b"error" and len(parts) == 1:
            message = str(parts[0], "utf-8", "replace")
            raise InternalError(f"the StableHLO interpreter failed: {message}")
        try:
            dtypes = json.loads(bytes(parts[0])) if status == b"ok" and parts else None
            if not isinstance(dtypes, list) or not len(dtypes) == len(self._outs) == len(parts) - 1:
                raise ValueError(f"{len(parts) - 1} results")
            outs = []
            for name, data, dims in zip(dtypes, parts[1:], self._outs):
                dtype = _RAW_DTYPES[name]
                if len(data) != dtype.itemsize * math.prod(dims):
                    raise ValueError(f"{len(data)} bytes for {name}{list(dims)}")
                outs.append(np.frombuffer(data, dtype).reshape(dims))
            return outs
        except (ValueError, KeyError, TypeError) as e:
            raise InternalError(f"the StableHLO interpreter's worker answered malformed: {e}") from None


def _tensor_text(tensor_type) -> str:
    element = next(k for k, v in mlir.ELEMENT_TYPES.items() if v == tensor_type.dtype.kind)
    return "tensor<" + "".join(f"{d}x" for d in tensor_type.shape.dims) + element + ">"


def element_name(type_: object) -> str:
    """The element type of an MLIR ranked tensor type, as StableHLO spells it."""
    from jaxlib.mlir import ir
    return str(ir.RankedTensorType(type_).element_type)
