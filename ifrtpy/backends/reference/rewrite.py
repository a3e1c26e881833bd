"""A StableHLO program made ready for the reference interpreter.

The interpreter runs programs on global values, so: what cannot run on them (collectives
of an SPMD program outside manual computations, XLA's manual-sharding custom calls, custom
calls other than sharding annotations and jaxlib's LAPACK kernels, ops the interpreter
aborts on) is refused with UnimplementedError (a program over replicas is cut at its
collectives instead, see :mod:`.replicas`; one with ops of :mod:`.kernels` at those, see
:mod:`.stages`); a program with manual computations (``sdy.manual_computation``, run per
device with their collectives, :mod:`.per_device`) must run whole in the NumPy evaluator;
sharding annotations are dropped (they are identities on global values); integer division and remainder get XLA's results where the
interpreter's would kill the process (a zero divisor, INT_MIN / -1); composites are calls
of their decompositions; the parameter and output shardings are read from the
``mhlo.sharding`` or ``sdy.sharding`` attributes of ``main``, after Shardy's propagation
where the program has a mesh (replicated where there are none); and where ``main`` has element types the interpreter's Python bindings cannot pass
(complex parameters; bf16, f8, sub-byte and complex results), a wrapper ``main`` converts
them (bitcast, convert, real/imag) around a call of the original.
"""

from __future__ import annotations

import math
import re
from typing import Union

import numpy as np

from ifrtpy.backends.reference import kernels, lapack, numpy_eval, replicas, stages
from ifrtpy.backends.reference import per_device  # noqa: F401  (the evaluator's collectives)
from ifrtpy.backends.reference.interpreter import MLIR_LOCK, Interpretable, element_name
from ifrtpy.device import DeviceList, MemoryKind
from ifrtpy.errors import InvalidArgumentError, UnimplementedError
from ifrtpy.program import HloProgram, mlir
from ifrtpy.program.hlo import HOST_CALLBACK_TARGETS
from ifrtpy.sharding import ConcreteEvenSharding, HloSharding, Sharding, SingleDeviceSharding

__all__ = ["prepare"]

_ORIGINAL_MAIN = "__ifrtpy_original_main"

#: What runs a prepared program: each has ``run(values) -> results``.
Runner = Union[Interpretable, "stages.StagedProgram", replicas.ReplicatedProgram]

#: Ops that need several devices' data at once (or a device's own id): not runnable on
#: global values.
_COLLECTIVES = frozenset({
    "stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.all_to_all",
    "stablehlo.reduce_scatter", "stablehlo.collective_permute",
    "stablehlo.collective_broadcast", "stablehlo.partition_id", "stablehlo.replica_id",
    "mhlo.all_reduce", "mhlo.all_gather", "mhlo.all_to_all", "mhlo.reduce_scatter",
    "mhlo.collective_permute", "mhlo.partition_id", "mhlo.replica_id",
})
#: Sharding annotations: identities on global values.
_ANNOTATIONS = frozenset({"sdy.sharding_constraint", "sdy.reshard", "sdy.propagation_barrier"})
_ANNOTATION_TARGETS = frozenset({"Sharding", "xla.sdy.FuncResultSharding"})
_MANUAL_TARGETS = frozenset({"SPMDFullToShardShape", "SPMDShardToFullShape",
                             "xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape",
                             "xla.sdy.ManualComputationCall"})

#: StableHLO ops the interpreter does not run: it aborts the process on them, so they are
#: refused at compile time (UnimplementedError). Ops of other dialects than stablehlo and
#: func (chlo, mhlo, ...) are refused too. Those of _NUMPY_ONLY run where the NumPy
#: evaluator runs the whole program.
_NOT_INTERPRETED = frozenset("stablehlo." + name for name in (
    "batch_norm_grad", "batch_norm_inference", "batch_norm_training", "broadcast",
    "composite", "compute_reshape_shape", "create_token", "cross-replica-sum",
    "cstr_reshapable", "dot", "dynamic_broadcast_in_dim", "dynamic_conv", "dynamic_gather",
    "dynamic_iota", "dynamic_pad", "dynamic_reshape", "einsum",
    "get_dimension_size", "infeed", "outfeed", "real_dynamic_slice", "recv",
    "send", "set_dimension_size", "torch_index_select", "trace",
    "unary_einsum", "uniform_dequantize", "uniform_quantize",
))
_INTERPRETED_DIALECTS = ("stablehlo.", "func.")
_NUMPY_ONLY = frozenset({"stablehlo.rng_bit_generator"})

