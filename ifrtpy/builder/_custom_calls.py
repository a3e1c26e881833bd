"""Custom calls beyond ``custom_call``: typed XLA FFI calls (``ffi_call``), host
callbacks, and the linear algebra XLA's client library offers that StableHLO has no op
for (QR, eigh, SVD, LU), emitted as the LAPACK custom calls jax emits on CPU (jaxlib's
kernels, which ifrtpy registers with a plugin on demand: see :mod:`ifrtpy.ffi`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ifrtpy.builder import _infer
from ifrtpy.builder._types import (
    FLOAT, INTEGER, as_dtype, mlir_element_type, real_part, result_types,
)
from ifrtpy.builder._value import Value
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.program.hlo import HOST_CALLBACK_TARGETS
from ifrtpy.shape import Shape

if TYPE_CHECKING:  # the mixin sees the whole builder when type-checked
    from ifrtpy.builder._core import BuilderCore
    from ifrtpy.builder._ops import OpsMixin
    from ifrtpy.builder._regions import RegionOpsMixin

    class _Base(RegionOpsMixin, OpsMixin, BuilderCore):
        pass
else:
    _Base = object

K = DType.Kind
#: LAPACK's letter of each element type jaxlib's kernels take.
_LAPACK_TYPES = {K.F32: "s", K.F64: "d", K.C64: "c", K.C128: "z"}
_HOST_CALLBACK = "xla_ffi_python_cpu_callback"
assert _HOST_CALLBACK in HOST_CALLBACK_TARGETS


def _column_major(rank: int) -> list[int]:
    """The minor-to-major order of a batch of matrices stored column by column (LAPACK's)."""
    return [rank - 2, rank - 1] + list(range(rank - 3, -1, -1)) if rank >= 2 else [0] * rank


def _row_major(rank: int) -> list[int]:
    return list(range(rank - 1, -1, -1))


class CustomCallsMixin(_Base):
    """``ffi_call``, ``host_callback`` and the LAPACK-backed linear algebra."""

    # -- typed FFI ---------------------------------------------------------------------------

    def ffi_attribute(self, value: Any):
        """An MLIR attribute of ``value`` as jax encodes FFI attributes: NumPy scalars keep
        their type (``np.float32(2)`` is f32), Python ints are i64, floats f64 and bools i1;
        arrays are dense elements, str a string, dict a dictionary, list/tuple an array
        attribute, a NumPy dtype a type."""
        ir = self._ir
        with self._ctx, ir.Location.unknown():
            if isinstance(value, (str, bytes)):
                return ir.StringAttr.get(value)
            if isinstance(value, dict):
                return ir.DictAttr.get({str(k): self.ffi_attribute(v) for k, v in value.items()})
            if isinstance(value, (list, tuple)):
                return ir.ArrayAttr.get([self.ffi_attribute(v) for v in value])
            if isinstance(value, np.dtype):
                return ir.TypeAttr.get(mlir_element_type(as_dtype(value, "ffi_call")))
            if isinstance(value, (bool, int, float)):
                value = np.asarray(value, {bool: np.bool_, int: np.int64, float: np.float64}[type(value)])
            if isinstance(value, (np.ndarray, np.generic)):
                array = np.asarray(value)
                dtype = as_dtype(array.dtype, "ffi_call")
                element = mlir_element_type(dtype)
                if array.ndim == 0:
                    if dtype.kind in INTEGER or dtype.kind == K.PRED:
                        return ir.IntegerAttr.get(element, int(array))
                    if dtype.kind in FLOAT:
                        return ir.FloatAttr.get(element, float(array))
                    raise InvalidArgumentError(f"ffi_call: no attribute for a {dtype} scalar")
                return ir.DenseElementsAttr.get(np.ascontiguousarray(array), type=element,
                                                shape=list(array.shape))
        raise InvalidArgumentError(f"ffi_call: no attribute for {type(value).__name__} {value!r}")

    def _typed_call(self, target: str, operands: Sequence[Value],
                    types: Sequence[tuple[Shape, DType]], attributes: dict,
                    has_side_effect: bool = False, operand_layouts=None, result_layouts=None,
                    aliases: Sequence[tuple[int, int]] = ()) -> list[Value]:
        """A typed FFI custom call (api_version 4, attributes in a dictionary
        ``backend_config``), with explicit layouts (row-major unless given) and
        ``(operand, result)`` aliases."""
        from jaxlib.mlir.dialects import stablehlo

        ir = self._ir
        if operand_layouts is None:
            operand_layouts = [_row_major(x.rank) for x in operands]
        if result_layouts is None:
            result_layouts = [_row_major(len(s)) for s, _ in types]

        def layouts(orders):
            return ir.ArrayAttr.get([ir.DenseIntElementsAttr.get(
                np.asarray(order, dtype=np.int64).reshape(len(order)), type=ir.IndexType.get())
                for order in orders])

        with self._ctx:
            attrs = {"call_target_name": ir.StringAttr.get(target),
                     "api_version": ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 4),
                     "backend_config": ir.DictAttr.get(attributes),
                     "has_side_effect": self._bool(has_side_effect),
                     "operand_layouts": layouts(operand_layouts),
                     "result_layouts": layouts(result_layouts)}
            if aliases:
                attrs["output_operand_aliases"] = ir.ArrayAttr.get([
                    stablehlo.OutputOperandAlias.get(
                        output_tuple_indices=[result] if len(types) > 1 else [],
                        operand_index=operand, operand_tuple_indices=[])
                    for operand, result in aliases])
        return self._op("stablehlo.custom_call", list(operands), list(types), attrs)

    def ffi_call(self, name: str, result_types_: Any, /, *operands: Any,
                 has_side_effect: bool = False, **attributes: Any) -> Any:
        """A typed XLA FFI call of custom call target ``name`` (``jax.ffi.ffi_call``):
        ``result_types_`` is one (shape, dtype) pair (one Value returned) or a list of them
        (a tuple returned); keyword arguments are the call's attributes, encoded as jax
        encodes them (:meth:`ffi_attribute`). Register the handler with
        :func:`ifrtpy.ffi.register_ffi_target`."""
        op = "ffi_call"
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"{op}: name must be a non-empty str, got {name!r}")
        types, many = result_types(op, result_types_)
        xs = [self._operand(x, op) for x in operands]
        attrs = {key: self.ffi_attribute(value) for key, value in attributes.items()}
        values = self._typed_call(name, xs, types, attrs, has_side_effect)
        return tuple(values) if many else values[0]

    # -- host callbacks ----------------------------------------------------------------------

    def host_callback(self, fn: Callable, operands: Sequence[Any], result_types_: Any = None,
                      has_side_effect: bool = False) -> Any:
        """A call of Python function ``fn`` on the host (IFRT's host callback, jax's
        ``pure_callback``; ``has_side_effect`` keeps it when its results are unused, as
        ``io_callback``): ``fn`` gets one NumPy array per operand and returns one array
        per result of ``result_types_`` (one (shape, dtype) pair, a list of them, or
        None for none), each of exactly that dtype and shape. The built program carries
        ``fn``; an exception in it is the execute's error."""
        op = "host_callback"
        if not callable(fn):
            raise InvalidArgumentError(f"{op}: fn must be callable, got {fn!r}")
        if result_types_ is None:
            types: list[tuple[Shape, DType]] = []
            many = True
        else:
            types, many = result_types(op, result_types_)
        xs = [self._operand(x, op) for x in (operands if isinstance(operands, (list, tuple)) else [operands])]
        index = len(self._host_callbacks)
        self._host_callbacks.append(_results_as_tuple(fn, len(types), many))
        with self._ctx:
            attrs = {"index": self._ir.IntegerAttr.get(self._ir.IntegerType.get_unsigned(64), index)}
        values = self._typed_call(_HOST_CALLBACK, xs, types, attrs,
                                  has_side_effect or not types)
        return tuple(values) if many else values[0]

    # -- linear algebra (LAPACK custom calls) --------------------------------------------------

    def _lapack_operand(self, op: str, a: Any, square: bool = False) -> Value:
        a = self._operand(a, op)
        if a.rank < 2 or a.dtype.kind not in _LAPACK_TYPES:
            raise _infer.fail(op, [a], "needs a (batch of) f32, f64, c64 or c128 matrices")
        if square and a.shape[-1] != a.shape[-2]:
            raise _infer.fail(op, [a], "needs square matrices")
        return a

    def _ui8(self, letter: str):
        ir = self._ir
        with self._ctx:
            return ir.IntegerAttr.get(ir.IntegerType.get_unsigned(8), ord(letter))

    def _lapack(self, op: str, name: str, a: Value, operands: Sequence[Value],
                types: Sequence[tuple[Shape, DType]], attributes: dict,
                matrices_in: Sequence[bool], matrices_out: Sequence[bool],
                aliases: Sequence[tuple[int, int]]) -> list[Value]:
        """jaxlib's kernel ``lapack_<letter><name>_ffi``: matrices column-major, the rest
        row-major."""
        target = f"lapack_{_LAPACK_TYPES[a.dtype.kind]}{name}_ffi"
        layouts_in = [_column_major(x.rank) if m else _row_major(x.rank)
                      for x, m in zip(operands, matrices_in)]
        layouts_out = [_column_major(len(s)) if m else _row_major(len(s))
                       for (s, _), m in zip(types, matrices_out)]
        return self._typed_call(target, operands, types, attributes,
                                operand_layouts=layouts_in, result_layouts=layouts_out,
                                aliases=aliases)

    def _nan_unless(self, ok: Value, x: Value) -> Value:
        """``x`` where ``ok`` (a pred per batch), NaN elsewhere."""
        batch = len(ok.shape)
        ok = self.broadcast_in_dim(ok, x.shape, list(range(batch)))
        return self.select(ok, x, self.full(x.shape, np.nan, x.dtype))

    def _triangle(self, x: Value, upper: bool) -> Value:
        """The upper (or lower) triangle of (a batch of) matrices, zeros elsewhere."""
        rows = self.iota(x.shape, np.int32, x.rank - 2)
        cols = self.iota(x.shape, np.int32, x.rank - 1)
        keep = self.ge(cols, rows) if upper else self.le(cols, rows)
        return self.select(keep, x, self.full(x.shape, 0, x.dtype))

    def _info_ok(self, info: Value) -> Value:
        return self.eq(info, self.full(info.shape, 0, info.dtype))

    def qr(self, a: Any, full_matrices: bool = False) -> tuple[Value, Value]:
        """``(q, r)`` of (a batch of) m x n matrices, as ``np.linalg.qr``: q is m x k and r
        k x n with k = min(m, n), or m x m and m x n with ``full_matrices`` (LAPACK's
        geqrf and orgqr/ungqr)."""
        op = "qr"
        a = self._lapack_operand(op, a)
        *batch, m, n = a.shape
        k = min(m, n)
        taus = Shape((*batch, k))
        r, tau = self._lapack(op, "geqrf", a, [a], [(a.shape, a.dtype), (taus, a.dtype)], {},
                              [True], [True, False], [(0, 0)])
        zero = [0] * len(batch)
        if m < n:
            base = self.slice(r, zero + [0, 0], [*batch, m, m])
        elif full_matrices and m > n:
            base = self.pad(r, 0, zero + [0, 0], zero + [0, m - n])
        else:
            base = r
        name = "orgqr" if a.dtype.kind in (K.F32, K.F64) else "ungqr"
        (q,) = self._lapack(op, name, a, [base, tau], [(base.shape, a.dtype)], {},
                            [True, False], [True], [(0, 0)])
        rows = m if full_matrices else k
        return q, self._triangle(self.slice(r, zero + [0, 0], [*batch, rows, n]), upper=True)

    def eigh(self, a: Any, lower: bool = True) -> tuple[Value, Value]:
        """``(v, w)`` of (a batch of) Hermitian matrices, as XLA's SelfAdjointEig: the
        eigenvectors (columns of v) and the eigenvalues w, ascending, read from the
        ``lower`` (or upper) triangle; NaN where LAPACK's syevd/heevd fails."""
        op = "eigh"
        a = self._lapack_operand(op, a, square=True)
        *batch, n, _ = a.shape
        name = "syevd" if a.dtype.kind in (K.F32, K.F64) else "heevd"
        attrs = {"mode": self._ui8("V"), "uplo": self._ui8("L" if lower else "U")}
        v, w, info = self._lapack(
            op, name, a, [a], [(a.shape, a.dtype), (Shape((*batch, n)), real_part(a.dtype)),
                               (Shape(tuple(batch)), DType(K.S32))],
            attrs, [True], [True, False, False], [(0, 0)])
        ok = self._info_ok(info)
        return self._nan_unless(ok, v), self._nan_unless(ok, w)

    def svd(self, a: Any, full_matrices: bool = False) -> tuple[Value, Value, Value]:
        """``(u, s, vh)`` of (a batch of) m x n matrices, as ``np.linalg.svd``: s
        descending; u is m x k and vh k x n with k = min(m, n), or m x m and n x n with
        ``full_matrices``; NaN where LAPACK's gesdd fails."""
        op = "svd"
        a = self._lapack_operand(op, a)
        *batch, m, n = a.shape
        k = min(m, n)
        u_cols, vt_rows = (m, n) if full_matrices else (k, k)
        types = [(a.shape, a.dtype), (Shape((*batch, k)), real_part(a.dtype)),
                 (Shape((*batch, m, u_cols)), a.dtype), (Shape((*batch, vt_rows, n)), a.dtype),
                 (Shape(tuple(batch)), DType(K.S32))]
        _, s, u, vt, info = self._lapack(
            op, "gesdd", a, [a], types, {"mode": self._ui8("A" if full_matrices else "S")},
            [True], [True, False, True, True, False], [(0, 0)])
        ok = self._info_ok(info)
        return self._nan_unless(ok, u), self._nan_unless(ok, s), self._nan_unless(ok, vt)

    def lu(self, a: Any) -> tuple[Value, Value, Value]:
        """``(lu, pivots, permutation)`` of (a batch of) m x n matrices, as XLA's
        LuDecomposition (LAPACK's getrf): L (unit lower, below the diagonal) and U in
        one matrix; row i was swapped with row ``pivots[i]`` (0-based, s32), in order;
        ``permutation`` is the resulting order of the rows, so that
        ``a[permutation] == L @ U``. NaN where the factorization fails."""
        op = "lu"
        a = self._lapack_operand(op, a)
        *batch, m, n = a.shape
        k = min(m, n)
        s32 = DType(K.S32)
        lu, ipiv, info = self._lapack(
            op, "getrf", a, [a], [(a.shape, a.dtype), (Shape((*batch, k)), s32),
                                  (Shape(tuple(batch)), s32)],
            {}, [True], [True, False, False], [(0, 0)])
        pivots = ipiv - self.full(ipiv.shape, 1, s32)
        ok = self.ge(info, self.full(info.shape, 0, s32))
        return self._nan_unless(ok, lu), pivots, self._permutation(pivots, m)

    def _permutation(self, pivots: Value, m: int) -> Value:
        """The row order the swaps ``pivots`` (..., k) make of ``range(m)``."""
        *batch, k = pivots.shape
        s32 = DType(K.S32)
        rank = len(batch) + 1
        positions = self.iota((*batch, m), s32, rank - 1)

        def entry(x, index):  # x[..., index] for a scalar Value index, as (...,)
            sliced = self.dynamic_slice(x, [0] * len(batch) + [index], [*batch, 1])
            return self.reshape(sliced, tuple(batch))

        def body(i, perm):
            spread = list(range(len(batch)))
            j = entry(pivots, i)
            is_i = self.eq(positions, self.broadcast_in_dim(i, (*batch, m), []))
            is_j = self.eq(positions, self.broadcast_in_dim(j, (*batch, m), spread))
            at_i = entry(perm, i)
            at_j = self.reduce(self.select(is_j, perm, self.full((*batch, m), 0, s32)), None,
                               [rank - 1], "sum")
            swapped = self.select(is_j, self.broadcast_in_dim(at_i, (*batch, m), spread), perm)
            swapped = self.select(is_i, self.broadcast_in_dim(at_j, (*batch, m), spread), swapped)
            return i + 1, swapped

        zero = self.constant(np.int32(0))
        _, perm = self.while_loop(lambda i, perm: self.lt(i, k), body, (zero, positions))
        return perm


def _results_as_tuple(fn: Callable, count: int, many: bool) -> Callable:
    """``fn`` returning a tuple of its ``count`` results, as host callback handlers (ifrtpy's
    and jax's) take them: one value for one result, and None for no result, are wrapped."""

    def call(*args: Any) -> tuple[Any, ...]:
        out = fn(*args)
        if not many:
            return (out,)
        if out is None and count == 0:
            return ()
        return tuple(out)

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call
