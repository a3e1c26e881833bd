"""An exact oracle of fused multiply-add: ``a * b + c`` in rational arithmetic, rounded
once to a binary float type (to nearest, ties to even, subnormals and overflow as IEEE 754
has them), and awkward fma operands (ties that a second rounding breaks, cancellations)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import ml_dtypes
import numpy as np

#: dtype -> (precision in bits, smallest normal exponent, largest exponent).
FORMATS = {np.dtype(np.float64): (53, -1022, 1023), np.dtype(np.float32): (24, -126, 127),
           np.dtype(np.float16): (11, -14, 15), np.dtype(ml_dtypes.bfloat16): (8, -126, 127)}


def round_once(value: Fraction, dtype) -> float:
    """``value`` rounded to ``dtype`` (nonzero; the result as a Python float)."""
    precision, emin, emax = FORMATS[np.dtype(dtype)]
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    quantum = Fraction(2) ** (max(exponent, emin) - precision + 1)
    rounded = round(magnitude / quantum) * quantum  # round() of a Fraction: ties to even
    if rounded >= Fraction(2) ** (emax + 1) - quantum / 2:
        result = math.inf
    else:
        result = float(rounded)  # exact: it fits the type, so an f64
    return result if value > 0 else -result


def fma(a, b, c, dtype) -> float:
    """``a * b + c`` rounded once to ``dtype``; IEEE's inf, NaN and signed zeros."""
    a, b, c = float(a), float(b), float(c)
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b + c
    if not math.isfinite(c):
        return c
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        return a * b + c  # the product is exactly -c or a zero: its sum's sign is IEEE's
    return round_once(exact, dtype)


def same(x, y) -> bool:
    """Equal floats, a zero's sign included; any NaN equals any NaN."""
    x, y = float(x), float(y)
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)


def hard_cases(dtype, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` fma operand triples of ``dtype``: a product near a tie of the type with a
    tiny addend (a second rounding gets it wrong), addends cancelling the product's
    leading bits, random magnitudes over the type's range, and the special values."""
    dtype = np.dtype(dtype)
    precision, emin, emax = FORMATS[dtype]
    rng = random.Random(seed)
    ulp = 2.0 ** (1 - precision)

    def number(low=emin - precision + 1, high=emax):
        return rng.choice((-1.0, 1.0)) * (1 + rng.random()) * 2.0 ** rng.randint(low, high - 1)

    rows = [
        # (1 + 2u)^2 = 1 + 4u + 4u^2 (u = 2^-(p/2+1)): a tie plus a tiny addend
        (1 + 2.0 ** -(precision // 2), 1 + 2.0 ** -(precision // 2), 2.0 ** (emin + 2)),
        (1 + 2.0 ** -(precision // 2), 1 + 2.0 ** -(precision // 2), -(2.0 ** (emin + 2))),
        (1 + ulp, 1 - ulp, -1.0), (1 + ulp, 1 + ulp, -1.0), (3.0, 1 / 3, -1.0),
        (0.0, -1.0, 0.0), (-0.0, 1.0, -0.0), (math.inf, 0.0, 1.0), (math.inf, 1.0, -math.inf),
        (math.nan, 1.0, 1.0), (2.0 ** emax, 2.0, -math.inf), (2.0 ** emax, 2.0, -(2.0 ** emax)),
        (2.0 ** (emin - precision + 1), 0.5, 0.0), (2.0 ** (emin // 2), 2.0 ** (emin // 2), 0.0),
    ]
    while len(rows) < n:
        a, b = number(emin // 2, emax // 2), number(emin // 2, emax // 2)
        kind = rng.randrange(4)
        if kind == 0:  # cancel the rounded product, exactly or nearly
            c = -float(np.asarray(a * b, dtype)) * (1 + rng.choice((0, 1, -1)) * ulp * rng.random())
        elif kind == 1:  # a tiny addend to a product
            c = number(emin, emin + precision)
        else:
            c = number(emin // 2, emax // 2)
        rows.append((a, b, c))
    with np.errstate(all="ignore"):
        a, b, c = (np.array(column[:n], np.float64).astype(dtype) for column in zip(*rows))
    return a, b, c
