"""Programs with ops the interpreter lacks (FFT, RngUniform/RngNormal, Cholesky,
triangular solves, jaxlib's LAPACK custom calls: :mod:`.kernels`), cut into stages.

The interpreter runs whole programs and calls nothing back, so such a program is cut at
each of those ops: the calls of functions that hold one are inlined into ``main``; then
``main``'s body is a sequence of steps, each either a *stage* (a run of other ops, made a
program of its own whose parameters are the values it uses from before and whose results
are the values used after it, run by the interpreter), a *kernel* (the op, computed in
NumPy in this process), or, for a ``while``, ``case`` or ``if`` with such an op inside, a
*loop* or *branch* that this process drives, each of its regions cut the same way. Such an
op in another kind of region (a reduction's computation, a sort's comparator), in a
function that calls itself, or a token or tuple between steps, is refused with
UnimplementedError at compile time.

Each step's values live in this process as NumPy arrays; the stages run in the
interpreter's workers (:mod:`.pool`), the kernels here, holding the GIL while they compute
in Python or in SciPy's LAPACK (NumPy's FFTs release it).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

from ifrtpy.backends.reference import kernels
from ifrtpy.backends.reference.interpreter import Interpretable, element_name
from ifrtpy.errors import IfrtError, InternalError, UnimplementedError
from ifrtpy.program import mlir

__all__ = ["has_kernel_ops", "plan", "StagedProgram"]

#: Ops whose regions this process drives when a kernel op is inside.
_CONTROL = frozenset({"stablehlo.while", "stablehlo.case", "stablehlo.if"})


def has_kernel_ops(module) -> bool:
    """Whether any op of ``module`` is computed by a kernel."""
    return any(kernels.is_kernel_op(op) for op in mlir.ops_inside(module.operation))


# -- the plan ------------------------------------------------------------------------------

@dataclasses.dataclass
class Stage:
    """Ops run by the interpreter: ``inputs`` and ``outputs`` are value ids."""

    ops: list
    inputs: list[int] = dataclasses.field(default_factory=list)
    outputs: list[int] = dataclasses.field(default_factory=list)
    program: Interpretable | None = None

    def run(self, values: list[np.ndarray], outer: Mapping) -> list[np.ndarray]:
        assert self.program is not None
        return self.program.run(values)


@dataclasses.dataclass
class KernelStep:
    """One op computed by its kernel."""

    name: str
    kernel: kernels.Kernel
    inputs: list[int]
    outputs: list[int]
    results: list[tuple[tuple[int, ...], np.dtype]]

    def run(self, values: list[np.ndarray], outer: Mapping) -> list[np.ndarray]:
        try:
            outs = self.kernel(values)
        except IfrtError:
            raise
        except Exception as e:  # noqa: BLE001 - NumPy's and SciPy's errors alike
            raise InternalError(f"{self.name} failed: {type(e).__name__}: {e}") from None
        checked = []
        for out, (shape, dtype) in zip(outs, self.results):
            out = np.asarray(out)
            if out.shape != shape:
                raise InternalError(f"{self.name} made a {list(out.shape)} result, not {list(shape)}")
            checked.append(out.astype(dtype, copy=False))
        return checked


@dataclasses.dataclass
class Block:
    """A block this process runs: its arguments, steps and returned values (ids)."""

    params: list[int]
    steps: list
    results: list[int]

    def run(self, args: Sequence[np.ndarray], outer: Mapping) -> list[np.ndarray]:
        env = collections.ChainMap(dict(zip(self.params, args)), outer)  # type: ignore[arg-type]
        for step in self.steps:
            values = step.run([env[i] for i in step.inputs], env)
            env.maps[0].update(zip(step.outputs, values))
        return [env[i] for i in self.results]


@dataclasses.dataclass
class Loop:
    """A ``stablehlo.while``: its condition and body run in turn."""

    cond: Block
    body: Block
    inputs: list[int]
    outputs: list[int]

    def run(self, values: list[np.ndarray], outer: Mapping) -> list[np.ndarray]:
        while bool(self.cond.run(values, outer)[0]):
            values = self.body.run(values, outer)
        return values


@dataclasses.dataclass
class Branch:
    """A ``stablehlo.case`` (an index out of range takes the last branch) or
    ``stablehlo.if`` (the true branch first)."""

    branches: list[Block]
    inputs: list[int]
    outputs: list[int]
    is_if: bool

    def run(self, values: list[np.ndarray], outer: Mapping) -> list[np.ndarray]:
        chosen = int(values[0])
        if self.is_if:
            chosen = 0 if chosen else 1
        elif not 0 <= chosen < len(self.branches):
            chosen = len(self.branches) - 1
        return self.branches[chosen].run([], outer)


Step = Union[Stage, KernelStep, Loop, Branch]


class StagedProgram:
    """A program run as its steps (:func:`plan`): its results from its arguments, as
    :class:`~.interpreter.Interpretable` gives them."""

    def __init__(self, main: Block):
        self.main = main

    def run(self, values: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.main.run(list(values), {})


def plan(module, name: str, interpretable: Callable[[str], Interpretable]) -> StagedProgram:
    """``module`` (prepared for the interpreter: annotations stripped, composites
    inlined) cut into steps; ``interpretable`` prepares a stage's text for the
    interpreter. UnimplementedError for what cannot be cut."""
    _inline_calls(module, name)
    return _Planner(module, name, interpretable).program()


# -- inlining ------------------------------------------------------------------------------

def _callee(op) -> str:
    from jaxlib.mlir import ir
    return ir.FlatSymbolRefAttr(op.attributes["callee"]).value


def _reachable(calls: dict[str, set[str]], start: str) -> set[str]:
    """The functions that ``start`` calls, directly or not."""
    found: set[str] = set()
    todo = list(calls[start])
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo.extend(calls.get(name, ()))
    return found


def _remap(op, mapping: dict) -> None:
    """Points every operand of ``op`` (and of the ops inside it) found in ``mapping``
    at its value there."""
    from jaxlib.mlir import ir

    def visit(inner):
        operands = inner.operands
        for i in range(len(operands)):
            new = mapping.get(operands[i])
            if new is not None:
                operands[i] = new
        return ir.WalkResult.ADVANCE
    op.operation.walk(visit, ir.WalkOrder.PRE_ORDER)


def _inline_calls(module, name: str) -> None:
    """Inlines into ``main`` every call of a function that holds a kernel op or calls one
    (directly or not), then erases those functions. UnimplementedError where one of them
    calls itself."""
    from jaxlib.mlir import ir
    functions = mlir.functions(module)
    calls = {f: {_callee(op) for op in mlir.ops_inside(function.operation) if op.operation.name == "func.call"}
             for f, function in functions.items()}
    staged = {f for f, function in functions.items()
              if f != "main" and any(kernels.is_kernel_op(op) for op in mlir.ops_inside(function.operation))}
    staged |= {f for f in functions if f != "main" and _reachable(calls, f) & staged}
    for f in staged:
        if f in _reachable(calls, f):
            raise UnimplementedError(
                f"{name}: the reference backend cannot inline function @{f}, which calls "
                "itself, to reach its FFT and linear-algebra ops")
    while True:
        inlined = [op for op in mlir.ops_inside(functions["main"].operation)
                   if op.operation.name == "func.call" and _callee(op) in staged]
        if not inlined:
            break
        for call in inlined:
            body = functions[_callee(call)].regions[0].blocks[0]
            mapping = dict(zip(body.arguments, call.operands))
            *ops, ret = list(body.operations)
            for op in ops:
                clone = op.operation.clone(ip=ir.InsertionPoint(call))
                _remap(clone, mapping)
                mapping.update(zip(op.results, clone.results))
            for old, value in zip(call.results, ret.operands):
                old.replace_all_uses_with(mapping.get(value, value))
            call.operation.erase()
    for f in staged:
        functions[f].operation.erase()


# -- cutting -------------------------------------------------------------------------------

class _Planner:
    """Cuts ``main`` into steps, then makes each stage's program."""

    def __init__(self, module, name: str, interpretable: Callable[[str], Interpretable]):
        self.module = module
        self.name = name
        self.interpretable = interpretable
        self.generator = kernels.Generator()
        self.functions = mlir.functions(module)
        self.ids: dict[Any, int] = {}
        self.types: dict[int, Any] = {}
        self.owner: dict[Any, Any] = {}  # op -> the step (or block, for its return) it is in
        self.defined: dict[int, Any] = {}  # value id -> the step (or block) that makes it
        self.stages: list[Stage] = []

    def id(self, value) -> int:
        if value not in self.ids:
            self.ids[value] = len(self.ids)
            self.types[self.ids[value]] = value.type
        return self.ids[value]

    def program(self) -> StagedProgram:
        main = self.block(self.functions["main"].regions[0].blocks[0])
        self.link()
        for stage in self.stages:
            stage.program = self.interpretable(self.stage_text(stage))
        return StagedProgram(main)

    def block(self, block) -> Block:
        params = [self.id(a) for a in block.arguments]
        *ops, ret = list(block.operations)
        plan = Block(params, [], [self.id(v) for v in ret.operands])
        for i in params:
            self.defined[i] = plan
        self.owner[ret.operation] = plan
        run: list = []
        for op in ops:
            if not self.staged(op):
                run.append(op)
                continue
            if run:
                plan.steps.append(self.stage(run))
                run = []
            plan.steps.append(self.step(op))
        if run:
            plan.steps.append(self.stage(run))
        return plan

    def staged(self, op) -> bool:
        """Whether ``op`` is a step of its own: a kernel op, or a while, case or if with
        one inside (UnimplementedError for one inside any other op)."""
        if kernels.is_kernel_op(op):
            return True
        inside = [o for o in mlir.ops_inside(op.operation) if kernels.is_kernel_op(o)]
        if not inside:
            return False
        kind = op.operation.name
        if kind not in _CONTROL:
            raise UnimplementedError(
                f"{self.name}: the reference backend runs {inside[0].operation.name} inside "
                f"while, case and if, not inside {kind}")
        return True

    def stage(self, ops: list) -> Stage:
        stage = Stage(ops)
        for op in ops:
            for inner in [op, *mlir.ops_inside(op.operation)]:
                self.owner[inner.operation] = stage
            for value in op.results:
                self.defined[self.id(value)] = stage
        self.stages.append(stage)
        return stage

    def step(self, op) -> Step:
        kind = op.operation.name
        inputs = [self.id(v) for v in op.operands]
        outputs = [self.id(v) for v in op.results]
        if kind == "stablehlo.while":
            made: Step = Loop(self.block(op.regions[0].blocks[0]), self.block(op.regions[1].blocks[0]),
                              inputs, outputs)
        elif kind in ("stablehlo.case", "stablehlo.if"):
            made = Branch([self.block(region.blocks[0]) for region in op.regions], inputs, outputs,
                          kind == "stablehlo.if")
        else:
            results = [kernels.tensor_spec(r.type) for r in op.results]
            made = KernelStep(kind if kind != "stablehlo.custom_call" else _target(op),
                              kernels.kernel(op, self.generator), inputs, outputs, results)
        self.owner[op.operation] = made
        for i in outputs:
            self.defined[i] = made
        for i in inputs + outputs:
            self.check_type(i)
        return made

    def check_type(self, value_id: int) -> None:
        """UnimplementedError unless the value can pass between steps (a static tensor of
        an element type ifrtpy knows)."""
        from jaxlib.mlir import ir
        type_ = self.types[value_id]
        if (not isinstance(type_, ir.RankedTensorType) or not ir.RankedTensorType(type_).has_static_shape
                or element_name(type_) not in mlir.ELEMENT_TYPES):
            raise UnimplementedError(
                f"{self.name}: the reference backend passes static tensors between the "
                f"interpreter and its FFT and linear-algebra ops, not {type_}")

    def link(self) -> None:
        """Each stage's inputs (values it uses from elsewhere) and outputs (values it
        makes that are used elsewhere), in the order of first use."""
        for op in mlir.ops_inside(self.functions["main"].operation):
            user = self.owner[op.operation]
            for value in op.operands:
                i = self.id(value)
                maker = self.defined.get(i)
                if maker is None:  # a block argument inside a stage's own op
                    continue
                if maker is user:
                    continue
                if isinstance(user, Stage) and i not in user.inputs:
                    user.inputs.append(i)
                    self.check_type(i)
                if isinstance(maker, Stage) and i not in maker.outputs:
                    maker.outputs.append(i)
                    self.check_type(i)

    def stage_text(self, stage: Stage) -> str:
        """A module whose ``main`` runs the stage's ops (and the functions they call)."""
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import func
        values = {i: v for v, i in self.ids.items()}
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            for op in self.module.body.operations:
                if op.operation != self.functions["main"].operation:
                    op.operation.clone()
            function = func.FuncOp("main", ([self.types[i] for i in stage.inputs],
                                            [self.types[i] for i in stage.outputs]))
        entry = function.add_entry_block()  # type: ignore[attr-defined]
        mapping = {values[i]: arg for i, arg in zip(stage.inputs, entry.arguments)}
        with ir.InsertionPoint(entry):
            for op in stage.ops:
                clone = op.operation.clone()
                _remap(clone, mapping)
                mapping.update(zip(op.results, clone.results))
            func.ReturnOp([mapping[values[i]] for i in stage.outputs])
        return str(module)


def _target(op) -> str:
    from jaxlib.mlir import ir
    return f"custom call {ir.StringAttr(op.attributes['call_target_name']).value}"
