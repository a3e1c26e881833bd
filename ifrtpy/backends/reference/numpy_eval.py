"""A NumPy evaluator of StableHLO programs: what the reference backend's interpreter
workers (:mod:`.worker`) run instead of jaxlib's StableHLO interpreter
(``stablehlo.eval_module``) where a program uses only the ops it implements.

The interpreter holds every element as an object of its own (about 1.5 us per element and
op); this evaluator computes each op on whole NumPy arrays, so a program's time goes with
its ops, not its elements. It gives the interpreter's results, bit for bit:

* arithmetic as StableHLO defines it: integers wrap, integer division follows XLA (x / 0
  is all bits set, x % 0 is x, INT_MIN / -1 is INT_MIN), shifts by the bit width or more
  give 0 (or the sign's fill for an arithmetic right shift), float to integer conversion
  truncates and saturates (NaN gives 0);
* transcendental ops on f16 and f32 computed in f64 and rounded once, as the interpreter
  computes them (f64 ones in NumPy's f64, or the C library's where NumPy's own differs);
* dots and float reductions accumulated in the interpreter's order, one element after
  another (not NumPy's pairwise sums or BLAS).

:func:`compile_module` decides once, when a worker parses a program, whether the whole
program runs here: any op, type or attribute it does not implement (f8 or sub-byte
values, tuples, ...) gives None,
and the worker runs the program in the interpreter as before. ``tests/backends/reference/test_numpy_eval.py``
runs random programs of each op through both and compares the bits.

Like :mod:`.worker`, it imports only the standard library, NumPy and jaxlib's MLIR
bindings (the worker loads it from its file, without ifrtpy).
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["ProgramError", "Unsupported", "compile_module", "Program"]


class Unsupported(Exception):
    """What the evaluator does not implement (the program then runs in the interpreter)."""


class ProgramError(Exception):
    """A fault of the program as it runs, which XLA would not run either (the devices of
    a manual computation meeting at different collectives): the execute fails with it."""


_DTYPES = {"i1": np.dtype(np.bool_), "i8": np.dtype(np.int8), "i16": np.dtype(np.int16),
           "i32": np.dtype(np.int32), "i64": np.dtype(np.int64), "ui8": np.dtype(np.uint8),
           "ui16": np.dtype(np.uint16), "ui32": np.dtype(np.uint32),
           "ui64": np.dtype(np.uint64), "f16": np.dtype(np.float16),
           "f32": np.dtype(np.float32), "f64": np.dtype(np.float64),
           "complex<f32>": np.dtype(np.complex64), "complex<f64>": np.dtype(np.complex128)}
try:  # jaxlib's own dependency
    import ml_dtypes as _ml_dtypes
    _DTYPES["bf16"] = np.dtype(_ml_dtypes.bfloat16)
    BF16: np.dtype | None = _DTYPES["bf16"]
except ImportError:  # pragma: no cover
    BF16 = None
_UNSIGNED = {np.dtype(np.int8): np.uint8, np.dtype(np.int16): np.uint16,
             np.dtype(np.int32): np.uint32, np.dtype(np.int64): np.uint64}


def _tensor(type_) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a ranked tensor type of static shape and a supported element."""
    from jaxlib.mlir import ir

    if not isinstance(type_, ir.RankedTensorType):
        raise Unsupported(f"type {type_}")
    tensor = ir.RankedTensorType(type_)
    if not tensor.has_static_shape:
        raise Unsupported(f"type {type_}")
    dtype = _DTYPES.get(str(tensor.element_type))
    if dtype is None:
        raise Unsupported(f"element type {tensor.element_type}")
    return tuple(tensor.shape), dtype


def _first(values: list[tuple[tuple[int, ...], np.dtype]]) -> tuple[tuple[int, ...], Any]:
    """The first (shape, dtype) of an op's operands or results; ((), None) where it has none."""
    return values[0] if values else ((), None)


def _ints(attr) -> list[int]:
    from jaxlib.mlir import ir

    if isinstance(attr, ir.DenseI64ArrayAttr):
        return list(ir.DenseI64ArrayAttr(attr))
    if isinstance(attr, ir.DenseIntElementsAttr):
        return [int(v) for v in np.array(ir.DenseIntElementsAttr(attr)).reshape(-1)]
    if isinstance(attr, ir.DenseBoolArrayAttr):
        return [int(v) for v in ir.DenseBoolArrayAttr(attr)]
    raise Unsupported(f"attribute {attr}")


def _attr(op, name: str, default=None):
    return op.attributes[name] if name in op.attributes else default


# -- elementwise kernels -------------------------------------------------------------------

def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == BF16


def _is_int(dtype: np.dtype) -> bool:
    return dtype.kind in "iu"


def _complex_sign(x):
    size = np.abs(x)
    return np.where(size == 0, x, x / np.where(size == 0, 1, size)).astype(x.dtype)


#: Elementwise ops on complex values, in NumPy's complex arithmetic.
_COMPLEX: dict[str, Callable] = {
    "negate": np.negative, "abs": np.abs, "sign": _complex_sign, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "exponential": np.exp,
    "exponential_minus_one": np.expm1, "log": np.log, "log_plus_one": np.log1p,
    "sine": np.sin, "cosine": np.cos, "tan": np.tan, "tanh": np.tanh, "add": np.add,
    "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide, "power": np.power}


def _via_f64(function: Callable, f64_function: Callable | None = None) -> Callable:
    """A float op computed as the interpreter does: f16 and f32 in f64, rounded once."""
    f64_function = f64_function or function

    def apply(*xs):
        dtype = xs[0].dtype
        if dtype == np.float64:
            return f64_function(*xs)
        return function(*(x.astype(np.float64) for x in xs)).astype(dtype)
    return apply


def _libm(function: Callable) -> Callable:
    """``function`` (of Python's math module: the C library's) over an f64 array."""
    vectorized = np.frompyfunc(function, 1, 1)

    def apply(x):
        return np.asarray(vectorized(x), np.float64).reshape(np.shape(x))
    return apply


def _safe(function: Callable) -> Callable:
    """A math-module function that gives what C's would instead of raising (math.tanh
    does not raise; this covers the domain errors of the others)."""
    def call(x):
        try:
            return function(x)
        except (ValueError, OverflowError):
            return math.nan
    return call


def _logistic(x):
    dtype = x.dtype
    e = np.exp(-x.astype(np.float64)).astype(dtype)
    one = dtype.type(1)
    return one / (one + e)


def _fma(a, b, c):
    """``stablehlo.fma``: ``a * b + c`` rounded once. Below f64 the product is exact in f64
    and the sum there is rounded to odd, which the one rounding to the type keeps right;
    in f64 the product is split into two f64s (Dekker's) and the three summed with one
    rounding (Boldo and Melquiond's sum rounded to odd); elements near either end of f64's
    range, where the split is not exact, are computed exactly one by one."""
    dtype = a.dtype
    with np.errstate(all="ignore"):
        if dtype != np.float64:
            x, y, z = (np.asarray(v, np.float64) for v in (a, b, c))
            odd = _add_to_odd(x * y, z)
            return _to_bf16(odd) if dtype == BF16 else odd.astype(dtype)
        a, b, c = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in (a, b, c)))
        high = a * b
        split = 134217729.0  # 2**27 + 1
        ah = a * split - (a * split - a)
        bh = b * split - (b * split - b)
        low = ((ah * bh - high) + ah * (b - bh) + (a - ah) * bh) + (a - ah) * (b - bh)
        mid, mid_error = _two_sum(low, c)
        top, top_error = _two_sum(high, mid)
        out = np.asarray(top + _add_to_odd(top_error, mid_error), np.float64)
        size = np.abs(high)
        exact = ~((size > 2.0 ** -900) & (size < 2.0 ** 1020) & (np.abs(c) < 2.0 ** 1020)
                  & (np.abs(a) < 2.0 ** 995) & (np.abs(b) < 2.0 ** 995))
    if exact.any():
        out = np.array(out)
        out[exact] = [_fma_exactly(*v) for v in zip(a[exact], b[exact], c[exact])]
    return out


def _two_sum(x, y):
    """``(s, e)``: ``s = x + y`` rounded and ``e`` its error, ``x + y == s + e`` exactly."""
    s = x + y
    t = s - x
    return s, (x - (s - t)) + (y - t)


def _add_to_odd(x, y):
    """``x + y`` rounded to odd: truncated, its last bit set where inexact."""
    s, e = _two_sum(x, y)
    bits = np.asarray(s, np.float64).view(np.int64)
    even_inexact = (e != 0) & np.isfinite(s) & ((bits & 1) == 0)
    away = (e > 0) == (s > 0)  # the exact sum is farther from zero than s
    return np.where(even_inexact, bits + np.where(away, 1, -1), bits).view(np.float64)


