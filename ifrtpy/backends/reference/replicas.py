"""Programs over replicas: main cut at its collectives, the collectives done in NumPy.

A program compiled with ``num_replicas`` (and one partition) runs on every replica, each
on its own values, and its collectives exchange values between replicas. The interpreter
runs one program on one set of values, so main is cut at each collective (collectives
must be ops of main itself, not of a region or another function): stage k is main up to
its k-th collective, returning that collective's operands, with the results of the earlier
ones as parameters; the collective's results are made from every replica's operands; the
last stage is the whole of main, every collective a parameter. ``replica_id`` is a
parameter of each stage too, ``partition_id`` is 0.

The groups follow XLA's rules for one partition: without a channel a collective is over
replica ids; with one, ``all_reduce``, ``all_gather`` and ``reduce_scatter`` still are,
while ``all_to_all`` and ``collective_permute`` are over partition ids (each replica
alone, partition 0). Groups must name each replica once, as XLA's verifier requires. A
reduction runs its computation in the interpreter (a ``stablehlo.map`` of two replicas'
values), over a group in group order.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from ifrtpy.errors import InvalidArgumentError, UnimplementedError
from ifrtpy.program import mlir

__all__ = ["OPS", "IDS", "Collective", "Plan", "plan", "ReplicatedProgram"]

#: The collectives run over replicas.
OPS = frozenset({"stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter",
                 "stablehlo.all_to_all", "stablehlo.collective_permute"})
#: Ops that read the device's place: a parameter (replica_id) or 0 (partition_id).
IDS = frozenset({"stablehlo.replica_id", "stablehlo.partition_id"})
#: Collectives whose groups are of partition ids where they have a channel.
_PARTITION_WITH_CHANNEL = frozenset({"stablehlo.all_to_all", "stablehlo.collective_permute"})


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of main, resolved for its replicas: ``groups`` lists the replicas
    exchanging values (in group order); ``sources`` (collective_permute) maps each
    receiving replica to its sender; ``dims`` holds the op's dimension attributes."""

    name: str
    groups: tuple[tuple[int, ...], ...]
    sources: dict
    dims: dict
    combiner: int | None  # the index of its reduction program, if it reduces

    def apply(self, operands: Sequence[list[np.ndarray]], combine: Callable | None
              ) -> list[list[np.ndarray]]:
        """The results on each replica from ``operands[r]``, replica r's operands."""
        replicas = len(operands)
        out: list[list[np.ndarray]] = [[] for _ in range(replicas)]
        for i in range(len(operands[0])):
            values = [operands[r][i] for r in range(replicas)]
            for r, value in enumerate(self._one(values, combine)):
                out[r].append(value)
        return out

    def _one(self, values: list[np.ndarray], combine: Callable | None) -> list[np.ndarray]:
        name, dims = self.name, self.dims
        if name == "stablehlo.collective_permute":
            return [values[self.sources[r]] if r in self.sources else np.zeros_like(values[r])
                    for r in range(len(values))]
        results: list[np.ndarray] = [values[r] for r in range(len(values))]
        for group in self.groups:
            n = len(group)
            if name in ("stablehlo.all_reduce", "stablehlo.reduce_scatter"):
                assert combine is not None
                total = values[group[0]]
                for member in group[1:]:
                    total = combine(total, values[member])
                pieces = ([total] * n if name == "stablehlo.all_reduce"
                          else np.split(total, n, dims["scatter_dimension"]))
            elif name == "stablehlo.all_gather":
                whole = np.concatenate([values[m] for m in group], dims["all_gather_dim"])
                pieces = [whole] * n
            else:  # all_to_all: piece j of each member goes to member j
                split, concat = dims["split_dimension"], dims["concat_dimension"]
                parts = [np.split(values[m], n, split) for m in group]
                pieces = [np.concatenate([parts[s][j] for s in range(n)], concat) for j in range(n)]
            for member, piece in zip(group, pieces):
                results[member] = piece
        return results


@dataclasses.dataclass(frozen=True)
class Plan:
    """The texts of main's stages (the last is the whole program) and of the reduction
    programs, and the collectives between the stages."""

    stages: list[str]
    combiners: list[str]
    collectives: list[Collective]


def _ints(attr) -> np.ndarray:
    return np.asarray(attr, dtype=np.int64)


