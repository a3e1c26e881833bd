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