def _fma_exactly(a: float, b: float, c: float) -> float:
    """One f64 ``a * b + c`` in exact rational arithmetic, rounded once (Python's
    int division rounds correctly, subnormals included)."""
    from fractions import Fraction

    a, b, c = float(a), float(b), float(c)
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b + c  # the product is exactly inf or NaN
    if not math.isfinite(c):
        return c
    value = Fraction(a) * Fraction(b) + Fraction(c)
    if value == 0:
        return a * b + c  # the product is exact: IEEE's sign of a zero sum
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _sign(x):
    if x.dtype == np.bool_:
        return x
    if _is_float(x.dtype):
        return np.where(x > 0, x.dtype.type(1), np.where(x < 0, x.dtype.type(-1), x))
    return np.sign(x).astype(x.dtype)


def _round_afz(x):
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= x.dtype.type(0.5), t + np.sign(x), t).astype(x.dtype)


def _int_divide(a, b):
    zero = b == 0
    refused = zero
    if a.dtype.kind == "i":
        refused = zero | ((a == np.iinfo(a.dtype).min) & (b == -1))
    divisor = np.where(refused, b.dtype.type(1), b)
    q = a // divisor
    if a.dtype.kind == "i":  # floor to truncation
        q = q + ((a % divisor != 0) & ((a < 0) != (divisor < 0))).astype(a.dtype)
    return np.where(zero, np.array(-1).astype(a.dtype) if a.dtype.kind == "i"
                    else a.dtype.type(np.iinfo(a.dtype).max), q).astype(a.dtype)


def _int_remainder(a, b):
    zero = b == 0
    refused = zero
    if a.dtype.kind == "i":
        refused = zero | ((a == np.iinfo(a.dtype).min) & (b == -1))
    divisor = np.where(refused, b.dtype.type(1), b)
    return np.where(zero, a, np.fmod(a, divisor)).astype(a.dtype)


_SIGNED = {np.dtype(u): s for s, u in _UNSIGNED.items()}


def _shift(kind: str):
    """A shift: by the bit width or more (the amount read unsigned) gives 0, or for an
    arithmetic right shift the sign bit's fill (of unsigned values too)."""
    def apply(x, y):
        dtype = x.dtype
        bits = dtype.itemsize * 8
        unsigned = np.dtype(_UNSIGNED.get(dtype, dtype))
        signed = _SIGNED.get(unsigned, dtype)
        amount = y.view(unsigned) if dtype.kind == "i" else y
        big = amount >= bits
        amount = np.where(big, 0, amount).astype(unsigned)
        if kind == "arithmetic":
            as_signed = x.view(signed)
            out = np.right_shift(as_signed, amount.astype(signed))
            fill = np.where(as_signed < 0, signed.type(-1), signed.type(0))
            return np.where(big, fill, out).view(dtype)
        shift = np.left_shift if kind == "left" else np.right_shift
        out = shift(x.view(unsigned), amount).view(dtype)
        return np.where(big, dtype.type(0), out)
    return apply


def _maximum(x, y):
    """IEEE maximum: NaN wins, and +0 over -0 (NumPy's keeps the first of two zeros)."""
    out = np.maximum(x, y)
    zeros = (x == 0) & (y == 0)
    return np.where(zeros, x + y, out) if zeros.any() else out


def _minimum(x, y):
    """IEEE minimum: NaN wins, and -0 over +0."""
    out = np.minimum(x, y)
    zeros = (x == 0) & (y == 0)
    return np.where(zeros, -(-x + -y), out) if zeros.any() else out


def _popcount(x):
    unsigned = x.view(_UNSIGNED.get(x.dtype, x.dtype))
    count = np.zeros(x.shape, np.uint8)
    for byte in range(x.dtype.itemsize):
        count += _POPCOUNT8[(unsigned >> np.array(8 * byte).astype(unsigned.dtype)) & 0xFF]
    return count.astype(x.dtype)


_POPCOUNT8 = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def _clz(x):
    bits = x.dtype.itemsize * 8
    unsigned = x.view(_UNSIGNED.get(x.dtype, x.dtype))
    count = np.full(x.shape, bits, np.int64)
    for bit in range(bits):
        set_ = ((unsigned >> np.array(bit).astype(unsigned.dtype)) & 1) != 0
        count = np.where(set_, bits - 1 - bit, count)
    return count.astype(x.dtype)


def _unary(name: str, dtype: np.dtype) -> Callable:
    """The kernel of elementwise op ``name`` on ``dtype`` operands."""
    if dtype.kind == "c":
        return _complex(name, dtype)
    floating, integer, boolean = _is_float(dtype), _is_int(dtype), dtype == np.bool_
    if name == "negate" and (floating or integer):
        return np.negative
    if name == "abs" and (floating or integer):
        return np.abs
    if name == "not" and (integer or boolean):
        return np.invert
    if name == "sign" and (floating or integer):
        return _sign
    if name == "popcnt" and integer:
        return _popcount
    if name == "count_leading_zeros" and integer:
        return _clz
    if name == "is_finite" and floating:
        return np.isfinite
    if not floating:
        raise Unsupported(f"stablehlo.{name} on {dtype}")
    exact: dict[str, Callable] = {"floor": np.floor, "ceil": np.ceil, "round_nearest_even": np.rint,
             "round_nearest_afz": _round_afz, "sqrt": np.sqrt}
    if name in exact:
        return exact[name]
    if name == "logistic":
        return _logistic
    # NumPy's own f64 loops agree with the C library's for these (checked by the tests)
    transcendental: dict[str, Callable] = {"exponential": np.exp, "exponential_minus_one": np.expm1,
                      "log": np.log, "log_plus_one": np.log1p, "sine": np.sin,
                      "cosine": np.cos, "cbrt": np.cbrt}
    if name in transcendental:
        return _via_f64(transcendental[name])
    if name == "rsqrt":
        return _via_f64(lambda x: 1.0 / np.sqrt(x))
    if name == "tanh":
        return _via_f64(_libm(math.tanh))
    if name == "tan":
        return _via_f64(_libm(_safe(math.tan)))
    raise Unsupported(f"stablehlo.{name}")


def _complex(name: str, dtype: np.dtype) -> Callable:
    if name not in _COMPLEX:
        raise Unsupported(f"stablehlo.{name} on {dtype}")
    return _COMPLEX[name]


def _binary(name: str, dtype: np.dtype) -> Callable:
    if dtype.kind == "c":
        return _complex(name, dtype)
    floating, integer, boolean = _is_float(dtype), _is_int(dtype), dtype == np.bool_
    if boolean:
        table: dict[str, Callable] = {"add": np.logical_or, "multiply": np.logical_and, "and": np.logical_and,
                 "or": np.logical_or, "xor": np.logical_xor, "maximum": np.logical_or,
                 "minimum": np.logical_and}
        if name in table:
            return table[name]
        raise Unsupported(f"stablehlo.{name} on i1")
    table = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
             "maximum": _maximum if floating else np.maximum,
             "minimum": _minimum if floating else np.minimum}
    if name in table:
        return table[name]
    if integer:
        table = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
                 "divide": _int_divide, "remainder": _int_remainder,
                 "shift_left": _shift("left"), "shift_right_logical": _shift("logical"),
                 "shift_right_arithmetic": _shift("arithmetic")}
        if name in table:
            return table[name]
    if floating:
        if name == "divide":
            return np.divide
        if name == "remainder":
            return np.fmod
        if name == "power":
            return _via_f64(np.power)
        if name == "atan2":
            return _via_f64(np.arctan2)
    raise Unsupported(f"stablehlo.{name} on {dtype}")


def _convert(source: np.dtype, target: np.dtype) -> Callable:
    if target == np.bool_:
        return lambda x: x != 0
    if source.kind == "c" and target.kind != "c":  # the real part, as XLA converts
        real = _convert(np.dtype(source.char.lower()), target)
        return lambda x: real(np.real(x))
    if _is_int(target) and _is_float(source):
        info = np.iinfo(target)
        low, high = float(info.min), float(info.max) + 1.0  # powers of two: exact

        def float_to_int(x):
            t = np.trunc(x.astype(np.float64))
            inside = (t >= low) & (t < high)
            out = np.where(inside, t, 0.0).astype(target)
            out = np.where(t >= high, target.type(info.max), out)
            return np.where(t < low, target.type(info.min), out)
        return float_to_int
    return lambda x: x.astype(target)


def _bitcast(source: np.dtype, target: np.dtype, shape: tuple[int, ...]) -> Callable:
    """``bitcast_convert``; between widths, the narrower type's last dimension holds the
    wider's bytes, low ones first (this machine's order, as XLA's on it)."""
    if np.bool_ in (source, target):
        raise Unsupported(f"stablehlo.bitcast_convert from {source} to {target}")
    if source.itemsize == target.itemsize:
        return lambda x: np.asarray(x).view(target)
    return lambda x: np.ascontiguousarray(x).view(target).reshape(shape)


def _total_order(x):
    """Integers that order floats as IEEE's total order does (-NaN < -inf < ... < -0 < +0
    < ... < inf < NaN): the bits, with those below the sign flipped for negative values."""
    signed = np.dtype(f"i{x.dtype.itemsize}")
    bits = np.asarray(x).view(signed)
    return bits ^ ((bits >> (8 * x.dtype.itemsize - 1)) & np.iinfo(signed).max)