# Result element types np.array() cannot read from an attribute: how the wrapper hands
# them over (the interpreter turns them back, see interpreter.py).
_BITCAST = {"bf16": "i16", "f8E3M4": "i8", "f8E4M3": "i8", "f8E4M3FN": "i8",
            "f8E4M3B11FNUZ": "i8", "f8E4M3FNUZ": "i8", "f8E5M2": "i8", "f8E5M2FNUZ": "i8",
            "f8E8M0FNU": "i8"}
_CONVERT = {"i2": "i8", "i4": "i8", "ui2": "ui8", "ui4": "ui8", "f4E2M1FN": "f32"}
_COMPLEX_PARTS = {"complex<f32>": "f32", "complex<f64>": "f64"}



def _string(attr) -> str:
    from jaxlib.mlir import ir
    return ir.StringAttr(attr).value


def _meshes(module) -> dict:
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy
    return {ir.StringAttr(op.attributes["sym_name"]).value: sdy.MeshAttr(op.attributes["mesh"])
            for op in module.body.operations if op.operation.name == "sdy.mesh"}


def _check_and_strip(module, name: str, over_replicas: bool) -> tuple[int, str | None]:
    """Raise UnimplementedError for what cannot run on global values (or, in a program
    run over replicas, in :mod:`.replicas`); erase sharding annotations (uses of their
    result take their operand). Returns the op count, and the first op making a tensor
    the interpreter cannot run (too large, or of _NUMPY_ONLY), with why; None where
    there is none."""
    ops = mlir.ops_inside(module.operation)
    strip = []
    numpy_only = None
    manual = _has_manual_computations(module)
    for op in ops:
        op_name = op.operation.name
        if over_replicas and op_name in replicas.OPS | replicas.IDS or kernels.is_kernel_op(op):
            continue
        if op_name in _COLLECTIVES and not (manual and op_name.startswith("stablehlo.")):
            raise UnimplementedError(
                f"{name}: the reference backend runs collectives inside manual SPMD regions "
                f"(sdy.manual_computation, as from shard_map) or over replicas, not {op_name} "
                "on the global values of a program over partitions")
        if op_name in _COLLECTIVES or op_name in ("sdy.manual_computation", "sdy.return"):
            numpy_only = numpy_only or (f"{name}: the StableHLO reference interpreter does "
                                        f"not run {op_name} (per-device values)")
            continue
        if op_name in _ANNOTATIONS:
            strip.append(op)
        elif op_name in ("stablehlo.custom_call", "mhlo.custom_call"):
            target = _string(op.attributes["call_target_name"])
            if target in _ANNOTATION_TARGETS and len(op.operands) == 1 and len(op.results) == 1:
                strip.append(op)
            elif target in _MANUAL_TARGETS:
                raise UnimplementedError(
                    f"{name}: the reference backend runs programs on global values and does "
                    f"not run manual SPMD regions (custom call {target}, as from shard_map)")
            else:
                raise UnimplementedError(f"{name}: the reference backend cannot run custom call "
                                         f"{target!r}{_why_not(target)}")
        elif op_name in _NUMPY_ONLY:
            numpy_only = numpy_only or (f"{name}: the StableHLO reference interpreter does "
                                        f"not run {op_name}")
        elif op_name != "sdy.mesh" and (op_name in _NOT_INTERPRETED
                                        or not op_name.startswith(_INTERPRETED_DIALECTS)):
            raise UnimplementedError(
                f"{name}: the StableHLO reference interpreter does not run {op_name}")
        too_large = _too_large(name, op)  # every op: it raises past the evaluator's limit
        numpy_only = numpy_only or too_large
    for op in strip:
        op.results[0].replace_all_uses_with(op.operands[0])
        op.operation.erase()
    return len(ops) - len(strip), numpy_only


def _has_manual_computations(module) -> bool:
    return any(op.operation.name == "sdy.manual_computation"
               for op in mlir.ops_inside(module.operation))