def _resolve(op, replicas: int, name: str) -> Collective:
    """The collective ``op`` of a program of ``name`` over ``replicas`` replicas (one
    partition); InvalidArgumentError where its groups or pairs break XLA's rules."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo
    kind = op.operation.name
    attrs = op.attributes
    channel = "channel_handle" in attrs and stablehlo.ChannelHandle(attrs["channel_handle"]).handle > 0
    partitions = channel and kind in _PARTITION_WITH_CHANNEL  # ids of partitions: only 0
    limit = 1 if partitions else replicas
    what = f"{name}: {kind.split('.')[-1]}"
    ids = "partitions" if partitions else "replicas"
    dims = {key: ir.IntegerAttr(attrs[key]).value for key in
            ("all_gather_dim", "scatter_dimension", "split_dimension", "concat_dimension")
            if key in attrs}
    if kind == "stablehlo.collective_permute":
        pairs = [tuple(p) for p in _ints(attrs["source_target_pairs"]).reshape(-1, 2).tolist()]
        if any(not 0 <= i < limit for p in pairs for i in p):
            raise InvalidArgumentError(
                f"{what}: source_target_pairs {pairs} must name {ids} in [0, {limit})")
        sources = ({r: r for r in range(replicas)} if partitions and (0, 0) in pairs else
                   {} if partitions else {t: s for s, t in pairs})
        return Collective(kind, (), sources, dims, None)
    rows = _ints(attrs["replica_groups"])  # -1 pads shorter groups
    groups = [[i for i in row if i >= 0] for row in rows.reshape(len(rows), -1).tolist()
              ] if rows.size else []
    groups = [g for g in groups if g] or [list(range(limit))]  # none: one of them all
    flat = [i for g in groups for i in g]
    if len(set(flat)) != len(flat) or any(not 0 <= i < limit for i in flat) or (
            limit > 1 and len(flat) != limit):
        raise InvalidArgumentError(
            f"{what}: replica_groups {groups} must name each of the {limit} {ids} once")
    if partitions:  # each replica alone: its partition 0
        groups = [[r] for r in range(replicas)]
    size = len(groups[0])
    split_count = ir.IntegerAttr(attrs["split_count"]).value if "split_count" in attrs else size
    if split_count != size:
        raise InvalidArgumentError(f"{what}: split_count {split_count} is not the group size {size}")
    for operand, result in zip(op.operands, op.results):
        shape_in = list(ir.RankedTensorType(operand.type).shape)
        shape_out = list(ir.RankedTensorType(result.type).shape)
        expected = list(shape_in)
        if kind == "stablehlo.all_gather":
            expected[dims["all_gather_dim"]] *= size
        elif kind == "stablehlo.reduce_scatter":
            expected[dims["scatter_dimension"]] //= size
        elif kind == "stablehlo.all_to_all":
            expected[dims["split_dimension"]] //= size
            expected[dims["concat_dimension"]] *= size
        split = dims.get("scatter_dimension", dims.get("split_dimension"))
        if shape_out != expected or (split is not None and shape_in[split] % size):
            raise InvalidArgumentError(f"{what}: groups of {size} make {expected} of {shape_in}, "
                                       f"not the result's {shape_out}")
    return Collective(kind, tuple(tuple(g) for g in groups), {}, dims, None)


def _main_block(module):
    from jaxlib.mlir import ir
    for op in module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op, op.regions[0].blocks[0]
    raise InvalidArgumentError("the program has no main function")


def _retype(main, block) -> None:
    """main's function type from its block arguments and return; no argument or result
    attributes (the stages change their number)."""
    from jaxlib.mlir import ir
    ret = list(block.operations)[-1]
    main.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        [a.type for a in block.arguments], [v.type for v in ret.operands]))
    for key in ("arg_attrs", "res_attrs"):
        if key in main.attributes:
            del main.attributes[key]


def _with_ids(module) -> None:
    """replica_id becomes a parameter of main (after the program's own), partition_id 0."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo
    main, block = _main_block(module)
    scalar = ir.RankedTensorType.get([], ir.IntegerType.get_unsigned(32))
    replica = block.add_argument(scalar, main.location)
    for op in mlir.ops_inside(main):
        kind = op.operation.name
        if kind == "stablehlo.replica_id":
            op.results[0].replace_all_uses_with(replica)
        elif kind == "stablehlo.partition_id":
            with ir.InsertionPoint(op), op.location:
                zero = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
                    scalar, ir.IntegerAttr.get(ir.IntegerType.get_unsigned(32), 0)))
            op.results[0].replace_all_uses_with(zero.result)
        else:
            continue
        op.operation.erase()
    _retype(main, block)