_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
            "GT": np.greater, "GE": np.greater_equal}


# -- the compiler ----------------------------------------------------------------------------

Step = Callable[[list], None]


class _Region:
    """A compiled block: its arguments' slots, its steps, the slots it returns."""

    __slots__ = ("args", "steps", "returns")

    def __init__(self, args: list[int], steps: list[Step], returns: list[int]):
        self.args, self.steps, self.returns = args, steps, returns

    def run(self, env: list, values: Sequence) -> list:
        for slot, value in zip(self.args, values):
            env[slot] = value
        for step in self.steps:
            step(env)
        return [env[slot] for slot in self.returns]


class _Function:
    """A compiled ``func.func``: each call runs its body in an environment of its own."""

    def __init__(self) -> None:
        self.size = 0
        self.body: _Region | None = None

    def __call__(self, values: Sequence) -> list:
        assert self.body is not None
        return self.body.run([None] * self.size, values)


class _Compiler:
    def __init__(self, module, checked: bool = False) -> None:
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import sdy

        self.functions = {}
        #: The module's meshes by name (manual computations name them).
        self.meshes = {}
        for op in module.body.operations:
            name = ir.StringAttr(op.attributes["sym_name"]).value if "sym_name" in op.attributes else ""
            if op.operation.name == "func.func":
                self.functions[name] = op
            elif op.operation.name == "sdy.mesh":
                self.meshes[name] = sdy.MeshAttr(op.attributes["mesh"])
            else:
                raise Unsupported(op.operation.name)
        self.compiled: dict[str, _Function] = {}
        self.compiling: set[str] = set()
        self.function: _Function | None = None
        self.slots: dict[Any, int] = {}
        self.checked = checked
        #: Compiling a reduction's body, run on whole rows at once: elementwise ops only.
        self.elementwise = False

    def compile_function(self, name: str) -> _Function:
        if name in self.compiled:
            return self.compiled[name]
        if name in self.compiling or name not in self.functions:
            raise Unsupported(f"a call of @{name}")
        self.compiling.add(name)
        outer = self.function, self.slots
        function = self.function = _Function()
        self.slots = {}
        op = self.functions[name]
        if len(op.regions[0].blocks) != 1:
            raise Unsupported(f"@{name} has no body or several blocks")
        function.body = self.region(op.regions[0])
        self.function, self.slots = outer
        self.compiling.discard(name)
        self.compiled[name] = function
        return function

    def elementwise_region(self, region) -> _Region:
        """``region`` (a reduction's body, a comparator) compiled to run on whole rows of
        elements at once: elementwise ops only."""
        outer, self.elementwise = self.elementwise, True
        try:
            return self.region(region)
        finally:
            self.elementwise = outer

    def slot(self, value) -> int:
        slot = self.slots.get(value)
        if slot is None:
            raise Unsupported("a value used before it is defined")
        return slot

    def define(self, value) -> int:
        assert self.function is not None
        _tensor(value.type)
        slot = self.slots[value] = self.function.size
        self.function.size += 1
        return slot

    def region(self, region) -> _Region:
        blocks = list(region.blocks)
        if len(blocks) != 1:
            raise Unsupported("a region of several blocks")
        block = blocks[0]
        args = [self.define(arg) for arg in block.arguments]
        steps: list[Step] = []
        returns: list[int] | None = None
        for op in block.operations:
            name = op.operation.name
            if name in ("func.return", "stablehlo.return", "sdy.return"):
                returns = [self.slot(v) for v in op.operands]
                break
            steps.append(self.step(op))
        if returns is None:
            raise Unsupported("a block without a return")
        return _Region(args, steps, returns)

    def step(self, op) -> Step:
        name = op.operation.name
        ins = [self.slot(v) for v in op.operands]
        if name in _CONTROL:
            return _CONTROL[name](self, op, ins)
        if name == "stablehlo.reduce":
            return _reduce(self, op, ins)
        if name == "stablehlo.sort":
            return _sort(self, op, ins)
        if name == "stablehlo.reduce_window":
            return _reduce_window(self, op, ins)
        if name == "stablehlo.select_and_scatter" and not self.elementwise:
            return _select_and_scatter(self, op, ins)
        if name == "stablehlo.scatter" and not self.elementwise:
            try:
                kernel = _kernel(self, op)
            except Unsupported:
                return _scatter_any(self, op, ins)
            if self.checked:
                kernel = _checked(kernel, op, self.elementwise)
            return _bind(kernel, ins, [self.define(r) for r in op.results])
        if name == "sdy.manual_computation":
            return _per_device().manual_computation(self, op, ins)
        short = name[len("stablehlo."):] if name.startswith("stablehlo.") else None
        if short in _per_device().COLLECTIVES and not self.elementwise:
            return _per_device().collective(self, op, ins)
        if short in _per_device().IDS and not self.elementwise:
            return _bind(_per_device().device_id(short), ins, [self.define(op.results[0])])
        if name == "func.call":
            from jaxlib.mlir import ir
            callee = self.compile_function(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
            outs = [self.define(r) for r in op.results]

            def call(env):
                for slot, value in zip(outs, callee([env[i] for i in ins])):
                    env[slot] = value
            return call
        if not name.startswith("stablehlo."):
            raise Unsupported(name)
        if self.elementwise and name[len("stablehlo."):] not in _ELEMENTWISE:
            raise Unsupported(f"{name} in a reduction's body")
        kernel = _kernel(self, op)
        outs = [self.define(r) for r in op.results]
        if self.checked:
            kernel = _checked(kernel, op, self.elementwise)
        return _bind(kernel, ins, outs)


#: The module :mod:`.per_device` (manual computations and collectives). It builds on this
#: module, so it sets this itself as it is imported (:mod:`.rewrite` and the worker
#: import it); None before.
per_device: Any = None


def _per_device() -> Any:
    """:data:`per_device`, which manual computations and collectives need."""
    if per_device is None:
        raise Unsupported("manual computations and collectives: per_device is not loaded")
    return per_device


def _checked(kernel: Callable, op, elementwise: bool) -> Callable:
    """``kernel``, raising AssertionError where a result is not of its op's type (its
    element type only in a reduction's body, whose ops run on rows of elements) (tests)."""
    types = [_tensor(r.type) for r in op.results]
    name = op.operation.name

    def check(*xs):
        outs = kernel(*xs)
        for out, (shape, dtype) in zip([outs] if len(types) == 1 else outs, types):
            if (np.shape(out) != shape and not elementwise) or np.asarray(out).dtype != dtype:
                raise AssertionError(f"{name} gave {np.asarray(out).dtype}{list(np.shape(out))}, "
                                     f"not {dtype}{list(shape)}")
        return outs
    return check


def _bind(kernel: Callable, ins: list[int], outs: list[int]) -> Step:
    """A step computing ``kernel`` of the slots ``ins`` into the slots ``outs``."""
    if len(outs) == 1:
        out, = outs
        if len(ins) == 1:
            a, = ins

            def step1(env):
                env[out] = kernel(env[a])
            return step1
        if len(ins) == 2:
            a, b = ins

            def step2(env):
                env[out] = kernel(env[a], env[b])
            return step2

        def step(env):
            env[out] = kernel(*[env[i] for i in ins])
        return step

    def steps(env):
        for slot, value in zip(outs, kernel(*[env[i] for i in ins])):
            env[slot] = value
    return steps


_UNARY = frozenset({"negate", "abs", "not", "sign", "popcnt", "count_leading_zeros",
                    "is_finite", "floor", "ceil", "round_nearest_even", "round_nearest_afz",
                    "sqrt", "rsqrt", "cbrt", "exponential", "exponential_minus_one", "log",
                    "log_plus_one", "logistic", "sine", "cosine", "tan", "tanh"})
_ELEMENTWISE_OTHER = frozenset({"compare", "select", "clamp", "convert", "constant",
                                "bitcast_convert"})
_BINARY = frozenset({"add", "subtract", "multiply", "divide", "remainder", "maximum",
                     "minimum", "and", "or", "xor", "shift_left", "shift_right_logical",
                     "shift_right_arithmetic", "power", "atan2"})


_ELEMENTWISE = _UNARY | _BINARY | _ELEMENTWISE_OTHER


def _kernel(compiler: _Compiler, op, bf16: bool = True) -> Callable:
    """The kernel of a stablehlo op (no regions but a reduction's); ``bf16=False``: one
    that moves bf16 values as they are (:func:`_bf16_kernel` decided so)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo as hlo

    name = op.operation.name[len("stablehlo."):]
    operands = [_tensor(v.type) for v in op.operands]
    results = [_tensor(v.type) for v in op.results]
    if "result_accuracy" in op.attributes and "DEFAULT" not in str(op.attributes["result_accuracy"]):
        raise Unsupported(f"result_accuracy {op.attributes['result_accuracy']}")
    if name == "fma" and _is_float(operands[0][1]):
        return _fma
    if bf16 and BF16 is not None and BF16 in [d for _, d in operands + results]:
        return _bf16_kernel(compiler, op, name, operands, results)
    if name in _UNARY or name in _BINARY:
        function = (_unary if name in _UNARY else _binary)(name, operands[0][1])
        dtype = results[0][1]
        return lambda *xs: np.asarray(function(*xs)).astype(dtype, copy=False)
    shape, dtype = _first(results)
    if name == "constant":
        if dtype.kind == "c":  # the bindings read no complex elements: from the text
            value = _complex_elements(str(op.operation), dtype)
        else:
            value = np.array(ir.DenseElementsAttr(op.attributes["value"]))
        if value.size == math.prod(shape) and value.shape != shape:
            value = value.reshape(shape)
        if value.dtype != dtype:
            raise Unsupported(f"a constant of {dtype} read as {value.dtype}")
        if value.shape != shape:
            value = np.broadcast_to(value.reshape(-1)[:1].reshape(()), shape)
        value = np.array(value, order="C")
        value.flags.writeable = False
        return lambda: value
    if name == "compare":
        direction = hlo.ComparisonDirectionAttr(op.attributes["comparison_direction"]).value
        kind = _attr(op, "compare_type")
        compare = _COMPARE[direction]
        if kind is not None and hlo.ComparisonTypeAttr(kind).value == "TOTALORDER":
            if not _is_float(operands[0][1]):
                return compare
            return lambda x, y: compare(_total_order(x), _total_order(y))
        return compare
    if name == "select":
        return lambda p, a, b: np.where(p, a, b)
    if name in ("real", "imag"):
        part = np.real if name == "real" else np.imag
        return lambda x: part(x).astype(dtype)
    if name == "complex":
        def complex_(re, im):
            out = np.empty(np.broadcast_shapes(np.shape(re), np.shape(im)), dtype)
            out.real, out.imag = re, im
            return out
        return complex_
    if name == "reduce_precision":
        return _reduce_precision(op, dtype)
    if name == "clamp":
        if _is_float(dtype):
            return lambda lo, x, hi: _minimum(_maximum(x, lo), hi)
        return lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi).astype(dtype)
    if name == "convert":
        return _convert(operands[0][1], dtype)
    if name == "bitcast_convert":
        return _bitcast(operands[0][1], dtype, shape)
    if name == "reshape":
        return lambda x: np.reshape(x, shape)
    if name == "broadcast_in_dim":
        dims = _ints(op.attributes["broadcast_dimensions"])
        source = operands[0][0]
        middle = [1] * len(shape)
        for i, d in enumerate(dims):
            middle[d] = source[i]
        perm = sorted(range(len(dims)), key=lambda i: dims[i])

        def broadcast(x):
            return np.broadcast_to(np.reshape(np.transpose(x, perm), middle), shape)
        return broadcast
    if name == "transpose":
        perm = _ints(op.attributes["permutation"])
        return lambda x: np.transpose(x, perm)
    if name == "slice":
        index = tuple(slice(a, b, c) for a, b, c in zip(
            _ints(op.attributes["start_indices"]), _ints(op.attributes["limit_indices"]),
            _ints(op.attributes["strides"])))
        return lambda x: np.asarray(x)[index]
    if name == "reverse":
        dims = _ints(op.attributes["dimensions"])
        return lambda x: np.flip(x, tuple(dims))
    if name == "iota":
        dim = int(ir.IntegerAttr(op.attributes["iota_dimension"]).value)
        line = np.arange(shape[dim]).astype(dtype)
        value = np.array(np.broadcast_to(
            line.reshape([-1 if i == dim else 1 for i in range(len(shape))]), shape))
        value.flags.writeable = False
        return lambda: value
    if name == "concatenate":
        dim = int(ir.IntegerAttr(op.attributes["dimension"]).value)
        return lambda *xs: np.concatenate(xs, axis=dim)
    if name == "dynamic_slice":
        sizes = _ints(op.attributes["slice_sizes"])
        source = operands[0][0]

        def dynamic_slice(x, *starts):
            index = tuple(slice(s, s + n) for s, n in (
                (min(max(int(start), 0), dim - n), n) for start, dim, n in zip(starts, source, sizes)))
            return np.asarray(x)[index]
        return dynamic_slice
    if name == "dynamic_update_slice":
        source, update = operands[0][0], operands[1][0]

        def dynamic_update_slice(x, u, *starts):
            out = np.array(x)
            index = tuple(slice(s, s + n) for s, n in (
                (min(max(int(start), 0), dim - n), n) for start, dim, n in zip(starts, source, update)))
            out[index] = u
            return out
        return dynamic_update_slice
    if name == "pad":
        low, high = _ints(op.attributes["edge_padding_low"]), _ints(op.attributes["edge_padding_high"])
        interior = _ints(op.attributes["interior_padding"])
        return _pad(low, high, interior, shape)
    if name == "optimization_barrier":
        return lambda *xs: xs
    if name == "tuple" or name == "get_tuple_element":
        raise Unsupported("tuples")
    if name == "dot_general":
        return _dot_general(op, operands, dtype)
    if name == "gather":
        return _gather(op, operands, shape)
    if name == "scatter":
        return _scatter(op, operands)
    if name == "convolution":
        return _convolution(op, operands, shape, dtype)
    if name == "rng_bit_generator":
        return _rng_bit_generator(op, results)
    raise Unsupported(op.operation.name)


def _reduce_precision(op, dtype: np.dtype) -> Callable:
    """``stablehlo.reduce_precision`` as XLA computes it on the bits: the mantissa
    rounded to ``mantissa_bits`` (to nearest, ties to even), then exponents past the
    narrower range overflowing to infinity and underflowing to zero (signed); NaNs
    stay NaNs."""
    from jaxlib.mlir import ir

    exponent_bits = int(ir.IntegerAttr(op.attributes["exponent_bits"]).value)
    mantissa_bits = int(ir.IntegerAttr(op.attributes["mantissa_bits"]).value)
    if not _is_float(dtype):
        raise Unsupported(f"reduce_precision of {dtype}")
    info = (_ml_dtypes.finfo if dtype == BF16 else np.finfo)(dtype)
    source_mantissa, source_exponent = info.nmant, info.iexp
    unsigned = np.dtype(f"u{dtype.itemsize}")

    def constant(value):
        return unsigned.type(value)

    def reduce_precision(x):
        bits = np.asarray(x).view(unsigned)
        if mantissa_bits < source_mantissa:
            shift = source_mantissa - mantissa_bits
            last = constant(1 << shift)
            bias = ((bits & last) >> constant(shift)) + constant((1 << (shift - 1)) - 1)
            bits = (bits + bias) & ~constant((1 << shift) - 1)
        if exponent_bits < source_exponent:
            sign = constant(1 << (8 * dtype.itemsize - 1))
            exponent_mask = constant(((1 << source_exponent) - 1) << source_mantissa)
            source_bias = (1 << (source_exponent - 1)) - 1
            reduced_bias = (1 << (exponent_bits - 1)) - 1
            exponent = bits & exponent_mask
            overflows = exponent > constant((source_bias + reduced_bias) << source_mantissa)
            underflows = exponent <= constant((source_bias - reduced_bias) << source_mantissa)
            signed_zero = bits & sign
            bits = np.where(overflows, signed_zero | exponent_mask,
                            np.where(underflows, signed_zero, bits))
        out = np.asarray(bits, unsigned).view(dtype)
        if mantissa_bits < source_mantissa:
            out = np.where(np.isnan(x), x, out)
        return out.astype(dtype, copy=False)
    return reduce_precision


def _to_bf16(v):
    """f64 values rounded once to bf16 (to nearest, ties to even), as the interpreter
    rounds: through f32 rounded to odd (truncated, its last bit set where inexact), which
    keeps the rounding to bf16 right (NumPy's f32 rounding first could round twice)."""
    v = np.asarray(v, np.float64)
    f = v.astype(np.float32)
    back = f.astype(np.float64)
    inexact = (back != v) & np.isfinite(v) & np.isfinite(f)
    bits = f.view(np.uint32)
    bits = np.where(inexact & (np.abs(back) > np.abs(v)), bits - np.uint32(1), bits)
    bits = np.where(inexact, bits | np.uint32(1), bits).astype(np.uint32)
    return bits.view(np.float32).astype(BF16)


#: Ops on bf16 computed as the interpreter computes them.
_BF16_EXACT_IN_F64 = (_UNARY | _BINARY) - {"logistic", "popcnt", "count_leading_zeros",
                                           "not", "and", "or", "xor", "shift_left",
                                           "shift_right_logical", "shift_right_arithmetic"}


def _bf16_kernel(compiler, op, name, operands, results) -> Callable:
    """The kernel of an op with bf16 operands or results: each value in f64 (exactly),
    the op there (rounded once in f64, which for bf16's 8 bits is as good as exact), the
    result rounded once to bf16; ops that only move or pick values as they are."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo as hlo

    _, source = _first(operands)
    shape, dtype = _first(results)
    if name in _BF16_EXACT_IN_F64 and source == BF16:
        function = (_unary if name in _UNARY else _binary)(name, np.dtype(np.float64))
        if name == "is_finite":
            return lambda x: np.isfinite(x.astype(np.float32))
        return lambda *xs: _to_bf16(function(*(x.astype(np.float64) for x in xs)))
    if name == "logistic":  # the interpreter's: 1 / (1 + exp(-x)), each op rounded
        def logistic(x):
            e = _to_bf16(np.exp(-x.astype(np.float64)))
            return _to_bf16(1.0 / _to_bf16(1.0 + e.astype(np.float64)).astype(np.float64))
        return logistic
    if name == "convert":
        if dtype == BF16:
            if source == BF16:
                return lambda x: x
            if source == np.bool_:
                return lambda x: x.astype(np.float32).astype(BF16)
            return lambda x: _to_bf16(x.astype(np.float64))
        widen = _convert(np.dtype(np.float32), dtype)
        return lambda x: widen(x.astype(np.float32))
    if name == "compare":
        compare = _COMPARE[hlo.ComparisonDirectionAttr(op.attributes["comparison_direction"]).value]
        if _is_total_order(op):
            return lambda x, y: compare(_total_order(x), _total_order(y))
        return lambda x, y: compare(x.astype(np.float32), y.astype(np.float32))
    if name == "clamp":
        return lambda lo, x, hi: _minimum(_maximum(x.astype(np.float32), lo.astype(np.float32)),
                                          hi.astype(np.float32)).astype(BF16)
    if name == "constant":
        attr = ir.DenseElementsAttr(op.attributes["value"])
        if attr.is_splat:
            values = np.full(shape, ir.FloatAttr(attr.get_splat_value()).value)
        else:
            values = _bf16_elements(str(attr)).reshape(shape)
        value = values.astype(BF16)  # exact: each is a bf16 value
        value.flags.writeable = False
        return lambda: value
    if name in ("select", "reshape", "broadcast_in_dim", "transpose", "slice", "reverse",
                "concatenate", "dynamic_slice", "dynamic_update_slice", "pad",
                "optimization_barrier", "bitcast_convert", "iota", "gather",
                "reduce_precision"):
        if name == "iota":
            dim = int(ir.IntegerAttr(op.attributes["iota_dimension"]).value)
            line = _to_bf16(np.arange(shape[dim], dtype=np.float64))
            value = np.array(np.broadcast_to(
                line.reshape([-1 if i == dim else 1 for i in range(len(shape))]), shape))
            value.flags.writeable = False
            return lambda: value
        return _kernel(compiler, op, bf16=False)
    raise Unsupported(f"stablehlo.{name} on bf16")


_COMPLEX_ELEMENT = re.compile(r"\(\s*([^,()\s]+)\s*,\s*([^,()\s]+)\s*\)")


def _complex_elements(text: str, dtype: np.dtype) -> np.ndarray:
    """The elements of the complex ``dense<...>`` attribute in ``text`` (a constant op's):
    hex of the whole data, or ``(real, imag)`` pairs, each part a number or the hex of
    its bits."""
    start = text.index("dense<") + len("dense<")
    end, depth = start, 1
    while depth:
        depth += {"<": 1, ">": -1}.get(text[end], 0)
        end += 1
    body = text[start:end - 1]
    if body.startswith('"0x'):
        return np.frombuffer(bytes.fromhex(body[3:-1]), dtype).copy()
    part = np.dtype(f"f{dtype.itemsize // 2}")

    def number(token: str) -> float:
        if token.startswith("0x"):
            return float(np.array([int(token, 16)], f"u{part.itemsize}").view(part)[0])
        return float(token)
    pairs = _COMPLEX_ELEMENT.findall(body)
    out = np.empty(len(pairs), dtype)
    out.real = [number(re_) for re_, _ in pairs]
    out.imag = [number(im) for _, im in pairs]
    return out


_BF16_ELEMENT = re.compile(r"0x[0-9A-Fa-f]+|[-+]?(?:inf|nan|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


def _bf16_elements(text: str) -> np.ndarray:
    """The elements of a bf16 ``dense<...>`` attribute's text (the Python bindings read
    no bf16 elements), as f64: hex of the whole data, or each element as a number or
    the hex of its bits (NaNs, infinities)."""
    body = text[text.index("<") + 1:text.rindex(">", 0, text.rindex(":"))]
    if body.startswith('"0x'):
        return np.frombuffer(bytes.fromhex(body[3:-1]), _DTYPES["bf16"]).astype(np.float64)
    out = []
    for token in _BF16_ELEMENT.findall(body):
        if token.startswith("0x"):
            out.append(float(np.array([int(token, 16)], np.uint16).view(_DTYPES["bf16"])[0]))
        else:
            out.append(float(token))
    return np.array(out, np.float64)


def _is_total_order(op) -> bool:
    from jaxlib.mlir.dialects import stablehlo as hlo

    kind = _attr(op, "compare_type")
    return kind is not None and hlo.ComparisonTypeAttr(kind).value == "TOTALORDER"


def _pad(low, high, interior, shape):
    def pad(x, value):
        x = np.asarray(x)
        inner = [n + max(n - 1, 0) * i for n, i in zip(x.shape, interior)]
        frame = [max(lo, 0) + m + max(hi, 0) for lo, m, hi in zip(low, inner, high)]
        out = np.full(frame, value, x.dtype)
        out[tuple(slice(max(lo, 0), max(lo, 0) + m, i + 1)
                  for lo, m, i in zip(low, inner, interior))] = x
        return out[tuple(slice(max(-lo, 0), max(-lo, 0) + d) for lo, d in zip(low, shape))]
    return pad


def _reduce(compiler: _Compiler, op, ins: list[int]) -> Step:
    """``stablehlo.reduce``: the body applied in the interpreter's order (the init value
    first, then each input element in row-major order of the reduced dimensions); one-op
    bodies of integers and booleans, whose order cannot matter, by NumPy's reduce."""
    operands = [_tensor(v.type) for v in op.operands]
    dims = sorted(_ints(op.attributes["dimensions"]))
    count = len(op.operands) // 2
    shape = operands[0][0]
    kept = [d for d in range(len(shape)) if d not in dims]
    perm = kept + dims
    out_shape = tuple(shape[d] for d in kept)
    size = math.prod(shape[d] for d in dims)

    def flat(x):
        return np.transpose(np.asarray(x), perm).reshape(out_shape + (size,))

    body = op.regions[0].blocks[0]
    body_ops = list(body.operations)
    single = None
    if count == 1 and len(body_ops) == 2 and body_ops[1].operation.name == "stablehlo.return":
        inner = body_ops[0]
        if (inner.operation.name in ("stablehlo.add", "stablehlo.multiply", "stablehlo.maximum",
                                     "stablehlo.minimum", "stablehlo.and", "stablehlo.or",
                                     "stablehlo.xor")
                and list(inner.operands) == list(body.arguments)
                and body_ops[1].operands[0] == inner.results[0]):
            single = inner.operation.name[len("stablehlo."):]
    dtype = operands[0][1]
    if dtype == BF16:  # each step rounded to bf16: the body's own kernels
        single = None
    if single is not None and (dtype == np.bool_ or _is_int(dtype)):
        ufunc = _binary(single, dtype)

        def reduce_any_order(x, init):
            if size == 0:
                return np.broadcast_to(init, out_shape)
            return ufunc(ufunc.reduce(flat(x), axis=-1, dtype=dtype), init).astype(dtype)
        return _bind(reduce_any_order, ins, [compiler.define(r) for r in op.results])
    if single is not None and single in ("maximum", "minimum"):
        ufunc = np.maximum if single == "maximum" else np.minimum
        pick = _binary(single, dtype)

        def reduce_extreme(x, init):
            flat_x = flat(x)
            out = pick(ufunc.reduce(flat_x, axis=-1, initial=None) if size else init, init)
            if size and (out == 0).any():  # IEEE: +0 over -0 for maximum, -0 for minimum
                zeros = flat_x == 0
                want_positive = single == "maximum"
                signs = np.signbit(flat_x) != want_positive  # zeros of the wanted sign
                found = (zeros & signs).any(axis=-1) | ((init == 0) & (np.signbit(init) != want_positive))
                wanted = dtype.type(0.0) if want_positive else dtype.type(-0.0)
                other = dtype.type(-0.0) if want_positive else dtype.type(0.0)
                out = np.where(out == 0, np.where(found, wanted, other), out)
            return out
        return _bind(reduce_extreme, ins, [compiler.define(r) for r in op.results])
    if single is not None and single in ("add", "multiply"):
        ufunc = _binary(single, dtype)

        def reduce_in_order(x, init):
            column = np.broadcast_to(init, out_shape + (1,))
            return ufunc.accumulate(np.concatenate([column, flat(x)], axis=-1), axis=-1)[..., -1]
        return _bind(reduce_in_order, ins, [compiler.define(r) for r in op.results])
    region = compiler.elementwise_region(op.regions[0])
    outs = [compiler.define(r) for r in op.results]

    def reduce_generic(env):
        values = [env[i] for i in ins]
        flats = [flat(x) for x in values[:count]]
        _fold(region, env, values[count:], ([f[..., k] for f in flats] for k in range(size)),
              outs, out_shape)
    return reduce_generic


def _fold(region: _Region, env: list, inits: list, steps, outs: list[int], shape) -> None:
    """Accumulators from ``inits``, ``region`` applied to them and each item of ``steps``
    (a list of elements per operand) in turn, the results into the slots ``outs``."""
    accs = [np.broadcast_to(init, shape) for init in inits]
    for elements in steps:
        accs = region.run(env, [*accs, *elements])
    for slot, acc in zip(outs, accs):
        env[slot] = np.broadcast_to(acc, shape)


def _reduce_window(compiler: _Compiler, op, ins: list[int]) -> Step:
    """``stablehlo.reduce_window``: the inputs padded with the init values (edges and base
    dilation), then for each output element the body applied to the init value and each
    element of its window in row-major order (as the interpreter's reduce does), every
    output element at once: one strided slice of the padded inputs per window offset."""
    count = len(op.operands) // 2
    shape, _ = _tensor(op.operands[0].type)
    out_shape, _ = _tensor(op.results[0].type)
    rank = len(shape)

    def ints(name, default):
        return _ints(op.attributes[name]) if name in op.attributes else [default] * rank

    window = ints("window_dimensions", 1)
    strides, base, dilation = ints("window_strides", 1), ints("base_dilations", 1), ints(
        "window_dilations", 1)
    padding = _ints(op.attributes["padding"]) if "padding" in op.attributes else [0] * (2 * rank)
    low, high = padding[0::2], padding[1::2]
    if min(low + high, default=0) < 0:
        raise Unsupported("reduce_window with negative padding")
    pad = _pad(low, high, [b - 1 for b in base],
               [lo + hi + (n - 1) * b + 1 if n else lo + hi
                for lo, hi, n, b in zip(low, high, shape, base)])
    offsets = list(np.ndindex(*window))
    region = compiler.elementwise_region(op.regions[0])
    outs = [compiler.define(r) for r in op.results]

    def run_reduce_window(env):
        values = [env[i] for i in ins]
        padded = [pad(x, init) for x, init in zip(values[:count], values[count:])]
        windows = (tuple(slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in
                         zip(offset, dilation, out_shape, strides)) for offset in offsets)
        _fold(region, env, values[count:], ([p[index] for p in padded] for index in windows),
              outs, out_shape)
    return run_reduce_window


def _dot_general(op, operands, dtype) -> Callable:
    from jaxlib.mlir.dialects import stablehlo as hlo

    numbers = hlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lb, rb = list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)
    lc, rc = list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions)
    (ls, ldt), (rs, rdt) = operands
    if np.bool_ in (ldt, rdt) and dtype != np.bool_:
        raise Unsupported(f"dot_general of {ldt} and {rdt} into {dtype}")
    # operands of other types converted to the result's first, as XLA does; booleans
    # as integers (an or of ands: a nonzero sum of products)
    work = np.dtype(np.int64) if dtype == np.bool_ else dtype
    if "algorithm" in op.attributes:
        raise Unsupported("dot_general with an algorithm")
    lf = [d for d in range(len(ls)) if d not in lb and d not in lc]
    rf = [d for d in range(len(rs)) if d not in rb and d not in rc]
    batch = [ls[d] for d in lb]
    k = math.prod(ls[d] for d in lc)
    lfree, rfree = [ls[d] for d in lf], [rs[d] for d in rf]
    # lhs as [batch, lfree, 1..., k], rhs as [batch, 1..., rfree, k]
    lshape = batch + lfree + [1] * len(rfree) + [k]
    rshape = batch + [1] * len(lfree) + rfree + [k]
    out_shape = tuple(batch + lfree + rfree)

    def operands_of(x, y):
        a = np.transpose(x, lb + lf + lc).reshape(lshape)
        b = np.transpose(y, rb + rf + rc).reshape(rshape)
        return a, b

    def dot(x, y):
        x, y = np.asarray(x).astype(work, copy=False), np.asarray(y).astype(work, copy=False)
        out = _products_summed(*operands_of(x, y), work).reshape(out_shape)
        return out != 0 if dtype == np.bool_ else out
    return dot


