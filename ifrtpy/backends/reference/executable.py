"""ReferenceCompiler and ReferenceLoadedExecutable: StableHLO run by the StableHLO
reference interpreter (``jaxlib.mlir.dialects.stablehlo.eval_module``) on global values.

"Compiling" parses the program, checks it has nothing the interpreter cannot run on
global values (manual SPMD regions, collectives, custom calls other than sharding
annotations: UnimplementedError), drops the sharding annotations (they are identities
on global values) and reads the parameter and output shardings from the ``mhlo.sharding``
or ``sdy.sharding`` attributes of ``main`` (replicated where there are none). Where
``main`` has element types the interpreter's Python bindings cannot pass (complex
parameters; bf16, f8, sub-byte and complex results), a wrapper ``main`` converts them
(bitcast, convert, real/imag) around a call of the original.

Executing gathers each argument's global value from its shards, runs the interpreter
(one run at a time: the MLIR context is shared), and splits each result by its output
sharding. It is synchronous: the outputs are ready when ``execute`` returns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import threading
from typing import Any, Sequence

import numpy as np

from ifrtpy.array import Array
from ifrtpy.array_plans import check_of_client
from ifrtpy.backends import serialized
from ifrtpy.backends.host_arrays import check_layout, global_value, split
from ifrtpy.backends.reference.array import ReferenceArray
from ifrtpy.client import Compiler
from ifrtpy.device import DeviceList, MemoryKind
from ifrtpy.dtypes import DType
from ifrtpy.errors import (
    FailedPreconditionError, IfrtError, InternalError, InvalidArgumentError, UnimplementedError,
)
from ifrtpy.executable import (
    CompiledMemoryStats, CompileOptions, ExecuteOptions, ExecuteResult, LoadedExecutable,
    check_argument_placement, check_argument_value, program_layouts,
)
from ifrtpy.future import Future
from ifrtpy.sharding import HloSharding
from ifrtpy.layout import Layout
from ifrtpy.program import HloProgram, mlir
from ifrtpy.sharding import Sharding, SingleDeviceSharding

_MAGIC = b"IFRTPY-REFERENCE-EXECUTABLE-1\n"
_LOCK = threading.RLock()  # the MLIR context is shared: parse, rewrite and run one at a time
_ORIGINAL_MAIN = "__ifrtpy_original_main"

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
#: func (chlo, mhlo, ...) are refused too.
_NOT_INTERPRETED = frozenset("stablehlo." + name for name in (
    "batch_norm_grad", "batch_norm_inference", "batch_norm_training", "broadcast",
    "cholesky", "composite", "compute_reshape_shape", "create_token", "cross-replica-sum",
    "cstr_reshapable", "dot", "dynamic_broadcast_in_dim", "dynamic_conv", "dynamic_gather",
    "dynamic_iota", "dynamic_pad", "dynamic_reshape", "einsum", "fft",
    "get_dimension_size", "infeed", "outfeed", "real_dynamic_slice", "recv", "rng",
    "rng_bit_generator", "send", "set_dimension_size", "torch_index_select", "trace",
    "triangular_solve", "unary_einsum", "uniform_dequantize", "uniform_quantize",
))
_INTERPRETED_DIALECTS = ("stablehlo.", "func.")

# Result element types np.array() cannot read from an attribute: how the wrapper hands
# them over, and how the host turns them back.
_BITCAST = {"bf16": "i16", "f8E3M4": "i8", "f8E4M3": "i8", "f8E4M3FN": "i8",
            "f8E4M3B11FNUZ": "i8", "f8E4M3FNUZ": "i8", "f8E5M2": "i8", "f8E5M2FNUZ": "i8",
            "f8E8M0FNU": "i8"}
_CONVERT = {"i2": "i8", "i4": "i8", "ui2": "ui8", "ui4": "ui8", "f4E2M1FN": "f32"}
_COMPLEX_PARTS = {"complex<f32>": "f32", "complex<f64>": "f64"}


# -- compiling ----------------------------------------------------------------------------

def _walk(op, out: list) -> list:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                out.append(inner)
                _walk(inner.operation, out)
    return out


def _string(attr) -> str:
    from jaxlib.mlir import ir
    return ir.StringAttr(attr).value


def _functions(module) -> dict:
    from jaxlib.mlir import ir
    return {ir.StringAttr(op.attributes["sym_name"]).value: op
            for op in module.body.operations if op.operation.name == "func.func"}


def _meshes(module) -> dict:
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy
    return {ir.StringAttr(op.attributes["sym_name"]).value: sdy.MeshAttr(op.attributes["mesh"])
            for op in module.body.operations if op.operation.name == "sdy.mesh"}


def _check_and_strip(module, name: str) -> int:
    """Raise UnimplementedError for what cannot run on global values; erase sharding
    annotations (uses of their result take their operand). Returns the op count."""
    ops = _walk(module.operation, [])
    strip = []
    for op in ops:
        op_name = op.operation.name
        if op_name in _COLLECTIVES:
            raise UnimplementedError(
                f"{name}: the reference backend runs programs on global values and does not "
                f"run collectives ({op_name}, as in shard_map with psum)")
        if op_name == "sdy.manual_computation":
            raise UnimplementedError(
                f"{name}: the reference backend runs programs on global values and does not "
                "run manual SPMD regions (sdy.manual_computation, as from shard_map)")
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
                raise UnimplementedError(
                    f"{name}: the reference backend cannot run custom call {target!r}")
        elif op_name != "sdy.mesh" and (op_name in _NOT_INTERPRETED
                                        or not op_name.startswith(_INTERPRETED_DIALECTS)):
            raise UnimplementedError(
                f"{name}: the StableHLO reference interpreter does not run {op_name}")
    for op in strip:
        op.results[0].replace_all_uses_with(op.operands[0])
        op.operation.erase()
    return len(ops) - len(strip)


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
    if list(sharding.unreduced_axes):
        raise UnimplementedError("sdy.sharding with unreduced axes is not supported")
    dims = []
    for dim in sharding.dimension_shardings:
        axes = []
        for axis in sdy.DimensionShardingAttr(dim).axes:
            ref = sdy.AxisRefAttr(axis)
            if ref.sub_axis_info is not None:
                raise UnimplementedError(f"sdy.sharding with sub-axes is not supported: {attr}")
            axes.append(names.index(ref.name))
        dims.append(axes)
    used = [a for axes in dims for a in axes]
    if not used:
        return "{replicated}"
    rest = [a for a in range(len(names)) if a not in used]
    tiles = [math.prod(sizes[a] for a in axes) for axes in dims]
    replication = math.prod(sizes[a] for a in rest)
    grid = np.array(ids).reshape(sizes).transpose(used + rest).reshape(-1)
    shape = tiles + ([replication] if replication > 1 else [])
    suffix = " last_tile_dim_replicate" if replication > 1 else ""
    return (f"{{devices=[{','.join(map(str, shape))}]{','.join(map(str, grid.tolist()))}"
            f"{suffix}}}")


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


def _element(type_) -> str:
    from jaxlib.mlir import ir
    return str(ir.RankedTensorType(type_).element_type)


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
    encoders = ["complex" if _element(t) in _COMPLEX_PARTS else "hex" for t in inputs]
    decoders = []
    for t in results:
        element = _element(t)
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
            part = _retyped(t, _COMPLEX_PARTS[_element(t)])
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
        element, value = _element(t), names[i] if results else None
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


class _Interpretable:
    """A program prepared for the interpreter: the (re-parsed) module, and how to pass
    parameters and read results."""

    def __init__(self, text: str, encoders: list, decoders: list, program: HloProgram):
        self.text = text
        self.encoders = encoders
        self.decoders = decoders
        self.params = program.parameters
        self.results = program.results
        self._module = None

    def run(self, values: Sequence[np.ndarray]) -> list[np.ndarray]:
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import stablehlo
        with _LOCK, mlir.context(), ir.Location.unknown():
            if self._module is None:
                self._module = ir.Module.parse(self.text)
            args = []
            for value, param, how in zip(values, self.params, self.encoders):
                type_text = _tensor_text(param)
                if how == "complex":
                    part = type_text.replace("complex<f32>", "f32").replace("complex<f64>", "f64")
                    args += [_dense(np.ascontiguousarray(value.real), part),
                             _dense(np.ascontiguousarray(value.imag), part)]
                else:
                    args.append(_dense(value, type_text))
            try:
                outs = list(stablehlo.eval_module(self._module, args))
            except Exception as e:  # noqa: BLE001 - the interpreter raises RuntimeError
                raise InternalError(f"the StableHLO interpreter failed: {e}") from None
            results = []
            for result, how in zip(self.results, self.decoders):
                dims, dtype = tuple(result.shape.dims), result.dtype.to_numpy()
                if how == "complex":
                    re, im = _numpy(outs.pop(0), dims), _numpy(outs.pop(0), dims)
                    value = (re + 1j * im.astype(re.dtype)).astype(dtype)
                else:
                    raw = _numpy(outs.pop(0), dims)
                    value = (raw.view(dtype) if how == "bitcast" else raw.astype(dtype))
                results.append(np.ascontiguousarray(value).reshape(dims))
            return results


def _tensor_text(tensor_type) -> str:
    element = next(k for k, v in mlir.ELEMENT_TYPES.items() if v == tensor_type.dtype.kind)
    return "tensor<" + "".join(f"{d}x" for d in tensor_type.shape.dims) + element + ">"


def _dense(value: np.ndarray, type_text: str):
    from jaxlib.mlir import ir
    data = np.ascontiguousarray(value).tobytes().hex()
    return ir.Attribute.parse(f'dense<"0x{data}"> : {type_text}')


def _numpy(attr, dims: tuple) -> np.ndarray:
    if 0 in dims:
        return np.zeros(dims, _ATTR_DTYPES.get(_element(attr.type), np.float32))
    value = np.array(attr)
    if value.shape != dims:  # a splat holds one element
        value = np.broadcast_to(value.reshape(-1)[:1].reshape(()), dims)
    return value


_ATTR_DTYPES = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
                "i64": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
                "ui64": np.uint64, "f16": np.float16, "f32": np.float32, "f64": np.float64}


def _prepare(program: HloProgram, devices: DeviceList | None):
    """(interpretable, parameter shardings, output shardings, op count)."""
    from jaxlib.mlir import ir
    with _LOCK, mlir.context(), ir.Location.unknown():
        module = ir.Module.parse(program.text)
        main = _functions(module)["main"]
        if devices is None:
            params = outputs = None
        else:
            meshes = _meshes(module)
            params = _value_shardings(main, "arg_attrs", len(program.parameters), devices, meshes)
            outputs = _value_shardings(main, "res_attrs", len(program.results), devices, meshes)
        op_count = _check_and_strip(module, program.name)
        text, encoders, decoders = _wrap_main(module, main)
    return _Interpretable(text, encoders, decoders, program), params, outputs, op_count


def compile_program(client, program: Any, options: CompileOptions | None
                    ) -> ReferenceLoadedExecutable:
    program = program if isinstance(program, HloProgram) else HloProgram(program)
    options = options if options is not None else CompileOptions()
    if not isinstance(options, CompileOptions):
        raise InvalidArgumentError(f"expected CompileOptions, got {type(options).__name__}")
    if options.num_replicas != 1:
        raise UnimplementedError(
            f"the reference backend runs SPMD programs only (num_replicas=1), got "
            f"num_replicas={options.num_replicas}")
    if options.compile_portable_executable:
        devices = None
    elif options.devices is not None:
        devices = options.devices
        for device in devices:
            if device.client is not client:
                raise InvalidArgumentError(f"device {device} belongs to another client")
            if not device.is_addressable:
                raise UnimplementedError(
                    f"the reference backend runs programs on addressable devices only; "
                    f"{device} is not addressable")
        if len(set(map(id, devices))) != len(devices):
            raise InvalidArgumentError(f"devices {devices.to_string()} repeat a device")
    else:
        count = options.num_partitions
        available = client.addressable_devices()
        if count > len(available):
            raise InvalidArgumentError(
                f"the program needs {count} devices, the client has {len(available)} addressable")
        devices = DeviceList(available[:count])
    return ReferenceLoadedExecutable(client, program, devices, options)


def deserialize_executable(client, data: bytes, options: CompileOptions | None
                           ) -> ReferenceLoadedExecutable:
    text, device_ids, payload = serialized.unpack(_MAGIC, data, "reference-backend executable")
    program = HloProgram(text)
    layouts = _stored_layouts(payload)
    if options is not None and (options.devices is not None or options.compile_portable_executable):
        if options.argument_layouts is None and options.result_layouts is None:
            options = dataclasses.replace(options, **layouts)
        return compile_program(client, program, options)
    if device_ids is None:
        options = CompileOptions(compile_portable_executable=True, **layouts)
    else:
        devices = DeviceList([client.lookup_device(i) for i in device_ids])
        options = CompileOptions(devices=devices, num_partitions=len(devices), **layouts)
    return compile_program(client, program, options)


def _stored_layouts(payload: bytes) -> dict[str, list[Layout]]:
    """The compiled layouts ``serialize`` stored (none in bytes written before layouts)."""
    if not payload:
        return {}
    try:
        stored = json.loads(payload)
        return {name: [Layout(m2m) for m2m in stored[name]]
                for name in ("argument_layouts", "result_layouts")}
    except (ValueError, TypeError, KeyError, InvalidArgumentError) as e:
        raise InvalidArgumentError(f"corrupt serialized executable: its layouts: {e}") from None


class ReferenceCompiler(Compiler):
    """The reference client's compiler: HloPrograms (or anything HloProgram takes)."""

    def __init__(self, client):
        self._client = client

    def compile(self, program, options=None):
        return compile_program(self._client, program, options)

    def deserialize_loaded_executable(self, data, options=None):
        return deserialize_executable(self._client, data, options)