def _stage(text: str, k: int) -> str:
    """Main up to its k-th collective, returning its operands (the whole of main for k
    past the last), the earlier collectives' results parameters."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import func
    module = ir.Module.parse(text)
    main, block = _main_block(module)
    ops = list(block.operations)
    at = [i for i, op in enumerate(ops) if op.operation.name in OPS]
    for i in at[:k]:
        for result in ops[i].results:
            result.replace_all_uses_with(block.add_argument(result.type, ops[i].location))
    if k < len(at):
        operands = list(ops[at[k]].operands)
        location = ops[at[k]].location
        for op in reversed(ops[at[k]:]):
            op.operation.erase()
        with ir.InsertionPoint(block), location:
            func.ReturnOp(operands)
    for i in at[:k]:
        ops[i].operation.erase()
    _retype(main, block)
    return str(module)


def _combiner(text: str, k: int) -> str:
    """A program combining two replicas' values as the k-th collective's computation does
    (its region as the computation of a stablehlo.map)."""
    from jaxlib.mlir import ir
    module = ir.Module.parse(text)
    _, block = _main_block(module)
    op = [op for op in block.operations if op.operation.name in OPS][k]
    tensor = op.operands[0].type
    rank = len(ir.RankedTensorType(tensor).shape)
    combined = ir.Module.parse(f"func.func public @main(%a: {tensor}, %b: {tensor}) -> {tensor} {{\n"
                               f"  return %a : {tensor}\n}}")
    _, body = _main_block(combined)
    ret = list(body.operations)[0]
    with ir.InsertionPoint(ret), op.location:
        mapped = ir.Operation.create(
            "stablehlo.map", results=[tensor], operands=list(body.arguments),
            attributes={"dimensions": ir.DenseI64ArrayAttr.get(list(range(rank)))}, regions=1)
    op.regions[0].blocks[0].append_to(mapped.regions[0])
    ret.operands[0] = mapped.results[0]
    return str(combined)


def plan(module, name: str, replicas: int) -> Plan:
    """The stages of ``module`` (prepared for the interpreter: composites inlined,
    annotations stripped) run over ``replicas`` replicas. UnimplementedError for a
    collective inside a region or another function, or one that reduces several operands."""
    main, block = _main_block(module)
    for op in mlir.ops_inside(module.operation):
        kind = op.operation.name
        parent = op.operation.parent
        if kind in OPS and parent != main.operation:
            raise UnimplementedError(
                f"{name}: the reference backend runs collectives over replicas only as ops of "
                f"main itself; this {kind} is inside {parent.name}")
        if kind in IDS and _function_of(op) != main.operation:
            raise UnimplementedError(f"{name}: the reference backend reads {kind} only in main")
    collectives = []
    for op in block.operations:
        if op.operation.name not in OPS:
            continue
        if op.operation.name in ("stablehlo.all_reduce", "stablehlo.reduce_scatter"):
            if len(op.operands) != 1:
                raise UnimplementedError(f"{name}: the reference backend reduces one operand "
                                         f"per {op.operation.name}, not {len(op.operands)}")
            if not _isolated(op):
                raise InvalidArgumentError(f"{name}: the computation of {op.operation.name} "
                                           f"uses a value from outside it (XLA refuses it too)")
        collectives.append(_resolve(op, replicas, name))
    _with_ids(module)
    text = str(module)
    combiners: list[str] = []
    for k, collective in enumerate(collectives):
        if collective.name in ("stablehlo.all_reduce", "stablehlo.reduce_scatter"):
            collectives[k] = dataclasses.replace(collective, combiner=len(combiners))
            combiners.append(_combiner(text, k))
    stages = [_stage(text, k) for k in range(len(collectives) + 1)]
    return Plan(stages, combiners, collectives)


def _isolated(op) -> bool:
    """Whether the ops in the regions of ``op`` use only values made in those regions."""
    from jaxlib.mlir import ir
    inner = mlir.ops_inside(op)
    blocks = [block for o in [op, *inner] for region in o.operation.regions for block in region.blocks]
    for o in inner:
        for value in o.operands:
            owner = value.owner
            if isinstance(value, ir.BlockArgument):
                if not any(owner == b for b in blocks):
                    return False
            elif not any(owner == i for i in inner):
                return False
    return True


def _function_of(op):
    """The func.func that holds ``op``."""
    parent = op.operation.parent
    while parent is not None and parent.name != "func.func":
        parent = parent.parent
    return parent


class ReplicatedProgram:
    """A program run on each of ``replicas`` replicas: its stages and collectives
    (:func:`plan`), each stage and reduction prepared for the interpreter."""

    def __init__(self, replicas: int, stages: list, combiners: list,
                 collectives: list[Collective]):
        self.replicas = replicas
        self.stages = stages
        self.combiners = combiners
        self.collectives = collectives

    def run(self, arguments: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """Each result's value on each replica, from each argument's value on each
        (``arguments[i][r]``: argument i on replica r)."""
        values = [[arg[r] for arg in arguments] for r in range(self.replicas)]
        done: list[list[np.ndarray]] = [[] for _ in values]
        for k, stage in enumerate(self.stages):
            outs = [stage.run([*args, np.asarray(r, np.uint32), *done[r]])
                    for r, args in enumerate(values)]
            if k == len(self.collectives):
                return [list(results) for results in zip(*outs)]
            collective = self.collectives[k]
            combine = None
            if collective.combiner is not None:
                program = self.combiners[collective.combiner]

                def combine(a, b, program=program):
                    return program.run([a, b])[0]
            for r, results in enumerate(collective.apply(outs, combine)):
                done[r].extend(results)
        raise AssertionError("the last stage returns")
