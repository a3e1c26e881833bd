"""Shape and dtype inference: one pure function per rule, before anything is emitted.

Every function takes the op's name, its operands (anything with ``.shape`` and ``.dtype``)
and its static attributes, and returns the result ``(shape, dtype)`` (or a list of them),
or raises InvalidArgumentError naming the op and the operand types. The rules are
StableHLO's (https://openxla.org/stablehlo/spec), restricted where XLA is: no implicit
broadcasting, equal element types for binary ops.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import Shape

from ifrtpy.builder._types import (
    COMPLEX, FLOAT, INTEGER, PRED, SIGNED, class_name, fmt, real_part,
)

Result = tuple[Shape, DType]


def _types(*operands) -> str:
    return ", ".join(fmt(o.shape, o.dtype) for o in operands)


def fail(op: str, operands: Sequence[Any], message: str) -> InvalidArgumentError:
    """The error for ``op``: its message and the operand types."""
    where = f" (operands: {_types(*operands)})" if operands else ""
    return InvalidArgumentError(f"{op}: {message}{where}")


def check_class(op: str, operands, allowed: frozenset, what: str) -> None:
    for o in operands:
        if o.dtype.kind not in allowed:
            raise fail(op, operands, f"needs {what} operands, got {class_name(o.dtype)} {o.dtype}")


def same_types(op: str, operands) -> None:
    first = operands[0]
    for o in operands[1:]:
        if o.shape != first.shape or o.dtype != first.dtype:
            raise fail(op, operands,
                       "operands must have the same shape and dtype (StableHLO does not "
                       "broadcast implicitly: use broadcast_in_dim or broadcast_to, and convert)")


def check_axes(op: str, operands, axes: Sequence[int], rank: int, what: str,
               distinct: bool = True) -> None:
    for a in axes:
        if not 0 <= a < rank:
            raise fail(op, operands, f"{what} {list(axes)} has {a}, out of range for rank {rank}")
    if distinct and len(set(axes)) != len(axes):
        raise fail(op, operands, f"{what} {list(axes)} has duplicates")


# -- elementwise ------------------------------------------------------------------------------

NUMERIC = INTEGER | FLOAT | COMPLEX
_FC = (FLOAT | COMPLEX, "floating-point or complex")
_F = (FLOAT, "floating-point")
_I = (INTEGER, "integer")
_SFC = (SIGNED | FLOAT | COMPLEX, "signed integer, floating-point or complex")
_LOGICAL = (PRED | INTEGER, "pred or integer")
UNARY_CLASSES = {
    "neg": (INTEGER | FLOAT | COMPLEX, "integer, floating-point or complex"),
    "abs": _SFC, "sign": _SFC,
    "exp": _FC, "expm1": _FC, "log": _FC, "log1p": _FC, "logistic": _FC,
    "sqrt": _FC, "rsqrt": _FC, "cbrt": _F, "square": _FC,
    "sin": _FC, "cos": _FC, "tan": _FC, "tanh": _FC, "sinh": _FC, "cosh": _FC,
    "asin": _FC, "acos": _FC, "atan": _FC, "asinh": _FC, "acosh": _FC, "atanh": _FC,
    "erf": _F, "erfc": _F, "erf_inv": _F, "lgamma": _F, "digamma": _F, "bessel_i1e": _F,
    "floor": _F, "ceil": _F, "round": _F, "round_nearest_even": _F,
    "is_finite": _F, "is_inf": _F, "is_pos_inf": _F, "is_neg_inf": _F,
    "real": _FC, "imag": _FC, "conj": (COMPLEX, "complex"),
    "not": _LOGICAL, "popcnt": _I, "clz": _I,
}
#: Unary ops whose result dtype is not the operand's.
_TO_PRED = frozenset({"is_finite", "is_inf", "is_pos_inf", "is_neg_inf"})
_TO_REAL = frozenset({"abs", "real", "imag"})

BINARY_CLASSES = {
    "add": (PRED | NUMERIC, "pred or numeric"),
    "sub": (NUMERIC, "integer, floating-point or complex"),
    "mul": (PRED | NUMERIC, "pred or numeric"),
    "div": (NUMERIC, "integer, floating-point or complex"),
    "rem": (INTEGER | FLOAT, "integer or floating-point"),
    "max": (PRED | INTEGER | FLOAT, "pred, integer or floating-point"),
    "min": (PRED | INTEGER | FLOAT, "pred, integer or floating-point"),
    "pow": (NUMERIC, "integer, floating-point or complex"),
    "and": _LOGICAL, "or": _LOGICAL, "xor": _LOGICAL,
    "shift_left": _I, "shift_right_arithmetic": _I, "shift_right_logical": _I,
    "atan2": _FC, "next_after": _F, "polygamma": _F, "zeta": _F,
    "complex": (frozenset({DType.Kind.F32, DType.Kind.F64}), "f32 or f64"),
}


def unary(op: str, x) -> Result:
    allowed, what = UNARY_CLASSES[op]
    check_class(op, [x], allowed, what)
    if op in _TO_PRED:
        return x.shape, DType(DType.Kind.PRED)
    return x.shape, (real_part(x.dtype) if op in _TO_REAL else x.dtype)


def binary(op: str, x, y) -> Result:
    same_types(op, [x, y])
    allowed, what = BINARY_CLASSES[op]
    check_class(op, [x, y], allowed, what)
    if op == "complex":
        return x.shape, DType(DType.Kind.C64 if x.dtype.kind == DType.Kind.F32 else DType.Kind.C128)
    return x.shape, x.dtype


#: ResultAccuracy modes (StableHLO's); TOLERANCE goes with atol, rtol and ulps.
ACCURACY_MODES = ("DEFAULT", "HIGHEST", "TOLERANCE")


def result_accuracy(op: str, x, value) -> tuple[float, float, int, str]:
    """``(atol, rtol, ulps, mode)`` from a mode name or a ResultAccuracy-like object."""
    if isinstance(value, str):
        atol, rtol, ulps, mode = 0.0, 0.0, 0, value.upper()
    else:
        try:
            atol, rtol, ulps, mode = (float(value.atol), float(value.rtol), int(value.ulps),
                                      str(value.mode).upper())
        except (AttributeError, TypeError, ValueError):
            raise fail(op, [x], f"result_accuracy must be a mode name or a ResultAccuracy, "
                                f"got {value!r}") from None
    if mode not in ACCURACY_MODES:
        raise fail(op, [x], f"result_accuracy mode must be one of {', '.join(ACCURACY_MODES)}, "
                            f"got {mode!r}")
    if min(atol, rtol, ulps) < 0 or not all(math.isfinite(v) for v in (atol, rtol)):
        raise fail(op, [x], f"result_accuracy tolerances must be finite and non-negative, got "
                            f"atol={atol}, rtol={rtol}, ulps={ulps}")
    if mode != "TOLERANCE" and (atol or rtol or ulps):
        raise fail(op, [x], f"result_accuracy mode {mode} takes no tolerances (atol, rtol, ulps "
                            f"go with mode TOLERANCE)")
    return atol, rtol, ulps, mode


DIRECTIONS = ("EQ", "NE", "LT", "LE", "GT", "GE")


def compare(op: str, x, y, direction: str) -> Result:
    if direction not in DIRECTIONS:
        raise fail(op, [x, y], f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    same_types(op, [x, y])
    if x.dtype.kind in COMPLEX and direction not in ("EQ", "NE"):
        raise fail(op, [x, y], f"complex operands only compare EQ or NE, not {direction}")
    return x.shape, DType(DType.Kind.PRED)


def compare_type(dtype: DType) -> str:
    """The comparison type XLA expects for a dtype."""
    if dtype.kind in FLOAT or dtype.kind in COMPLEX:
        return "FLOAT"
    if dtype.kind in SIGNED:
        return "SIGNED"
    return "UNSIGNED"


def select(op: str, pred, on_true, on_false) -> Result:
    operands = [pred, on_true, on_false]
    if pred.dtype.kind not in PRED:
        raise fail(op, operands, f"the predicate must be pred, got {pred.dtype}")
    if on_true.shape != on_false.shape or on_true.dtype != on_false.dtype:
        raise fail(op, operands, "on_true and on_false must have the same shape and dtype")
    if pred.shape != () and pred.shape != on_true.shape:
        raise fail(op, operands, "the predicate must be a scalar or have the shape of the branches")
    return on_true.shape, on_true.dtype


def clamp(op: str, lo, x, hi) -> Result:
    operands = [lo, x, hi]
    for bound in (lo, hi):
        if bound.dtype != x.dtype or (bound.shape != () and bound.shape != x.shape):
            raise fail(op, operands, "min and max must be scalars or have the operand's shape, "
                                     "with its dtype")
    check_class(op, [x], PRED | INTEGER | FLOAT, "pred, integer or floating-point")
    return x.shape, x.dtype


def convert(op: str, x, dtype: DType) -> Result:
    if x.dtype.kind in COMPLEX and dtype.kind not in COMPLEX:
        raise fail(op, [x], f"cannot convert complex to {dtype}; take the real part first")
    return x.shape, dtype


def bitcast_convert(op: str, x, dtype: DType) -> Result:
    if PRED & {x.dtype.kind, dtype.kind}:
        raise fail(op, [x], "pred cannot be bitcast")
    src, dst = x.dtype.bit_size, dtype.bit_size
    if src == dst:
        return x.shape, dtype
    if src > dst:
        if src % dst:
            raise fail(op, [x], f"{src}-bit elements do not split into {dst}-bit ones")
        return Shape(tuple(x.shape) + (src // dst,)), dtype
    if dst % src or not x.shape or x.shape[-1] != dst // src:
        raise fail(op, [x], f"to bitcast {src}-bit elements to {dst}-bit ones the last "
                            f"dimension must be {dst // src if dst % src == 0 else '?'}")
    return Shape(x.shape[:-1]), dtype


# -- shapes ----------------------------------------------------------------------------------

def iota(op: str, shape: Sequence[int], dtype: DType, dimension: int) -> Result:
    if dtype.kind in PRED:
        raise InvalidArgumentError(f"{op}: dtype must be numeric, got {dtype}")
    if not 0 <= dimension < len(shape):
        raise InvalidArgumentError(
            f"{op}: dimension {dimension} is out of range for shape {list(shape)}")
    return Shape(shape), dtype


def broadcast_in_dim(op: str, x, shape: Sequence[int], dims: Sequence[int]) -> Result:
    if len(dims) != len(x.shape):
        raise fail(op, [x], f"broadcast_dimensions {list(dims)} must have one entry per operand "
                            f"dimension ({len(x.shape)})")
    check_axes(op, [x], dims, len(shape), "broadcast_dimensions")
    for i, d in enumerate(dims):
        if x.shape[i] not in (1, shape[d]):
            raise fail(op, [x], f"operand dimension {i} (size {x.shape[i]}) cannot broadcast to "
                                f"result dimension {d} (size {shape[d]}) of {list(shape)}")
    return Shape(shape), x.dtype


def broadcast_to(op: str, x, shape: Sequence[int]) -> tuple[int, ...]:
    """NumPy's rule (trailing dims aligned): the broadcast_dimensions to use."""
    if len(shape) < len(x.shape):
        raise fail(op, [x], f"cannot broadcast to the lower-rank shape {list(shape)}")
    offset = len(shape) - len(x.shape)
    dims = tuple(range(offset, len(shape)))
    broadcast_in_dim(op, x, shape, dims)
    return dims