def _products_summed(a, b, dtype) -> np.ndarray:
    """The sum over the last axis of ``a * b`` (broadcast): integers at once (they wrap
    alike in any order), floats one product after another from 0, in the interpreter's
    order."""
    if _is_int(dtype):
        return np.multiply(a, b).sum(axis=-1, dtype=dtype)
    acc = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]), dtype)
    for i in range(a.shape[-1]):
        acc = acc + a[..., i] * b[..., i]
    return acc


#: The most elements an array of a program the evaluator runs may have (512 MiB of f32;
#: an op on it takes about a second): its values (``rewrite`` refuses larger ones), and
#: what an op makes on the way (a convolution's windows).
MAX_ELEMENTS = 2 ** 27


def _convolution(op, operands, shape, dtype) -> Callable:
    """``stablehlo.convolution`` as the interpreter computes it (operands of a narrower
    type converted to the result's first, as XLA does): per group (of features,
    or of the batch), the lhs padded and dilated, each output position's window taken
    (reversed where ``window_reversal`` says), and the window's dot with the kernel,
    accumulated over the window's spatial dimensions, then its features, in row-major
    order (floats one product after another from 0, as :func:`_dot_general`)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo as hlo

    (ls, ldt), (rs, rdt) = operands
    widens = ldt == rdt and ldt.kind in "iuf" and ldt.itemsize <= dtype.itemsize and (
        ldt.kind == "f") <= (dtype.kind == "f")  # no float into an integer
    if not widens or not (_is_int(dtype) or dtype in (np.float32, np.float64)):
        raise Unsupported(f"a convolution of {ldt} and {rdt} into {dtype}")
    numbers = hlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    lb, lf = numbers.input_batch_dimension, numbers.input_feature_dimension
    lsp = list(numbers.input_spatial_dimensions)
    ki, ko = numbers.kernel_input_feature_dimension, numbers.kernel_output_feature_dimension
    ksp = list(numbers.kernel_spatial_dimensions)
    ob, of = numbers.output_batch_dimension, numbers.output_feature_dimension
    osp = list(numbers.output_spatial_dimensions)
    n = len(lsp)

    def ints(name, default):
        return _ints(op.attributes[name]) if name in op.attributes else [default] * n

    strides, lhs_dilation = ints("window_strides", 1), ints("lhs_dilation", 1)
    rhs_dilation, reversal = ints("rhs_dilation", 1), ints("window_reversal", 0)
    padding = (np.array(ir.DenseIntElementsAttr(op.attributes["padding"])).reshape(n, 2)
               if "padding" in op.attributes else np.zeros((n, 2), np.int64))
    groups = int(ir.IntegerAttr(op.attributes["feature_group_count"]).value)
    batch_groups = int(ir.IntegerAttr(op.attributes["batch_group_count"]).value)
    out_spatial = [shape[d] for d in osp]
    kernel = [rs[d] for d in ksp]
    windows = ls[lb] * math.prod(out_spatial) * math.prod(kernel) * ls[lf]
    if _is_int(dtype):  # every product at once
        windows *= rs[ko] // (groups * batch_groups)
    if windows > MAX_ELEMENTS:
        raise Unsupported(f"a convolution whose windows hold {windows} elements")
    # the lhs as [batch, spatial..., feature], padded and dilated as the interpreter pads
    dilated = [(ls[d] - 1) * e + 1 if ls[d] else 0 for d, e in zip(lsp, lhs_dilation)]
    pad = _pad([0, *padding[:, 0], 0], [0, *padding[:, 1], 0],
               [0, *(e - 1 for e in lhs_dilation), 0],
               [ls[lb], *(m + lo + hi for m, (lo, hi) in zip(dilated, padding)), ls[lf]])
    # along spatial dimension d, element k of output position o's window (the window
    # reversed where window_reversal says), as an index of shape [o..., k...]
    index = []
    for d in range(n):
        at_o, at_k = [1] * (2 * n), [1] * (2 * n)
        at_o[d] = at_k[n + d] = -1
        o = np.arange(out_spatial[d]) * strides[d]
        k = np.arange(kernel[d])[::-1 if reversal[d] else 1] * rhs_dilation[d]
        index.append(o.reshape(at_o) + k.reshape(at_k))

    def one(x, w):
        """One group's: x as [batch, spatial..., feature], w as [spatial..., in, out]."""
        windows = x[(slice(None), *index)]  # [batch, o..., k..., feature]
        flat = windows.reshape(windows.shape[0], *out_spatial, 1, -1)
        w = w.reshape(-1, w.shape[-1]).T  # [out, the window: spatial, then feature]
        return _products_summed(flat, w, dtype)

    def convolution(x, y):  # a preferred element type: the operands converted to it first
        x = pad(np.transpose(x, [lb, *lsp, lf]).astype(dtype), np.zeros((), dtype))
        y = np.transpose(y, [*ksp, ki, ko]).astype(dtype)
        if batch_groups > 1:
            xs = np.split(x, batch_groups, axis=0)
            ys = np.split(y, batch_groups, axis=-1)
        else:
            xs = np.split(x, groups, axis=-1)
            ys = np.split(y, groups, axis=-1)
        out = np.concatenate([one(a, b) for a, b in zip(xs, ys)], axis=-1)
        return np.transpose(out, np.argsort([ob, *osp, of]))
    return convolution


