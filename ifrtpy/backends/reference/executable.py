"""ReferenceCompiler and ReferenceLoadedExecutable: StableHLO run by the StableHLO
reference interpreter (``jaxlib.mlir.dialects.stablehlo.eval_module``) on global values
(the program is prepared by :mod:`.rewrite`, run by :mod:`.interpreter`).

"Compiling" parses the program, checks it has nothing the backend cannot run (collectives
of an SPMD program outside manual computations, custom calls other than sharding
annotations and jaxlib's LAPACK kernels: UnimplementedError), cuts it around the
ops :mod:`.kernels` computes (:mod:`.stages`), drops the sharding annotations (they are identities
on global values) and reads the parameter and output shardings from the ``mhlo.sharding``
or ``sdy.sharding`` attributes of ``main`` (after Shardy's propagation; replicated where
there are none). Where
``main`` has element types the interpreter's Python bindings cannot pass (complex
parameters; bf16, f8, sub-byte and complex results), a wrapper ``main`` converts them
(bitcast, convert, real/imag) around a call of the original.

Executing gathers each argument's global value from its shards (an argument with
unreduced axes: its partial values reduced, :mod:`.partials`), runs the interpreter
in a worker process (:mod:`.pool`: the GIL is not held meanwhile, and executes from
several threads run at once), and splits each result by its output
sharding (into partial values along unreduced axes). A program over replicas (:mod:`.replicas`) runs instead on each device's shard,
its replica's value, and each result's shard on a device is that replica's value. It is
synchronous: the outputs are ready when ``execute`` returns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

from ifrtpy.backends import serialized
from ifrtpy.backends.host_arrays import check_layout, split
from ifrtpy.backends.reference import partials, rewrite
from ifrtpy.backends.reference.array import ReferenceArray
from ifrtpy.backends.reference.replicas import ReplicatedProgram
from ifrtpy.client import Compiler
from ifrtpy.device import DeviceList
from ifrtpy.errors import IfrtError, InvalidArgumentError, UnimplementedError
from ifrtpy.execute_checks import CheckedExecute, ExecuteContract
from ifrtpy.executable import CompiledMemoryStats, ExecuteResult, LoadedExecutable
from ifrtpy.executable_options import CompileOptions, program_layouts
from ifrtpy.future import Future
from ifrtpy.layout import Layout
from ifrtpy.program import HloProgram
from ifrtpy.sharding import SingleDeviceSharding
from ifrtpy.user_context import current_user_context

_MAGIC = b"IFRTPY-REFERENCE-EXECUTABLE-1\n"


def compile_program(client, program: Any, options: CompileOptions | None
                    ) -> ReferenceLoadedExecutable:
    program = program if isinstance(program, HloProgram) else HloProgram(program)
    options = options if options is not None else CompileOptions()
    if not isinstance(options, CompileOptions):
        raise InvalidArgumentError(f"expected CompileOptions, got {type(options).__name__}")
    devices = options.resolve_devices(client)
    for device in devices or ():
        if not device.is_addressable:
            raise UnimplementedError(
                f"the reference backend runs programs on addressable devices only; "
                f"{device} is not addressable")
    return ReferenceLoadedExecutable(client, program, devices, options)


def deserialize_executable(client, data: bytes, options: CompileOptions | None
                           ) -> ReferenceLoadedExecutable:
    text, device_ids, payload = serialized.unpack(_MAGIC, data, "reference-backend executable")
    program = HloProgram(text)
    layouts = _stored_layouts(payload)
    replicas = _stored_replicas(payload, device_ids)
    if options is not None and (options.devices is not None or options.compile_portable_executable):
        if options.argument_layouts is None and options.result_layouts is None:
            options = dataclasses.replace(options, **layouts)
        return compile_program(client, program, options)
    if device_ids is None:
        options = CompileOptions(compile_portable_executable=True, **layouts)
    else:
        devices = DeviceList([client.lookup_device(i) for i in device_ids])
        options = CompileOptions(devices=devices, num_replicas=replicas,
                                 num_partitions=len(devices) // replicas, **layouts)
    return compile_program(client, program, options)


def _stored_replicas(payload: bytes, device_ids) -> int:
    """The number of replicas ``serialize`` stored (1 in bytes written before replicas)."""
    replicas = json.loads(payload).get("num_replicas", 1) if payload else 1
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1 or (
            device_ids is not None and len(device_ids) % replicas):
        raise InvalidArgumentError(f"corrupt serialized executable: num_replicas {replicas!r} "
                                   f"for {len(device_ids or [1])} devices")
    return replicas


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
    """The compiled layouts: those ``options`` ask for, else those the program names
    (``layout_modes``: a layout, or ``"default"`` or ``"auto"``), row-major elsewhere."""
    layouts = program_layouts(options, program.parameters, program.results)
    compiled = []
    for values, asked, modes in zip((program.parameters, program.results), layouts,
                                    program.layout_modes):
        chosen = []
        for i, value in enumerate(values):
            layout = asked[i] if asked is not None else None
            if layout is None and modes[i] not in (None, "default", "auto"):
                layout = Layout.parse(modes[i])
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
        self._interpretable, self._params, self._outputs, self._op_count = rewrite.prepare(
            program, devices, options.num_replicas, options.num_partitions)
        self._parameter_layouts, self._output_layouts = _layouts(options, program)
        self._deleted = False
        self._user_context = current_user_context()
        self._execute_contract = ExecuteContract(
            program.name, client, ReferenceArray, program.parameters, self._params,
            program.results, self._outputs, program.donated_inputs)

    @property
    def client(self):
        return self._client

    @property
    def user_context(self):
        return self._user_context

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
        key = [self._program.text, ids, self._options.num_replicas]
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()

    def serialize(self) -> bytes:
        ids = None if self._devices is None else [d.id for d in self._devices]
        layouts = json.dumps({
            "argument_layouts": [layout.minor_to_major for layout in self._parameter_layouts],
            "result_layouts": [layout.minor_to_major for layout in self._output_layouts],
            "num_replicas": self._options.num_replicas})
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

    def _launch(self, call: CheckedExecute) -> ExecuteResult:
        args, options, outputs = call.args, call.options, call.output_shardings
        runner = self._interpretable
        over_replicas = isinstance(runner, ReplicatedProgram)  # each device its replica's values
        values = [a.shards if over_replicas else partials.argument_value(a) for a in args]
        for i in sorted(call.donated):
            args[i].delete()
        client, results = self._client, self._program.results
        try:
            out_values = runner.run(values)
        except IfrtError as e:
            arrays = [ReferenceArray(client, r.dtype, r.shape, s, (), e)
                      for r, s in zip(results, outputs)]
            return ExecuteResult(Future.failed(e) if options.fill_status else None, arrays)
        if over_replicas:  # one value per replica, each on its device
            arrays = [ReferenceArray(client, r.dtype, r.shape, s, tuple(
                split(v, SingleDeviceSharding(d), r.shape, layout)[0]
                for v, d in zip(vs, s.devices)), layout=layout)
                for r, s, vs, layout in zip(results, outputs, out_values, self._output_layouts)]
        else:
            arrays = [ReferenceArray(client, r.dtype, r.shape, s,
                                     partials.result_shards(v, s, r.shape, layout), layout=layout)
                      for r, s, v, layout in zip(results, outputs, out_values, self._output_layouts)]
        return ExecuteResult(Future.ready(None) if options.fill_status else None, arrays)