def reshape(op: str, x, shape: Sequence[int]) -> Result:
    if math.prod(shape) != math.prod(x.shape):
        raise fail(op, [x], f"cannot reshape {math.prod(x.shape)} elements into {list(shape)}")
    return Shape(shape), x.dtype


def transpose(op: str, x, permutation: Sequence[int]) -> Result:
    if sorted(permutation) != list(range(len(x.shape))):
        raise fail(op, [x], f"permutation {list(permutation)} is not a permutation of "
                            f"range({len(x.shape)})")
    return Shape(x.shape[p] for p in permutation), x.dtype


def slice_(op: str, x, start, limit, strides) -> Result:
    rank = len(x.shape)
    if not len(start) == len(limit) == len(strides) == rank:
        raise fail(op, [x], f"start {list(start)}, limit {list(limit)} and strides {list(strides)} "
                            f"need one entry per dimension ({rank})")
    dims = []
    for i, (s, l, st, d) in enumerate(zip(start, limit, strides, x.shape)):
        if not 0 <= s <= l <= d:
            raise fail(op, [x], f"dimension {i}: need 0 <= start ({s}) <= limit ({l}) <= size ({d})")
        if st < 1:
            raise fail(op, [x], f"dimension {i}: stride must be positive, got {st}")
        dims.append(-(-(l - s) // st))
    return Shape(dims), x.dtype


def start_indices(op: str, operands, indices, rank: int) -> None:
    if len(indices) != rank:
        raise fail(op, operands, f"needs {rank} start indices, got {len(indices)}")
    for i in indices:
        if i.shape != () or i.dtype.kind not in INTEGER:
            raise fail(op, operands, f"start indices must be integer scalars, got {fmt(i.shape, i.dtype)}")
    if len({i.dtype for i in indices}) > 1:
        raise fail(op, operands, "start indices must all have the same dtype")


def dynamic_slice(op: str, x, indices, sizes) -> Result:
    start_indices(op, [x, *indices], indices, len(x.shape))
    if len(sizes) != len(x.shape):
        raise fail(op, [x], f"slice_sizes {list(sizes)} need one entry per dimension ({len(x.shape)})")
    for i, (s, d) in enumerate(zip(sizes, x.shape)):
        if not 0 <= s <= d:
            raise fail(op, [x], f"slice size {s} of dimension {i} is outside [0, {d}]")
    return Shape(sizes), x.dtype


def dynamic_update_slice(op: str, x, update, indices) -> Result:
    start_indices(op, [x, update, *indices], indices, len(x.shape))
    if update.dtype != x.dtype or len(update.shape) != len(x.shape):
        raise fail(op, [x, update], "the update must have the operand's rank and dtype")
    for i, (u, d) in enumerate(zip(update.shape, x.shape)):
        if u > d:
            raise fail(op, [x, update], f"the update is larger than the operand in dimension {i}")
    return x.shape, x.dtype


def concatenate(op: str, xs, dimension: int) -> Result:
    if not xs:
        raise InvalidArgumentError(f"{op}: needs at least one operand")
    first = xs[0]
    rank = len(first.shape)
    if not 0 <= dimension < rank:
        raise fail(op, xs, f"dimension {dimension} is out of range for rank {rank}")
    total = 0
    for x in xs:
        if x.dtype != first.dtype or len(x.shape) != rank:
            raise fail(op, xs, "operands must have the same rank and dtype")
        for i in range(rank):
            if i != dimension and x.shape[i] != first.shape[i]:
                raise fail(op, xs, f"operands differ in dimension {i}, which is not the "
                                   f"concatenation dimension {dimension}")
        total += x.shape[dimension]
    shape = list(first.shape)
    shape[dimension] = total
    return Shape(shape), first.dtype


def pad(op: str, x, value, low, high, interior) -> Result:
    operands = [x, value]
    if value.shape != () or value.dtype != x.dtype:
        raise fail(op, operands, "the padding value must be a scalar of the operand's dtype")
    rank = len(x.shape)
    if not len(low) == len(high) == len(interior) == rank:
        raise fail(op, operands, f"low {list(low)}, high {list(high)} and interior "
                                 f"{list(interior)} need one entry per dimension ({rank})")
    dims = []
    for i, (lo, hi, inner, d) in enumerate(zip(low, high, interior, x.shape)):
        if inner < 0:
            raise fail(op, operands, f"interior padding of dimension {i} is negative ({inner})")
        size = lo + hi + d + max(d - 1, 0) * inner
        if size < 0:
            raise fail(op, operands, f"dimension {i} would have negative size {size}")
        dims.append(size)
    return Shape(dims), x.dtype


def reverse(op: str, x, dims) -> Result:
    check_axes(op, [x], dims, len(x.shape), "dimensions")
    return x.shape, x.dtype


# -- contractions ----------------------------------------------------------------------------

PRECISIONS = ("DEFAULT", "HIGH", "HIGHEST")


def precision(op: str, operands, value) -> tuple[str, str]:
    if value is None:
        value = "DEFAULT"
    pair = (value, value) if isinstance(value, str) else tuple(value)
    pair = tuple(getattr(p, "name", p) for p in pair)
    if len(pair) != 2 or any(p not in PRECISIONS for p in pair):
        raise fail(op, operands, f"precision must be one of {', '.join(PRECISIONS)} or a pair "
                                 f"of them, got {value!r}")
    return pair  # type: ignore[return-value]


def _result_dtype(op: str, operands, preferred) -> DType:
    lhs, rhs = operands
    if lhs.dtype != rhs.dtype:
        raise fail(op, operands, "lhs and rhs must have the same dtype")
    if lhs.dtype.kind in PRED:
        raise fail(op, operands, "needs numeric operands, got pred")
    if preferred is None:
        return lhs.dtype
    source = next(c for c in (INTEGER, FLOAT, COMPLEX) if lhs.dtype.kind in c)
    if preferred.kind not in source:
        raise fail(op, operands, f"preferred_element_type {preferred} does not suit "
                                 f"{class_name(lhs.dtype)} operands")
    return preferred


def dot_general(op: str, lhs, rhs, contracting, batch, preferred) -> Result:
    operands = [lhs, rhs]
    (lc, rc), (lb, rb) = contracting, batch
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise fail(op, operands, f"lhs and rhs need as many contracting dims ({list(lc)} vs "
                                 f"{list(rc)}) and batch dims ({list(lb)} vs {list(rb)})")
    for side, x, dims in (("lhs", lhs, list(lb) + list(lc)), ("rhs", rhs, list(rb) + list(rc))):
        check_axes(op, operands, dims, len(x.shape), f"{side} batch + contracting dims")
    for a, b in zip(lb, rb):
        if lhs.shape[a] != rhs.shape[b]:
            raise fail(op, operands, f"batch dims lhs {a} (size {lhs.shape[a]}) and rhs {b} "
                                     f"(size {rhs.shape[b]}) differ")
    for a, b in zip(lc, rc):
        if lhs.shape[a] != rhs.shape[b]:
            raise fail(op, operands, f"contracting dims lhs {a} (size {lhs.shape[a]}) and rhs {b} "
                                     f"(size {rhs.shape[b]}) differ")
    dtype = _result_dtype(op, operands, preferred)
    free_l = [d for i, d in enumerate(lhs.shape) if i not in lb and i not in lc]
    free_r = [d for i, d in enumerate(rhs.shape) if i not in rb and i not in rc]
    return Shape([lhs.shape[i] for i in lb] + free_l + free_r), dtype


def dot_dims(op: str, lhs, rhs) -> tuple[int, int]:
    """``dot``'s contracting dims (rank 1 or 2 operands, as XLA's Dot)."""
    if len(lhs.shape) not in (1, 2) or len(rhs.shape) not in (1, 2):
        raise fail(op, [lhs, rhs], "dot takes rank 1 or 2 operands; use dot_general")
    return len(lhs.shape) - 1, 0


def _window(op, operands, i, size, window, stride, lo, hi, base_dil, win_dil) -> int:
    if stride < 1 or base_dil < 1 or win_dil < 1 or window < 0:
        raise fail(op, operands, f"spatial dimension {i}: strides and dilations must be positive "
                                 f"and window sizes non-negative")
    dilated = (size - 1) * base_dil + 1 if size else 0
    padded = lo + dilated + hi
    extent = (window - 1) * win_dil + 1 if window else 0
    if padded < 0:
        raise fail(op, operands, f"spatial dimension {i}: padding ({lo}, {hi}) leaves a negative size")
    return 0 if padded < extent else (padded - extent) // stride + 1


def conv(op: str, lhs, rhs, dn, strides, padding, lhs_dil, rhs_dil, feature_groups: int,
         batch_groups: int, preferred) -> Result:
    operands = [lhs, rhs]
    rank = len(lhs.shape)
    if len(rhs.shape) != rank or rank < 2:
        raise fail(op, operands, "lhs and rhs must have the same rank (at least 2)")
    nsp = rank - 2
    (ib, ifeat, isp), (ko, ki, ksp), (ob, ofeat, osp) = dn
    for side, dims in (("lhs", [ib, ifeat, *isp]), ("rhs", [ko, ki, *ksp]), ("out", [ob, ofeat, *osp])):
        if len(dims) != rank or sorted(dims) != list(range(rank)):
            raise fail(op, operands, f"{side} dimension numbers {dims} are not a permutation of "
                                     f"range({rank})")
    for name, values in (("window_strides", strides), ("padding", padding),
                         ("lhs_dilation", lhs_dil), ("rhs_dilation", rhs_dil)):
        if len(values) != nsp:
            raise fail(op, operands, f"{name} needs {nsp} entries, got {list(values)}")
    if feature_groups < 1 or batch_groups < 1 or (feature_groups > 1 and batch_groups > 1):
        raise fail(op, operands, f"feature_group_count ({feature_groups}) and batch_group_count "
                                 f"({batch_groups}) must be positive, and not both above 1")
    n, c = lhs.shape[ib], lhs.shape[ifeat]
    o, i = rhs.shape[ko], rhs.shape[ki]
    if c != i * feature_groups:
        raise fail(op, operands, f"input features ({c}) must equal kernel input features ({i}) "
                                 f"x feature_group_count ({feature_groups})")
    if o % feature_groups or o % batch_groups:
        raise fail(op, operands, f"kernel output features ({o}) must divide by the group count")
    if n % batch_groups:
        raise fail(op, operands, f"batch ({n}) must divide by batch_group_count ({batch_groups})")
    dtype = _result_dtype(op, operands, preferred)
    out = [0] * rank
    out[ob], out[ofeat] = n // batch_groups, o
    for k in range(nsp):
        lo, hi = padding[k]
        out[osp[k]] = _window(op, operands, k, lhs.shape[isp[k]], rhs.shape[ksp[k]], strides[k],
                              lo, hi, lhs_dil[k], rhs_dil[k])
    return Shape(out), dtype


# -- reductions, windows, sort -------------------------------------------------------------------

def window_reversal(op: str, operands, value, spatial: int) -> list[bool]:
    """One bool per spatial dimension."""
    try:
        flags = list(value)
    except TypeError:
        flags = None
    if flags is None or len(flags) != spatial or not all(
            isinstance(f, (bool, np.bool_)) for f in flags):
        raise fail(op, operands, f"window_reversal must be {spatial} bools (one per spatial "
                                 f"dimension), got {value!r}")
    return [bool(f) for f in flags]


def reduce(op: str, xs, inits, dims) -> list[Result]:
    operands = [*xs, *inits]
    if not xs or len(xs) != len(inits):
        raise fail(op, operands, "needs as many init values as inputs (at least one)")
    for x in xs[1:]:
        if x.shape != xs[0].shape:
            raise fail(op, operands, "inputs must have the same shape")
    for x, init in zip(xs, inits):
        if init.shape != () or init.dtype != x.dtype:
            raise fail(op, operands, "each init value must be a scalar of its input's dtype")
    check_axes(op, operands, dims, len(xs[0].shape), "dimensions")
    shape = Shape(d for i, d in enumerate(xs[0].shape) if i not in dims)
    return [(shape, x.dtype) for x in xs]


def reduce_window(op: str, xs, inits, window, strides, base_dil, win_dil, padding) -> list[Result]:
    reduce(op, xs, inits, [])
    operands = [*xs, *inits]
    rank = len(xs[0].shape)
    for name, values in (("window_dimensions", window), ("window_strides", strides),
                         ("base_dilations", base_dil), ("window_dilations", win_dil),
                         ("padding", padding)):
        if len(values) != rank:
            raise fail(op, operands, f"{name} needs {rank} entries, got {list(values)}")
    shape = Shape(_window(op, operands, i, xs[0].shape[i], window[i], strides[i], *padding[i],
                          base_dil[i], win_dil[i]) for i in range(rank))
    if any(w < 1 for w in window):
        raise fail(op, operands, f"window_dimensions must be positive, got {list(window)}")
    return [(shape, x.dtype) for x in xs]


def sort(op: str, xs, dimension: int) -> list[Result]:
    if not xs:
        raise InvalidArgumentError(f"{op}: needs at least one operand")
    for x in xs[1:]:
        if x.shape != xs[0].shape:
            raise fail(op, xs, "operands must have the same shape")
    rank = len(xs[0].shape)
    if not -rank <= dimension < rank or rank == 0:
        raise fail(op, xs, f"dimension {dimension} is out of range for rank {rank}")
    return [(x.shape, x.dtype) for x in xs]


def region_results(op: str, what: str, got, expected) -> None:
    """A region's results must have the given types."""
    got_s = ", ".join(fmt(s, d) for s, d in got)
    exp_s = ", ".join(fmt(s, d) for s, d in expected)
    if len(got) != len(expected) or any(
            tuple(a[0]) != tuple(b[0]) or a[1] != b[1] for a, b in zip(got, expected)):
        raise InvalidArgumentError(f"{op}: {what} returns ({got_s}); it must return ({exp_s})")


# -- gather and scatter --------------------------------------------------------------------------

def index_map(op: str, operands, indices, index_vector_dim: int, mapping: Sequence[int],
              rank: int, what: str) -> None:
    """Check ``mapping`` (named ``what``): one operand dimension in range for each element
    of the index vectors, which lie along ``index_vector_dim`` of ``indices``."""
    if not 0 <= index_vector_dim <= len(indices.shape):
        raise fail(op, operands, f"index_vector_dim {index_vector_dim} is out of range")
    vector = indices.shape[index_vector_dim] if index_vector_dim < len(indices.shape) else 1
    if len(mapping) != vector:
        raise fail(op, operands, f"{what} {list(mapping)} needs one entry per index vector "
                                 f"element ({vector})")
    check_axes(op, operands, mapping, rank, what)


def batching(op: str, operands, x, indices, operand_dims, indices_dims, index_vector_dim,
             what: tuple[str, str]) -> None:
    """Check batching dims: operand dim ``operand_dims[i]`` pairs with indices dim
    ``indices_dims[i]`` (equal sizes; never the index vector dim)."""
    check_axes(op, operands, operand_dims, len(x.shape), what[0])
    check_axes(op, operands, indices_dims, len(indices.shape), what[1])
    if len(operand_dims) != len(indices_dims):
        raise fail(op, operands, f"{what[0]} {list(operand_dims)} and {what[1]} "
                                 f"{list(indices_dims)} must pair up")
    for a, b in zip(operand_dims, indices_dims):
        if b == index_vector_dim:
            raise fail(op, operands, f"{what[1]} {list(indices_dims)} has the index_vector_dim {b}")
        if x.shape[a] != indices.shape[b]:
            raise fail(op, operands, f"batching dims {a} (size {x.shape[a]}) and {b} (size "
                                     f"{indices.shape[b]}) differ")


def gather(op: str, x, indices, offset_dims, collapsed, start_index_map, index_vector_dim,
           slice_sizes, operand_batching=(), indices_batching=()) -> Result:
    operands = [x, indices]
    rank = len(x.shape)
    if indices.dtype.kind not in INTEGER:
        raise fail(op, operands, f"indices must be integers, got {indices.dtype}")
    index_map(op, operands, indices, index_vector_dim, start_index_map, rank, "start_index_map")
    check_axes(op, operands, collapsed, rank, "collapsed_slice_dims")
    batching(op, operands, x, indices, operand_batching, indices_batching, index_vector_dim,
             ("operand_batching_dims", "start_indices_batching_dims"))
    if set(operand_batching) & (set(collapsed) | set(start_index_map)):
        raise fail(op, operands, "operand_batching_dims must not be collapsed_slice_dims or in "
                                 "start_index_map")
    if len(slice_sizes) != rank:
        raise fail(op, operands, f"slice_sizes {list(slice_sizes)} need one entry per operand "
                                 f"dimension ({rank})")
    for i, (s, d) in enumerate(zip(slice_sizes, x.shape)):
        if not 0 <= s <= d:
            raise fail(op, operands, f"slice size {s} of dimension {i} is outside [0, {d}]")
    for what, dims in (("collapsed", collapsed), ("batching", operand_batching)):
        for c in dims:
            if slice_sizes[c] > 1:
                raise fail(op, operands, f"{what} dimension {c} has slice size {slice_sizes[c]}, "
                                         f"not 0 or 1")
    offsets = [s for i, s in enumerate(slice_sizes) if i not in collapsed and i not in operand_batching]
    batch = [d for i, d in enumerate(indices.shape) if i != index_vector_dim]
    out_rank = len(batch) + len(offsets)
    if len(offset_dims) != len(offsets):
        raise fail(op, operands, f"offset_dims {list(offset_dims)} need {len(offsets)} entries")
    check_axes(op, operands, offset_dims, out_rank, "offset_dims")
    if list(offset_dims) != sorted(offset_dims):
        raise fail(op, operands, f"offset_dims {list(offset_dims)} must be sorted")
    out, b, o = [], iter(batch), iter(offsets)
    for i in range(out_rank):
        out.append(next(o) if i in offset_dims else next(b))
    return Shape(out), x.dtype


def scatter(op: str, xs, indices, all_updates, update_window_dims, inserted,
            scatter_dims_to_operand, index_vector_dim, input_batching=(), indices_batching=()
            ) -> list[Result]:
    """Scatter's result types (one per operand; updates pair with operands)."""
    operands = [*xs, indices, *all_updates]
    if not xs or len(xs) != len(all_updates):
        raise fail(op, operands, "needs as many updates as operands (at least one)")
    same_shapes(op, xs)
    same_shapes(op, all_updates, "updates")
    for x, u in zip(xs, all_updates):
        if u.dtype != x.dtype:
            raise fail(op, operands, "updates must have the operand's dtype")
    x, updates = xs[0], all_updates[0]
    rank = len(x.shape)
    if indices.dtype.kind not in INTEGER:
        raise fail(op, operands, f"indices must be integers, got {indices.dtype}")
    index_map(op, operands, indices, index_vector_dim, scatter_dims_to_operand, rank,
              "scatter_dims_to_operand_dims")
    check_axes(op, operands, inserted, rank, "inserted_window_dims")
    batching(op, operands, x, indices, input_batching, indices_batching, index_vector_dim,
             ("input_batching_dims", "scatter_indices_batching_dims"))
    if set(input_batching) & (set(inserted) | set(scatter_dims_to_operand)):
        raise fail(op, operands, "input_batching_dims must not be inserted_window_dims or in "
                                 "scatter_dims_to_operand_dims")
    check_axes(op, operands, update_window_dims, len(updates.shape), "update_window_dims")
    if list(update_window_dims) != sorted(update_window_dims):
        raise fail(op, operands, f"update_window_dims {list(update_window_dims)} must be sorted")
    if len(update_window_dims) + len(inserted) + len(input_batching) != rank:
        raise fail(op, operands, f"update_window_dims ({len(update_window_dims)}), "
                                 f"inserted_window_dims ({len(inserted)}) and input_batching_dims "
                                 f"({len(input_batching)}) must cover the operand rank ({rank})")
    scatter_dims = [d for i, d in enumerate(indices.shape) if i != index_vector_dim]
    update_scatter = [d for i, d in enumerate(updates.shape) if i not in update_window_dims]
    if update_scatter != scatter_dims:
        raise fail(op, operands, f"the update scatter dims {update_scatter} must match the index "
                                 f"batch dims {scatter_dims}")
    window_bounds = [d for i, d in enumerate(x.shape) if i not in inserted and i not in input_batching]
    for w, bound in zip(update_window_dims, window_bounds):
        if updates.shape[w] > bound:
            raise fail(op, operands, f"update window dimension {w} (size {updates.shape[w]}) "
                                     f"exceeds the operand's {bound}")
    return [(o.shape, o.dtype) for o in xs]


# -- linear algebra, FFT, top_k, random bits --------------------------------------------------

def _matrices(op: str, operands, a, what: str = "a") -> None:
    if len(a.shape) < 2 or a.shape[-1] != a.shape[-2]:
        raise fail(op, operands, f"{what} must be (a batch of) square matrices")
    check_class(op, operands, FLOAT | COMPLEX, "floating-point or complex")


def cholesky(op: str, a) -> Result:
    _matrices(op, [a], a)
    return a.shape, a.dtype


def triangular_solve(op: str, a, b, left_side: bool) -> Result:
    operands = [a, b]
    _matrices(op, operands, a)
    if a.dtype != b.dtype or len(b.shape) != len(a.shape) or b.shape[:-2] != a.shape[:-2]:
        raise fail(op, operands, "b must have a's dtype, rank and batch dimensions")
    side = b.shape[-2] if left_side else b.shape[-1]
    if side != a.shape[-1]:
        raise fail(op, operands, f"a ({a.shape[-1]}x{a.shape[-1]}) does not match b's "
                                 f"{'rows' if left_side else 'columns'} ({side})")
    return b.shape, b.dtype


FFT_TYPES = ("FFT", "IFFT", "RFFT", "IRFFT")


def fft(op: str, x, fft_type: str, lengths: Sequence[int]) -> Result:
    if fft_type not in FFT_TYPES:
        raise fail(op, [x], f"fft_type must be one of {', '.join(FFT_TYPES)}, got {fft_type!r}")
    n = len(lengths)
    if not 1 <= n <= min(3, len(x.shape)) or any(v < 1 for v in lengths):
        raise fail(op, [x], f"fft_length {list(lengths)} must be 1 to 3 positive lengths, no "
                            f"more than the rank")
    lead, tail = list(x.shape[:-n]), list(x.shape[-n:])
    real = fft_type == "RFFT"
    check_class(op, [x], frozenset({DType.Kind.F32, DType.Kind.F64}) if real else COMPLEX,
                "f32 or f64" if real else "complex")
    expected = list(lengths)
    if fft_type == "IRFFT":
        expected[-1] = lengths[-1] // 2 + 1
    if tail != expected:
        raise fail(op, [x], f"{fft_type} of lengths {list(lengths)} needs trailing dimensions "
                            f"{expected}, got {tail}")
    if fft_type == "RFFT":
        k = DType.Kind.C64 if x.dtype.kind == DType.Kind.F32 else DType.Kind.C128
        return Shape(lead + tail[:-1] + [lengths[-1] // 2 + 1]), DType(k)
    if fft_type == "IRFFT":
        return Shape(lead + list(lengths)), real_part(x.dtype)
    return x.shape, x.dtype


def top_k(op: str, x, k: int) -> list[Result]:
    if not x.shape:
        raise fail(op, [x], "needs rank 1 or more")
    check_class(op, [x], INTEGER | FLOAT, "integer or floating-point")
    if not 0 <= k <= x.shape[-1]:
        raise fail(op, [x], f"k ({k}) must be in [0, {x.shape[-1]}] (the last dimension)")
    shape = Shape(tuple(x.shape[:-1]) + (k,))
    return [(shape, x.dtype), (shape, DType(DType.Kind.S32))]


#: The tile of XLA's TPU ApproxTopK: 1024 elements for rank 1, 128 lanes otherwise.
_TPU_TILING = {True: 1024, False: 128}


def _log2_floor(v: int) -> int:
    return v.bit_length() - 1 if v > 0 else 0


def _log2_ceil(v: int) -> int:
    return (v - 1).bit_length() if v > 0 else 0


def approx_top_k_output_size(input_size: int, rank: int, top_k: int, recall_target: float,
                             aggregate_to_topk: bool = True,
                             reduction_input_size_override: int = -1) -> tuple[int, int]:
    """``(output size, log2 of the reduction)`` of XLA's ApproxTopK along a dimension of
    ``input_size`` (XLA's ApproxTopKReductionOutputSize): ``top_k`` when aggregating;
    else what the TPU's windowed reduction keeps for ``recall_target`` (the log2 is -1
    when aggregating, 0 when nothing is reduced)."""
    if aggregate_to_topk:
        return top_k, -1
    tiling = _TPU_TILING[rank == 1]
    if input_size <= tiling:
        return input_size, 0
    if 0 <= reduction_input_size_override < input_size:
        raise InvalidArgumentError(
            f"approx_top_k: reduction_input_size_override ({reduction_input_size_override}) "
            f"must be at least the size of the reduction dimension ({input_size})")
    logical = reduction_input_size_override if reduction_input_size_override >= 0 else input_size
    if top_k == 1:
        return tiling, _log2_ceil(-(-logical // tiling))
    if recall_target == 1.0:
        return input_size, 0
    if not 0.0 < recall_target < 1.0:
        raise InvalidArgumentError(f"approx_top_k: recall_target must be in (0, 1], got {recall_target}")
    # M windows keep the top k with recall ~ exp((1 - k) / M): M = (1 - k) / log(recall)
    windows = min(max(int((1.0 - top_k) / math.log(recall_target)), tiling), input_size)
    log2_reduction = _log2_floor(logical // windows)
    if log2_reduction == 0:
        return input_size, 0
    log2_reduction = min(log2_reduction, _log2_ceil(input_size // tiling))
    return -(-(-(-input_size // tiling)) // (1 << log2_reduction)) * tiling, log2_reduction


def approx_top_k(op: str, xs, inits, top_k: int, reduction_dim: int) -> None:
    operands = [*xs, *inits]
    if not xs or len(inits) != len(xs):
        raise fail(op, operands, f"needs operands and one init value per operand, got "
                                 f"{len(xs)} operands and {len(inits)} init values")
    rank = len(xs[0].shape)
    if rank == 0:
        raise fail(op, operands, "operands must have rank 1 or more")
    same_shapes(op, xs)
    for x, init in zip(xs, inits):
        if init.shape != () or init.dtype != x.dtype:
            raise fail(op, operands, "each init value must be a scalar of its operand's dtype")
    if not 0 <= reduction_dim < rank:
        raise fail(op, operands, f"reduction_dim {reduction_dim} is out of range for rank {rank}")
    if not 1 <= top_k <= xs[0].shape[reduction_dim]:
        raise fail(op, operands, f"top_k ({top_k}) must be in [1, {xs[0].shape[reduction_dim]}] "
                                 f"(the reduction dimension)")


RNG_ALGORITHMS = {"DEFAULT": None, "THREE_FRY": (2,), "PHILOX": (2, 3)}


def rng_bit_generator(op: str, state, algorithm: str, shape: Sequence[int], dtype: DType) -> list[Result]:
    if algorithm not in RNG_ALGORITHMS:
        raise fail(op, [state], f"algorithm must be one of {', '.join(RNG_ALGORITHMS)}, got {algorithm!r}")
    sizes = RNG_ALGORITHMS[algorithm]
    if state.dtype.kind != DType.Kind.U64 or len(state.shape) != 1 or (
            sizes is not None and state.shape[0] not in sizes):
        need = "u64[2]" if sizes == (2,) else "u64[2] or u64[3]" if sizes else "a u64 vector"
        raise fail(op, [state], f"the {algorithm} state must be {need}")
    if dtype.kind not in (DType.Kind.U8, DType.Kind.U16, DType.Kind.U32, DType.Kind.U64):
        raise fail(op, [state], f"random bits come as u8, u16, u32 or u64, not {dtype}")
    return [(state.shape, state.dtype), (Shape(shape), dtype)]


#: What XLA's stateful generator (its RngExpander) makes of each distribution: others
#: abort the compiler.
RNG_DTYPES = {
    "UNIFORM": (frozenset({DType.Kind.S32, DType.Kind.S64, DType.Kind.U32, DType.Kind.U64,
                           DType.Kind.F16, DType.Kind.BF16, DType.Kind.F32, DType.Kind.F64}),
                "s32, s64, u32, u64, f16, bf16, f32 or f64"),
    "NORMAL": (frozenset({DType.Kind.F16, DType.Kind.BF16, DType.Kind.F32, DType.Kind.F64}),
               "f16, bf16, f32 or f64"),
}


def rng(op: str, distribution: str, a, b, shape: Sequence[int]) -> Result:
    allowed, what = RNG_DTYPES[distribution]
    if a.shape != () or b.shape != () or a.dtype != b.dtype:
        raise fail(op, [a, b], "the parameters must be scalars of one dtype")
    if a.dtype.kind not in allowed:
        raise fail(op, [a, b], f"XLA's generator makes {what} values, not {a.dtype}")
    if any(d < 0 for d in shape):
        raise fail(op, [a, b], f"shape {list(shape)} has a negative dimension")
    return Shape(shape), a.dtype


def reduce_precision(op: str, x, exponent_bits: int, mantissa_bits: int) -> Result:
    check_class(op, [x], FLOAT, "floating-point")
    if exponent_bits < 1 or mantissa_bits < 0:
        raise fail(op, [x], f"needs exponent_bits >= 1 and mantissa_bits >= 0, got "
                            f"{exponent_bits} and {mantissa_bits}")
    return x.shape, x.dtype


def batch_norm(op: str, x, vectors, feature_index: int) -> Result:
    """Checks for the batch_norm ops: ``vectors`` (scale, offset, mean, ...) are rank 1 of
    the feature dimension's size, x's dtype. Returns the vectors' type."""
    operands = [x, *vectors]
    check_class(op, operands, FLOAT, "floating-point")
    if not 0 <= feature_index < len(x.shape):
        raise fail(op, operands, f"feature_index {feature_index} is out of range for rank {len(x.shape)}")
    features = x.shape[feature_index]
    for v in vectors:
        if v.dtype != x.dtype or tuple(v.shape) != (features,):
            raise fail(op, operands, f"scale, offset, mean and variance must be {fmt((features,), x.dtype)}")
    return Shape((features,)), x.dtype


def same_shapes(op: str, operands, what: str = "operands") -> None:
    for o in operands[1:]:
        if o.shape != operands[0].shape:
            raise fail(op, operands, f"{what} must have the same shape")


def select_and_scatter(op: str, x, source, init, window, strides, padding) -> Result:
    operands = [x, source, init]
    if source.dtype != x.dtype or init.dtype != x.dtype or init.shape != ():
        raise fail(op, operands, "source and the init value (a scalar) must have the operand's dtype")
    [(shape, _)] = reduce_window(op, [x], [init], window, strides, [1] * len(x.shape),
                                 [1] * len(x.shape), padding)
    if shape != source.shape:
        raise fail(op, operands, f"source must have the windowed shape {list(shape)}")
    return x.shape, x.dtype


# -- collectives --------------------------------------------------------------------------------

def replica_groups(op: str, operands, groups, count: Optional[int]) -> list[list[int]]:
    """Groups of device ids: equal sizes, each id at most once; positions among ``count``
    devices, or (``count`` None: replica ids, their number known only when compiled)
    together each of 0 to n - 1."""
    try:
        groups = [[int(i) for i in g] for g in groups]
    except TypeError:
        raise fail(op, operands, f"replica_groups must be lists of device ids, got {groups!r}") from None
    flat = [i for g in groups for i in g]
    if not groups or not groups[0] or any(len(g) != len(groups[0]) for g in groups):
        raise fail(op, operands, f"replica_groups {groups} must be non-empty groups of one size")
    if count is None:
        if sorted(flat) != list(range(len(flat))):
            raise fail(op, operands, f"replica_groups {groups} must name each replica of "
                                     f"0 to {len(flat) - 1} once")
    elif len(set(flat)) != len(flat) or any(not 0 <= i < count for i in flat):
        raise fail(op, operands, f"replica_groups {groups} must name distinct devices in [0, {count})")
    return groups


def group_size(op: str, operands, groups: Optional[list[list[int]]], given: Optional[int],
               name: str) -> int:
    """The size of each group: that of ``groups``, or ``given`` (the op's ``name``
    argument) where there are none (every replica in one group)."""
    if groups is not None:
        if given is not None and int(given) != len(groups[0]):
            raise fail(op, operands, f"{name} ({given}) must be the group size {len(groups[0])}")
        return len(groups[0])
    if given is None or isinstance(given, bool) or int(given) < 1:
        raise fail(op, operands, f"over all replicas (no replica_groups) the group size is the "
                                 f"number of replicas, which the program does not know: give "
                                 f"{name} (a positive int), got {given!r}")
    return int(given)


def all_gather(op: str, x, dimension: int, group_size: int) -> Result:
    if not 0 <= dimension < len(x.shape):
        raise fail(op, [x], f"dimension {dimension} is out of range for rank {len(x.shape)}")
    shape = list(x.shape)
    shape[dimension] *= group_size
    return Shape(shape), x.dtype


def reduce_scatter(op: str, x, dimension: int, group_size: int) -> Result:
    if not 0 <= dimension < len(x.shape):
        raise fail(op, [x], f"dimension {dimension} is out of range for rank {len(x.shape)}")
    if x.shape[dimension] % group_size:
        raise fail(op, [x], f"dimension {dimension} (size {x.shape[dimension]}) must divide by "
                            f"the group size {group_size}")
    shape = list(x.shape)
    shape[dimension] //= group_size
    return Shape(shape), x.dtype


def all_to_all(op: str, x, split_dimension: int, concat_dimension: int, group_size: int) -> Result:
    rank = len(x.shape)
    for name, d in (("split_dimension", split_dimension), ("concat_dimension", concat_dimension)):
        if not 0 <= d < rank:
            raise fail(op, [x], f"{name} {d} is out of range for rank {rank}")
    shape = list(reduce_scatter(op, x, split_dimension, group_size)[0])
    shape[concat_dimension] *= group_size
    return Shape(shape), x.dtype


def source_target_pairs(op: str, x, pairs, count: Optional[int]) -> list[tuple[int, int]]:
    try:
        pairs = [(int(s), int(t)) for s, t in pairs]
    except (TypeError, ValueError):
        raise fail(op, [x], f"source_target_pairs must be (source, target) pairs, got {pairs!r}") from None
    sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    if len(set(sources)) != len(sources) or len(set(targets)) != len(targets):
        raise fail(op, [x], f"source_target_pairs {pairs}: each device is a source at most once "
                            f"and a target at most once")
    if count is None:
        if any(i < 0 for i in sources + targets):
            raise fail(op, [x], f"source_target_pairs {pairs} must name replicas (ids >= 0)")
    elif any(not 0 <= i < count for i in sources + targets):
        raise fail(op, [x], f"source_target_pairs {pairs} must name devices in [0, {count})")
    return pairs