def _rng_bit_generator(op, results) -> Callable:
    """``stablehlo.rng_bit_generator`` as XLA's CPU compiler makes it
    (:mod:`.bit_generators`): ``DEFAULT`` is Philox there."""
    from jaxlib.mlir.dialects import stablehlo as hlo

    if __package__:  # imported from the package
        from ifrtpy.backends.reference import bit_generators
    else:  # a worker's copy: it loaded its bit generators beside it, and imports no ifrtpy
        bit_generators = sys.modules["_ifrtpy_reference_bit_generators"]
    algorithm = hlo.RngAlgorithmAttr(op.attributes["rng_algorithm"]).value
    (state_shape, state_dtype), (shape, dtype) = results
    generate = {"DEFAULT": bit_generators.philox, "PHILOX": bit_generators.philox,
                "THREE_FRY": bit_generators.three_fry}.get(algorithm)
    states = [(2,)] if generate is bit_generators.three_fry else [(2,), (3,)]
    if (generate is None or state_dtype != np.uint64 or tuple(state_shape) not in states
            or dtype.kind not in "iu"):
        raise Unsupported(f"rng_bit_generator {algorithm} of a {state_dtype}{list(state_shape)} "
                          f"state into {dtype}")
    unsigned = np.dtype(f"u{dtype.itemsize}")

    def rng_bit_generator(state):
        new, bits = generate(state, shape, unsigned)
        return new, bits.view(dtype)
    return rng_bit_generator


