"""The executable requests of a session (compile, metadata, execute, cost analysis,
program text, deletion) and the client-level queries (default device assignment and
layout), on ifrtpy's public ``Client`` / ``LoadedExecutable`` interfaces."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

from ifrtpy import ffi
from ifrtpy.device import DeviceList
from ifrtpy.errors import InvalidArgumentError, UnimplementedError
from ifrtpy.executable import CompileOptions, ExecuteOptions
from ifrtpy._xla import varint_bytes
from ifrtpy.future import Future, join_futures
from ifrtpy.program import HloProgram
from ifrtpy.proxy import wire
from ifrtpy.proxy._protocol import message_class, messages
from ifrtpy.proxy.kind import Kind, Later
from ifrtpy.proxy.tokens import Signature, Token

__all__ = ["KINDS", "XLA_CUSTOM_CALLS", "PLATFORM_CUSTOM_CALLS", "JAX_CUSTOM_CALLS"]

_XLA_PROGRAM = "xla::ifrt::XlaProgram"
_XLA_OPTIONS = "xla::ifrt::XlaCompileOptions"

#: Custom-call targets XLA itself implements (partitioner, placement and layout
#: annotations, ops it translates): every backend compiles them without a registered handler.
XLA_CUSTOM_CALLS = frozenset({
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "annotate_device_placement",
    "MoveToHost", "MoveToDevice", "LayoutConstraint", "X64Combine", "X64SplitLow",
    "X64SplitHigh", "TopK", "ApproxTopK", "PartialReduce", "ShardBarrierFrom",
    "ShardBarrierTo", "local_sharding", "xla.sdy.GlobalToLocalShape",
    "xla.sdy.LocalToGlobalShape", "xla.sdy.FuncResultSharding", "Cholesky",
    "ragged_all_to_all",
})

#: Targets the compiler of one platform implements, which jax lowers to there: on a TPU,
#: Pallas kernels, linear algebra (``eigh``, ``qr``, ``svd``, ``lu``) and ``lax.empty``.
PLATFORM_CUSTOM_CALLS = {
    "tpu": frozenset({"tpu_custom_call", "Eigh", "Qr", "ProductOfElementaryHouseholderReflectors",
                      "LuDecomposition", "AllocateBuffer"}),
}

#: jax's own runtime targets that ifrtpy's backends serve themselves (``lax.dce_sink``:
#: the PjRt backend with a handler of its own, the jax backend with jax's runtime).
JAX_CUSTOM_CALLS = frozenset({"dce_sink"})


@dataclasses.dataclass
class Compiled:
    """An executable of a session with the program it was compiled from and where its
    ``main`` has tokens (``signature``: the client counts them, the executable does not);
    of the inputs the backend would donate, those the compiled code takes (``donated``)
    and the others (``kept``: each execute keeps them from the backend's donation), by the
    executable's indices."""

    executable: Any
    program: HloProgram
    signature: Signature
    donated: frozenset[int]
    kept: frozenset[int]
    #: what executes reuse, per device list: each output's part of the answer up to its
    #: handle (see _output_heads)
    output_heads: dict[tuple | None, list[bytes]] = dataclasses.field(default_factory=dict)

    @property
    def always_fills_status(self) -> bool:
        """Whether every execute fills its status: a program returning tokens, or nothing,
        has nothing else that tells when it ends."""
        return bool(self.signature.token_results) or not self.signature.num_results


def _compiled(executable: Any, program: HloProgram) -> Compiled:
    try:
        marked = frozenset(executable.donatable_input_indices())
    except UnimplementedError:
        marked = program.donated_inputs
    signature = Signature.of(program)
    donated = _aliased_inputs(executable, signature, marked)
    return Compiled(executable, program, signature, donated, marked - donated)


def _aliased_inputs(executable: Any, signature: Signature,
                    marked: frozenset[int]) -> frozenset[int]:
    """The inputs of ``marked`` the compiler aliased to an output (``jax.buffer_donor``
    leaves that choice to it), as the optimized module's ``input_output_alias`` says (its
    parameter numbers count ``main``'s tokens): only those are donated. A backend without
    optimized modules donates every marked input."""
    if not marked:
        return marked
    try:
        module = executable.hlo_modules()[0]
    except (UnimplementedError, IndexError):
        return marked
    proto = message_class("xla.HloModuleProto").FromString(
        module.as_serialized_hlo_module_proto())
    aliased = {signature.array_index(entry.parameter_number)
               for entry in proto.input_output_alias.entries}
    return marked & aliased


# -- compile -----------------------------------------------------------------------------

def _compile_options(session: Any, serialized: Any) -> CompileOptions:
    if serialized.type_name != _XLA_OPTIONS:
        raise UnimplementedError(
            f"Compile: compile options of type {serialized.type_name!r} are not served "
            f"(served: {_XLA_OPTIONS})")
    proto = wire.parse(messages().XlaCompileOptionsProto, serialized.data,
                       "Compile's compile options").compile_options
    build = proto.executable_build_options
    replicas = build.num_replicas or 1
    partitions = build.num_partitions or 1
    devices = None
    if build.HasField("device_assignment"):
        devices = _assigned_devices(session, build.device_assignment, replicas, partitions)
    portable = proto.compile_portable_executable
    return CompileOptions(
        devices=None if portable else devices, num_replicas=replicas,
        num_partitions=partitions, use_spmd_partitioning=build.use_spmd_partitioning,
        use_shardy_partitioner=build.use_shardy_partitioner,
        compile_portable_executable=portable,
        env_option_overrides=_option_overrides(proto.env_option_overrides))


def _option_overrides(overrides: Any) -> dict[str, Any]:
    """The ``compiler_options`` jax sends (``env_option_overrides``: XLA flags and debug
    options by name), for the backend's compiler to apply or refuse."""
    values = {}
    for name, value in overrides.items():
        kind = value.WhichOneof("value")
        if kind is None:
            raise InvalidArgumentError(f"Compile: compile option {name!r} has no value")
        values[name] = getattr(value, kind)
    return values


def _assigned_devices(session: Any, assignment: Any, replicas: int, partitions: int) -> DeviceList:
    if (assignment.replica_count, assignment.computation_count) != (replicas, partitions) or len(
            assignment.computation_devices) != partitions:
        raise InvalidArgumentError(
            f"Compile: the device assignment is {assignment.replica_count} x "
            f"{assignment.computation_count} for {replicas} replicas x {partitions} partitions")
    ids = []
    for replica in range(replicas):
        for partition in range(partitions):
            column = assignment.computation_devices[partition].replica_device_ids
            if len(column) != replicas:
                raise InvalidArgumentError(
                    f"Compile: partition {partition} of the device assignment names "
                    f"{len(column)} devices for {replicas} replicas")
            ids.append(column[replica])
    return wire.devices_of(session.client, ids, "Compile's device assignment")


def _check_host_transfers(program: HloProgram) -> None:
    """UnimplementedError naming the host transfers of ``program``: a run of it would wait
    forever for a host feeding or draining them (the server has none)."""
    if program.host_transfers:
        raise UnimplementedError(
            f"Compile: the program has {', '.join(sorted(program.host_transfers))}, which "
            "wait for the host to feed or drain them; the ifrtpy proxy has no infeed, outfeed "
            "or host send/recv, so a run would never finish")


def _check_custom_calls(session: Any, program: HloProgram) -> None:
    """UnimplementedError naming the custom-call targets of ``program`` that nothing in
    this server provides for its platform: a client may call only what the compilers, jax's
    runtime targets, jaxlib's kernels and the targets registered in this process
    (``ifrt.ffi.register_ffi_target``) provide. The backend runs or refuses the others."""
    platform = session.client.platform_name
    targets = (program.custom_call_targets - XLA_CUSTOM_CALLS - JAX_CUSTOM_CALLS
               - PLATFORM_CUSTOM_CALLS.get(platform, frozenset()))
    if not targets:
        return
    known: set[str] = set(ffi.registered_targets(platform)) if platform in ffi.PLATFORMS else set()
    if platform in ffi.PLATFORMS:
        known |= set(ffi.jaxlib_kernels(platform))
    unknown = sorted(targets - known)
    if unknown:
        raise UnimplementedError(
            f"Compile: the program calls custom-call targets {unknown} that this server has "
            f"not registered for platform {platform!r}")


#: Why programs with host callbacks are refused: the server would hand each call to the
#: client, and jaxlib's proxy client (jaxlib 0.10 to 0.12, as published) runs none.
CLIENT_RUNS_NO_CALLBACKS = (
    "jaxlib's proxy client answers every call of one with 'UNIMPLEMENTED: "
    "ExecuteLoadedHostCallback is unsupported.' (its published builds leave the callback "
    "runner out), so the program could not finish")


def compile_program(session: Any, request: Any) -> Any:
    if request.host_callbacks:
        raise UnimplementedError(
            f"Compile: the program has {len(request.host_callbacks)} host callbacks "
            "(jax.debug.print, pure_callback, io_callback); the ifrtpy proxy refuses them: "
            f"{CLIENT_RUNS_NO_CALLBACKS}")
    if request.program.type_name != _XLA_PROGRAM:
        raise UnimplementedError(
            f"Compile: programs of type {request.program.type_name!r} are not served "
            f"(served: {_XLA_PROGRAM})")
    options = _compile_options(session, request.compile_options)
    program = HloProgram(bytes(request.program.data))
    _check_host_transfers(program)
    _check_custom_calls(session, program)
    executable = session.client.compile(program, options)
    handle = session.put_executable(_compiled(executable, program))
    m = messages()
    response = m.CompileResponse(loaded_executable_handle=handle, name=executable.name,
                                 num_devices=executable.num_devices)
    devices = executable.devices()
    if devices is not None:
        response.device_ids.extend(d.id for d in devices)
    response.addressable_device_ids.extend(d.id for d in executable.addressable_devices())
    fingerprint = executable.fingerprint
    if fingerprint is not None:
        response.fingerprint_value = fingerprint.encode()
    else:
        response.fingerprint_error.CopyFrom(
            wire.status_proto(UnimplementedError("the executable has no fingerprint")))
    response.ready_future_handle = session.put_future(0, Future.ready())
    return response


# -- metadata ----------------------------------------------------------------------------

def _call(what: Any) -> tuple[Any, BaseException | None]:
    try:
        return what(), None
    except Exception as error:  # noqa: BLE001 - reported in the response's error field
        return None, error


def _layouts(what: str, tokens: frozenset[int], query: Any) -> tuple[Any, BaseException | None]:
    """The executable's layouts of its parameters or outputs, or the error answering for
    them: as PjRt, none where ``main`` has tokens there (a token has no layout)."""
    if tokens:
        return None, UnimplementedError(
            f"the program's main has !stablehlo.token {what} (at {sorted(tokens)}), which have "
            "no layout")
    return _call(query)


def metadata(session: Any, request: Any) -> Any:
    """The executable's shardings, layouts, memory kinds and donated inputs, one per
    parameter or result of ``main`` (a token: replicated, in the device's default memory,
    no layout, as jax's PjRt client reports it)."""
    compiled = session.executable(request.loaded_executable_handle)
    exe, program, signature = compiled.executable, compiled.program, compiled.signature
    m = messages()
    response = m.LoadedExecutableMetadataResponse()

    def replicated() -> Any:
        return m.OpSharding(type=m.OpSharding.Type.Value("REPLICATED"))

    parameters = exe.parameter_shardings()
    if parameters is not None:
        shardings = [wire.op_sharding_bytes(s, p.shape.dims)
                     for s, p in zip(parameters, program.parameters)]
        response.parameter_shardings.shardings.extend(signature.parameters(shardings, replicated))
    outputs = exe.output_shardings()
    if outputs is not None:
        shardings = [wire.op_sharding_bytes(s, shape.dims)
                     for s, shape in zip(outputs, exe.output_shapes())]
        response.output_shardings.shardings.extend(signature.results(shardings, replicated))
    layouts, error = _layouts("parameters", signature.token_parameters, exe.parameter_layouts)
    if error is None:
        response.parameter_layouts_list.layouts.extend(
            wire.xla_layout_proto(l, len(p.shape.dims)) for l, p in zip(layouts, program.parameters))
    else:
        response.parameter_layouts_error.CopyFrom(wire.status_proto(error))
    layouts, error = _layouts("results", signature.token_results, exe.output_layouts)
    if error is None:
        response.output_layouts_list.layouts.extend(
            wire.xla_layout_proto(l, len(s.dims)) for l, s in zip(layouts, exe.output_shapes()))
    else:
        response.output_layouts_error.CopyFrom(wire.status_proto(error))
    def default_kind() -> str:
        devices = exe.addressable_devices() or session.client.addressable_devices()
        return str(devices[0].default_memory().kind)

    response.output_memory_kinds.memory_kind_lists.add(memory_kinds=signature.results(
        [str(k) for k in exe.output_memory_kinds()], default_kind))
    response.donated_input_indices.donated_input_indices.extend(
        signature.main_parameters(compiled.donated))
    stats, error = _call(exe.compiled_memory_stats)
    if error is None:
        cls = message_class("xla.CompiledMemoryStatsProto")
        known = cls.DESCRIPTOR.fields_by_name  # jaxlib versions differ in these fields
        proto = cls(**{f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)
                       if f.name in known})
        response.compiled_memory_stats.CopyFrom(proto)
        response.size_of_generated_code_in_bytes = stats.generated_code_size_in_bytes
    else:
        response.compiled_memory_stats_error.CopyFrom(wire.status_proto(error))
    return response


