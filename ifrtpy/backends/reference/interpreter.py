"""Running a prepared program in jaxlib's StableHLO reference interpreter
(``stablehlo.eval_module``): arguments passed as dense attributes, results read back into
NumPy (with the conversions the rewriter's wrapper ``main`` made undone)."""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from ifrtpy.errors import InternalError
from ifrtpy.program import HloProgram, mlir

__all__ = ["MLIR_LOCK", "Interpretable", "element_name"]

#: The MLIR context is shared: parse, rewrite and run one at a time.
MLIR_LOCK = threading.RLock()


class Interpretable:
    """A program prepared for the interpreter: the (re-parsed) module, and how to pass
    parameters and read results."""

    def __init__(self, text: str, encoders: list, decoders: list, program: HloProgram):
        self.text = text
        self.encoders = encoders
        self.decoders = decoders
        self.params = program.parameters
        self.results = program.results
        self._module = None

    def run(self, values: Sequence[np.ndarray]) -> list[np.ndarray]:
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import stablehlo
        with MLIR_LOCK, mlir.context(), ir.Location.unknown():
            if self._module is None:
                self._module = ir.Module.parse(self.text)
            args = []
            for value, param, how in zip(values, self.params, self.encoders):
                type_text = _tensor_text(param)
                if how == "complex":
                    part = type_text.replace("complex<f32>", "f32").replace("complex<f64>", "f64")
                    args += [_dense(np.ascontiguousarray(value.real), part),
                             _dense(np.ascontiguousarray(value.imag), part)]
                else:
                    args.append(_dense(value, type_text))
            try:
                outs = list(stablehlo.eval_module(self._module, args))
            except Exception as e:  # noqa: BLE001 - the interpreter raises RuntimeError
                raise InternalError(f"the StableHLO interpreter failed: {e}") from None
            results = []
            for result, how in zip(self.results, self.decoders):
                dims, dtype = tuple(result.shape.dims), result.dtype.to_numpy()
                if how == "complex":
                    re, im = _numpy(outs.pop(0), dims), _numpy(outs.pop(0), dims)
                    value = (re + 1j * im.astype(re.dtype)).astype(dtype)
                else:
                    raw = _numpy(outs.pop(0), dims)
                    value = (raw.view(dtype) if how == "bitcast" else raw.astype(dtype))
                results.append(np.ascontiguousarray(value).reshape(dims))
            return results


def _tensor_text(tensor_type) -> str:
    element = next(k for k, v in mlir.ELEMENT_TYPES.items() if v == tensor_type.dtype.kind)
    return "tensor<" + "".join(f"{d}x" for d in tensor_type.shape.dims) + element + ">"


def _dense(value: np.ndarray, type_text: str):
    from jaxlib.mlir import ir
    data = np.ascontiguousarray(value).tobytes().hex()
    return ir.Attribute.parse(f'dense<"0x{data}"> : {type_text}')


def _numpy(attr, dims: tuple) -> np.ndarray:
    if 0 in dims:
        return np.zeros(dims, _ATTR_DTYPES.get(element_name(attr.type), np.float32))
    value = np.array(attr)
    if value.shape != dims:  # a splat holds one element
        value = np.broadcast_to(value.reshape(-1)[:1].reshape(()), dims)
    return value


_ATTR_DTYPES = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
                "i64": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
                "ui64": np.uint64, "f16": np.float16, "f32": np.float32, "f64": np.float64}


def element_name(type_: object) -> str:
    """The element type of an MLIR ranked tensor type, as StableHLO spells it."""
    from jaxlib.mlir import ir
    return str(ir.RankedTensorType(type_).element_type)