def _index_vectors(indices, index_dim: int) -> np.ndarray:
    """A gather's or scatter's start indices as int64, each index vector along the last
    dimension (one of one element where ``index_dim`` is past the last)."""
    indices = np.asarray(indices).astype(np.int64)
    if index_dim == indices.ndim:
        return indices[..., None]
    return np.moveaxis(indices, index_dim, -1)


def _gather(op, operands, shape) -> Callable:
    from jaxlib.mlir.dialects import stablehlo as hlo

    numbers = hlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    offset_dims = list(numbers.offset_dims)
    collapsed = list(numbers.collapsed_slice_dims)
    operand_batching = list(numbers.operand_batching_dims)
    indices_batching = list(numbers.start_indices_batching_dims)
    start_map = list(numbers.start_index_map)
    index_dim = numbers.index_vector_dim
    sizes = _ints(op.attributes["slice_sizes"])
    (source, _), (index_shape, _) = operands
    window = [d for d in range(len(source)) if d not in collapsed and d not in operand_batching]
    rank = len(shape)
    batch_rank = rank - len(offset_dims)
    perm = []
    batch_seen = 0
    for r in range(rank):
        if r in offset_dims:
            perm.append(batch_rank + offset_dims.index(r))
        else:
            perm.append(batch_seen)
            batch_seen += 1

    def gather(x, indices):
        x, indices = np.asarray(x), _index_vectors(indices, index_dim)
        batch_shape = indices.shape[:-1]
        nb, nw = len(batch_shape), len(window)
        full = []
        for d in range(len(source)):
            if d in start_map:
                start = np.clip(indices[..., start_map.index(d)], 0, source[d] - sizes[d])
            elif d in operand_batching:
                axis = indices_batching[operand_batching.index(d)]
                axis = axis if axis < index_dim else axis - 1
                start = np.arange(batch_shape[axis]).reshape(
                    [-1 if i == axis else 1 for i in range(nb)])
            else:
                start = np.zeros([1] * nb, np.int64)
            start = start.reshape(start.shape + (1,) * nw)
            if d in window:
                w = window.index(d)
                start = start + np.arange(sizes[d]).reshape(
                    [1] * nb + [-1 if i == w else 1 for i in range(nw)])
            full.append(start)
        return np.transpose(x[tuple(full)].reshape(batch_shape + tuple(
            sizes[d] for d in window)), perm)
    return gather


