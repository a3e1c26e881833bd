"""The builder's core: the module being built, parameters, constants, op emission with
source locations, nested regions, sharding annotations, and ``build``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.program import HloProgram, TensorType, mlir
from ifrtpy.shape import Shape

from ifrtpy.builder._shardings import hlo_sharding_string
from ifrtpy.builder._types import (
    COMPLEX, INTEGER, as_dims, as_dtype, mlir_element_type, mlir_tensor_type,
)
from ifrtpy.builder._value import Value

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

#: Ops :meth:`BuilderCore.is_constant` never counts as constant: those XLA's IsConstant
#: refuses (stateful, side effects, or computations it does not look into), and those
#: whose value differs by device (collectives, replica and partition ids).
_NOT_CONSTANT = frozenset("stablehlo." + name for name in (
    "rng", "custom_call", "while", "scatter", "infeed", "outfeed", "send", "recv",
    "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "collective_permute",
    "collective_broadcast", "replica_id", "partition_id")) | {"func.call"}


def _user_frame(frame):
    """The innermost frame from ``frame`` outwards that is outside this package."""
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame = frame.f_back
    return frame


def _caller_location(ir):
    """An MLIR file location for the innermost frame outside this package."""
    frame = _user_frame(sys._getframe(1))
    if frame is None:
        return ir.Location.unknown()
    line, col = frame.f_lineno, 0
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is not None and frame.f_lasti >= 0:
        try:
            pos = list(positions())[frame.f_lasti // 2]
            if pos[0] is not None:
                line, col = pos[0], (pos[2] or 0) + 1
        except (IndexError, TypeError):
            pass
    return ir.Location.file(frame.f_code.co_filename, line or 0, col)


def _as_array(value: Any, dtype: Any, who: str) -> np.ndarray:
    """``np.asarray(value, dtype)``, refusing ragged nesting with InvalidArgumentError
    (what has no element type is refused by ``as_dtype`` after)."""
    np_dtype = None if dtype is None else as_dtype(dtype, who).to_numpy()
    try:
        arr = np.asarray(value, dtype=np_dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidArgumentError(f"{who}: cannot make an array of {value!r}: {e}") from None
    return arr


def _nested_ops(op) -> Iterator:
    """Every op inside the regions of ``op``, at any depth."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner
                yield from _nested_ops(inner.operation)


def shape_from_pyval(pyval: Any) -> Any:
    """The TensorType (dtype and shape) of a Python or NumPy value, as XLA's
    ``shape_from_pyval``: NumPy's dtype for it (a Python int is s64, a float f64) and its
    shape; a tuple of values gives a tuple of TensorTypes (nested alike). Pass a
    TensorType to :meth:`Builder.parameter`."""
    if isinstance(pyval, tuple):
        return tuple(shape_from_pyval(v) for v in pyval)
    arr = _as_array(pyval, None, "shape_from_pyval")
    return TensorType(as_dtype(arr.dtype, "shape_from_pyval"), Shape(arr.shape))


@dataclasses.dataclass(frozen=True)
class OpMetadata:
    """What XLA records of an op (its ``metadata={...}`` in HLO): ``op_type`` (the kind of
    operation, as "Dense"), ``op_name`` (its name; name scopes are prefixed), and the
    ``source_file`` and ``source_line`` it came from. A field left None keeps the builder's
    own (the caller's file and line, the op's StableHLO name inside a name scope)."""

    op_type: Optional[str] = None
    op_name: Optional[str] = None
    source_file: Optional[str] = None
    source_line: Optional[int] = None

    def merged(self, other: OpMetadata) -> OpMetadata:
        """This metadata with the fields ``other`` sets replaced."""
        return dataclasses.replace(self, **{f.name: getattr(other, f.name)
                                            for f in dataclasses.fields(other)
                                            if getattr(other, f.name) is not None})


def source_metadata(op_type: Optional[str] = None, op_name: Optional[str] = None,
                    skip_frames: int = 1) -> OpMetadata:
    """OpMetadata naming the caller's file and line (``skip_frames`` frames up: 1 is the
    function calling this one), as XLA's ``current_source_info_metadata``; give it to
    :meth:`Builder.op_metadata` to attribute ops built deeper down (in a helper library)
    to the user's line."""
    if skip_frames < 1:
        raise InvalidArgumentError(f"source_metadata: skip_frames must be at least 1, got {skip_frames}")
    frame = sys._getframe(1)
    for _ in range(skip_frames - 1):
        if frame.f_back is None:
            break
        frame = frame.f_back
    return OpMetadata(op_type, op_name, frame.f_code.co_filename, frame.f_lineno)