def cost_analysis(session: Any, request: Any) -> Any:
    exe = session.executable(request.loaded_executable_handle).executable
    response = messages().LoadedExecutableCostAnalysisResponse()
    costs, error = _call(exe.cost_analysis)
    if error is None:
        response.attributes.CopyFrom(wire.attribute_map(costs))
    else:
        response.status.CopyFrom(wire.status_proto(error))
    return response


def program_text(session: Any, request: Any) -> Any:
    """What the compiler made of the program (jax's ``compiled.as_text()``, as IFRT's PjRt
    executables answer), or the program itself where the backend cannot tell."""
    exe = session.executable(request.loaded_executable_handle).executable
    response = messages().LoadedExecutableHumanReadableProgramTextResponse()
    text, error = _call(lambda: exe.program_text(optimized=True))
    if isinstance(error, UnimplementedError):
        text, error = _call(exe.program_text)
    if error is None:
        response.human_readable_program_text = text
    else:
        response.status.CopyFrom(wire.status_proto(error))
    return response


def mpmd_metadata(session: Any, request: Any) -> Any:
    session.executable(request.mpmd_loaded_executable_handle)
    response = messages().LoadedExecutableMpmdMetadataResponse()
    response.mpmd_compiled_memory_stats_error.CopyFrom(wire.status_proto(
        UnimplementedError("LoadedExecutableMpmdMetadata: the executable is not an MPMD one")))
    return response