def _nbytes(tensor_types) -> int:
    return sum(t.dtype.to_numpy().itemsize * math.prod(t.shape.dims) for t in tensor_types)


def _layouts(options: CompileOptions, program: HloProgram) -> tuple[list[Layout], list[Layout]]:
    """The compiled layouts: those ``options`` ask for, row-major elsewhere."""
    layouts = program_layouts(options, program.parameters, program.results)
    compiled = []
    for values, asked in zip((program.parameters, program.results), layouts):
        chosen = []
        for i, value in enumerate(values):
            layout = asked[i] if asked is not None else None
            check_layout(layout, len(value.shape.dims))
            chosen.append(layout if layout is not None else Layout.row_major(len(value.shape.dims)))
        compiled.append(chosen)
    return compiled[0], compiled[1]


class ReferenceLoadedExecutable(LoadedExecutable):
    """A program prepared for the StableHLO interpreter, bound to a client's devices (or
    portable: ``devices()`` is None and execute names the device)."""

    def __init__(self, client, program: HloProgram, devices: DeviceList | None,
                 options: CompileOptions):
        self._client = client
        self._program = program
        self._devices = devices
        self._options = options
        self._interpretable, self._params, self._outputs, self._op_count = _prepare(program, devices)
        self._parameter_layouts, self._output_layouts = _layouts(options, program)
        self._deleted = False

    @property
    def client(self):
        return self._client

    @property
    def name(self) -> str:
        return self._program.name

    def devices(self) -> DeviceList | None:
        return self._devices

    def addressable_devices(self):
        return [] if self._devices is None else list(self._devices)

    def parameter_shardings(self):
        return None if self._params is None else list(self._params)

    def output_shardings(self):
        return None if self._outputs is None else list(self._outputs)

    def output_dtypes(self):
        return [r.dtype for r in self._program.results]

    def output_shapes(self):
        return [r.shape for r in self._program.results]

    def parameter_dtypes(self):
        return [p.dtype for p in self._program.parameters]

    def parameter_shapes(self):
        return [p.shape for p in self._program.parameters]

    def output_memory_kinds(self) -> list[str]:
        if self._outputs is None:
            return ["device"] * len(self._program.results)
        return [str(s.memory_kind) for s in self._outputs]

    def parameter_layouts(self) -> list[Layout]:
        """The layouts compiled for (the reference reads arguments of any layout)."""
        return list(self._parameter_layouts)

    def output_layouts(self) -> list[Layout]:
        """The layouts compiled for; the outputs' shards hold their data in them."""
        return list(self._output_layouts)

    def donatable_input_indices(self) -> frozenset[int]:
        return self._program.donated_inputs

    @property
    def fingerprint(self) -> str:
        ids = None if self._devices is None else [d.id for d in self._devices]
        return hashlib.sha256(json.dumps([self._program.text, ids]).encode()).hexdigest()

    def serialize(self) -> bytes:
        ids = None if self._devices is None else [d.id for d in self._devices]
        layouts = json.dumps({
            "argument_layouts": [layout.minor_to_major for layout in self._parameter_layouts],
            "result_layouts": [layout.minor_to_major for layout in self._output_layouts]})
        return serialized.pack(_MAGIC, self._program.text, ids, layouts.encode())

    def compiled_memory_stats(self) -> CompiledMemoryStats:
        args, outs = _nbytes(self._program.parameters), _nbytes(self._program.results)
        return CompiledMemoryStats(argument_size_in_bytes=args, output_size_in_bytes=outs,
                                   peak_memory_in_bytes=args + outs)

    def cost_analysis(self) -> dict[str, Any]:
        """Rough: the op count of the program and the bytes it reads and writes."""
        return {"ops": float(self._op_count),
                "bytes accessed": float(_nbytes(self._program.parameters)
                                        + _nbytes(self._program.results))}

    def program_text(self, optimized: bool = False) -> str:
        """The StableHLO program; the interpreter runs it as it is, so the optimized
        program is the same text."""
        return self._program.text

    def delete(self) -> Future[None]:
        self._deleted = True
        return Future.ready(None)

    def is_deleted(self) -> bool:
        return self._deleted

    # -- execution ------------------------------------------------------------------------

    def execute(self, args: Sequence[Array], options: ExecuteOptions | None = None,
                devices: DeviceList | None = None) -> ExecuteResult:
        if self._deleted:
            raise FailedPreconditionError(f"executable {self.name!r} has been deleted")
        options = options if options is not None else ExecuteOptions()
        args = list(args)
        if self._devices is None:
            if devices is None or len(devices) != 1:
                raise InvalidArgumentError(
                    f"{self.name} is a portable executable: execute it with devices= one device")
            device = devices[0]
            if device.client is not self._client or not device.is_addressable:
                raise InvalidArgumentError(f"device {device} is not an addressable device of "
                                           "this client")
            params = [SingleDeviceSharding(device)] * len(self._program.parameters)
            outputs = [SingleDeviceSharding(device)] * len(self._program.results)
        else:
            if devices is not None and DeviceList(devices) != self._devices:
                raise InvalidArgumentError(
                    f"{self.name} is compiled for {self._devices.to_string()}; execute got "
                    f"{DeviceList(devices).to_string()}")
            params, outputs = self._params, self._outputs
        self._check_arguments(args, params)
        values = [global_value(a) for a in args]
        donated = self._program.donated_inputs - options.non_donatable_input_indices
        for i in sorted(donated):
            if i < len(args):
                args[i].delete()
        client, results = self._client, self._program.results
        try:
            out_values = self._interpretable.run(values)
        except IfrtError as e:
            arrays = [ReferenceArray(client, r.dtype, r.shape, s, (), e)
                      for r, s in zip(results, outputs)]
            return ExecuteResult(Future.failed(e) if options.fill_status else None, arrays)
        arrays = [ReferenceArray(client, r.dtype, r.shape, s, split(v, s, r.shape, layout))
                  for r, s, v, layout in zip(results, outputs, out_values, self._output_layouts)]
        return ExecuteResult(Future.ready(None) if options.fill_status else None, arrays)

    def _check_arguments(self, args: list, shardings: list) -> None:
        params = self._program.parameters
        if len(args) != len(params):
            raise InvalidArgumentError(f"{self.name} takes {len(params)} arguments, got {len(args)}")
        for i, (arg, param, sharding) in enumerate(zip(args, params, shardings)):
            check_of_client(self._client, arg, f"argument {i} of {self.name}", ReferenceArray)
            if arg.dtype.kind == DType.Kind.STRING:
                raise UnimplementedError(
                    f"argument {i} of {self.name} is a STRING array; XLA programs cannot take strings")
            check_argument_value(self.name, i, arg, param)
            check_argument_placement(self.name, i, arg, param, sharding)