#: The most comparisons a sort may make at once (its rows times the square of their
#: length): the evaluator compares every pair of a row.
MAX_SORT_PAIRS = 1 << 24


def _sort(compiler: _Compiler, op, ins: list[int]) -> Step:
    """``stablehlo.sort``, stable (an unstable sort may order ties any way, so this
    way too): each element's place is the number of elements of its
    row its comparator puts before it, plus the earlier ones it ties with (as a stable
    sort places them); the comparator runs on every pair of a row at once."""
    from jaxlib.mlir import ir

    shape, _ = _tensor(op.operands[0].type)
    dim = int(ir.IntegerAttr(op.attributes["dimension"]).value) % max(len(shape), 1)
    n = shape[dim]
    if math.prod(shape) * n > MAX_SORT_PAIRS:
        raise Unsupported(f"a sort of rows of {n}: too many pairs to compare at once")
    comparator = compiler.elementwise_region(op.regions[0])
    outs = [compiler.define(r) for r in op.results]

    def run_sort(env):
        rows = [np.moveaxis(np.asarray(env[i]), dim, -1) for i in ins]
        pairs = []
        for row in rows:
            pairs += [row[..., :, None], row[..., None, :]]
        before = np.broadcast_to(comparator.run(env, pairs)[0], rows[0].shape + (n,))
        ties = ~before & ~np.swapaxes(before, -1, -2)
        place = before.sum(axis=-2) + np.tril(ties, -1).sum(axis=-1)
        if not (np.sort(place, axis=-1) == np.arange(n)).all():
            raise ValueError("the sort's comparator is not a strict weak order")
        order = np.argsort(place, axis=-1)
        for slot, row in zip(outs, rows):
            env[slot] = np.moveaxis(np.take_along_axis(row, order, axis=-1), -1, dim)
    return run_sort


def _scatter(op, operands) -> Callable:
    """``stablehlo.scatter`` of one operand whose computation replaces (returns the
    update) or is one op of the current value and the update, with NumPy's indexed
    ufuncs: updates applied in the row-major order of ``updates``; an update window
    that does not fit inside the operand whole is skipped whole, as XLA does. Other
    scatters are :func:`_scatter_any`'s."""
    if len(op.operands) != 3:
        raise Unsupported("a scatter of several operands")
    (source, dtype), _, (update_shape, _) = operands
    body = op.regions[0].blocks[0]
    body_ops = list(body.operations)
    current, update = list(body.arguments)
    returned = body_ops[-1].operands[0]
    kind = None
    if len(body_ops) == 1 and returned == update:
        kind = "replace"
    elif len(body_ops) == 2 and returned == body_ops[0].results[0]:
        inner = body_ops[0]
        name = inner.operation.name[len("stablehlo."):]
        commutes = name in ("add", "multiply", "maximum", "minimum", "and", "or", "xor")
        if list(inner.operands) == [current, update] or (
                commutes and list(inner.operands) == [update, current]):
            kind = name
    floating = _is_float(dtype)
    if kind is None or (floating and kind not in ("replace", "add", "multiply", "maximum",
                                                   "minimum")) or (
            dtype == BF16 and kind != "replace"):
        raise Unsupported("a scatter computation other than a replace or one op")
    # a float maximum (minimum) is NumPy's, then IEEE's +0 (-0) among zeros that tie
    signed_zero = {"maximum": False, "minimum": True}.get(kind) if floating else None
    ufunc = None if kind == "replace" else (
        getattr(np, kind) if signed_zero is not None else _binary(kind, dtype))
    if ufunc is not None and not isinstance(ufunc, np.ufunc):
        raise Unsupported(f"a scatter with {kind}")
    positions = _scatter_positions(op, source, update_shape)

    def scatter(x, indices, updates):
        index, inside = positions(indices)
        out = np.array(x)
        chosen = np.broadcast_to(updates, update_shape)[inside]
        if ufunc is None:
            out[index] = chosen
        else:
            ufunc.at(out, index, chosen)
        if signed_zero is not None:  # a zero of that sign among a zero's values wins
            wins = (x == 0) & (np.signbit(x) == signed_zero)
            np.logical_or.at(wins, index, (chosen == 0) & (np.signbit(chosen) == signed_zero))
            out[wins & (out == 0)] = -0.0 if signed_zero else 0.0
        return out
    return scatter


