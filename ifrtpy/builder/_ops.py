"""Ops without regions: elementwise, shape manipulation, dot and convolution."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence, Union

import numpy as np

from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import Shape

from ifrtpy.builder import _infer
from ifrtpy.builder._types import FLOAT, as_dims, as_dtype
from ifrtpy.builder._types import result_types as checked_result_types
from ifrtpy.builder._value import Value

if TYPE_CHECKING:  # the mixins see the whole builder when type-checked
    from ifrtpy.builder._core import BuilderCore as _Base
else:
    _Base = object

#: Unary elementwise ops: method name -> (StableHLO or CHLO op, docstring). The dtype
#: classes each accepts, and result types, are in ``_infer.UNARY_CLASSES``.
_UNARY = {
    "neg": ("stablehlo.negate", "``-x``."),
    "abs": ("stablehlo.abs", "Absolute value (the magnitude, as a real, for complex)."),
    "sign": ("stablehlo.sign", "-1, 0 or 1 (NaN stays NaN; ``x / |x|`` for complex)."),
    "exp": ("stablehlo.exponential", "``e ** x``."),
    "expm1": ("stablehlo.exponential_minus_one", "``e ** x - 1``, accurate near 0."),
    "log": ("stablehlo.log", "Natural logarithm."),
    "log1p": ("stablehlo.log_plus_one", "``log(1 + x)``, accurate near 0."),
    "logistic": ("stablehlo.logistic", "``1 / (1 + e ** -x)``."),
    "sqrt": ("stablehlo.sqrt", "Square root."),
    "rsqrt": ("stablehlo.rsqrt", "``1 / sqrt(x)``."),
    "cbrt": ("stablehlo.cbrt", "Cube root (``np.cbrt``)."),
    "square": ("chlo.square", "``x * x``."),
    "sin": ("stablehlo.sine", "Sine."),
    "cos": ("stablehlo.cosine", "Cosine."),
    "tan": ("stablehlo.tan", "Tangent."),
    "tanh": ("stablehlo.tanh", "Hyperbolic tangent."),
    "sinh": ("chlo.sinh", "Hyperbolic sine."),
    "cosh": ("chlo.cosh", "Hyperbolic cosine."),
    "asin": ("chlo.asin", "Inverse sine."),
    "acos": ("chlo.acos", "Inverse cosine."),
    "atan": ("chlo.atan", "Inverse tangent."),
    "asinh": ("chlo.asinh", "Inverse hyperbolic sine."),
    "acosh": ("chlo.acosh", "Inverse hyperbolic cosine."),
    "atanh": ("chlo.atanh", "Inverse hyperbolic tangent."),
    "erf": ("chlo.erf", "The error function."),
    "erfc": ("chlo.erfc", "``1 - erf(x)``."),
    "erf_inv": ("chlo.erf_inv", "The inverse of erf."),
    "lgamma": ("chlo.lgamma", "``log(|gamma(x)|)``."),
    "digamma": ("chlo.digamma", "The derivative of lgamma."),
    "bessel_i1e": ("chlo.bessel_i1e", "The exponentially scaled modified Bessel function of order 1."),
    "floor": ("stablehlo.floor", "Round toward -inf."),
    "ceil": ("stablehlo.ceil", "Round toward +inf."),
    "round": ("stablehlo.round_nearest_afz", "Round half away from zero (XLA's Round)."),
    "round_nearest_even": ("stablehlo.round_nearest_even", "Round half to even (``np.round``)."),
    "is_finite": ("stablehlo.is_finite", "pred: neither infinite nor NaN."),
    "is_inf": ("chlo.is_inf", "pred: +inf or -inf."),
    "is_pos_inf": ("chlo.is_pos_inf", "pred: +inf."),
    "is_neg_inf": ("chlo.is_neg_inf", "pred: -inf."),
    "real": ("stablehlo.real", "The real part (x itself for a real x)."),
    "imag": ("stablehlo.imag", "The imaginary part (zeros for a real x)."),
    "conj": ("chlo.conj", "The complex conjugate."),
    "not": ("stablehlo.not", "Logical not for pred, bitwise not for integers."),
    "popcnt": ("stablehlo.popcnt", "The number of set bits."),
    "clz": ("stablehlo.count_leading_zeros", "The number of leading zero bits."),
}
#: Binary elementwise ops: method name -> (StableHLO or CHLO op, docstring).
_BINARY = {
    "add": ("stablehlo.add", "``x + y`` (or for pred)."),
    "sub": ("stablehlo.subtract", "``x - y``."),
    "mul": ("stablehlo.multiply", "``x * y`` (and for pred)."),
    "div": ("stablehlo.divide", "Division; integers round toward zero."),
    "rem": ("stablehlo.remainder", "Remainder with the dividend's sign (C's fmod, ``np.fmod``)."),
    "max": ("stablehlo.maximum", "Elementwise maximum (NaN if either is NaN)."),
    "min": ("stablehlo.minimum", "Elementwise minimum (NaN if either is NaN)."),
    "pow": ("stablehlo.power", "``x ** y``."),
    "and": ("stablehlo.and", "Logical and for pred, bitwise and for integers."),
    "or": ("stablehlo.or", "Logical or for pred, bitwise or for integers."),
    "xor": ("stablehlo.xor", "Logical xor for pred, bitwise xor for integers."),
    "shift_left": ("stablehlo.shift_left", "``x << y``; 0 where y is negative or at least the bit width."),
    "shift_right_arithmetic": ("stablehlo.shift_right_arithmetic",
                               "``x >> y`` filling with the sign bit (all sign bits where y is "
                               "negative or at least the bit width)."),
    "shift_right_logical": ("stablehlo.shift_right_logical",
                            "``x >> y`` filling with zeros; 0 where y is negative or at least "
                            "the bit width."),
    "atan2": ("stablehlo.atan2", "``arctan(x / y)`` in the quadrant of (y, x) (``np.arctan2``)."),
    "polygamma": ("chlo.polygamma", "The polygamma function of order x (an integer value) at y."),
    "zeta": ("chlo.zeta", "The Hurwitz zeta function of x at q=y."),
    "complex": ("stablehlo.complex", "``x + 1j * y`` from f32 (c64) or f64 (c128) parts."),
}


def _method_name(op: str) -> str:
    return op + "_" if op in ("not", "and", "or") else op


def _named(method, op: str, doc: str):
    method.__name__ = method.__qualname__ = _method_name(op)
    method.__doc__ = f"{doc} (``{(_UNARY[op] if op in _UNARY else _BINARY[op])[0]}``)"
    return method


def _unary_method(op: str):
    def method(self, x: Any) -> Value:
        return self._unary(op, x)
    return _named(method, op, _UNARY[op][1])


def _accurate_method(op: str):
    def method(self, x: Any, result_accuracy: Any = None) -> Value:
        return self._unary(op, x, result_accuracy)
    return _named(method, op, _UNARY[op][1] + (
        " ``result_accuracy``: a mode (\"DEFAULT\", \"HIGHEST\") or a :class:`ResultAccuracy` "
        "tolerance."))


def _binary_method(op: str):
    def method(self, x: Any, y: Any) -> Value:
        return self._binary(op, x, y)
    return _named(method, op, _BINARY[op][1])


class ResultAccuracy(NamedTuple):
    """How accurate a transcendental op's result must be, as StableHLO's
    ``#stablehlo.result_accuracy``: a ``mode`` ("DEFAULT", "HIGHEST") or, with mode
    "TOLERANCE", the absolute, relative and units-in-the-last-place tolerances."""

    atol: float = 0.0
    rtol: float = 0.0
    ulps: int = 0
    mode: str = "TOLERANCE"


class ConvDimensionNumbers(NamedTuple):
    """Dimension positions, as ``lax.ConvDimensionNumbers``: ``lhs_spec`` is (batch,
    feature, *spatial), ``rhs_spec`` (output feature, input feature, *spatial), ``out_spec``
    (batch, feature, *spatial)."""

    lhs_spec: tuple[int, ...]
    rhs_spec: tuple[int, ...]
    out_spec: tuple[int, ...]


def conv_dimension_numbers(rank: int, spec: Any) -> ConvDimensionNumbers:
    """From None (NCHW/OIHW/NCHW-like), a ConvDimensionNumbers/triple of int tuples, or a
    triple of strings such as ``("NHWC", "HWIO", "NHWC")`` (spatial dims matched by letter
    in the kernel's order)."""
    if spec is None:
        base = tuple(range(rank))
        return ConvDimensionNumbers(base, base, base)
    try:
        lhs, rhs, out = spec
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"conv: dimension_numbers must be a triple, got {spec!r}") from None
    if all(isinstance(s, str) for s in (lhs, rhs, out)):
        if not len(lhs) == len(rhs) == len(out) == rank:
            raise InvalidArgumentError(f"conv: dimension_numbers {spec!r} must each have {rank} letters")
        spatial = [c for c in rhs if c not in "OI"]
        try:
            return ConvDimensionNumbers(
                (lhs.index("N"), lhs.index("C"), *[lhs.index(c) for c in spatial]),
                (rhs.index("O"), rhs.index("I"), *[rhs.index(c) for c in spatial]),
                (out.index("N"), out.index("C"), *[out.index(c) for c in spatial]))
        except ValueError:
            raise InvalidArgumentError(
                f"conv: dimension_numbers {spec!r} must use N and C (lhs, out), O and I (rhs) "
                f"and the same spatial letters") from None
    return ConvDimensionNumbers(*(as_dims(s, "conv", "dimension_numbers") for s in (lhs, rhs, out)))