#: The most elements a tensor of a program the interpreter runs may have. The interpreter
#: holds every element as an object of its own and takes about 1.5 us per element and op
#: (f32 add on a shared 2-core machine): a tensor of 2**22 elements costs some 6 s an op
#: and a few hundred MB, while jax's bernoulli over 1e8 elements grew a worker past 10 GB
#: and ran for hours. A larger one is refused at compile time, unless the NumPy evaluator
#: runs the whole program (up to :data:`NUMPY_MAX_ELEMENTS`).
MAX_ELEMENTS = 2 ** 22
#: The most elements a tensor of a program the NumPy evaluator runs may have.
NUMPY_MAX_ELEMENTS = numpy_eval.MAX_ELEMENTS


def _too_large(name: str, op) -> str | None:
    """Why the interpreter cannot run ``op`` (a tensor of more than :data:`MAX_ELEMENTS`),
    or None; UnimplementedError where nothing can (over :data:`NUMPY_MAX_ELEMENTS`)."""
    from jaxlib.mlir import ir

    for result in op.results:
        type_ = result.type
        if not (isinstance(type_, ir.RankedTensorType) and type_.has_static_shape):
            continue
        size = math.prod(type_.shape)
        if size > MAX_ELEMENTS:
            why = (f"{name}: the StableHLO reference interpreter runs tensors of at most "
                   f"{MAX_ELEMENTS} elements; {op.operation.name} makes {type_} "
                   f"({size} elements), which would take it hours and tens of GB (it holds "
                   "every element as an object)")
            if size > NUMPY_MAX_ELEMENTS:
                raise UnimplementedError(f"{why}, and the NumPy evaluator runs tensors of at "
                                         f"most {NUMPY_MAX_ELEMENTS} elements")
            return why
    return None


def _numpy_runs(text: str) -> str | None:
    """None where the workers' NumPy evaluator runs the program ``text``, else why not."""
    from jaxlib.mlir import ir

    from ifrtpy.backends.reference import worker
    if not worker.numpy_chosen():
        return f"{worker.EVALUATOR_VARIABLE}=interpreter"
    why: list[str] = []
    numpy_eval.compile_module(ir.Module.parse(text), why)
    return why[0] if why else None


def _inline_composites(module) -> None:
    """Replace each ``stablehlo.composite`` by a call of its decomposition (portable
    artifacts carry CHLO ops such as ``chlo.atanh`` that way); the interpreter does not
    run composites."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import func

    for op in mlir.ops_inside(module.operation):
        if op.operation.name != "stablehlo.composite":
            continue
        callee = ir.FlatSymbolRefAttr(op.attributes["decomposition"])
        with ir.InsertionPoint(op), op.location:
            call = func.CallOp([r.type for r in op.results], callee, list(op.operands))
        for old, new in zip(op.results, call.results):
            old.replace_all_uses_with(new)
        op.operation.erase()


def _guard_integer_division(module) -> None:
    """Make integer ``stablehlo.divide`` and ``remainder`` total, with XLA's results: x / 0
    is -1 (all bits set, unsigned too), x % 0 is x, INT_MIN / -1 is INT_MIN and
    INT_MIN % -1 is 0. The interpreter divides with the machine's instruction, which kills
    the process (SIGFPE) on a zero divisor or that overflow; here they divide by 1 instead
    and the result is selected."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo as hlo

    for op in mlir.ops_inside(module.operation):
        kind = op.operation.name
        if kind not in ("stablehlo.divide", "stablehlo.remainder"):
            continue
        tensor = ir.RankedTensorType(op.results[0].type)
        integer = re.fullmatch(r"(u?)i(\d+)", element_name(tensor))
        if integer is None:
            continue
        element = tensor.element_type
        width, signed = int(integer.group(2)), not integer.group(1)
        lhs, rhs = op.operands[0], op.operands[1]
        with ir.InsertionPoint(op), op.location:
            def constant(value):
                return hlo.ConstantOp(ir.DenseElementsAttr.get_splat(
                    tensor, ir.IntegerAttr.get(element, value))).result

            def equal(a, b):
                return hlo.CompareOp(a, b, hlo.ComparisonDirectionAttr.get("EQ")).result

            by_zero = equal(rhs, constant(0))
            refused = by_zero
            if signed and width > 1:
                overflow = hlo.AndOp(equal(lhs, constant(-(1 << (width - 1)))),
                                     equal(rhs, constant(-1))).result
                refused = hlo.OrOp(by_zero, overflow).result
            divisor = hlo.SelectOp(refused, constant(1), rhs).result
            if kind == "stablehlo.divide":  # INT_MIN / 1 is XLA's INT_MIN / -1
                # -1: all bits set, unsigned too (an attribute of ui64 takes no 2**64 - 1)
                value = hlo.SelectOp(by_zero, constant(-1),
                                     hlo.DivOp(lhs, divisor).result).result
            else:  # INT_MIN % 1 is XLA's 0
                value = hlo.SelectOp(by_zero, lhs, hlo.RemOp(lhs, divisor).result).result
        op.results[0].replace_all_uses_with(value)
        op.operation.erase()