def _scatter_positions(op, source: tuple[int, ...], update_shape: tuple[int, ...]) -> Callable:
    """For a scatter's indices: the operand position of each update element that lands
    (a tuple of index arrays, in the row-major order of ``updates``), and which do (an
    update window that does not fit inside the operand whole is skipped whole)."""
    from jaxlib.mlir.dialects import stablehlo as hlo

    numbers = hlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    window_dims = list(numbers.update_window_dims)
    inserted = list(numbers.inserted_window_dims)
    input_batching = list(numbers.input_batching_dims)
    indices_batching = list(numbers.scatter_indices_batching_dims)
    to_operand = list(numbers.scattered_dims_to_operand_dims)
    index_dim = numbers.index_vector_dim
    scatter_dims = [d for d in range(len(update_shape)) if d not in window_dims]
    window_operand = [d for d in range(len(source)) if d not in inserted and d not in input_batching]
    grid = np.indices(update_shape, sparse=True)

    def positions(indices):
        indices = _index_vectors(indices, index_dim)
        batch = tuple(grid[d] for d in scatter_dims)
        full, inside = [], np.ones(update_shape, np.bool_)
        for d in range(len(source)):
            start = np.zeros([1] * len(update_shape), np.int64)
            if d in to_operand:
                start = start + indices[batch + (to_operand.index(d),)]
            if d in input_batching:
                axis = indices_batching[input_batching.index(d)]
                start = start + grid[scatter_dims[axis if axis < index_dim else axis - 1]]
            size, offset = 1, 0
            if d in window_operand:
                window = window_dims[window_operand.index(d)]
                size, offset = update_shape[window], grid[window]
            inside &= (start >= 0) & (start + size <= source[d])  # the whole window fits
            full.append(np.broadcast_to(start + offset, update_shape))
        return tuple(v[inside] for v in full), inside
    return positions


def _rounds(targets: np.ndarray):
    """The positions of ``targets`` (flat indices, in the order updates apply) in rounds
    of distinct targets: the first update of each target, then the second, ..."""
    order = np.argsort(targets, kind="stable")
    ranked = targets[order]
    starts = np.r_[0, np.flatnonzero(ranked[1:] != ranked[:-1]) + 1] if len(ranked) else ranked
    occurrence = np.arange(len(ranked)) - np.repeat(starts, np.diff(np.r_[starts, len(ranked)]))
    for k in range(int(occurrence.max(initial=-1)) + 1):
        yield order[occurrence == k]


def _apply_in_rounds(region: _Region, env: list, outs: list[np.ndarray], flat: np.ndarray,
                     updates: list[np.ndarray]) -> None:
    """``outs`` (flat, written in place) with ``region`` applied at each target of
    ``flat`` to its current values and each update in turn (updates in order)."""
    for take in _rounds(flat):
        targets = flat[take]
        new = region.run(env, [*(o[targets] for o in outs), *(u[take] for u in updates)])
        for out, value in zip(outs, new):
            out[targets] = value


def _scatter_any(compiler: _Compiler, op, ins: list[int]) -> Step:
    """``stablehlo.scatter`` of any operands and computation: the computation applied to
    each target's current values and its updates one after another, in the row-major
    order of ``updates`` (every target's first update at once, then the second, ...)."""
    count = (len(op.operands) - 1) // 2
    source, _ = _tensor(op.operands[0].type)
    update_shape, _ = _tensor(op.operands[count + 1].type)
    positions = _scatter_positions(op, source, update_shape)
    region = compiler.elementwise_region(op.regions[0])
    outs = [compiler.define(r) for r in op.results]

    def run_scatter(env):
        values = [env[i] for i in ins]
        index, inside = positions(values[count])
        flat = (np.ravel_multi_index(index, source) if source
                else np.zeros(int(inside.sum()), np.int64))  # a scalar operand
        results = [np.array(x).reshape(-1) for x in values[:count]]
        updates = [np.broadcast_to(u, update_shape)[inside] for u in values[count + 1:]]
        _apply_in_rounds(region, env, results, flat, updates)
        for slot, out in zip(outs, results):
            env[slot] = out.reshape(source)
    return run_scatter


def _select_and_scatter(compiler: _Compiler, op, ins: list[int]) -> Step:
    """``stablehlo.select_and_scatter``: in each window of the operand (padding never
    chosen), the element ``select`` keeps against each next one in row-major order;
    then, from ``init_value`` everywhere, ``scatter`` applied at each chosen element to
    its value and the window's source value, in the source's row-major order."""
    shape, dtype = _tensor(op.operands[0].type)
    source_shape, _ = _tensor(op.operands[1].type)
    rank = len(shape)

    def ints(name, default):
        return _ints(op.attributes[name]) if name in op.attributes else [default] * rank

    window, strides = ints("window_dimensions", 1), ints("window_strides", 1)
    padding = _ints(op.attributes["padding"]) if "padding" in op.attributes else [0] * (2 * rank)
    low, high = padding[0::2], padding[1::2]
    if min(low + high, default=0) < 0:
        raise Unsupported("select_and_scatter with negative padding")
    pad = _pad(low, high, [0] * rank, [lo + n + hi for lo, n, hi in zip(low, shape, high)])
    select = compiler.elementwise_region(op.regions[0])
    scatter = compiler.elementwise_region(op.regions[1])
    out, = [compiler.define(r) for r in op.results]
    ids = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)

    def run_select_and_scatter(env):
        x, source, init = (env[i] for i in ins)
        padded, padded_ids = pad(x, np.zeros((), dtype)), pad(ids, np.int64(-1))
        chosen = chosen_ids = None
        for offset in np.ndindex(*window):
            index = tuple(slice(o, o + (n - 1) * s + 1, s)
                          for o, n, s in zip(offset, source_shape, strides))
            value, at = padded[index], padded_ids[index]
            if chosen is None:
                chosen, chosen_ids = value, at
                continue
            kept = np.asarray(select.run(env, [chosen, value])[0], np.bool_)
            take = (at >= 0) & ((chosen_ids < 0) | ~kept)
            chosen, chosen_ids = np.where(take, value, chosen), np.where(take, at, chosen_ids)
        result = np.array(np.broadcast_to(init, shape), dtype).reshape(-1)
        if chosen_ids is not None:
            flat = chosen_ids.reshape(-1)
            landed = flat >= 0
            _apply_in_rounds(scatter, env, [result], flat[landed],
                             [np.asarray(source).reshape(-1)[landed]])
        env[out] = result.reshape(shape)
    return run_select_and_scatter


# -- control flow -----------------------------------------------------------------------------

def _while(compiler: _Compiler, op, ins: list[int]) -> Step:
    cond = compiler.region(op.regions[0])
    body = compiler.region(op.regions[1])
    outs = [compiler.define(r) for r in op.results]

    def run_while(env):
        values = [env[i] for i in ins]
        while cond.run(env, values)[0]:
            values = body.run(env, values)
        for slot, value in zip(outs, values):
            env[slot] = value
    return run_while


def _branches(compiler: _Compiler, op, ins: list[int]) -> Step:
    branches = [compiler.region(region) for region in op.regions]
    outs = [compiler.define(r) for r in op.results]
    is_if = op.operation.name == "stablehlo.if"

    def run_branch(env):
        selector = env[ins[0]]
        if is_if:
            branch = branches[0] if selector else branches[1]
        else:
            index = int(selector)
            branch = branches[index if 0 <= index < len(branches) else -1]
        for slot, value in zip(outs, branch.run(env, ())):
            env[slot] = value
    return run_branch


_CONTROL = {"stablehlo.while": _while, "stablehlo.if": _branches, "stablehlo.case": _branches}


# -- the program -----------------------------------------------------------------------------

class Program:
    """A module compiled for NumPy: call it with ``main``'s arguments (NumPy arrays of its
    parameter types) for its results."""

    #: What a call raises for a fault of the program itself.
    ProgramError = ProgramError

    def __init__(self, module, checked: bool = False) -> None:
        from jaxlib.mlir import ir

        compiler = _Compiler(module, checked)
        self._main = compiler.compile_function("main")
        main = compiler.functions["main"]
        ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        self.params = [_tensor(t) for t in ftype.inputs]
        self.results = [_tensor(t) for t in ftype.results]

    def __call__(self, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        values = []
        for arg, (shape, dtype) in zip(args, self.params):
            value = np.asarray(arg)
            if value.dtype != dtype or value.shape != shape:
                raise ValueError(f"an argument of {value.dtype}{list(value.shape)} for "
                                 f"{dtype}{list(shape)}")
            values.append(value)
        with np.errstate(all="ignore"):
            outs = self._main(values)
        return [np.array(np.broadcast_to(out, shape), dtype, order="C")
                for out, (shape, dtype) in zip(outs, self.results)]


def compile_module(module, why: list | None = None) -> Program | None:
    """``module`` (parsed) compiled for NumPy, or None where it has anything the evaluator
    does not implement (the interpreter runs it then; ``why`` gets what)."""
    try:
        return Program(module)
    except Unsupported as e:
        if why is not None:
            why.append(str(e))
        return None
    except Exception as e:  # noqa: BLE001 - what the bindings cannot read: the interpreter runs it
        if why is not None:
            why.append(f"{type(e).__name__}: {e}")
        return None