def mpmd_cost_analysis(session: Any, request: Any) -> Any:
    session.executable(request.loaded_executable_handle)
    response = messages().LoadedExecutableMpmdCostAnalysisResponse()
    response.status.CopyFrom(wire.status_proto(
        UnimplementedError("LoadedExecutableMpmdCostAnalysis: the executable is not an MPMD one")))
    return response


# -- execute -----------------------------------------------------------------------------

def _execute_options(proto: Any, compiled: Compiled) -> ExecuteOptions:
    """The request's options, keeping the inputs the compiled code does not take (made
    per call: jax sends a new ``launch_id`` with each), asking for the status where the
    request or the program needs it."""
    kept = compiled.kept
    named = proto.non_donatable_input_indices
    if named:
        signature = compiled.signature
        for i in named:
            if not 0 <= i < signature.num_parameters:
                raise InvalidArgumentError(
                    f"Execute: non_donatable_input_indices names argument {i}; the program's "
                    f"main takes {signature.num_parameters}")
        kept = kept | {index for index in map(signature.array_index, named) if index is not None}
    return ExecuteOptions(launch_id=proto.launch_id, non_donatable_input_indices=kept,
                          fill_status=proto.fill_status or compiled.always_fills_status,
                          execution_stream_id=proto.execution_stream_id)


