"""Math that XLA's client library writes out of plain ops, written here the same way:
``next_after`` (on the bits, right for every float type, the narrow ones included) and
``regularized_incomplete_beta`` (a continued fraction in a while loop)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ifrtpy.dtypes import DType

from ifrtpy.builder import _infer
from ifrtpy.builder._value import Value

if TYPE_CHECKING:  # the mixin sees the whole builder when type-checked
    from ifrtpy.builder._regions import RegionOpsMixin as _Base
else:
    _Base = object

K = DType.Kind
#: Floats without a sign bit (all values positive).
_UNSIGNED_FLOATS = frozenset({K.F8E8M0FNU})
#: Floats whose one NaN has the bits of negative zero, which they lack.
_NO_NEGATIVE_ZERO = frozenset({K.F8E4M3FNUZ, K.F8E4M3B11FNUZ, K.F8E5M2FNUZ})
#: The unsigned integer of each float width.
_BITS = {4: K.U4, 8: K.U8, 16: K.U16, 32: K.U32, 64: K.U64}


def _has_nan(dtype: DType) -> bool:
    with np.errstate(all="ignore"):
        return bool(np.isnan(np.asarray(np.nan).astype(dtype.to_numpy()).astype(np.float32)))


class MathOpsMixin(_Base):
    """``next_after`` and ``regularized_incomplete_beta`` of :class:`~ifrtpy.builder.Builder`."""

    def next_after(self, x: Any, y: Any) -> Value:
        """The next representable value after x toward y (C's ``nextafter``; ml_dtypes'
        for the 8- and 4-bit floats): y where x equals y, NaN where either is NaN. Worked
        on the bits, as XLA's NextAfter: a step of one in the magnitude, away from zero
        toward a larger y of the same sign, else toward zero; from zero, the least value
        of y's sign. Types without negative zero step from their least negative value to
        zero (not to their NaN, which has those bits)."""
        op = "next_after"
        if not isinstance(x, Value) and isinstance(y, Value):
            x = self._operand(x, op, like=y)
        x = self._operand(x, op)
        y = self._operand(y, op, like=x)
        _, dtype = _infer.binary(op, x, y)
        width = dtype.bit_size
        assert width is not None
        bits = DType(_BITS[width])
        xi, yi = self.bitcast_convert(x, bits), self.bitcast_convert(y, bits)

        def const(value: int) -> Value:
            return self._operand(np.asarray(value).astype(bits.to_numpy()).item(), op, like=xi)

        if dtype.kind in _UNSIGNED_FLOATS:
            step = self.select(self.gt(x, y), xi - const(1), xi + const(1))
        else:
            sign = const(1 << (width - 1))
            magnitude = const((1 << (width - 1)) - 1)
            x_abs, y_abs = self.and_(xi, magnitude), self.and_(yi, magnitude)
            toward_zero = self.or_(self.gt(x_abs, y_abs),
                                   self.ne(self.and_(self.xor(xi, yi), sign), const(0)))
            step = self.select(toward_zero, xi - const(1), xi + const(1))
            least = self.or_(self.and_(yi, sign), const(1))  # from zero: y's sign, 1 ulp
            step = self.select(self.eq(x_abs, const(0)), least, step)
            if dtype.kind in _NO_NEGATIVE_ZERO:
                step = self.select(self.eq(step, sign), const(0), step)
        out = self.select(self.eq(x, y), yi, step)
        if _has_nan(dtype):
            nan = np.asarray(np.nan).astype(dtype.to_numpy()).view(bits.to_numpy())
            either_nan = self.or_(self.ne(x, x), self.ne(y, y))
            out = self.select(either_nan, const(int(nan)), out)
        return self.bitcast_convert(out, dtype)

    def regularized_incomplete_beta(self, a: Any, b: Any, x: Any) -> Value:
        """I_x(a, b), the regularized incomplete beta function
        (``scipy.special.betainc``), of f16, bf16 (computed in f32), f32 or f64 operands
        of one shape; NaN outside a > 0, b > 0, 0 <= x <= 1. XLA's
        RegularizedIncompleteBeta: the continued fraction of DLMF 8.17.22 by Lentz's
        method in a while loop (200 steps at most in f32, 600 in f64, until every
        element converged), on I_{1-x}(b, a) = 1 - I_x(a, b) where x >= (a + 1) / (a + b + 2)."""
        op = "regularized_incomplete_beta"
        operands = [a, b, x]
        like = next((v for v in operands if isinstance(v, Value)), None)
        if like is None:
            a, b, x = (self._operand(v, op) for v in operands)
        else:
            a, b, x = (self._operand(v, op, like=like) for v in operands)
        _infer.same_types(op, [a, b, x])
        if a.dtype.kind not in (K.F16, K.BF16, K.F32, K.F64):
            raise _infer.fail(op, [a, b, x], "needs f16, bf16, f32 or f64 operands")
        dtype = a.dtype
        work = dtype if dtype.kind in (K.F32, K.F64) else DType(K.F32)
        a, b, x = (self.convert(v, work) for v in (a, b, x))
        steps, eps = (600, float(np.finfo(np.float64).eps)) if work.kind == K.F64 else \
            (200, float(np.finfo(np.float32).eps))
        small = eps / 2  # the floor of Lentz's c and d, and the tolerance on each step

        out_of_domain = self.or_(self.or_(self.le(a, 0.0), self.le(b, 0.0)),
                                 self.or_(self.lt(x, 0.0), self.gt(x, 1.0)))
        direct = self.lt(x, (a + 1.0) / (a + b + 2.0))  # where the fraction converges fast
        a, b, x = self.select(direct, a, b), self.select(direct, b, a), self.select(direct, x, 1.0 - x)

        def floor(v: Value) -> Value:
            return self.select(self.lt(self.abs(v), small), self._operand(small, op, like=v), v)

        def numerator(n: Value) -> Value:
            """The n-th partial numerator (n >= 1): 1, then alternately
            -(a+m)(a+b+m)x / ((a+2m)(a+2m+1)) for even n and m(b-m)x / ((a+2m-1)(a+2m))
            for odd n, where m = (n - 1) // 2."""
            m = self.broadcast_to(self.convert(self.div(n - 1, 2), work), a.shape)
            even = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0))
            odd = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m))
            value = self.select(self.eq(self.rem(n, 2), 0), even, odd)
            return self.select(self.eq(n, 1), self._operand(1.0, op, like=a), value)

        def step(n, unconverged, c, d, h):
            term = numerator(n)  # the partial denominators are 1 from n = 1 on
            c = floor(1.0 + term / c)
            d = self.reciprocal(floor(1.0 + term * d))
            delta = c * d
            far = self.ge(self.abs(delta - 1.0), small)
            unconverged = self.reduce(far, None, range(far.rank), "or")
            return n + 1, unconverged, c, d, h * delta

        h0 = self.full(a.shape, small, work)  # the 0th partial denominator, 0, floored
        state = (self.constant(np.uint32(1)), self.constant(True), h0,
                 self.full(a.shape, 0.0, work), h0)
        _, _, _, _, fraction = self.while_loop(
            lambda n, unconverged, *_: self.and_(self.lt(n, steps), unconverged), step, state)
        lbeta = self.lgamma(a) + self.lgamma(b) - self.lgamma(a + b)
        result = fraction * self.exp(self.log(x) * a + self.log1p(-x) * b - lbeta) / a
        result = self.select(out_of_domain, self._operand(np.nan, op, like=result), result)
        return self.convert(self.select(direct, result, 1.0 - result), dtype)