#: Float element types narrower than f32: XLA computes their dots, convolutions and
#: reductions in f32 and rounds the result once; the interpreter would accumulate in them.
_NARROW_FLOATS = frozenset({"bf16", "f16", *(k for k in _BITCAST if k.startswith("f8"))})
_WIDENED = frozenset({"stablehlo.dot_general", "stablehlo.convolution"})
_REDUCTIONS = frozenset({"stablehlo.reduce", "stablehlo.reduce_window"})
#: Reduction bodies that compute the same in f32 (rounded once at the end).
_WIDENABLE_BODY = frozenset({"stablehlo.add", "stablehlo.multiply", "stablehlo.maximum",
                             "stablehlo.minimum", "stablehlo.return"})


def _narrow(type_) -> bool:
    from jaxlib.mlir import ir

    return isinstance(type_, ir.RankedTensorType) and element_name(type_) in _NARROW_FLOATS


def _widened(type_):
    from jaxlib.mlir import ir

    return ir.RankedTensorType.get(ir.RankedTensorType(type_).shape, ir.F32Type.get())


def _widen_narrow_accumulation(module) -> None:
    """Compute dots, convolutions and reductions (add, multiply, max, min) of floats
    narrower than f32 in f32, rounding the result once, as XLA does; a dot's or
    convolution's result converted to f32 is not rounded at all (XLA folds the convert
    into the op). The interpreter
    would accumulate in the narrow type (a bf16 dot of 16 terms a few ulps off, a bf16
    sum of 4096 values in [0, 1) stuck at 256)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo as hlo

    for op in mlir.ops_inside(module.operation):
        kind = op.operation.name
        if kind in _WIDENED:
            if not _narrow(op.results[0].type):
                continue
        elif kind in _REDUCTIONS:
            if not all(_narrow(v.type) for v in [*op.operands, *op.results]):
                continue
            body = op.regions[0].blocks[0]
            if not all(o.operation.name in _WIDENABLE_BODY for o in body.operations):
                continue
            for arg in body.arguments:
                arg.set_type(_widened(arg.type))
            for inner in body.operations:
                for result in inner.results:
                    result.set_type(_widened(result.type))
        else:
            continue
        with ir.InsertionPoint(op), op.location:
            for i, operand in enumerate(list(op.operands)):
                if _narrow(operand.type):
                    op.operands[i] = hlo.ConvertOp(_widened(operand.type), operand).result
        for result in op.results:
            narrow_type = result.type
            uses = [(use.owner, use.operand_number) for use in result.uses]
            result.set_type(_widened(narrow_type))
            narrow = None
            for owner, number in uses:
                if kind in _WIDENED and owner.name == "stablehlo.convert" and element_name(
                        ir.RankedTensorType(owner.results[0].type)) == "f32":
                    owner.results[0].replace_all_uses_with(result)  # folded: no rounding
                    owner.erase()
                    continue
                if narrow is None:
                    with ir.InsertionPoint.after(op), op.location:
                        narrow = hlo.ConvertOp(narrow_type, result).result
                owner.operands[number] = narrow


def _why_not(target: str) -> str:
    """What the reference backend's refusal of custom call ``target`` adds for a known kind."""
    if target in HOST_CALLBACK_TARGETS:
        return " (a host callback: the PjRt and jax backends run them)"
    if target.startswith("lapack_"):
        routines = sorted({t[len("lapack_s"):-len("_ffi")] for t in lapack.TARGETS
                           if t.startswith("lapack_")})
        return (f" (a LAPACK kernel of jaxlib this backend lacks: it runs {', '.join(routines)}; "
                "the PjRt and jax backends run them all)")
    return " (custom calls run on the PjRt and jax backends, see ifrtpy.ffi)"