#: ``LoadedExecutableExecuteResponse`` is written by hand: ``status_handle=1:fixed64``,
#: then per output ``outputs=2:message`` holding the output's dtype, shape and sharding
#: and ``array_handle=4:fixed64`` (the numbers checked against jaxlib's by
#: ifrtpy.proxy.fields).
_U64 = struct.Struct("<Q")
_STATUS_HANDLE, _OUTPUT, _ARRAY_HANDLE = b"\x09", b"\x12", b"\x21"


def _output_heads(compiled: Compiled, outputs: list[Any], devices: Any) -> list[bytes]:
    """Each output's part of the answer up to its handle's 8 bytes: an executable's are
    the same on every run on the same devices, so they are made once."""
    key = None if devices is None else tuple(d.id for d in devices)
    heads = compiled.output_heads.get(key)
    if heads is None:
        m = messages()
        heads = []
        for a in outputs:
            spec = m.LoadedExecutableExecuteResponse.Output(
                dtype=wire.dtype_to_proto(a.dtype), shape=m.ShapeProto(dims=a.shape.dims),
                sharding=wire.sharding_to_proto(a.sharding, a.shape.dims)).SerializeToString()
            heads.append(_OUTPUT + varint_bytes(len(spec) + 9) + spec + _ARRAY_HANDLE)
        compiled.output_heads[key] = heads
    return heads


