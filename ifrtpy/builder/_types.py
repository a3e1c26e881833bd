"""Element types and tensor types of the builder: DType <-> MLIR, dtype classes, formatting.

The MLIR spelling of each kind comes from :mod:`ifrtpy.program` (the one table mapping
StableHLO element types to kinds), inverted here.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.program.mlir import ELEMENT_TYPES
from ifrtpy.shape import Shape

K = DType.Kind
MLIR_NAME = {kind: name for name, kind in ELEMENT_TYPES.items()}

SIGNED = frozenset({K.S2, K.S4, K.S8, K.S16, K.S32, K.S64})
UNSIGNED = frozenset({K.U2, K.U4, K.U8, K.U16, K.U32, K.U64})
INTEGER = SIGNED | UNSIGNED
COMPLEX = frozenset({K.C64, K.C128})
FLOAT = frozenset(k for k in MLIR_NAME if k not in INTEGER | COMPLEX | {K.PRED})
PRED = frozenset({K.PRED})

#: Names for the dtype classes an op accepts, used in error messages.
CLASS_NAMES = [(PRED, "pred"), (SIGNED, "signed integer"), (UNSIGNED, "unsigned integer"),
               (FLOAT, "floating-point"), (COMPLEX, "complex")]


def as_dtype(dtype: Any, who: str = "dtype") -> DType:
    """A DType from a DType, a DType.Kind, an MLIR name ("f32", "bf16", "i1") or anything
    ``np.dtype`` accepts."""
    if isinstance(dtype, DType):
        result = dtype
    elif isinstance(dtype, K):
        result = DType(dtype)
    elif isinstance(dtype, str) and dtype in ELEMENT_TYPES:
        result = DType(ELEMENT_TYPES[dtype])
    else:
        try:
            result = DType.from_numpy(dtype)
        except (TypeError, InvalidArgumentError) as e:
            raise InvalidArgumentError(f"{who}: {dtype!r} is not an element type ({e})") from None
    if result.kind not in MLIR_NAME:
        raise InvalidArgumentError(f"{who}: {result} has no StableHLO element type")
    return result


def as_dims(values: Any, who: str, what: str) -> tuple[int, ...]:
    """A tuple of Python ints from a sequence of integers (InvalidArgumentError otherwise)."""
    if isinstance(values, (int, np.integer)):
        values = (values,)
    try:
        return tuple(int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                     else _not_int(v) for v in values)
    except TypeError:
        raise InvalidArgumentError(f"{who}: {what} must be a sequence of integers, got {values!r}") from None


def _not_int(v):
    raise TypeError(v)


def fmt(shape: Iterable[int], dtype: DType) -> str:
    """``f32[2,3]``: how errors write a tensor type."""
    return f"{dtype}[{','.join(map(str, shape))}]"


def mlir_element_type(dtype: DType):
    from jaxlib.mlir import ir
    return ir.Type.parse(MLIR_NAME[dtype.kind])


def mlir_tensor_type(shape: Shape, dtype: DType):
    from jaxlib.mlir import ir
    return ir.RankedTensorType.get(list(shape), mlir_element_type(dtype))


def class_name(dtype: DType) -> str:
    for members, name in CLASS_NAMES:
        if dtype.kind in members:
            return name
    return "unknown"


def real_part(dtype: DType) -> DType:
    """f32 for c64, f64 for c128; the dtype itself otherwise."""
    return {K.C64: DType(K.F32), K.C128: DType(K.F64)}.get(dtype.kind, dtype)


def result_types(op: str, types: Any) -> tuple[list[tuple[Shape, DType]], bool]:
    """``(types, many)``: one (shape, dtype) pair (many False) or a list of them."""
    many = isinstance(types, list)
    pairs = types if many else [types]
    try:
        return [(Shape(as_dims(s, op, "result shape")), as_dtype(d, op)) for s, d in pairs], many
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{op}: result_types must be a (shape, dtype) pair or a "
                                   f"list of them, got {types!r}") from None