class _Types(list):
    """A region's result types, and whether its function returned a tuple."""

    def __init__(self, types, many: bool):
        super().__init__(types)
        self.many = many


class _Scope:
    """One block being filled: the entry block of main or a region body."""

    __slots__ = ("block", "parent", "isolated", "what")

    def __init__(self, block, parent: Optional[_Scope], isolated: bool, what: str):
        self.block = block
        self.parent = parent
        self.isolated = isolated
        self.what = what


class BuilderCore:
    """What every op method uses; see :class:`ifrtpy.builder.Builder`."""

    def __init__(self, name: str = "main", devices: Optional[Sequence] = None):
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import func

        self._ir = ir
        self._name = name
        self._devices = None if devices is None else list(devices)
        self._ctx = mlir.context()
        with self._ctx, ir.Location.unknown():
            self._module = ir.Module.create()
            self._module.operation.attributes["sym_name"] = ir.StringAttr.get(name)
            with ir.InsertionPoint(self._module.body):
                self._func = func.FuncOp("main", ir.FunctionType.get([], []))
            self._func.attributes["sym_visibility"] = ir.StringAttr.get("public")
            entry = self._func.add_entry_block()
        self._params: list[Value] = []
        self._param_shardings: list[Optional[str]] = []
        self._scope = _Scope(entry, None, False, "main")
        self._root = self._scope
        self._name_stack: list[str] = []
        self._metadata = OpMetadata()
        self._manual_devices: Optional[int] = None  # inside shard_map: the device count
        self._last_channel = 0  # the last channel id given to a collective
        self._collectives: Optional[tuple[str, str]] = None  # the first's kind and op
        self._host_callbacks: list[Callable] = []  # by index (see host_callback)

    # -- introspection -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def parameters(self) -> tuple[Value, ...]:
        return tuple(self._params)

    def __repr__(self) -> str:
        return f"<Builder {self._name!r} with {len(self._params)} parameter(s)>"

    def is_constant(self, x: Value) -> bool:
        """Whether ``x`` is a compile-time constant (XLA's IsConstant): it depends on no
        parameter (of main, or of the region it was made in) and on no op XLA does not
        fold: random numbers, custom calls (host callbacks among them), while loops,
        scatter, and here also collectives and replica or partition ids. Values that
        regions of the ops it depends on use from outside count too."""
        x = self._operand(x, "is_constant")
        ir = self._ir
        enclosing, scope = [], x._scope  # main's block and the region blocks x is made in
        while scope is not None:
            enclosing.append(scope.block)
            scope = scope.parent
        with self._ctx:
            pending, seen = [x._ir], set()
            while pending:
                value = pending.pop()
                if value in seen:
                    continue
                seen.add(value)
                if isinstance(value, ir.BlockArgument):
                    if any(value.owner == block for block in enclosing):
                        return False  # a parameter of main, or of a region x is made in
                    continue  # of a region of an op x depends on: that op's operands count
                op = value.owner
                if op.name in _NOT_CONSTANT:
                    return False
                pending.extend(op.operands)
                for inner in _nested_ops(op.operation):
                    if inner.name in _NOT_CONSTANT:
                        return False
                    pending.extend(inner.operands)
        return True

    # -- values ------------------------------------------------------------------------------

    def _visible(self, scope: _Scope) -> bool:
        s = self._scope
        while s is not None:
            if s is scope:
                return True
            if s.isolated:
                return False
            s = s.parent
        return False

    def _check(self, value: Value, op: str) -> Value:
        if value._builder is not self:
            raise InvalidArgumentError(f"{op}: operand {value!r} belongs to another builder")
        if not self._visible(value._scope):
            raise InvalidArgumentError(
                f"{op}: operand {value!r} was made in {value._scope.what}, which is not visible "
                f"here (in {self._scope.what}); computations of reduce, sort and scatter see "
                f"only their arguments")
        return value

    def _operand(self, x: Any, op: str, like: Any = None) -> Value:
        """A Value: ``x`` itself, or a constant made from a scalar in ``like``'s dtype and
        shape (or from an array, in its own dtype)."""
        if isinstance(x, Value):
            return self._check(x, op)
        if like is not None and np.ndim(x) == 0 and not isinstance(x, np.ndarray):
            scalar = self._scalar(x, like.dtype, op)
            return scalar if like.shape == () else self.broadcast_in_dim(scalar, like.shape, ())
        if isinstance(x, (np.ndarray, np.generic, int, float, bool, complex, list, tuple)):
            return self.constant(x)
        raise InvalidArgumentError(f"{op}: expected a Value or a number, got {type(x).__name__}")

    def _scalar(self, x: Any, dtype: DType, op: str) -> Value:
        """A scalar constant of ``dtype`` holding Python/NumPy scalar ``x``, which must fit."""
        np_dtype = dtype.to_numpy()
        try:
            with np.errstate(all="ignore"):
                value = np.asarray(x).astype(np_dtype)
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidArgumentError(f"{op}: cannot make a {dtype} constant of {x!r}: {e}") from None
        if dtype.kind in INTEGER or dtype.kind == DType.Kind.PRED:
            if isinstance(x, (float, complex, np.floating, np.complexfloating)) or value.item() != x:
                raise InvalidArgumentError(f"{op}: {x!r} is not a {dtype} value")
        elif dtype.kind not in COMPLEX and isinstance(x, (complex, np.complexfloating)):
            raise InvalidArgumentError(f"{op}: {x!r} is not a {dtype} value")
        return self.constant(value, dtype)

    def _wrap(self, op, types: Sequence[tuple[Shape, DType]]) -> list[Value]:
        return [Value(self, r, Shape(s), d, self._scope) for r, (s, d) in zip(op.results, types)]

    def _emit(self, name: str, operands: Sequence[Value], types: Sequence[tuple[Shape, DType]],
              attributes: Optional[dict] = None, regions: int = 0):
        """Append op ``name`` to the current block, at the caller's source location."""
        ir = self._ir
        with self._ctx:
            loc = self._location(name)
            with loc, ir.InsertionPoint(self._scope.block):
                op = ir.Operation.create(
                    name, results=[mlir_tensor_type(s, d) for s, d in types],
                    operands=[v._ir for v in operands], attributes=attributes or {},
                    regions=regions, loc=loc)
        return op

    def _op(self, name, operands, types, attributes=None) -> list[Value]:
        return self._wrap(self._emit(name, operands, types, attributes), types)

    def _op1(self, name, operands, shape, dtype, attributes=None) -> Value:
        return self._op(name, operands, [(shape, dtype)], attributes)[0]

    # -- metadata ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def name_scope(self, name: str) -> Iterator[None]:
        """Ops built inside are named ``name/<op>`` (XLA's op_name metadata; scopes nest:
        ``outer/inner/<op>``), where ``<op>`` is the op's StableHLO name or the op_name
        of :meth:`op_metadata`."""
        name = str(name)
        if not name or "/" in name:
            raise InvalidArgumentError(f"name_scope: a scope name must be non-empty, without '/', got {name!r}")
        self._name_stack.append(name)
        try:
            yield
        finally:
            self._name_stack.pop()

    @contextlib.contextmanager
    def op_metadata(self, metadata: Optional[OpMetadata] = None, *, op_type: Optional[str] = None,
                    op_name: Optional[str] = None, source_file: Optional[str] = None,
                    source_line: Optional[int] = None) -> Iterator[None]:
        """Ops built inside carry this metadata (XLA's ``set_op_metadata``): the fields of
        ``metadata`` (an :class:`OpMetadata`, such as :func:`source_metadata` makes), then
        the keywords, override what is in force; the rest stays automatic."""
        if metadata is not None and not isinstance(metadata, OpMetadata):
            raise InvalidArgumentError(f"op_metadata: expected an OpMetadata, got {type(metadata).__name__}")
        if source_line is not None and (isinstance(source_line, bool) or not isinstance(source_line, int)):
            raise InvalidArgumentError(f"op_metadata: source_line must be an int, got {source_line!r}")
        for what, value in (("op_type", op_type), ("op_name", op_name), ("source_file", source_file)):
            if value is not None and not isinstance(value, str):
                raise InvalidArgumentError(f"op_metadata: {what} must be a str, got {value!r}")
        saved = self._metadata
        self._metadata = saved.merged(metadata or OpMetadata()).merged(
            OpMetadata(op_type, op_name, source_file, source_line))
        try:
            yield
        finally:
            self._metadata = saved

    def _location(self, op: str):
        """The location of a new op ``op`` (its StableHLO name): the source position (the
        caller's, or the metadata's), wrapped in name locations for op_name and op_type
        (``loc("op_type:"("scope/op_name"(file:line:col)))``, which XLA turns into
        metadata)."""
        ir = self._ir
        md = self._metadata
        if md.source_file is not None:
            loc = ir.Location.file(md.source_file, md.source_line or 0, 0)
        else:
            loc = _caller_location(ir)
            if md.source_line is not None:
                loc = ir.Location.file(_user_frame(sys._getframe(1)).f_code.co_filename, md.source_line, 0)
        if self._name_stack or md.op_name is not None:
            leaf = md.op_name if md.op_name is not None else op.split(".", 1)[-1]
            loc = ir.Location.name("/".join([*self._name_stack, leaf]), childLoc=loc)
        if md.op_type is not None:
            loc = ir.Location.name(md.op_type + ":", childLoc=loc)
        return loc

    # attribute helpers (call inside self._ctx)
    def _i64s(self, values):
        return self._ir.DenseI64ArrayAttr.get([int(v) for v in values])

    def _i64(self, value):
        return self._ir.IntegerAttr.get(self._ir.IntegerType.get_signless(64), int(value))

    def _bool(self, value):
        return self._ir.BoolAttr.get(bool(value))

    def _pairs(self, pairs):
        arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        return self._ir.DenseIntElementsAttr.get(arr)

    # -- regions -----------------------------------------------------------------------------

    def _region(self, op, index: int, arg_types, fn: Callable, what: str, isolated: bool,
                result_like: Optional[Sequence[DType]] = None) -> _Types:
        """Fill region ``index`` of ``op``: one block with ``arg_types`` arguments; run
        ``fn`` on them and return its results. Returns the result types."""
        ir = self._ir
        with self._ctx:
            loc = op.location
        with self._ctx, loc:
            block = ir.Block.create_at_start(op.regions[index],
                                             [mlir_tensor_type(s, d) for s, d in arg_types],
                                             [loc] * len(arg_types))
        scope = _Scope(block, self._scope, isolated, what)
        saved, self._scope = self._scope, scope
        try:
            args = [Value(self, a, Shape(s), d, scope) for a, (s, d) in zip(block.arguments, arg_types)]
            out = fn(*args)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            values = []
            for i, o in enumerate(outs):
                if not isinstance(o, Value) and result_like is not None and i < len(result_like):
                    o = self._scalar(o, result_like[i], what)
                values.append(self._operand(o, what))
            with self._ctx, loc, ir.InsertionPoint(block):
                ir.Operation.create("stablehlo.return", results=[],
                                    operands=[v._ir for v in values], loc=loc)
        finally:
            self._scope = saved
        return _Types([(v.shape, v.dtype) for v in values], isinstance(out, (tuple, list)))

    # -- parameters and constants ------------------------------------------------------------

    def parameter(self, shape: Any, dtype: Any = None, sharding: Any = None,
                  name: Optional[str] = None) -> Value:
        """A new parameter of main, of ``shape`` and ``dtype`` (or of a TensorType, as
        :func:`shape_from_pyval` gives, with no dtype); ``sharding`` (an HLO sharding
        string, HloSharding, NamedSharding, ShardingParamSharding or SingleDeviceSharding)
        annotates it as ``mhlo.sharding``; ``name`` labels its location."""
        if self._scope is not self._root:
            raise InvalidArgumentError("parameter: parameters can only be added to main, not "
                                       f"inside {self._scope.what}")
        if isinstance(shape, TensorType):
            if dtype is not None:
                raise InvalidArgumentError("parameter: give a TensorType or a shape and dtype, not both")
            shape, dtype = shape.shape, shape.dtype
        elif dtype is None:
            raise InvalidArgumentError("parameter: a shape needs a dtype")
        shape = Shape(as_dims(shape, "parameter", "shape"))
        dtype = as_dtype(dtype, "parameter")
        text = None if sharding is None else hlo_sharding_string(sharding, len(shape), self._devices)
        ir = self._ir
        with self._ctx:
            loc = _caller_location(ir)
            if name is not None:
                loc = ir.Location.name(str(name), childLoc=loc)
            with loc:
                arg = self._root.block.add_argument(mlir_tensor_type(shape, dtype), loc)
        value = Value(self, arg, shape, dtype, self._root)
        self._params.append(value)
        self._param_shardings.append(text)
        return value

    def constant(self, value: Any, dtype: Any = None) -> Value:
        """A constant holding ``np.asarray(value, dtype)``: a NumPy array or scalar, a
        Python number, or nested lists/tuples of them (NumPy's dtype when none given)."""
        arr = _as_array(value, dtype, "constant")
        dt = as_dtype(arr.dtype, "constant")
        shape = Shape(arr.shape)
        ir = self._ir
        with self._ctx:
            attr = ir.DenseElementsAttr.get(np.ascontiguousarray(arr), type=mlir_element_type(dt),
                                            shape=list(arr.shape))
        return self._op1("stablehlo.constant", [], shape, dt, {"value": attr})

    def full(self, shape: Sequence[int], value: Any, dtype: Any) -> Value:
        """``np.full(shape, value, dtype)``: a scalar constant broadcast."""
        dtype = as_dtype(dtype, "full")
        scalar = self._scalar(value, dtype, "full")
        return self.broadcast_in_dim(scalar, as_dims(shape, "full", "shape"), ())

    # -- sharding annotations ----------------------------------------------------------------

    def with_sharding(self, x: Value, sharding: Any) -> Value:
        """``x`` constrained to ``sharding`` (a ``@Sharding`` custom call, as XLA's
        sharding constraint)."""
        x = self._operand(x, "with_sharding")
        text = hlo_sharding_string(sharding, x.rank, self._devices)
        ir = self._ir
        with self._ctx:
            attrs = {"call_target_name": ir.StringAttr.get("Sharding"),
                     "mhlo.sharding": ir.StringAttr.get(text)}
        return self._op1("stablehlo.custom_call", [x], x.shape, x.dtype, attrs)

    # -- build -------------------------------------------------------------------------------

    def build(self, *results: Any, shardings: Optional[Sequence[Any]] = None) -> HloProgram:
        """An HloProgram whose main returns ``results`` (Values, or tuples/lists of them,
        flattened), annotated with ``shardings`` (one per result, None for none). The
        builder stays usable: building again makes another program."""
        if self._scope is not self._root:
            raise InvalidArgumentError(f"build: called inside {self._scope.what}")
        flat: list[Value] = []
        for r in results:
            flat.extend(r if isinstance(r, (tuple, list)) else [r])
        values = [self._operand(v, "build") for v in flat]
        if any(v._scope is not self._root for v in values):
            raise InvalidArgumentError("build: results must be values of main")
        if shardings is not None and len(shardings) != len(values):
            raise InvalidArgumentError(
                f"build: {len(shardings)} shardings for {len(values)} results")
        res_text = [None if s is None else hlo_sharding_string(s, v.rank, self._devices)
                    for v, s in zip(values, shardings or [None] * len(values))]
        ir = self._ir
        with self._ctx:
            from jaxlib.mlir.dialects import func
            with ir.Location.unknown(), ir.InsertionPoint(self._root.block):
                ret = func.ReturnOp([v._ir for v in values])
            f = self._func
            f.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
                [p._ir.type for p in self._params], [v._ir.type for v in values]))

            def attrs(texts):
                return ir.ArrayAttr.get([ir.DictAttr.get(
                    {} if t is None else {"mhlo.sharding": ir.StringAttr.get(t)}) for t in texts])

            for key, texts in (("arg_attrs", self._param_shardings), ("res_attrs", res_text)):
                if any(t is not None for t in texts):
                    f.attributes[key] = attrs(texts)
                elif key in f.attributes:
                    del f.attributes[key]
            try:
                try:
                    self._module.operation.verify()
                except ir.MLIRError as e:
                    raise InvalidArgumentError(f"build: the module does not verify: {e}") from None
                text: str = self._module.operation.get_asm(enable_debug_info=True)
            finally:
                ret.operation.erase()
            if "chlo." in text:
                text = mlir.legalize_chlo(text)
        return HloProgram(text, host_callbacks=self._host_callbacks if self._host_callbacks else None)

    def text(self, debug_info: bool = False) -> str:
        """The module as built so far (main without its return)."""
        with self._ctx:
            return self._module.operation.get_asm(enable_debug_info=debug_info)