def execute(session: Any, request: Any) -> Any:
    """Run an executable. Outputs (and, with ``fill_status``, the status future) go under
    the handles the client minted, or under new ones reported with their specs (the
    client's first execute of an executable)."""
    compiled = session.executable(request.loaded_executable_handle)
    exe, signature = compiled.executable, compiled.signature
    args = signature.arguments(session.values_of(request.args_handles))
    devices = None  # the request's devices run a portable executable; others have their own
    if request.device_ids:
        named = wire.devices_of(session.client, request.device_ids, "Execute's device_ids")
        devices = named if exe.devices() is None else None
    options = _execute_options(request.execute_options, compiled)
    filled = request.execute_options.fill_status
    # every handle is checked (and room made sure of) before the run donates anything
    handles = session.result_handles(request.result_array_handle, signature.num_results)
    status = session.result_handle(request.result_status_handle) if filled else 0
    session.check_room(len(handles) + 1)
    result = exe.execute(args, options, devices)
    outputs = result.outputs
    if signature.token_results:
        ran_on = devices or exe.devices() or DeviceList(exe.addressable_devices()[:1])
        outputs = signature.results(outputs, lambda: Token(ran_on, result.status))
    session.put_arrays(handles, outputs)
    answer = []
    if filled:
        session.put_future(status, result.status)
        if not request.result_status_handle:
            answer.append(_STATUS_HANDLE + _U64.pack(status))
    for handle, head in zip(handles, _output_heads(compiled, outputs, devices)):
        answer += (head, _U64.pack(handle))
    return b"".join(answer)


def fetch_execute_result(session: Any, request: Any) -> Later:
    """Answer when the execution's status future completes (and forget the future)."""
    return Later(session.take_future(request.result_status_handle),
                 bytes)  # an empty LoadedExecutableFetchExecuteResultResponse


# -- lifetime ----------------------------------------------------------------------------

def delete_executable(session: Any, request: Any) -> Any:
    exe = session.executable(request.loaded_executable_handle).executable
    handle = session.put_future(0, exe.delete())
    return messages().LoadedExecutableDeleteResponse(future_handle=handle)


