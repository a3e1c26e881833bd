"""``stablehlo.fma`` for consumers whose StableHLO predates it: each fused multiply-add
of floats rewritten into ops every StableHLO version has, rounded once as ``fma`` is.

* f16, bf16, f32: the product of two such values is exact in f64; the sum is rounded to
  odd there (truncated, its last bit set where inexact: ``TwoSum``'s error says which),
  and f64's 53 bits are more than twice the type's precision plus two, so the last
  rounding to the type (for f16 and bf16 through f32, also rounded to odd) gives the
  correctly rounded result.
* f64: the product split into two f64s (Dekker's), and ``high + low + c`` summed with one
  rounding (Boldo and Melquiond's sum of three rounded to odd). Exact where the split is:
  ``|a * b|`` between 2**-900 and 2**1020, ``|a|``, ``|b|`` below 2**995 and ``|c|``
  below 2**1020. Outside that (products near the ends of f64's range) the product is
  rounded before the sum: two roundings. Infinities and NaN are IEEE's everywhere.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["FMA_VERSION", "expand_fma"]

#: The first StableHLO version with ``stablehlo.fma``.
FMA_VERSION = (1, 24, 0)


def expand_fma(ops: Iterable[Any]) -> int:
    """Rewrite each of the ``stablehlo.fma`` ``ops`` (of a module, in its MLIR context) on
    floats of a static shape, in place; the number rewritten."""
    from jaxlib.mlir import ir

    done = 0
    for op in ops:
        value = op.operation.results[0]
        kind = _float_kind(value.type)
        if kind is None:
            continue
        with ir.InsertionPoint(op), op.location:
            a, b, c = op.operands
            fused = _Ops(ir.RankedTensorType(value.type).shape).fma(a, b, c, kind)
        value.replace_all_uses_with(fused)
        op.operation.erase()
        done += 1
    return done


def _float_kind(type_: Any) -> str | None:
    """The element type's name for a static-shaped tensor of f16, bf16, f32 or f64;
    else None."""
    from jaxlib.mlir import ir

    try:
        tensor = ir.RankedTensorType(type_)
    except ValueError:  # unranked
        return None
    if not tensor.has_static_shape:
        return None
    kind = str(tensor.element_type)
    return kind if kind in ("f16", "bf16", "f32", "f64") else None


class _Ops:
    """StableHLO ops on tensors of one shape, emitted at the current insertion point."""

    def __init__(self, shape: list[int]):
        self.shape = shape

    def type(self, element: Any) -> Any:
        from jaxlib.mlir import ir

        return ir.RankedTensorType.get(self.shape, element)

    def constant(self, value: float | int, element: Any) -> Any:
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import stablehlo as hlo

        if isinstance(value, float):
            scalar = ir.FloatAttr.get(element, value)
        else:
            scalar = ir.IntegerAttr.get(element, value)
        return hlo.ConstantOp(ir.DenseElementsAttr.get_splat(self.type(element), scalar)).result

    def binary(self, name: str, x: Any, y: Any) -> Any:
        from jaxlib.mlir.dialects import stablehlo as hlo

        return getattr(hlo, name)(x, y).result

    def add(self, x: Any, y: Any) -> Any:
        return self.binary("AddOp", x, y)

    def sub(self, x: Any, y: Any) -> Any:
        return self.binary("SubtractOp", x, y)

    def mul(self, x: Any, y: Any) -> Any:
        return self.binary("MulOp", x, y)

    def and_(self, x: Any, y: Any) -> Any:
        return self.binary("AndOp", x, y)

    def compare(self, direction: str, x: Any, y: Any) -> Any:
        from jaxlib.mlir.dialects import stablehlo as hlo

        return hlo.CompareOp(x, y, hlo.ComparisonDirectionAttr.get(direction)).result

    def select(self, pred: Any, x: Any, y: Any) -> Any:
        from jaxlib.mlir.dialects import stablehlo as hlo

        return hlo.SelectOp(pred, x, y).result

    def convert(self, x: Any, element: Any) -> Any:
        from jaxlib.mlir.dialects import stablehlo as hlo

        return hlo.ConvertOp(self.type(element), x).result

    def bitcast(self, x: Any, element: Any) -> Any:
        from jaxlib.mlir.dialects import stablehlo as hlo

        return hlo.BitcastConvertOp(self.type(element), x).result

    def finite(self, x: Any) -> Any:
        from jaxlib.mlir.dialects import stablehlo as hlo

        return hlo.IsFiniteOp(x).result

    def abs(self, x: Any) -> Any:
        from jaxlib.mlir.dialects import stablehlo as hlo

        return hlo.AbsOp(x).result

    def below(self, x: Any, limit: float) -> Any:
        """|x| < limit (f64 x)."""
        return self.compare("LT", self.abs(x), self.constant(limit, _f64()))

    # -- the arithmetic --------------------------------------------------------------------

    def two_sum(self, x: Any, y: Any) -> tuple[Any, Any]:
        """(s, e): s = x + y rounded, x + y == s + e exactly."""
        s = self.add(x, y)
        t = self.sub(s, x)
        return s, self.add(self.sub(x, self.sub(s, t)), self.sub(y, t))

    def add_to_odd(self, x: Any, y: Any) -> Any:
        """f64 x + y rounded to odd."""
        from jaxlib.mlir import ir

        i64 = ir.IntegerType.get_signless(64)
        s, e = self.two_sum(x, y)
        bits = self.bitcast(s, i64)
        zero, one = self.constant(0.0, _f64()), self.constant(1, i64)
        even = self.compare("EQ", self.and_(bits, one), self.constant(0, i64))
        inexact = self.and_(self.compare("NE", e, zero), self.finite(s))
        away = self.compare("EQ", self.compare("GT", e, zero), self.compare("GT", s, zero))
        step = self.select(away, one, self.constant(-1, i64))
        moved = self.add(bits, step)
        return self.bitcast(self.select(self.and_(inexact, even), moved, bits), _f64())

    def to_odd_f32(self, s: Any) -> Any:
        """f64 s rounded to odd in f32."""
        from jaxlib.mlir import ir

        f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
        f = self.convert(s, f32)
        back = self.convert(f, _f64())
        inexact = self.and_(self.compare("NE", back, s), self.finite(s))
        bits = self.bitcast(f, i32)
        one = self.constant(1, i32)
        toward_zero = self.select(self.compare("GT", self.abs(back), self.abs(s)),
                                  self.sub(bits, one), bits)
        odd = self.binary("OrOp", toward_zero, one)
        return self.bitcast(self.select(inexact, odd, bits), f32)

    def fma(self, a: Any, b: Any, c: Any, kind: str) -> Any:
        from jaxlib.mlir import ir

        element = ir.RankedTensorType(a.type).element_type
        if kind != "f64":
            x, y, z = (self.convert(v, _f64()) for v in (a, b, c))
            odd = self.add_to_odd(self.mul(x, y), z)
            if kind == "f32":
                return self.convert(odd, element)
            return self.convert(self.to_odd_f32(odd), element)
        high = self.mul(a, b)
        ah, al = self.split(a)
        bh, bl = self.split(b)
        low = self.add(self.add(self.add(self.sub(self.mul(ah, bh), high), self.mul(ah, bl)),
                                self.mul(al, bh)), self.mul(al, bl))
        mid, mid_error = self.two_sum(low, c)
        top, top_error = self.two_sum(high, mid)
        fused = self.add(top, self.add_to_odd(top_error, mid_error))
        size = self.abs(high)
        safe = self.and_(self.compare("GT", size, self.constant(2.0 ** -900, _f64())),
                         self.below(high, 2.0 ** 1020))
        for v, limit in ((c, 2.0 ** 1020), (a, 2.0 ** 995), (b, 2.0 ** 995)):
            safe = self.and_(safe, self.below(v, limit))
        # Outside: the product rounded first; c itself where it is inf or NaN and a, b
        # are finite (a product overflowing to inf must not make inf - inf).
        from jaxlib.mlir.dialects import stablehlo as hlo

        c_not_finite = hlo.NotOp(self.finite(c)).result
        plain = self.select(self.and_(self.and_(self.finite(a), self.finite(b)), c_not_finite),
                            c, self.add(high, c))
        return self.select(safe, fused, plain)

    def split(self, v: Any) -> tuple[Any, Any]:
        """Veltkamp's split of f64 v into two halves of 26 bits each, v == hi + lo."""
        t = self.mul(v, self.constant(134217729.0, _f64()))  # 2**27 + 1
        hi = self.sub(t, self.sub(t, v))
        return hi, self.sub(v, hi)


def _f64() -> Any:
    from jaxlib.mlir import ir

    return ir.F64Type.get()
