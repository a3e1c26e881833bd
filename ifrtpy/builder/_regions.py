"""Ops with regions: reduce, reduce_window, sort, scatter (computations over scalars), gather,
and control flow (while_loop, cond, case) whose bodies are Python functions building into
nested regions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import ml_dtypes
import numpy as np

from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import Shape

from ifrtpy.builder import _infer
from ifrtpy.builder._core import _caller_location
from ifrtpy.builder._ops import _ScalarLike, _window_padding
from ifrtpy.builder._types import COMPLEX, FLOAT, INTEGER, PRED, as_dims
from ifrtpy.builder._value import Value

if TYPE_CHECKING:  # the mixins see the whole builder when type-checked
    from ifrtpy.builder._ops import OpsMixin as _Base
else:
    _Base = object

#: Named reductions: the binary op, and the identity (init value) as a function of the dtype.
REDUCTIONS = ("sum", "prod", "max", "min", "and", "or")
_COMBINE = {"sum": "add", "prod": "mul", "max": "max", "min": "min", "and": "and_", "or": "or_",
            "add": "add", "mul": "mul"}


def identity(computation: str, dtype: DType):
    """The init value that makes ``computation`` a plain reduction over ``dtype``."""
    np_dtype = dtype.to_numpy()
    kind = dtype.kind
    if computation in ("sum", "or"):
        return np.zeros((), np_dtype)
    if computation == "prod":
        return np.ones((), np_dtype)
    if computation == "and":
        return np.asarray(True) if kind in PRED else np.asarray(-1).astype(np_dtype)
    if kind in PRED:
        return np.asarray(computation == "min")
    if kind in INTEGER:
        info = ml_dtypes.iinfo(np_dtype)
        return np.asarray(info.min if computation == "max" else info.max, np_dtype)
    if kind in FLOAT:
        with np.errstate(all="ignore"):
            has_inf = np.isinf(np.asarray(np.inf).astype(np_dtype).astype(np.float32))
        if has_inf:
            return np.asarray(-np.inf if computation == "max" else np.inf, np_dtype)
        info = ml_dtypes.finfo(np_dtype)  # no infinity (some f8 types): the extremes
        return np.asarray(info.min if computation == "max" else info.max, np_dtype)
    raise InvalidArgumentError(f"reduce: no {computation} identity for {dtype}")


def _as_list(x) -> tuple[list, bool]:
    if isinstance(x, (tuple, list)):
        return list(x), True
    return [x], False


class RegionOpsMixin(_Base):
    """Region-carrying ops of :class:`~ifrtpy.builder.Builder`."""

    def _computation(self, op: str, computation: Union[str, Callable], n: int) -> Callable:
        """A Python function over ``2n`` scalars for a named or given computation."""
        if callable(computation):
            return computation
        name = str(computation)
        if name not in _COMBINE:
            raise InvalidArgumentError(
                f"{op}: computation must be one of {', '.join(REDUCTIONS)} or a function, got {computation!r}")
        if n != 1:
            raise InvalidArgumentError(f"{op}: a named computation takes one input; give a "
                                       f"function for {n} inputs")
        return lambda a, b: getattr(self, _COMBINE[name])(a, b)

    def _reduction_inputs(self, op, operands, init_values, computation):
        xs, many = _as_list(operands)
        xs = [self._operand(x, op) for x in xs]
        if init_values is None:
            if callable(computation) or len(xs) != 1:
                raise InvalidArgumentError(f"{op}: init_values are needed with a computation function")
            init_values = [identity(str(computation), xs[0].dtype)]
        inits, _ = _as_list(init_values)
        inits = [self._operand(v, op) if isinstance(v, Value) else self._scalar(
            v.item() if isinstance(v, np.ndarray) else v, x.dtype, op) for v, x in zip(inits, xs)] \
            + [self._operand(v, op) for v in inits[len(xs):]]
        return xs, inits, many

    def _fill_computation(self, op_name, operation, index, dtypes, fn, what):
        scalars = [(Shape(()), d) for d in dtypes]
        got = self._region(operation, index, scalars + scalars if what != "comparator" else
                           [t for d in dtypes for t in ((Shape(()), d), (Shape(()), d))],
                           fn, f"the {what} of {op_name}", isolated=True,
                           result_like=dtypes if what != "comparator" else None)
        return got

    def reduce(self, operands, init_values=None, dimensions: Sequence[int] = (),
               computation: Union[str, Callable] = "sum"):
        """Reduce ``dimensions`` away with ``computation``: "sum", "prod", "max", "min",
        "and", "or" (init values default to the identity), or a function of ``2n`` scalars
        (n accumulators, then n inputs) returning n scalars. A list of operands gives a
        tuple of results."""
        op = "reduce"
        xs, inits, many = self._reduction_inputs(op, operands, init_values, computation)
        dims = as_dims(dimensions, op, "dimensions")
        types = _infer.reduce(op, xs, inits, dims)
        fn = self._computation(op, computation, len(xs))
        with self._ctx:
            attrs = {"dimensions": self._i64s(dims)}
        operation = self._emit("stablehlo.reduce", xs + inits, types, attrs, regions=1)
        got = self._fill_computation(op, operation, 0, [x.dtype for x in xs], fn, "computation")
        _infer.region_results(op, "the computation", got, [(Shape(()), x.dtype) for x in xs])
        values = self._wrap(operation, types)
        return tuple(values) if many else values[0]

    def reduce_window(self, operands, init_values=None, computation: Union[str, Callable] = "sum",
                      window_dimensions: Sequence[int] = (), window_strides=None,
                      padding: Any = "VALID", base_dilations=None, window_dilations=None):
        """Reduce each window (as ``lax.reduce_window``); ``padding`` "VALID", "SAME" or
        (low, high) pairs, padded with the init value."""
        op = "reduce_window"
        xs, inits, many = self._reduction_inputs(op, operands, init_values, computation)
        window = as_dims(window_dimensions, op, "window_dimensions")
        rank = xs[0].rank
        strides = (1,) * rank if window_strides is None else as_dims(window_strides, op, "window_strides")
        base = (1,) * rank if base_dilations is None else as_dims(base_dilations, op, "base_dilations")
        wdil = (1,) * rank if window_dilations is None else as_dims(window_dilations, op, "window_dilations")
        if len(window) == len(strides) == len(base) == len(wdil) == rank:
            pads = _window_padding(padding, xs[0].shape, window, strides, base, wdil, op)
        else:
            pads = [] if isinstance(padding, str) else _window_padding(padding, [], [], [], [], [], op)
        types = _infer.reduce_window(op, xs, inits, window, strides, base, wdil, pads)
        fn = self._computation(op, computation, len(xs))
        with self._ctx:
            attrs = {"window_dimensions": self._i64s(window), "window_strides": self._i64s(strides),
                     "base_dilations": self._i64s(base), "window_dilations": self._i64s(wdil),
                     "padding": self._pairs(pads)}
        operation = self._emit("stablehlo.reduce_window", xs + inits, types, attrs, regions=1)
        got = self._fill_computation(op, operation, 0, [x.dtype for x in xs], fn, "computation")
        _infer.region_results(op, "the computation", got, [(Shape(()), x.dtype) for x in xs])
        values = self._wrap(operation, types)
        return tuple(values) if many else values[0]

    def sort(self, operands, dimension: int = -1, is_stable: bool = True,
             comparator: Optional[Callable] = None, descending: bool = False, num_keys: int = 1):
        """Sort along ``dimension``. Without a ``comparator``, lexicographically by the first
        ``num_keys`` operands (ascending, or ``descending``; floats in total order); the
        other operands follow. A ``comparator`` gets ``(a0, b0, a1, b1, ...)`` scalars and
        returns pred: whether a sorts before b."""
        op = "sort"
        xs, many = _as_list(operands)
        xs = [self._operand(x, op) for x in xs]
        types = _infer.sort(op, xs, int(dimension))
        dim = int(dimension) % xs[0].rank
        if comparator is None:
            if not 1 <= num_keys <= len(xs):
                raise _infer.fail(op, xs, f"num_keys {num_keys} must be in [1, {len(xs)}]")
            for x in xs[:num_keys]:
                if x.dtype.kind in COMPLEX:
                    raise _infer.fail(op, xs, "complex keys need a comparator")
            comparator = self._default_comparator(xs[:num_keys], descending)
        with self._ctx:
            attrs = {"dimension": self._i64(dim), "is_stable": self._bool(is_stable)}
        operation = self._emit("stablehlo.sort", xs, types, attrs, regions=1)
        got = self._fill_computation(op, operation, 0, [x.dtype for x in xs], comparator, "comparator")
        _infer.region_results(op, "the comparator", got, [(Shape(()), DType(DType.Kind.PRED))])
        values = self._wrap(operation, types)
        return tuple(values) if many else values[0]

    def top_k(self, x: Any, k: int, largest: bool = True) -> tuple[Value, Value]:
        """The ``k`` largest entries along the last dimension, in descending order (or,
        not ``largest``, the smallest in ascending order: XLA's TopK), and their indices
        (s32; of equal entries the lower index comes first)."""
        x = self._operand(x, "top_k")
        types = _infer.top_k("top_k", x, int(k))
        if not largest:  # a stable sort, floats in total order (NaN last), then the first k
            shape = x.shape
            ordered, where = self.sort([x, self.iota(shape, "i32", x.rank - 1)], -1)
            limit = [*shape[:-1], int(k)]
            return self.slice(ordered, [0] * x.rank, limit), self.slice(where, [0] * x.rank, limit)
        with self._ctx:
            attrs = {"k": self._i64(k)}
        values, indices = self._op("chlo.top_k", [x], types, attrs)
        return values, indices

    def approx_top_k(self, operands, init_values, top_k: int, reduction_dim: int,
                     comparator: Callable, recall_target: float = 0.9,
                     aggregate_to_topk: bool = True, reduction_input_size_override: int = -1):
        """XLA's ApproxTopK as XLA runs it off TPU (ApproxTopKFallback), exact: the
        operands (of one shape) sorted along ``reduction_dim`` by ``comparator`` (as
        :meth:`sort`'s, ``(a0, b0, a1, b1, ...)`` -> pred: a comes first; stable here),
        and the first ``top_k`` kept. With ``aggregate_to_topk`` False as many are kept
        as the TPU's approximation returns for ``recall_target``
        (:func:`approx_top_k_reduction_output_size`). One kept: a reduce keeping the
        element the comparator puts first, from ``init_values`` (a scalar per operand).
        A list of operands gives a tuple."""
        op = "approx_top_k"
        xs, many = _as_list(operands)
        xs = [self._operand(x, op) for x in xs]
        inits, _ = _as_list(init_values)
        inits = [self._operand(v, op, like=_ScalarLike(x)) for v, x in zip(inits, xs)] + \
            [self._operand(v, op) for v in inits[len(xs):]]
        top_k, reduction_dim = int(top_k), int(reduction_dim)
        _infer.approx_top_k(op, xs, inits, top_k, reduction_dim)
        if not 0.0 < float(recall_target) <= 1.0:
            raise _infer.fail(op, xs, f"recall_target must be in (0, 1], got {recall_target}")
        size, _ = _infer.approx_top_k_output_size(
            xs[0].shape[reduction_dim], xs[0].rank, top_k, float(recall_target),
            bool(aggregate_to_topk), int(reduction_input_size_override))
        if size == 1:
            def keep_first(*args):  # accumulators, then inputs
                n = len(xs)
                first = comparator(*[v for pair in zip(args[:n], args[n:]) for v in pair])
                return tuple(self.select(first, a, x) for a, x in zip(args[:n], args[n:]))
            kept = self.reduce(xs, inits, (reduction_dim,), keep_first)
            shape = list(xs[0].shape)
            shape[reduction_dim] = 1
            results = [self.reshape(v, shape) for v in kept]
        else:
            ordered = self.sort(xs, reduction_dim, True, comparator)
            limit = list(xs[0].shape)
            limit[reduction_dim] = size
            results = [self.slice(v, [0] * len(limit), limit) for v in ordered]
        return tuple(results) if many else results[0]

    def _default_comparator(self, keys, descending: bool):
        def compare(a, b, direction):
            return self.compare(a, b, direction, total_order=a.dtype.kind in FLOAT)

        first = "GT" if descending else "LT"

        def comparator(*args):
            # lexicographic: a < b on key 0, or equal there and a < b on key 1, ...
            result = None
            for k in reversed(range(len(keys))):
                a, b = args[2 * k], args[2 * k + 1]
                less = compare(a, b, first)
                if result is None:
                    result = less
                else:
                    result = self.or_(less, self.and_(compare(a, b, "EQ"), result))
            return result
        return comparator

    # -- gather and scatter --------------------------------------------------------------------

    def gather(self, operand, start_indices, *, offset_dims: Sequence[int],
               collapsed_slice_dims: Sequence[int], start_index_map: Sequence[int],
               slice_sizes: Sequence[int], index_vector_dim: Optional[int] = None,
               indices_are_sorted: bool = False, operand_batching_dims: Sequence[int] = (),
               start_indices_batching_dims: Sequence[int] = ()) -> Value:
        """StableHLO gather: slices of ``slice_sizes`` at the positions ``start_indices``
        gives (clamped into range). ``index_vector_dim`` defaults to the last dimension of
        the indices; ``operand_batching_dims[i]`` of the operand goes with
        ``start_indices_batching_dims[i]`` of the indices (a batch of independent
        gathers, as ``jnp.take_along_axis`` makes)."""
        op = "gather"
        x = self._operand(operand, op)
        idx = self._operand(start_indices, op)
        ivd = idx.rank - 1 if index_vector_dim is None else int(index_vector_dim)
        offset = as_dims(offset_dims, op, "offset_dims")
        collapsed = as_dims(collapsed_slice_dims, op, "collapsed_slice_dims")
        smap = as_dims(start_index_map, op, "start_index_map")
        sizes = as_dims(slice_sizes, op, "slice_sizes")
        obatch = as_dims(operand_batching_dims, op, "operand_batching_dims")
        ibatch = as_dims(start_indices_batching_dims, op, "start_indices_batching_dims")
        shape, dtype = _infer.gather(op, x, idx, offset, collapsed, smap, ivd, sizes, obatch, ibatch)
        from jaxlib.mlir.dialects import stablehlo
        with self._ctx:
            attrs = {"dimension_numbers": stablehlo.GatherDimensionNumbers.get(
                         offset, collapsed, obatch, ibatch, smap, ivd),
                     "slice_sizes": self._i64s(sizes),
                     "indices_are_sorted": self._bool(indices_are_sorted)}
        return self._op1("stablehlo.gather", [x, idx], shape, dtype, attrs)

    def take(self, x, indices, axis: int = 0) -> Value:
        """``np.take(x, indices, axis)`` for in-range indices (out-of-range ones clamp)."""
        x, idx, axis, window = self._along("take", x, indices, axis)
        sizes = tuple(1 if i == axis else d for i, d in enumerate(x.shape))
        return self.gather(x, idx, offset_dims=window, collapsed_slice_dims=(axis,),
                           start_index_map=(axis,), slice_sizes=sizes, index_vector_dim=idx.rank)

    def scatter(self, operand, scatter_indices, updates, computation: Union[str, Callable] = "set",
                *, update_window_dims: Sequence[int], inserted_window_dims: Sequence[int],
                scatter_dims_to_operand_dims: Sequence[int], index_vector_dim: Optional[int] = None,
                indices_are_sorted: bool = False, unique_indices: bool = False,
                input_batching_dims: Sequence[int] = (),
                scatter_indices_batching_dims: Sequence[int] = ()):
        """StableHLO scatter: combine ``updates`` into the operand at ``scatter_indices``
        with ``computation``: "set" (replace), "add", "mul", "max", "min", or a function
        (current, update) -> new. Out-of-range updates are dropped. Lists of operands and
        of updates (one each) scatter together, with a function of ``2n`` scalars (n
        currents, then n updates) returning n; a tuple is returned. Batching dims pair as
        in :meth:`gather`."""
        op = "scatter"
        xs, many = _as_list(operand)
        ups, _ = _as_list(updates)
        xs = [self._operand(x, op) for x in xs]
        ups = [self._operand(u, op) for u in ups]
        idx = self._operand(scatter_indices, op)
        ivd = idx.rank - 1 if index_vector_dim is None else int(index_vector_dim)
        window = as_dims(update_window_dims, op, "update_window_dims")
        inserted = as_dims(inserted_window_dims, op, "inserted_window_dims")
        sdims = as_dims(scatter_dims_to_operand_dims, op, "scatter_dims_to_operand_dims")
        ibatch = as_dims(input_batching_dims, op, "input_batching_dims")
        sbatch = as_dims(scatter_indices_batching_dims, op, "scatter_indices_batching_dims")
        types = _infer.scatter(op, xs, idx, ups, window, inserted, sdims, ivd, ibatch, sbatch)
        n = len(xs)
        if computation == "set":
            fn = (lambda *args: args[n:] if n > 1 else args[1])
        else:
            fn = self._computation(op, computation, n)
        from jaxlib.mlir.dialects import stablehlo
        with self._ctx:
            attrs = {"scatter_dimension_numbers": stablehlo.ScatterDimensionNumbers.get(
                         window, inserted, ibatch, sbatch, sdims, ivd),
                     "indices_are_sorted": self._bool(indices_are_sorted),
                     "unique_indices": self._bool(unique_indices)}
        operation = self._emit("stablehlo.scatter", [*xs, idx, *ups], types, attrs, regions=1)
        dtypes = [t[1] for t in types]
        got = self._fill_computation(op, operation, 0, dtypes, fn, "computation")
        _infer.region_results(op, "the computation", got, [(Shape(()), d) for d in dtypes])
        values = self._wrap(operation, types)
        return tuple(values) if many else values[0]

    def scatter_along(self, x, indices, updates, axis: int = 0,
                      computation: Union[str, Callable] = "add") -> Value:
        """Combine ``updates`` (shaped like ``take(x, indices, axis)``) into x at
        ``indices`` along ``axis``: "add" is ``np.add.at``, "set" assignment."""
        x, idx, axis, window = self._along("scatter_along", x, indices, axis)
        return self.scatter(x, idx, updates, computation, update_window_dims=window,
                            inserted_window_dims=(axis,), scatter_dims_to_operand_dims=(axis,),
                            index_vector_dim=idx.rank)

    def _along(self, op: str, x, indices, axis: int):
        """``(x, indices, axis, window)`` for indexing x along ``axis`` with whole index
        arrays (index vectors of one element, on a new last dimension): the axis made
        non-negative, and the result dimensions that are x's other dimensions."""
        x = self._operand(x, op)
        idx = self._operand(indices, op)
        if not -x.rank <= axis < x.rank:
            raise _infer.fail(op, [x, idx], f"axis {axis} is out of range for rank {x.rank}")
        axis %= x.rank
        k = idx.rank
        return x, idx, axis, tuple(range(axis)) + tuple(range(axis + k, x.rank - 1 + k))

    # -- control flow --------------------------------------------------------------------------

    def while_loop(self, cond: Callable, body: Callable, init):
        """Loop ``state = body(*state)`` while ``cond(*state)`` (a pred scalar). ``init`` is
        a Value or a tuple of them; so is the result. The functions build with this
        builder and may use values from outside."""
        op = "while_loop"
        values, many = _as_list(init)
        values = [self._operand(v, op) for v in values]
        types = [(v.shape, v.dtype) for v in values]
        operation = self._emit("stablehlo.while", values, types, regions=2)
        got = self._region(operation, 0, types, cond, "the condition of while_loop", isolated=False)
        _infer.region_results(op, "the condition", got, [(Shape(()), DType(DType.Kind.PRED))])
        got = self._region(operation, 1, types, body, "the body of while_loop", isolated=False)
        _infer.region_results(op, "the body", got, types)
        results = self._wrap(operation, types)
        return tuple(results) if many else results[0]

    def _branches(self, op: str, name: str, operands: Sequence[Value], fns: Sequence[Callable],
                  arg_types: Sequence = (), isolated: bool = False, what: str = "branch {i}",
                  types_of: Optional[Callable] = None, attrs: Optional[dict] = None):
        """Emit an op with one region per function (taking ``arg_types`` arguments);
        the first function's results give the types the others must match, and the op's
        result types (or ``types_of(those types)`` does). The regions are built in a
        detached scratch op first (the result types are known only then), then moved."""
        ir = self._ir
        with self._ctx:
            scratch = ir.Operation.create(name, results=[], operands=[], regions=len(fns),
                                          loc=_caller_location(ir))
        try:
            got = [self._region(scratch, i, list(arg_types), fn, f"{what.format(i=i)} of {op}",
                                isolated=isolated) for i, fn in enumerate(fns)]
            types = got[0]
            for i, g in enumerate(got[1:], 1):
                _infer.region_results(op, what.format(i=i), g, types)
            result_types = types if types_of is None else types_of(types)
            operation = self._emit(name, list(operands), result_types, attrs, regions=len(fns))
            with self._ctx:
                for i in range(len(fns)):
                    scratch.regions[i].blocks[0].append_to(operation.regions[i])
        finally:
            with self._ctx:
                scratch.erase()
        return self._wrap(operation, result_types), got[0].many

    def cond(self, pred, true_fn: Callable, false_fn: Callable):
        """``true_fn()`` if the pred scalar holds, else ``false_fn()``: both return the same
        types (a Value or a tuple) and may use values from outside."""
        pred = self._operand(pred, "cond")
        if pred.shape != () or pred.dtype.kind not in PRED:
            raise _infer.fail("cond", [pred], "the predicate must be a pred scalar")
        results, many = self._branches("cond", "stablehlo.if", [pred], [true_fn, false_fn])
        return tuple(results) if many else results[0]

    def case(self, index, branches: Sequence[Callable]):
        """``branches[index]()``; an out-of-range index runs the last branch. ``index`` is
        an s32 scalar."""
        index = self._operand(index, "case")
        if index.shape != () or index.dtype.kind != DType.Kind.S32:
            raise _infer.fail("case", [index], "the index must be an s32 scalar")
        if not branches:
            raise _infer.fail("case", [index], "needs at least one branch")
        results, many = self._branches("case", "stablehlo.case", [index], list(branches))
        return tuple(results) if many else results[0]

    # -- map and select_and_scatter ------------------------------------------------------------

    def map(self, operands: Any, computation: Callable) -> Value:
        """``computation`` applied elementwise: a function of one scalar per operand
        (operands of one shape) returning a scalar; the result has the operands' shape and
        the scalar's dtype (XLA's Map over all dimensions)."""
        op = "map"
        xs, _ = _as_list(operands)
        xs = [self._operand(x, op) for x in xs]
        if not xs:
            raise InvalidArgumentError(f"{op}: needs at least one operand")
        _infer.same_shapes(op, xs)
        shape = xs[0].shape

        def types_of(got):
            if len(got) != 1 or got[0][0] != ():
                raise InvalidArgumentError(f"{op}: the computation must return one scalar")
            return [(shape, got[0][1])]

        with self._ctx:
            attrs = {"dimensions": self._i64s(range(len(shape)))}
        values, _ = self._branches(op, "stablehlo.map", xs, [computation],
                                   arg_types=[(Shape(()), x.dtype) for x in xs], isolated=True,
                                   what="the computation", types_of=types_of, attrs=attrs)
        return values[0]

    def select_and_scatter(self, operand: Any, source: Any, init_value: Any = 0,
                           select: Union[str, Callable] = "ge",
                           scatter: Union[str, Callable] = "add",
                           window_dimensions: Sequence[int] = (), window_strides=None,
                           padding: Any = "VALID") -> Value:
        """For each window of ``operand``, the element ``select`` picks ("ge": the first
        maximum, "le": the first minimum, or a function (a, b) -> pred: keep a) receives the
        window's ``source`` value, combined by ``scatter`` ("add", ... or a function) into
        a result filled with ``init_value``: the gradient of a max pool."""
        op = "select_and_scatter"
        x = self._operand(operand, op)
        src = self._operand(source, op)
        init = self._operand(init_value, op, like=_ScalarLike(x))
        window = as_dims(window_dimensions, op, "window_dimensions")
        rank = x.rank
        strides = window if window_strides is None else as_dims(window_strides, op, "window_strides")
        ones = (1,) * rank
        if len(window) == len(strides) == rank:
            pads = _window_padding(padding, x.shape, window, strides, ones, ones, op)
        else:
            pads = [] if isinstance(padding, str) else _window_padding(padding, [], [], [], [], [], op)
        shape, dtype = _infer.select_and_scatter(op, x, src, init, window, strides, pads)
        if isinstance(select, str):
            if select not in ("ge", "le", "gt", "lt"):
                raise InvalidArgumentError(f"{op}: select must be 'ge', 'le', 'gt', 'lt' or a "
                                           f"function, got {select!r}")
            select_fn = getattr(self, select)
        else:
            select_fn = select
        with self._ctx:
            attrs = {"window_dimensions": self._i64s(window), "window_strides": self._i64s(strides),
                     "padding": self._pairs(pads)}
        operation = self._emit("stablehlo.select_and_scatter", [x, src, init], [(shape, dtype)],
                               attrs, regions=2)
        scalar = (Shape(()), dtype)
        got = self._region(operation, 0, [scalar, scalar], select_fn, f"the select of {op}", isolated=True)
        _infer.region_results(op, "select", got, [(Shape(()), DType(DType.Kind.PRED))])
        got = self._fill_computation(op, operation, 1, [dtype], self._computation(op, scatter, 1), "scatter")
        _infer.region_results(op, "scatter", got, [scalar])
        return self._wrap(operation, [(shape, dtype)])[0]