def is_executable_deleted(session: Any, request: Any) -> Any:
    exe = session.executable(request.loaded_executable_handle).executable
    return messages().LoadedExecutableIsDeletedResponse(is_deleted=exe.is_deleted())


def destruct_executable(session: Any, request: Any) -> Any:
    session.executables.pop(request.loaded_executable_handle, None)
    return messages().LoadedExecutableDestructResponse()


def host_callback(session: Any, request: Any) -> Any:
    raise UnimplementedError("the ifrtpy proxy compiles no host callbacks, so it has none to "
                             "poll or return")


# -- client queries ----------------------------------------------------------------------

def default_device_assignment(session: Any, request: Any) -> Any:
    ids = session.client.default_device_assignment(int(request.num_replicas),
                                                   int(request.num_partitions))
    assignment = message_class("xla.DeviceAssignmentProto")(
        replica_count=ids.shape[0], computation_count=ids.shape[1])
    for partition in range(ids.shape[1]):
        assignment.computation_devices.add(replica_device_ids=[int(i) for i in ids[:, partition]])
    return messages().GetDefaultDeviceAssignmentResponse(device_assignment=assignment)


def default_layout(session: Any, request: Any) -> Any:
    dtype = wire.dtype_from_proto(request.dtype)
    dims = wire.array_shape(dtype, request.dims, "GetDefaultLayout's dims")
    device = wire.device_of(session.client, request.device_id, "GetDefaultLayout")
    kind = request.memory_kind or None
    device.memory(kind)  # InvalidArgumentError naming the device's kinds where it has none
    layout = session.client.get_default_layout(dtype, dims, device, kind)
    return messages().GetDefaultLayoutResponse(serialized_pjrt_layout=wire.layout_text(layout))


def cancel_execution(session: Any, request: Any) -> Any:
    raise UnimplementedError(
        "CancelExecution is not served by the ifrtpy proxy: the backends it serves cannot "
        "stop an execution they have started (a session's programs end with the session: "
        "disconnect to stop the reference backend's)")


def deserialize_executable(session: Any, request: Any) -> Any:
    raise UnimplementedError(
        "DeserializeLoadedExecutable is not served by the ifrtpy proxy: it loads no "
        "serialized executables (their format is the runtime's that made them); send the "
        "program to compile instead")


#: The request kinds of this module (see :class:`~ifrtpy.proxy.session.Kind`).
KINDS = {
    "compile_request": Kind(compile_program, 13),
    "loaded_executable_metadata_request": Kind(metadata, 14),
    "loaded_executable_cost_analysis_request": Kind(cost_analysis, 28),
    "loaded_executable_human_readable_program_text_request": Kind(program_text, 29),
    "loaded_executable_mpmd_metadata_request": Kind(mpmd_metadata, 30),
    "loaded_executable_mpmd_cost_analysis_request": Kind(mpmd_cost_analysis, 31),
    "loaded_executable_execute_request":
        Kind(execute, 15, ("result_array_handle", "result_status_handle")),
    "loaded_executable_fetch_execute_result_request":
        Kind(fetch_execute_result, 32),
    "loaded_executable_delete_request": Kind(delete_executable, 16),
    "loaded_executable_is_deleted_request": Kind(is_executable_deleted, 17),
    "loaded_executable_destruct_request": Kind(destruct_executable, 18),
    "loaded_host_callback_poll_request": Kind(host_callback, 21),
    "loaded_host_callback_return_request": Kind(host_callback, 22),
    "get_default_device_assignment_request": Kind(default_device_assignment, 19),
    "get_default_layout_request": Kind(default_layout, 27),
}

#: Kinds that newer jaxlibs' protocols have (0.12.1), refused by name: served where the
#: installed jaxlib's ``IfrtRequest`` has them.
NEWER_KINDS = {
    "cancel_execution_request": Kind(cancel_execution, 35),
    "deserialize_loaded_executable_request": Kind(deserialize_executable, 37),
}