def _sdy_to_hlo_text(attr, meshes: dict) -> str:
    """An ``sdy.sharding`` as XLA HloSharding text (tile assignment over the mesh's
    device ids, unsharded mesh axes replicated last)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy
    sharding = sdy.TensorShardingAttr(attr)
    mesh_or_ref = sharding.mesh_or_ref
    if sdy.MeshAttr.isinstance(mesh_or_ref):
        mesh = sdy.MeshAttr(mesh_or_ref)
    else:
        mesh_name = ir.FlatSymbolRefAttr(mesh_or_ref).value
        if mesh_name not in meshes:
            raise InvalidArgumentError(f"sdy.sharding names an unknown mesh @{mesh_name}")
        mesh = meshes[mesh_name]
    names = [sdy.MeshAxisAttr(a).name for a in mesh.axes]
    sizes = [sdy.MeshAxisAttr(a).size for a in mesh.axes]
    count = math.prod(sizes)
    ids = list(mesh.device_ids) or list(range(count))
    if not names:  # a maximal mesh: one device
        return f"{{maximal device={ids[0]}}}"
    def index(axis) -> int:
        ref = sdy.AxisRefAttr(axis)
        if ref.sub_axis_info is not None:
            raise UnimplementedError(f"sdy.sharding with sub-axes is not supported: {attr}")
        return names.index(ref.name)

    dims = [[index(axis) for axis in sdy.DimensionShardingAttr(dim).axes]
            for dim in sharding.dimension_shardings]
    unreduced = [index(axis) for axis in sharding.unreduced_axes]
    used = [a for axes in dims for a in axes]
    if not used and not unreduced:
        return "{replicated}"
    rest = [a for a in range(len(names)) if a not in used and a not in unreduced]
    tiles = [math.prod(sizes[a] for a in axes) for axes in dims]
    partial = math.prod(sizes[a] for a in unreduced)
    replication = math.prod(sizes[a] for a in rest)
    grid = np.array(ids).reshape(sizes).transpose(used + unreduced + rest).reshape(-1)
    kinds = [kind for kind, size in (("unreduced", partial), ("replicated", replication))
             if size > 1]
    shape = tiles + [size for size in (partial, replication) if size > 1]
    suffix = (" last_tile_dim_replicate" if kinds == ["replicated"]
              else f" last_tile_dims={{{', '.join(kinds)}}}" if kinds else "")
    return (f"{{devices=[{','.join(map(str, shape))}]{','.join(map(str, grid.tolist()))}"
            f"{suffix}}}")


#: Shardy's propagation, as XLA runs it before partitioning a program over a mesh.
_PROPAGATION = "builtin.module(sdy-propagation-pipeline)"


def _propagated(text: str):
    """The program ``text`` after Shardy's sharding propagation (jaxlib ships its
    passes): the parameters and results of ``main`` the program leaves open get the
    shardings XLA's partitioner would give them. Where the propagation fails, the program
    as it is (open ones replicated)."""
    from jaxlib.mlir import ir, passmanager

    module = ir.Module.parse(text)
    try:
        passmanager.PassManager.parse(_PROPAGATION).run(module.operation)
    except ir.MLIRError:
        module = ir.Module.parse(text)
    return module


def _value_shardings(function, key: str, count: int, devices: DeviceList, meshes: dict
                     ) -> list[Sharding]:
    """The sharding of each parameter (``key="arg_attrs"``) or result (``"res_attrs"``)."""
    from jaxlib.mlir import ir
    attrs = ([ir.DictAttr(a) for a in ir.ArrayAttr(function.attributes[key])]
             if key in function.attributes else [None] * count)
    out = []
    for attr in attrs:
        kind = None
        if attr is not None and "mhlo.memory_kind" in attr:
            kind = MemoryKind(_string(attr["mhlo.memory_kind"]))
        if len(devices) == 1:
            out.append(SingleDeviceSharding(devices[0], kind))
            continue
        text = "{replicated}"
        if attr is not None and "mhlo.sharding" in attr:
            text = _string(attr["mhlo.sharding"])
        elif attr is not None and "sdy.sharding" in attr:
            text = _sdy_to_hlo_text(attr["sdy.sharding"], meshes)
        out.append(HloSharding(devices, text, kind))
    return out


def _retyped(type_, element: str) -> str:
    from jaxlib.mlir import ir
    tensor = ir.RankedTensorType(type_)
    dims = "".join(f"{d}x" for d in tensor.shape)
    return f"tensor<{dims}{element}>"


def _wrap_main(module, main) -> tuple[str, list, list]:
    """The module text, with ``main`` wrapped where its types need converting; and for
    each parameter how to encode it, for each result how to decode it."""
    from jaxlib.mlir import ir
    ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    inputs, results = list(ftype.inputs), list(ftype.results)
    encoders = ["complex" if element_name(t) in _COMPLEX_PARTS else "hex" for t in inputs]
    decoders = []
    for t in results:
        element = element_name(t)
        decoders.append("bitcast" if element in _BITCAST else "convert" if element in _CONVERT
                        else "complex" if element in _COMPLEX_PARTS else "plain")
    if all(e == "hex" for e in encoders) and all(d == "plain" for d in decoders):
        return str(module), encoders, decoders
    main.attributes["sym_name"] = ir.StringAttr.get(_ORIGINAL_MAIN)
    main.attributes["sym_visibility"] = ir.StringAttr.get("private")
    for key in ("arg_attrs", "res_attrs"):
        if key in main.attributes:
            del main.attributes[key]
    params, body, call_args = [], [], []
    for i, (t, how) in enumerate(zip(inputs, encoders)):
        if how == "complex":
            part = _retyped(t, _COMPLEX_PARTS[element_name(t)])
            params += [f"%a{i}re: {part}", f"%a{i}im: {part}"]
            body.append(f"%a{i} = stablehlo.complex %a{i}re, %a{i}im : {t}")
        else:
            params.append(f"%a{i}: {t}")
        call_args.append(f"%a{i}")
    signature = f"({', '.join(map(str, inputs))}) -> ({', '.join(map(str, results))})"
    names = [f"%r#{i}" for i in range(len(results))] if len(results) > 1 else ["%r"]
    lhs = "" if not results else ("%r:{} = ".format(len(results)) if len(results) > 1 else "%r = ")
    body.append(f"{lhs}func.call @{_ORIGINAL_MAIN}({', '.join(call_args)}) : {signature}")
    returns, return_types = [], []
    for i, (t, how) in enumerate(zip(results, decoders)):
        element, value = element_name(t), names[i] if results else None
        if how == "bitcast":
            new = _retyped(t, _BITCAST[element])
            body.append(f"%o{i} = stablehlo.bitcast_convert {value} : ({t}) -> {new}")
        elif how == "convert":
            new = _retyped(t, _CONVERT[element])
            body.append(f"%o{i} = stablehlo.convert {value} : ({t}) -> {new}")
        elif how == "complex":
            new = _retyped(t, _COMPLEX_PARTS[element])
            body.append(f"%o{i} = stablehlo.real {value} : ({t}) -> {new}")
            body.append(f"%o{i}im = stablehlo.imag {value} : ({t}) -> {new}")
            returns.append(f"%o{i}")
            return_types.append(new)
            returns.append(f"%o{i}im")
            return_types.append(new)
            continue
        else:
            returns.append(value)
            return_types.append(str(t))
            continue
        returns.append(f"%o{i}")
        return_types.append(new)
    ret = f"return {', '.join(returns)} : {', '.join(return_types)}" if returns else "return"
    wrapper = (f"  func.func public @main({', '.join(params)}) -> ({', '.join(return_types)}) {{\n"
               + "".join(f"    {line}\n" for line in body) + f"    {ret}\n  }}\n")
    text = str(module).rstrip()
    assert text.endswith("}")
    return text[:-1] + wrapper + "}\n", encoders, decoders


def _interpretable(text: str) -> Interpretable:
    """The program ``text`` (no kernel ops) wrapped for the interpreter."""
    from jaxlib.mlir import ir
    module = ir.Module.parse(text)
    wrapped, encoders, decoders = _wrap_main(module, mlir.functions(module)["main"])
    return Interpretable(wrapped, encoders, decoders, HloProgram(text))


def _runner(module, program: HloProgram) -> Interpretable | stages.StagedProgram:
    """``module`` (prepared: annotations stripped, composites inlined; ``program`` its
    parameters and results) made ready to run: by the interpreter, or cut into stages
    around the ops of :mod:`.kernels` (:mod:`.stages`)."""
    if stages.has_kernel_ops(module):
        return stages.plan(module, program.name, _interpretable)
    text, encoders, decoders = _wrap_main(module, mlir.functions(module)["main"])
    return Interpretable(text, encoders, decoders, program)


def _over_replicas(module, num_replicas: int, num_partitions: int) -> bool:
    """Whether the program runs over replicas (:mod:`.replicas`): compiled for several, or
    for one device with collectives or replica and partition ids."""
    if num_replicas > 1 and num_partitions > 1:
        raise UnimplementedError(
            f"the reference backend runs programs over replicas (num_replicas="
            f"{num_replicas}) with num_partitions=1 only, got num_partitions={num_partitions}")
    if num_partitions > 1 or (num_replicas == 1 and _has_manual_computations(module)):
        return False  # manual computations run their bodies per device themselves
    return num_replicas > 1 or any(op.operation.name in replicas.OPS | replicas.IDS
                                   for op in mlir.ops_inside(module.operation))


def prepare(program: HloProgram, devices: DeviceList | None, num_replicas: int = 1,
            num_partitions: int = 1
            ) -> tuple[Runner, list[Sharding] | None, list[Sharding] | None, int]:
    """(interpretable, parameter shardings, output shardings, op count): a
    ReplicatedProgram for a program over replicas, run with each replica's values."""
    from jaxlib.mlir import ir
    if program.token_parameters or program.token_results:
        raise UnimplementedError(
            f"{program.name}: the reference backend runs no programs with ordered effects "
            "(!stablehlo.token parameters or results)")
    with MLIR_LOCK, mlir.context(), ir.Location.unknown():
        module = ir.Module.parse(program.text)
        main = mlir.functions(module)["main"]
        over_replicas = _over_replicas(module, num_replicas, num_partitions)
        if devices is None:
            params = outputs = None
        elif num_replicas > 1:  # each replica's own value, whole, on its device
            params, outputs = ([ConcreteEvenSharding(devices, t.shape, t.shape, is_fully_replicated=True)
                                for t in types] for types in (program.parameters, program.results))
        else:
            meshes = _meshes(module)
            propagated = _propagated(program.text) if meshes else module  # kept alive
            sharded = mlir.functions(propagated)["main"]
            params = _value_shardings(sharded, "arg_attrs", len(program.parameters), devices, meshes)
            outputs = _value_shardings(sharded, "res_attrs", len(program.results), devices, meshes)
        _inline_composites(module)
        op_count, numpy_only = _check_and_strip(module, program.name, over_replicas)
        _guard_integer_division(module)
        _widen_narrow_accumulation(module)
        if over_replicas:
            try:
                plan = replicas.plan(module, program.name, num_replicas)
                runner: Runner = replicas.ReplicatedProgram(
                    num_replicas, [_runner(ir.Module.parse(text), HloProgram(text))
                                   for text in plan.stages],
                    [_interpretable(text) for text in plan.combiners], plan.collectives)
            except ir.MLIRError as e:
                raise UnimplementedError(f"{program.name}: the reference backend cannot cut "
                                         f"this program at its collectives: {e}") from None
        else:
            runner = _runner(module, program)
        if numpy_only is not None:  # only the NumPy evaluator can run it
            why_not = ("it is cut into stages or run over replicas"
                       if not isinstance(runner, Interpretable) else _numpy_runs(runner.text))
            if why_not is not None:
                raise UnimplementedError(f"{numpy_only}; the NumPy evaluator does not run this "
                                         f"program ({why_not})")
    return runner, params, outputs, op_count