def _window_padding(padding, sizes, windows, strides, base_dil, win_dil, who):
    """Explicit (low, high) pairs from pairs, "VALID" or "SAME" (XLA's rule: output size
    ceil(size / stride), the extra padding split with the odd one high)."""
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return [(0, 0)] * len(sizes)
        if mode != "SAME":
            raise InvalidArgumentError(f"{who}: padding must be 'SAME', 'VALID' or (low, high) pairs, got {padding!r}")
        pads = []
        for n, k, s, bd, wd in zip(sizes, windows, strides, base_dil, win_dil):
            size = (n - 1) * bd + 1 if n else 0
            extent = (k - 1) * wd + 1 if k else 0
            out = -(-size // s)
            total = max((out - 1) * s + extent - size, 0)
            pads.append((total // 2, total - total // 2))
        return pads
    try:
        pads = [tuple(int(v) for v in p) for p in padding]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{who}: padding must be 'SAME', 'VALID' or (low, high) pairs, got {padding!r}") from None
    if any(len(p) != 2 for p in pads):
        raise InvalidArgumentError(f"{who}: padding must be (low, high) pairs, got {padding!r}")
    return pads


class OpsMixin(_Base):
    """Elementwise, shape and contraction ops of :class:`~ifrtpy.builder.Builder`."""

    # -- elementwise -----------------------------------------------------------------------------

    def _unary(self, op: str, x: Any, result_accuracy: Any = None) -> Value:
        x = self._operand(x, op)
        shape, dtype = _infer.unary(op, x)
        attrs = None
        if result_accuracy is not None:
            atol, rtol, ulps, mode = _infer.result_accuracy(op, x, result_accuracy)
            from jaxlib.mlir.dialects import stablehlo
            with self._ctx:
                attrs = {"result_accuracy": stablehlo.ResultAccuracyAttr.get(atol, rtol, ulps, mode)}
        return self._op1(_UNARY[op][0], [x], shape, dtype, attrs)

    def _binary(self, op: str, x: Any, y: Any) -> Value:
        if not isinstance(x, Value) and isinstance(y, Value):
            x = self._operand(x, op, like=y)
        x = self._operand(x, op)
        y = self._operand(y, op, like=x)
        shape, dtype = _infer.binary(op, x, y)
        return self._op1(_BINARY[op][0], [x, y], shape, dtype)

    # One method per table entry (b.sin(x), b.atan2(y, x), b.not_(p), ...); the
    # transcendental ops (_accurate_method) take a result_accuracy, as StableHLO's do.
    neg = _unary_method("neg")
    abs = _unary_method("abs")
    sign = _unary_method("sign")
    exp = _accurate_method("exp")
    expm1 = _accurate_method("expm1")
    log = _accurate_method("log")
    log1p = _accurate_method("log1p")
    logistic = _accurate_method("logistic")
    sqrt = _accurate_method("sqrt")
    rsqrt = _accurate_method("rsqrt")
    cbrt = _accurate_method("cbrt")
    square = _unary_method("square")
    sin = _accurate_method("sin")
    cos = _accurate_method("cos")
    tan = _accurate_method("tan")
    tanh = _accurate_method("tanh")
    sinh = _unary_method("sinh")
    cosh = _unary_method("cosh")
    asin = _unary_method("asin")
    acos = _unary_method("acos")
    atan = _unary_method("atan")
    asinh = _unary_method("asinh")
    acosh = _unary_method("acosh")
    atanh = _unary_method("atanh")
    erf = _unary_method("erf")
    erfc = _unary_method("erfc")
    erf_inv = _unary_method("erf_inv")
    lgamma = _unary_method("lgamma")
    digamma = _unary_method("digamma")
    bessel_i1e = _unary_method("bessel_i1e")
    floor = _unary_method("floor")
    ceil = _unary_method("ceil")
    round = _unary_method("round")
    round_nearest_even = _unary_method("round_nearest_even")
    is_finite = _unary_method("is_finite")
    is_inf = _unary_method("is_inf")
    is_pos_inf = _unary_method("is_pos_inf")
    is_neg_inf = _unary_method("is_neg_inf")
    real = _unary_method("real")
    imag = _unary_method("imag")
    conj = _unary_method("conj")
    not_ = _unary_method("not")
    popcnt = _unary_method("popcnt")
    clz = _unary_method("clz")
    add = _binary_method("add")
    sub = _binary_method("sub")
    mul = _binary_method("mul")
    div = _binary_method("div")
    rem = _binary_method("rem")
    max = _binary_method("max")
    min = _binary_method("min")
    pow = _binary_method("pow")
    and_ = _binary_method("and")
    or_ = _binary_method("or")
    xor = _binary_method("xor")
    shift_left = _binary_method("shift_left")
    shift_right_arithmetic = _binary_method("shift_right_arithmetic")
    shift_right_logical = _binary_method("shift_right_logical")
    atan2 = _binary_method("atan2")
    polygamma = _binary_method("polygamma")
    zeta = _binary_method("zeta")
    complex = _binary_method("complex")

    def reciprocal(self, x: Any) -> Value:
        """``1 / x``."""
        x = self._operand(x, "reciprocal")
        return self.div(1, x)

    def compare(self, x, y, direction: str, total_order: bool = False) -> Value:
        """Elementwise ``x <direction> y`` (EQ, NE, LT, LE, GT, GE) -> pred. With
        ``total_order`` floats compare in IEEE's total order (XLA's ``EqTotalOrder``, ...:
        -NaN < -inf < ... < -0 < +0 < ... < inf < NaN, every NaN equal to itself)."""
        op = f"compare {direction}"
        if not isinstance(x, Value) and isinstance(y, Value):
            x = self._operand(x, op, like=y)
        x = self._operand(x, op)
        y = self._operand(y, op, like=x)
        direction = str(direction).upper()
        shape, dtype = _infer.compare("compare", x, y, direction)
        if total_order:
            if x.dtype.kind not in FLOAT:
                raise _infer.fail("compare", [x, y], "total_order compares floats only")
            x, y = self._total_order_key(x), self._total_order_key(y)
        kind = _infer.compare_type(x.dtype)
        from jaxlib.mlir.dialects import stablehlo
        with self._ctx:
            attrs = {"comparison_direction": stablehlo.ComparisonDirectionAttr.get(direction),
                     "compare_type": stablehlo.ComparisonTypeAttr.get(kind)}
        return self._op1("stablehlo.compare", [x, y], shape, dtype, attrs)

    def _total_order_key(self, x: Value) -> Value:
        """Integers ordered as the floats x are in total order (as XLA's comparison
        expander compares them): the bits, the magnitude bits flipped where the sign is
        set; a float without sign bit (f8E8M0FNU) is its unsigned bits."""
        width = x.dtype.bit_size
        assert width is not None
        if x.dtype.kind == DType.Kind.F8E8M0FNU:
            return self.bitcast_convert(x, "ui8")
        bits = self.bitcast_convert(x, f"i{width}")
        return self.select(bits < 0, self.xor(bits, (1 << (width - 1)) - 1), bits)

    def eq(self, x, y) -> Value: return self.compare(x, y, "EQ")  # noqa: E704
    def ne(self, x, y) -> Value: return self.compare(x, y, "NE")  # noqa: E704
    def lt(self, x, y) -> Value: return self.compare(x, y, "LT")  # noqa: E704
    def le(self, x, y) -> Value: return self.compare(x, y, "LE")  # noqa: E704
    def gt(self, x, y) -> Value: return self.compare(x, y, "GT")  # noqa: E704
    def ge(self, x, y) -> Value: return self.compare(x, y, "GE")  # noqa: E704

    def select(self, pred, on_true, on_false) -> Value:
        """``np.where(pred, on_true, on_false)``; pred is a scalar or has their shape."""
        pred = self._operand(pred, "select")
        if not isinstance(on_true, Value) and isinstance(on_false, Value):
            on_true = self._operand(on_true, "select", like=on_false)
        on_true = self._operand(on_true, "select")
        on_false = self._operand(on_false, "select", like=on_true)
        shape, dtype = _infer.select("select", pred, on_true, on_false)
        return self._op1("stablehlo.select", [pred, on_true, on_false], shape, dtype)

    def clamp(self, lo, x, hi) -> Value:
        """``np.clip(x, lo, hi)``; bounds are scalars or have x's shape."""
        x = self._operand(x, "clamp")
        lo = self._operand(lo, "clamp", like=x)
        hi = self._operand(hi, "clamp", like=x)
        shape, dtype = _infer.clamp("clamp", lo, x, hi)
        return self._op1("stablehlo.clamp", [lo, x, hi], shape, dtype)

    def convert(self, x, dtype: Any) -> Value:
        """Elementwise conversion (``x.astype(dtype)``; floats to integers round toward zero)."""
        x = self._operand(x, "convert")
        shape, dtype = _infer.convert("convert", x, as_dtype(dtype, "convert"))
        return self._op1("stablehlo.convert", [x], shape, dtype)

    def bitcast_convert(self, x, dtype: Any) -> Value:
        """Reinterpret the bits (``x.view(dtype)``); a wider source gains a minor dimension,
        a narrower one loses its last dimension."""
        x = self._operand(x, "bitcast_convert")
        shape, dtype = _infer.bitcast_convert("bitcast_convert", x, as_dtype(dtype, "bitcast_convert"))
        return self._op1("stablehlo.bitcast_convert", [x], shape, dtype)

    # -- shapes ----------------------------------------------------------------------------------

    def iota(self, shape: Sequence[int], dtype: Any, dimension: int = 0) -> Value:
        """Values counting along ``dimension``, broadcast over the others."""
        shape = as_dims(shape, "iota", "shape")
        shape, dtype = _infer.iota("iota", shape, as_dtype(dtype, "iota"), int(dimension))
        with self._ctx:
            attrs = {"iota_dimension": self._i64(dimension)}
        return self._op1("stablehlo.iota", [], shape, dtype, attrs)

    def broadcast_in_dim(self, x, shape: Sequence[int], broadcast_dimensions: Sequence[int]) -> Value:
        """Operand dimension i becomes result dimension ``broadcast_dimensions[i]`` (of size
        1 or equal); the others are new."""
        x = self._operand(x, "broadcast_in_dim")
        shape = as_dims(shape, "broadcast_in_dim", "shape")
        dims = as_dims(broadcast_dimensions, "broadcast_in_dim", "broadcast_dimensions")
        shape, dtype = _infer.broadcast_in_dim("broadcast_in_dim", x, shape, dims)
        with self._ctx:
            attrs = {"broadcast_dimensions": self._i64s(dims)}
        return self._op1("stablehlo.broadcast_in_dim", [x], shape, dtype, attrs)

    def broadcast_to(self, x, shape: Sequence[int]) -> Value:
        """``np.broadcast_to``: NumPy's rule (trailing dimensions aligned)."""
        x = self._operand(x, "broadcast_to")
        shape = as_dims(shape, "broadcast_to", "shape")
        dims = _infer.broadcast_to("broadcast_to", x, shape)
        return x if tuple(shape) == tuple(x.shape) else self.broadcast_in_dim(x, shape, dims)

    def reshape(self, x, shape: Sequence[int]) -> Value:
        """``x.reshape(shape)`` (row-major)."""
        x = self._operand(x, "reshape")
        shape, dtype = _infer.reshape("reshape", x, as_dims(shape, "reshape", "shape"))
        return self._op1("stablehlo.reshape", [x], shape, dtype)

    def transpose(self, x, permutation: Sequence[int]) -> Value:
        """``np.transpose(x, permutation)``."""
        x = self._operand(x, "transpose")
        perm = as_dims(permutation, "transpose", "permutation")
        shape, dtype = _infer.transpose("transpose", x, perm)
        with self._ctx:
            attrs = {"permutation": self._i64s(perm)}
        return self._op1("stablehlo.transpose", [x], shape, dtype, attrs)

    def slice(self, x, start: Sequence[int], limit: Sequence[int],
              strides: Optional[Sequence[int]] = None) -> Value:
        """``x[start0:limit0:stride0, ...]`` with static, in-range bounds."""
        x = self._operand(x, "slice")
        start = as_dims(start, "slice", "start")
        limit = as_dims(limit, "slice", "limit")
        strides = (1,) * len(start) if strides is None else as_dims(strides, "slice", "strides")
        shape, dtype = _infer.slice_("slice", x, start, limit, strides)
        with self._ctx:
            attrs = {"start_indices": self._i64s(start), "limit_indices": self._i64s(limit),
                     "strides": self._i64s(strides)}
        return self._op1("stablehlo.slice", [x], shape, dtype, attrs)

    def _indices(self, indices, op: str) -> list[Value]:
        values = [i for i in indices if isinstance(i, Value)]
        dtype = values[0].dtype if values else as_dtype("i32")
        return [self._operand(i, op) if isinstance(i, Value) else self._scalar(i, dtype, op)
                for i in indices]

    def dynamic_slice(self, x, start_indices: Sequence[Union[Value, int]],
                      slice_sizes: Sequence[int]) -> Value:
        """A ``slice_sizes`` window of x at runtime ``start_indices`` (clamped so the window
        stays inside x)."""
        x = self._operand(x, "dynamic_slice")
        indices = self._indices(start_indices, "dynamic_slice")
        sizes = as_dims(slice_sizes, "dynamic_slice", "slice_sizes")
        shape, dtype = _infer.dynamic_slice("dynamic_slice", x, indices, sizes)
        with self._ctx:
            attrs = {"slice_sizes": self._i64s(sizes)}
        return self._op1("stablehlo.dynamic_slice", [x, *indices], shape, dtype, attrs)

    def dynamic_update_slice(self, x, update, start_indices: Sequence[Union[Value, int]]) -> Value:
        """x with ``update`` written at runtime ``start_indices`` (clamped)."""
        x = self._operand(x, "dynamic_update_slice")
        update = self._operand(update, "dynamic_update_slice")
        indices = self._indices(start_indices, "dynamic_update_slice")
        shape, dtype = _infer.dynamic_update_slice("dynamic_update_slice", x, update, indices)
        return self._op1("stablehlo.dynamic_update_slice", [x, update, *indices], shape, dtype)

    def concatenate(self, xs: Sequence, dimension: int) -> Value:
        """``np.concatenate(xs, dimension)``."""
        xs = [self._operand(x, "concatenate") for x in xs]
        shape, dtype = _infer.concatenate("concatenate", xs, int(dimension))
        with self._ctx:
            attrs = {"dimension": self._i64(dimension)}
        return self._op1("stablehlo.concatenate", xs, shape, dtype, attrs)

    def pad(self, x, padding_value, low: Sequence[int], high: Sequence[int],
            interior: Optional[Sequence[int]] = None) -> Value:
        """Pad with ``padding_value``: ``low``/``high`` elements at each end (negative
        crops), ``interior`` between elements."""
        x = self._operand(x, "pad")
        value = self._operand(padding_value, "pad", like=_ScalarLike(x))
        low = as_dims(low, "pad", "low")
        high = as_dims(high, "pad", "high")
        interior = (0,) * len(low) if interior is None else as_dims(interior, "pad", "interior")
        shape, dtype = _infer.pad("pad", x, value, low, high, interior)
        with self._ctx:
            attrs = {"edge_padding_low": self._i64s(low), "edge_padding_high": self._i64s(high),
                     "interior_padding": self._i64s(interior)}
        return self._op1("stablehlo.pad", [x, value], shape, dtype, attrs)

    def reverse(self, x, dimensions: Sequence[int]) -> Value:
        """``np.flip(x, dimensions)``."""
        x = self._operand(x, "reverse")
        dims = as_dims(dimensions, "reverse", "dimensions")
        shape, dtype = _infer.reverse("reverse", x, dims)
        with self._ctx:
            attrs = {"dimensions": self._i64s(dims)}
        return self._op1("stablehlo.reverse", [x], shape, dtype, attrs)

    # -- contractions ----------------------------------------------------------------------------

    def _precision(self, op, operands, precision):
        from jaxlib.mlir.dialects import stablehlo
        pair = _infer.precision(op, operands, precision)
        return self._ir.ArrayAttr.get([stablehlo.PrecisionAttr.get(p) for p in pair])

    def dot_general(self, lhs, rhs, contracting_dims, batch_dims=((), ()),
                    precision: Any = None, preferred_element_type: Any = None) -> Value:
        """``lax.dot_general``: result dims are batch, lhs free, rhs free. ``precision``:
        "DEFAULT", "HIGH", "HIGHEST" or a pair (lhs, rhs)."""
        lhs = self._operand(lhs, "dot_general")
        rhs = self._operand(rhs, "dot_general")
        lc, rc = (as_dims(d, "dot_general", "contracting_dims") for d in contracting_dims)
        lb, rb = (as_dims(d, "dot_general", "batch_dims") for d in batch_dims)
        preferred = None if preferred_element_type is None else as_dtype(preferred_element_type, "dot_general")
        shape, dtype = _infer.dot_general("dot_general", lhs, rhs, (lc, rc), (lb, rb), preferred)
        from jaxlib.mlir.dialects import stablehlo
        with self._ctx:
            attrs = {"dot_dimension_numbers": stablehlo.DotDimensionNumbers.get(lb, rb, lc, rc),
                     "precision_config": self._precision("dot_general", [lhs, rhs], precision)}
        return self._op1("stablehlo.dot_general", [lhs, rhs], shape, dtype, attrs)

    def dot(self, lhs, rhs, precision: Any = None, preferred_element_type: Any = None) -> Value:
        """Vector/matrix products of rank 1 or 2 operands (``np.dot``)."""
        lhs = self._operand(lhs, "dot")
        rhs = self._operand(rhs, "dot")
        lc, rc = _infer.dot_dims("dot", lhs, rhs)
        return self.dot_general(lhs, rhs, ((lc,), (rc,)), ((), ()), precision, preferred_element_type)

    def conv_general_dilated(self, lhs, rhs, window_strides: Sequence[int], padding: Any,
                             lhs_dilation: Optional[Sequence[int]] = None,
                             rhs_dilation: Optional[Sequence[int]] = None,
                             dimension_numbers: Any = None, feature_group_count: int = 1,
                             batch_group_count: int = 1, precision: Any = None,
                             preferred_element_type: Any = None,
                             window_reversal: Optional[Sequence[bool]] = None) -> Value:
        """``lax.conv_general_dilated`` (a cross-correlation): ``padding`` is "SAME",
        "VALID" or (low, high) per spatial dimension; ``dimension_numbers`` see
        :func:`conv_dimension_numbers`. ``window_reversal`` (XLA's, one bool per spatial
        dimension) reverses the kernel along the dimensions it marks: a true
        convolution there."""
        op = "conv_general_dilated"
        lhs = self._operand(lhs, op)
        rhs = self._operand(rhs, op)
        rank = lhs.rank
        dn = conv_dimension_numbers(rank, dimension_numbers)
        nsp = max(rank - 2, 0)
        strides = as_dims(window_strides, op, "window_strides")
        lhs_dil = (1,) * nsp if lhs_dilation is None else as_dims(lhs_dilation, op, "lhs_dilation")
        rhs_dil = (1,) * nsp if rhs_dilation is None else as_dims(rhs_dilation, op, "rhs_dilation")
        if len(dn.lhs_spec) == rank == rhs.rank and len(strides) == len(lhs_dil) == len(rhs_dil) == nsp:
            sizes = [lhs.shape[d] for d in dn.lhs_spec[2:]]
            windows = [rhs.shape[d] for d in dn.rhs_spec[2:]]
            pads = _window_padding(padding, sizes, windows, strides, lhs_dil, rhs_dil, op)
        else:
            pads = [] if isinstance(padding, str) else _window_padding(padding, [], [], [], [], [], op)
        preferred = None if preferred_element_type is None else as_dtype(preferred_element_type, op)
        nested = ((dn.lhs_spec[0], dn.lhs_spec[1], dn.lhs_spec[2:]),
                  (dn.rhs_spec[0], dn.rhs_spec[1], dn.rhs_spec[2:]),
                  (dn.out_spec[0], dn.out_spec[1], dn.out_spec[2:]))
        shape, dtype = _infer.conv(op, lhs, rhs, nested, strides, pads, lhs_dil, rhs_dil,
                                   int(feature_group_count), int(batch_group_count), preferred)
        reversal = None if window_reversal is None else _infer.window_reversal(
            op, [lhs, rhs], window_reversal, nsp)
        from jaxlib.mlir.dialects import stablehlo
        with self._ctx:
            attrs = {
                "window_strides": self._i64s(strides),
                "padding": self._pairs(pads),
                "lhs_dilation": self._i64s(lhs_dil),
                "rhs_dilation": self._i64s(rhs_dil),
                "dimension_numbers": stablehlo.ConvDimensionNumbers.get(
                    dn.lhs_spec[0], dn.lhs_spec[1], list(dn.lhs_spec[2:]),
                    dn.rhs_spec[1], dn.rhs_spec[0], list(dn.rhs_spec[2:]),
                    dn.out_spec[0], dn.out_spec[1], list(dn.out_spec[2:])),
                "feature_group_count": self._i64(feature_group_count),
                "batch_group_count": self._i64(batch_group_count),
                "precision_config": self._precision(op, [lhs, rhs], precision),
            }
            if reversal is not None:
                attrs["window_reversal"] = self._ir.DenseBoolArrayAttr.get(reversal)
        return self._op1("stablehlo.convolution", [lhs, rhs], shape, dtype, attrs)

    # -- linear algebra, FFT --------------------------------------------------------------

    def cholesky(self, a: Any, lower: bool = True) -> Value:
        """The Cholesky factor of (a batch of) Hermitian positive-definite matrices: L with
        ``a = L @ L^H`` (``lower``) or U with ``a = U^H @ U``; the other triangle is
        unspecified (take ``np.tril``/``np.triu`` of the result)."""
        a = self._operand(a, "cholesky")
        shape, dtype = _infer.cholesky("cholesky", a)
        with self._ctx:
            attrs = {"lower": self._bool(lower)}
        return self._op1("stablehlo.cholesky", [a], shape, dtype, attrs)

    def triangular_solve(self, a: Any, b: Any, left_side: bool = True, lower: bool = True,
                         unit_diagonal: bool = False, transpose_a: str = "NO_TRANSPOSE") -> Value:
        """x with ``op(a) @ x = b`` (``left_side``) or ``x @ op(a) = b``, a triangular
        (its ``lower`` or upper triangle is read; ``unit_diagonal`` takes the diagonal as
        ones); ``op`` is ``transpose_a``: "NO_TRANSPOSE", "TRANSPOSE" or "ADJOINT"."""
        op = "triangular_solve"
        a, b = self._operand(a, op), self._operand(b, op)
        if transpose_a not in ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"):
            raise _infer.fail(op, [a, b], f"transpose_a must be NO_TRANSPOSE, TRANSPOSE or "
                                          f"ADJOINT, got {transpose_a!r}")
        shape, dtype = _infer.triangular_solve(op, a, b, bool(left_side))
        from jaxlib.mlir.dialects import stablehlo
        with self._ctx:
            attrs = {"left_side": self._bool(left_side), "lower": self._bool(lower),
                     "unit_diagonal": self._bool(unit_diagonal),
                     "transpose_a": stablehlo.TransposeAttr.get(transpose_a)}
        return self._op1("stablehlo.triangular_solve", [a, b], shape, dtype, attrs)

    def fft(self, x: Any, fft_type: str, fft_length: Sequence[int]) -> Value:
        """The FFT over the trailing ``len(fft_length)`` (1 to 3) dimensions: "FFT" and
        "IFFT" (complex, ``np.fft.fftn``/``ifftn``), "RFFT" (real to complex, the last
        dimension becomes ``n // 2 + 1``: ``np.fft.rfftn``) and "IRFFT" (its inverse,
        ``np.fft.irfftn(x, fft_length)``)."""
        x = self._operand(x, "fft")
        lengths = as_dims(fft_length, "fft", "fft_length")
        fft_type = str(fft_type).upper()
        shape, dtype = _infer.fft("fft", x, fft_type, lengths)
        from jaxlib.mlir.dialects import stablehlo
        with self._ctx:
            attrs = {"fft_type": stablehlo.FftTypeAttr.get(fft_type), "fft_length": self._i64s(lengths)}
        return self._op1("stablehlo.fft", [x], shape, dtype, attrs)

    def get_dimension_size(self, x: Any, dimension: int) -> Value:
        """XLA's GetDimensionSize: the size of ``dimension`` as an s32 scalar (a constant:
        shapes are static)."""
        x = self._operand(x, "get_dimension_size")
        _infer.check_axes("get_dimension_size", [x], [int(dimension)], x.rank, "dimension")
        return self.constant(np.int32(x.shape[int(dimension)]))

    # -- random numbers ----------------------------------------------------------------------

    def rng_bit_generator(self, state: Any, shape: Sequence[int], dtype: Any = "ui32",
                          algorithm: str = "THREE_FRY") -> tuple[Value, Value]:
        """``(new_state, bits)``: random bits of ``shape`` and ``dtype`` (u8, u16, u32 or
        u64) from the u64 ``state`` (2 words for "THREE_FRY", 2 or 3 for "PHILOX"; any
        for "DEFAULT", the backend's choice), and the state to use next."""
        op = "rng_bit_generator"
        state = self._operand(state, op)
        shape = as_dims(shape, op, "shape")
        algorithm = str(algorithm).upper()
        types = _infer.rng_bit_generator(op, state, algorithm, shape, as_dtype(dtype, op))
        from jaxlib.mlir.dialects import stablehlo
        with self._ctx:
            attrs = {"rng_algorithm": stablehlo.RngAlgorithmAttr.get(algorithm)}
        new_state, bits = self._op("stablehlo.rng_bit_generator", [state], types, attrs)
        return new_state, bits

    def _rng(self, op: str, distribution: str, a: Any, b: Any, shape: Sequence[int],
             dtype: Any) -> Value:
        """A stablehlo.rng of ``distribution`` with parameters a and b (scalars, or
        numbers made ``dtype`` constants)."""
        shape = as_dims(shape, op, "shape")
        if not isinstance(a, Value) and not isinstance(b, Value):
            if dtype is None:
                raise InvalidArgumentError(f"{op}: give a dtype for number parameters")
            dtype = as_dtype(dtype, op)
            a, b = self._scalar(a, dtype, op), self._scalar(b, dtype, op)
        else:
            like = a if isinstance(a, Value) else b
            a = self._operand(a, op, like=_ScalarLike(like))
            b = self._operand(b, op, like=_ScalarLike(like))
            if dtype is not None and as_dtype(dtype, op) != a.dtype:
                raise _infer.fail(op, [a, b], f"dtype {as_dtype(dtype, op)} is not the parameters'")
        result = _infer.rng(op, distribution, a, b, shape)
        from jaxlib.mlir.dialects import stablehlo
        dims = self.constant(np.asarray(shape, np.int64).reshape(len(shape)))
        with self._ctx:
            attrs = {"rng_distribution": stablehlo.RngDistributionAttr.get(distribution)}
        return self._op1("stablehlo.rng", [a, b, dims], *result, attrs)

    def rng_uniform(self, a: Any, b: Any, shape: Sequence[int], dtype: Any = None) -> Value:
        """XLA's RngUniform: values uniform in [a, b) from the backend's own generator
        (stateful: every run gives new values). ``a`` and ``b`` are scalars (or numbers,
        of ``dtype``) of s32, s64, u32 or u64 (b must exceed a: XLA leaves the rest
        undefined), or f16, bf16, f32 or f64 (on the PjRt backend f16 and bf16 may round
        up to b). For values that a key determines see :meth:`random_uniform`."""
        return self._rng("rng_uniform", "UNIFORM", a, b, shape, dtype)

    def rng_normal(self, mu: Any, sigma: Any, shape: Sequence[int], dtype: Any = None) -> Value:
        """XLA's RngNormal: normal values of mean ``mu`` and standard deviation ``sigma``
        (f16, bf16, f32 or f64 scalars, or numbers of ``dtype``) from the backend's own
        generator (stateful). See also :meth:`random_normal`."""
        return self._rng("rng_normal", "NORMAL", mu, sigma, shape, dtype)

    def random_uniform(self, key: Any, shape: Sequence[int], dtype: Any = "f32",
                       minval: float = 0.0, maxval: float = 1.0,
                       algorithm: str = "THREE_FRY") -> tuple[Value, Value]:
        """``(new_key, values)``: values uniform in ``[minval, maxval)`` (f32 or f64) from
        the u64 ``key`` (as :meth:`rng_bit_generator`'s state)."""
        op = "random_uniform"
        dtype = as_dtype(dtype, op)
        if dtype.kind not in (DType.Kind.F32, DType.Kind.F64):
            raise InvalidArgumentError(f"{op}: dtype must be f32 or f64, got {dtype}")
        if not minval < maxval:
            raise InvalidArgumentError(f"{op}: needs minval < maxval, got {minval} and {maxval}")
        wide = dtype.kind == DType.Kind.F64
        bits_type, mantissa, one = ("ui64", 52, 0x3FF0000000000000) if wide else ("ui32", 23, 0x3F800000)
        new_key, bits = self.rng_bit_generator(key, shape, bits_type, algorithm)
        bits = self.or_(self.shift_right_logical(bits, 64 - mantissa if wide else 32 - mantissa), one)
        unit = self.sub(self.bitcast_convert(bits, dtype), 1.0)  # [0, 1)
        values = self.add(self.mul(unit, float(maxval) - float(minval)), float(minval))
        return new_key, self.max(values, float(minval))

    def random_normal(self, key: Any, shape: Sequence[int], dtype: Any = "f32",
                      algorithm: str = "THREE_FRY") -> tuple[Value, Value]:
        """``(new_key, values)``: standard normal values (f32 or f64) from the u64 ``key``
        (``sqrt(2) * erf_inv(u)`` of u uniform in (-1, 1))."""
        dtype = as_dtype(dtype, "random_normal")
        if dtype.kind not in (DType.Kind.F32, DType.Kind.F64):
            raise InvalidArgumentError(f"random_normal: dtype must be f32 or f64, got {dtype}")
        low = float(np.nextafter(np.asarray(-1.0, dtype.to_numpy()), 0))  # erf_inv(-1) is -inf
        new_key, u = self.random_uniform(key, shape, dtype, low, 1.0, algorithm)
        return new_key, self.mul(self.erf_inv(u), float(np.sqrt(2)))

    # -- other ops -----------------------------------------------------------------------------

    def reduce_precision(self, x: Any, exponent_bits: int, mantissa_bits: int) -> Value:
        """x rounded (to nearest even) to a float format with ``exponent_bits`` and
        ``mantissa_bits`` (values out of its range become inf), kept in x's dtype."""
        op = "reduce_precision"
        x = self._operand(x, op)
        shape, dtype = _infer.reduce_precision(op, x, int(exponent_bits), int(mantissa_bits))
        with self._ctx:
            i32 = self._ir.IntegerType.get_signless(32)
            attrs = {"exponent_bits": self._ir.IntegerAttr.get(i32, int(exponent_bits)),
                     "mantissa_bits": self._ir.IntegerAttr.get(i32, int(mantissa_bits))}
        return self._op1("stablehlo.reduce_precision", [x], shape, dtype, attrs)

    def optimization_barrier(self, *values: Any) -> tuple[Value, ...]:
        """The values themselves; the compiler may not move computation across the barrier
        (XLA's OptimizationBarrier)."""
        xs = [self._operand(v, "optimization_barrier") for v in values]
        return tuple(self._op("stablehlo.optimization_barrier", xs, [(x.shape, x.dtype) for x in xs]))

    def custom_call(self, call_target_name: str, operands: Sequence[Any], result_types: Any,
                    backend_config: Any = "", api_version: int = 4,
                    has_side_effect: bool = False) -> Any:
        """A call of the backend's ``call_target_name``: ``result_types`` is one (shape,
        dtype) pair (one Value returned) or a list of them (a tuple returned).
        ``api_version`` 1 to 3 take a string ``backend_config`` (the opaque bytes); 4,
        XLA's typed FFI, a dict of attributes (ints, floats, strings)."""
        op = "custom_call"
        xs = [self._operand(x, op) for x in operands]
        types, many = checked_result_types(op, result_types)
        if api_version not in (1, 2, 3, 4):
            raise InvalidArgumentError(f"{op}: api_version must be 1, 2, 3 or 4, got {api_version!r}")
        ir = self._ir
        with self._ctx:
            attrs = {"call_target_name": ir.StringAttr.get(str(call_target_name)),
                     "has_side_effect": self._bool(has_side_effect),
                     "api_version": ir.IntegerAttr.get(ir.IntegerType.get_signless(32), api_version),
                     "backend_config": self._backend_config(op, backend_config, api_version)}
        values = self._op("stablehlo.custom_call", xs, types, attrs)
        return tuple(values) if many else values[0]

    def _backend_config(self, op: str, config: Any, api_version: int):
        ir = self._ir
        if api_version < 4:
            if isinstance(config, bytes):
                config = config.decode("latin-1")
            if not isinstance(config, str):
                raise InvalidArgumentError(f"{op}: api_version {api_version} takes a str backend_config, "
                                           f"got {type(config).__name__}")
            return ir.StringAttr.get(config)
        if config == "":
            config = {}
        if not isinstance(config, dict):
            raise InvalidArgumentError(f"{op}: api_version 4 takes a dict backend_config, got "
                                       f"{type(config).__name__}")
        entries = {}
        for key, v in config.items():
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise InvalidArgumentError(f"{op}: backend_config[{key!r}] must be an int, float or "
                                           f"str, got {v!r}")
            entries[str(key)] = (ir.StringAttr.get(v) if isinstance(v, str) else self._i64(v)
                                 if isinstance(v, int) else ir.FloatAttr.get_f64(v))
        return ir.DictAttr.get(entries)

    def _batch_norm(self, name: str, x, vectors, epsilon: float, feature_index: int, types_of,
                    grad_output=None):
        """Emit batch_norm op ``name`` on x, the per-feature ``vectors`` (and grad_output);
        ``types_of(x type, vector type)`` gives the result types."""
        op = name.split(".")[-1]
        x = self._operand(x, op)
        vs = [self._operand(v, op) for v in vectors]
        vec = _infer.batch_norm(op, x, vs, int(feature_index))
        tail = []
        if grad_output is not None:
            tail = [self._operand(grad_output, op)]
            if tail[0].shape != x.shape or tail[0].dtype != x.dtype:
                raise _infer.fail(op, [x, *tail], "grad_output must have x's shape and dtype")
        with self._ctx:
            attrs = {"epsilon": self._ir.FloatAttr.get_f32(float(epsilon)),
                     "feature_index": self._i64(feature_index)}
        return self._op(name, [x, *vs, *tail], types_of((x.shape, x.dtype), vec), attrs)

    def batch_norm_training(self, x: Any, scale: Any, offset: Any, epsilon: float,
                            feature_index: int) -> tuple[Value, Value, Value]:
        """``(normalized, mean, variance)`` over all dimensions but ``feature_index``:
        ``(x - mean) / sqrt(variance + epsilon) * scale + offset``."""
        out, mean, var = self._batch_norm("stablehlo.batch_norm_training", x, [scale, offset],
                                          epsilon, feature_index, lambda t, v: [t, v, v])
        return out, mean, var

    def batch_norm_inference(self, x: Any, scale: Any, offset: Any, mean: Any, variance: Any,
                             epsilon: float, feature_index: int) -> Value:
        """``(x - mean) / sqrt(variance + epsilon) * scale + offset`` per feature."""
        return self._batch_norm("stablehlo.batch_norm_inference", x,
                                [scale, offset, mean, variance], epsilon, feature_index,
                                lambda t, v: [t])[0]

    def batch_norm_grad(self, x: Any, scale: Any, mean: Any, variance: Any, grad_output: Any,
                        epsilon: float, feature_index: int) -> tuple[Value, Value, Value]:
        """The gradients ``(grad_x, grad_scale, grad_offset)`` of batch_norm_training's
        output given ``grad_output`` (x's shape) and the batch's mean and variance."""
        gx, gs, go = self._batch_norm("stablehlo.batch_norm_grad", x, [scale, mean, variance],
                                      epsilon, feature_index, lambda t, v: [t, v, v], grad_output)
        return gx, gs, go

    def partition_id(self) -> Value:
        """This device's partition (u32 scalar): its position in an SPMD program's devices."""
        return self._op1("stablehlo.partition_id", [], Shape(()), DType(DType.Kind.U32))

    def replica_id(self) -> Value:
        """This device's replica (u32 scalar)."""
        return self._op1("stablehlo.replica_id", [], Shape(()), DType(DType.Kind.U32))


class _ScalarLike:
    """Makes ``_operand`` turn a Python scalar into a scalar (not a broadcast) constant."""

    def __init__(self, value: Value):
        self.dtype = value.dtype
        self.shape = Shape(())
