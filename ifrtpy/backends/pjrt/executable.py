"""PjrtCompiler and PjrtLoadedExecutable: StableHLO compiled and run by a PJRT plugin.

The executable knows its program's global parameter and result types (from the
StableHLO signature) and its compiled shardings (from the optimized HLO module the
plugin returns), and checks every argument against them before dispatch: the plugin
itself only compares byte sizes (it runs an s32 buffer as an f32 parameter).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Sequence


from ifrtpy import _jaxlib, _pjrt, _xla, compilation_cache
from ifrtpy.array import Array
from ifrtpy.array_plans import canonical_kind, default_shard_layout
from ifrtpy.backends import serialized
from ifrtpy.backends.pjrt import ffi, seal
from ifrtpy.backends.pjrt._fastpath import ExecutableCore
from ifrtpy.backends.pjrt.array import PjrtArray
from ifrtpy.backends.pjrt.effects import OrderedEffects
from ifrtpy.backends.pjrt.events import future_of_events
from ifrtpy.backends.pjrt.layouts import packed
from ifrtpy.client import Compiler
from ifrtpy.device import DeviceList
from ifrtpy.future import Future
from ifrtpy.errors import (
    FailedPreconditionError, IfrtError, InternalError, InvalidArgumentError, UnimplementedError,
    check_type,
)
from ifrtpy.execute_checks import CheckedExecute, ExecuteContract
from ifrtpy.executable import CompiledMemoryStats, CompileOptions, ExecuteResult, LoadedExecutable
from ifrtpy.sharding import HloSharding
from ifrtpy.layout import Layout
from ifrtpy.program import HloProgram, stablehlo_version
from ifrtpy.program.hlo import HOST_CALLBACK_TARGETS
from ifrtpy.sharding import ConcreteEvenSharding, Sharding, SingleDeviceSharding
from ifrtpy.user_context import current_user_context

_MAGIC = b"IFRTPY-EXECUTABLE-1\n"
MAX_BYTES = 2**63 - 1  # the byte size of an array is an int64 in XLA


def compile_program(client, program: Any, options: CompileOptions | None) -> PjrtLoadedExecutable:
    program = program if isinstance(program, HloProgram) else HloProgram(program)
    options = options if options is not None else CompileOptions()
    check_type(options, CompileOptions, "options", "a CompileOptions or None")
    for what, types in (("parameter", program.parameters), ("result", program.results)):
        for i, t in enumerate(types):
            bits = (t.dtype.bit_size or 8) * t.shape.num_elements()
            if bits > 8 * MAX_BYTES:  # the plugin aborts on a byte size beyond int64
                raise InvalidArgumentError(
                    f"{what} {i} of the program, {t}, takes {-(-bits // 8)} bytes; an array "
                    f"takes at most {MAX_BYTES} (2**63 - 1) bytes")
    devices = options.resolve_devices(client)
    compile_options = _xla.compile_options_proto(options, program, devices, client.platform_name)
    if not options.debug_options:  # the plugin's own XLA defaults, not jaxlib's
        compile_options = _xla.without_debug_options(compile_options)
    callbacks = _prepare_custom_calls(client, program, devices)
    target = client.plugin.attributes.get("stablehlo_current_version")
    cache = compilation_cache.cache_for(options.compilation_cache_dir)
    if cache is None:
        handle = _compile(client, program, target, compile_options)
    else:
        handle = _compile_through(cache, client, program, target, compile_options, devices)
    return PjrtLoadedExecutable(client, handle, program, devices, callbacks)


def _prepare_custom_calls(client, program: HloProgram, devices: DeviceList | None):
    """Register the custom call targets ``program`` names with the plugin; the user data
    type id of host callbacks where it makes any (see :mod:`ifrtpy.backends.pjrt.ffi`)."""
    if not program.custom_call_targets:
        return None
    return ffi.prepare(client._handle.plugin, client.platform_name, program,
                       len(devices) if devices is not None else 1)


def _compile_through(cache, client, program: HloProgram, target, compile_options: bytes,
                     devices: DeviceList | None):
    """The executable from the persistent ``cache``, else compiled and stored there. The
    key holds what the code sent to the plugin is made of (the program text, the StableHLO
    version targeted and jaxlib's), so a hit needs no serialization."""
    identity = seal.plugin_identity(client._handle)
    kinds = sorted({d.kind for d in devices}) if devices is not None else ["portable"]
    key = compilation_cache.cache_key([
        program.text.encode(), repr((target, stablehlo_version(), _jaxlib.version_text())).encode(),
        compile_options, identity, repr(kinds).encode(),
        str(len(devices) if devices is not None else 0).encode(),
        compilation_cache.host_cpu_identity() if client.platform_name == "cpu" else b""])
    payload = cache.load(key, lambda data: seal.unseal(identity, data))  # checked there
    if payload is not None:
        try:
            return _pjrt.deserialize_and_load(client._handle, payload)
        except IfrtError as e:
            compilation_cache.warn(f"the plugin did not load cache entry {key}: {e}")
    handle = _compile(client, program, target, compile_options)
    try:
        cache.store(key, seal.serialize(handle))
    except IfrtError as e:  # a cache must not make a compile fail
        compilation_cache.warn(f"the compiled program was not cached: {e}")
    return handle


def _compile(client, program: HloProgram, target, compile_options: bytes):
    code, how = program.serialize_for(target)
    try:
        return _pjrt.compile(client._handle, code, compile_options)
    except IfrtError as e:
        clearer = ffi.explain_compile_error(e)
        if clearer is not None:
            raise clearer from None
        if "pars" in str(e).lower():
            producer = ".".join(map(str, stablehlo_version()))
            consumer = ".".join(map(str, target)) if target else "unknown"
            raise type(e)(f"{e}\n(the program was sent as {how}; jaxlib writes StableHLO "
                          f"{producer}, this plugin reads StableHLO up to {consumer})") from None
        raise


def deserialize_executable(client, data: bytes, options: CompileOptions | None) -> PjrtLoadedExecutable:
    """Load what :meth:`PjrtLoadedExecutable.serialize` wrote, with the same plugin."""
    text, device_ids, payload = serialized.unpack(_MAGIC, data, "ifrtpy executable")
    program = HloProgram(text)
    devices = None if device_ids is None else DeviceList([client.lookup_device(i) for i in device_ids])
    if options is not None and options.devices is not None and DeviceList(options.devices) != devices:
        raise InvalidArgumentError(
            f"the executable was compiled for {devices.to_string() if devices else 'no devices (portable)'}; "
            f"it cannot be loaded onto {DeviceList(options.devices).to_string()} (compile it again)")
    callbacks = _prepare_custom_calls(client, program, devices)
    handle = seal.deserialize_and_load(client._handle, payload)
    return PjrtLoadedExecutable(client, handle, program, devices, callbacks)


class PjrtCompiler(Compiler):
    """The PjRt client's compiler: HloPrograms (or anything HloProgram takes).

    Identical compiles (the same program text and options, the same host callback
    objects, under the same user context object) return the same executable while it is
    alive and not deleted: an in-process memo holding the executables weakly.
    """

    def __init__(self, client):
        self._client = client
        self._memo: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._memo_lock = threading.Lock()

    def compile(self, program, options=None):
        if options is not None:
            check_type(options, CompileOptions, "options", "a CompileOptions")
        key = _memo_key(program, options)
        if key is not None:
            with self._memo_lock:
                executable = self._memo.get(key)
            if executable is not None and not executable._deleted:
                return executable
        executable = compile_program(self._client, program, options)
        if key is not None:
            with self._memo_lock:
                self._memo[key] = executable
        return executable

    def deserialize_loaded_executable(self, data, options=None):
        return deserialize_executable(self._client, data, options)


def _memo_key(program, options: CompileOptions | None) -> tuple | None:
    """What an executable in the memo is found by; None for a program other than an
    HloProgram. Host callbacks and the user context (which an executable records) count
    by identity: the key holds their ids only, so it keeps nothing alive and needs them
    neither hashable nor comparable. An id is unique while its object lives, and the
    executable an entry finds holds its program's callables and its context."""
    if not isinstance(program, HloProgram):
        return None
    try:
        hash(options)
    except TypeError:  # an option value of no valid kind: compile_program names it
        return None
    return (program.text, tuple(map(id, program.host_callbacks)), options,
            id(current_user_context()))


def _optimized_module(handle):
    """The compiled module the plugin returns (a jaxlib HloModule), or None for a format
    other than HLO."""
    HloModule = _jaxlib.hlo_module_class()

    fmt, code = handle.optimized_program()
    if fmt == "hlo_with_config":
        code = _xla.proto_field(code, 1)  # HloModuleProtoWithConfig.hlo_module
    elif fmt != "hlo":
        return None
    return HloModule.from_serialized_hlo_module_proto(code)


def _hlo_module_shardings(module) -> tuple[list | None, list | None]:
    """OpShardings of the parameters and outputs of the compiled (SPMD) ``module``, or
    None, None where it is not partitioned (it has no output sharding then; a partitioned
    module without parameters has no parameter shardings either)."""
    output = None if module is None else module.spmd_output_sharding
    if output is None:
        return None, None
    output = list(output.tuple_shardings) if output.type == output.type.TUPLE else [output]
    return list(module.spmd_parameters_shardings or ()), output


def _check_shard_shapes(name: str, module, program: HloProgram, params, outputs) -> None:
    """Each sharding read from the compiled ``module`` gives the per-device shape the module
    takes or returns. A sharding misread (a form of HloSharding ifrtpy does not know) would
    size buffers wrongly, which the plugin does not check: refuse the program instead."""
    shapes = _xla.entry_shapes(module)
    for what, types, shardings, compiled, tokens in (
            ("parameter", program.parameters, params, shapes[0], program.token_parameters),
            ("output", program.results, outputs, shapes[1], program.token_results)):
        compiled = [s for i, s in enumerate(compiled) if i not in tokens]
        if len(compiled) != len(types):
            continue  # another entry signature (tuples): no shape to compare with
        for i, (t, sharding, shape) in enumerate(zip(types, shardings, compiled)):
            expected = tuple(sharding.shard_shape(t.shape).dims)
            if shape.is_array() and shape.is_static() and tuple(shape.dimensions()) != expected:
                raise InternalError(
                    f"{what} {i} of {name}: ifrtpy reads its compiled sharding as {sharding}, "
                    f"shards of shape {list(expected)}, but the compiled program's are "
                    f"{list(shape.dimensions())}; this jaxlib writes a sharding form ifrtpy "
                    "does not read (please report it)")


class PjrtLoadedExecutable(ExecutableCore, LoadedExecutable):
    """A compiled program loaded on a PjrtClient's devices.

    Its fields, and the repeat of an accepted call in ``execute``, live in the C-level
    ``ExecutableCore``; every other call is checked by the interface's ``execute`` and
    launched here, in ``_launch``.
    """

    def __init__(self, client, handle, program: HloProgram, devices: DeviceList | None,
                 callbacks: int | None = None):
        self._client = client
        self._handle = handle
        self._program = program
        self._devices = devices
        self._addressable = [client.lookup_device(h.id) for h in handle.addressable_devices]
        self._deleted = False
        self._parameter_shardings, self._output_shardings = self._shardings()
        self._params = program.parameters
        self._results = program.results
        self._array_type = PjrtArray
        self._donated = frozenset(program.donated_inputs)
        self._accepted = None  # (dtype, shape, sharding) of the last checked arguments
        self._layout_plan: tuple | None = None  # see _read_layout_plan, read at the first call
        self._outputs_spec = tuple(
            (r.dtype, r.shape, sharding) for r, sharding in zip(self._results, self._output_shardings or ()))
        self._execute_contract = ExecuteContract(
            self.name, client, PjrtArray, program.parameters, self._parameter_shardings,
            self._results, self._output_shardings, self._donated)
        self._user_context = current_user_context()
        # Host callbacks: every execute passes their callables (the handle's execute
        # context, see ifrtpy.ffi); ordered effects: token arguments and results threaded
        # between executes, on the checked path only (the C one has no tokens).
        # The plugin crashes on an execute of a program with host callbacks without them.
        handle.needs_context = bool(program.custom_call_targets & HOST_CALLBACK_TARGETS)
        if callbacks is not None:
            handle.execute_context = ffi.execute_context(client._handle, program, callbacks)
        self._effects = (OrderedEffects(client, program)
                         if program.token_parameters or program.token_results else None)

    def _shardings(self) -> tuple[list[Sharding] | None, list[Sharding] | None]:
        devices = self._devices
        if devices is None:
            return None, None  # portable: the sharding is the execute device
        if len(devices) == 1:
            single = SingleDeviceSharding(devices[0])
            return ([single] * len(self._program.parameters), [single] * len(self._program.results))
        module = _optimized_module(self._handle)
        params, outputs = _hlo_module_shardings(module)
        if params is not None and outputs is not None:  # without token parameters and results
            params = [p for i, p in enumerate(params) if i not in self._program.token_parameters]
            outputs = [o for i, o in enumerate(outputs) if i not in self._program.token_results]
            if not self._program.results:  # the empty result tuple's sharding is no output's
                outputs = []
        if params is None or outputs is None:  # not partitioned: every device holds it whole
            def whole(types):
                return [ConcreteEvenSharding(devices, t.shape, t.shape, is_fully_replicated=True)
                        for t in types]
            return whole(self._program.parameters), whole(self._program.results)
        params = [HloSharding(devices, p) for p in params]
        outputs = [HloSharding(devices, o) for o in outputs]
        _check_shard_shapes(self.name, module, self._program, params, outputs)
        return params, outputs

    # -- properties -----------------------------------------------------------------------

    @property
    def client(self):
        return self._client

    @property
    def name(self) -> str:
        return self._handle.name

    def devices(self) -> DeviceList | None:
        return self._devices

    def addressable_devices(self):
        return list(self._addressable)

    @property
    def num_devices(self) -> int:
        return len(self._devices) if self._devices is not None else 1

    def parameter_shardings(self):
        return None if self._parameter_shardings is None else list(self._parameter_shardings)

    def output_shardings(self):
        return None if self._output_shardings is None else list(self._output_shardings)

    def output_dtypes(self):
        return [r.dtype for r in self._results]

    def output_shapes(self):
        return [r.shape for r in self._results]

    def donatable_input_indices(self) -> frozenset[int]:
        return self._program.donated_inputs

    def parameter_layouts(self) -> list[Layout]:
        """From the entry computation layout of the optimized module (:meth:`hlo_modules`)."""
        program = self._program
        values = [p for i, p in enumerate(program.parameters) if i not in program.token_parameters]
        return [packed(layout, v.dtype) for layout, v in
                zip(_xla.module_layouts(self.hlo_modules()[0])[0], values)]

    def output_layouts(self) -> list[Layout]:
        """From the entry computation layout of the optimized module (:meth:`hlo_modules`)."""
        program = self._program
        values = [r for i, r in enumerate(program.results) if i not in program.token_results]
        return [packed(layout, v.dtype) for layout, v in
                zip(_xla.module_layouts(self.hlo_modules()[0])[1], values)]

    @property
    def user_context(self):
        return self._user_context

    @property
    def fingerprint(self) -> str | None:
        try:
            return self._handle.fingerprint()
        except UnimplementedError:
            return None

    def serialize(self) -> bytes:
        if self._program.host_callbacks:
            raise UnimplementedError(
                f"{self.name!r} makes host callbacks: their Python callables cannot be serialized")
        ids = None if self._devices is None else [d.id for d in self._devices]
        return serialized.pack(_MAGIC, self._program.text, ids, seal.serialize(self._handle))

    def compiled_memory_stats(self) -> CompiledMemoryStats:
        return CompiledMemoryStats(**self._handle.compiled_memory_stats())

    def cost_analysis(self) -> dict[str, Any]:
        """The plugin's cost analysis; where a CPU plugin has none (XLA CPU builds after
        PJRT 0.81), XLA's HLO cost analysis of the optimized module with CPU costs."""
        try:
            return self._handle.cost_analysis()
        except UnimplementedError:
            if self._client.platform_name != "cpu":
                raise
        return _jaxlib.cpu_cost_analysis(self.hlo_modules()[0])

    def program_text(self, optimized: bool = False) -> str:
        """The StableHLO program compiled, or with ``optimized`` the HLO the compiler made
        of it (after its passes and SPMD partitioning: one device's program)."""
        if not optimized:
            return self._program.text
        return "\n".join(module.to_string() for module in self.hlo_modules())

    def hlo_modules(self) -> list:
        """The optimized HLO modules (``jaxlib`` HloModule objects) the plugin compiled;
        UnimplementedError where the plugin returns another format."""
        if self._deleted:
            raise FailedPreconditionError(f"executable {self.name!r} has been deleted")
        module = _optimized_module(self._handle)
        if module is None:
            raise UnimplementedError(
                f"the plugin returns its compiled program as {self._handle.optimized_program()[0]!r}, "
                f"not HLO")
        return [module]

    def output_memory_kinds(self) -> list[str]:
        """The memory kind of each output: the plugin's answer, or where it has none (the
        CPU plugin) the kinds of the compiled output shardings, which the outputs carry;
        UnimplementedError for a portable executable on such a plugin."""
        try:
            return self._handle.output_memory_kinds()
        except UnimplementedError:
            if self._output_shardings is None:
                raise
            return [str(canonical_kind(s)) for s in self._output_shardings]

    def delete(self):
        if not self._deleted:
            self._deleted = True
            self._handle.delete()
        return Future.ready()

    def is_deleted(self) -> bool:
        return self._deleted

    # -- execution ------------------------------------------------------------------------

    def _launch(self, call: CheckedExecute) -> ExecuteResult:
        args, options, execute_device = call.args, call.options, call.device
        non_donatable = options.non_donatable_input_indices
        non_donatable = sorted(non_donatable) if non_donatable else ()
        self._check_layouts_or_accept(args, call.output_shardings)
        self._check_donations(args, call.donated)
        device_handle = None if execute_device is None else execute_device._handle
        if self._effects is None:
            outputs, events = self._handle.execute_by_argument(
                [a._buffers for a in args], options.launch_id, non_donatable, device_handle,
                self._donated)
        else:
            effects = self._effects

            def launch(arguments):
                return self._handle.execute_by_argument(
                    arguments, options.launch_id, effects.main_indices(non_donatable),
                    device_handle, effects.main_indices(sorted(self._donated)))

            devices = [execute_device] if execute_device is not None else self._addressable
            outputs, events = effects.run(launch, [a._buffers for a in args], devices)
        for i in call.donated:  # their buffers are the outputs': they read as deleted
            args[i]._deleted = True
        client = self._client
        layouts = self._layout_plan[2]
        arrays = [PjrtArray(client, r.dtype, r.shape, sharding, buffers, layout=layout)
                  for r, sharding, buffers, layout in
                  zip(self._results, call.output_shardings, outputs, layouts)]
        status = future_of_events(events) if options.fill_status else None
        return ExecuteResult(status, arrays)

    def _check_layouts_or_accept(self, args: Sequence[Array], output_shardings) -> None:
        """Refuse an argument whose device layout is not its parameter's (PJRT compares
        only byte sizes: it would be read wrongly); then, where every argument and output
        is in the default layout of its memory (all are on the CPU plugin), let the C path
        repeat calls with arguments of these kinds."""
        plan = self._layout_plan
        if plan is None:
            plan = self._layout_plan = self._read_layout_plan(args, output_shardings)
        params, default_params, _ = plan
        host = self._client._host_platform  # the CPU plugin holds every array row-major
        everything_default = host or default_params is not None
        for i, arg in enumerate(args):
            if host or (arg._layout is None and default_params is not None and default_params[i]):
                continue
            everything_default = False
            expected = params[i] if params is not None else None
            if expected is None:
                continue  # nothing to compare with
            try:
                layout = arg.layout
            except UnimplementedError:  # the plugin reports no readable layout: nothing to compare
                continue
            if layout is not None and (layout.minor_to_major, layout.tiles) != (
                    expected.minor_to_major, expected.tiles):
                raise InvalidArgumentError(
                    f"argument {i} of {self.name} is in device layout {layout}, the program's "
                    f"parameter {i} takes {expected}: put it in that layout, or compile with "
                    "argument_layouts matching it")
        if everything_default and self._devices is not None and self._effects is None:
            self._execute_contract.named_outputs.accept(self, args)

    def _read_layout_plan(self, args: Sequence[Array], output_shardings) -> tuple:
        """(the parameters' layouts, whether each is the default layout of its argument's
        memory, each output's layout where it is not its default), from the compiled
        module and the first call's arguments; (None, None, [None...]) where the plugin
        returns no HLO to read them from (nothing is compared then)."""
        try:
            params, outputs = self.parameter_layouts(), self.output_layouts()
        except UnimplementedError:
            params = outputs = None
        if params is None or len(params) != len(args) or len(outputs) != len(self._results):
            return None, None, [None] * len(self._results)  # another entry signature (tuples)
        client = self._client
        default_params = [layout == default_shard_layout(client, a.dtype, a.shape, a.sharding)
                          for layout, a in zip(params, args)]
        custom_outputs = [None if layout == default_shard_layout(client, r.dtype, r.shape, s) else layout
                          for layout, r, s in zip(outputs, self._results, output_shardings)]
        if any(layout is not None for layout in custom_outputs):
            default_params = None  # the C path makes outputs in default layouts only
        return params, default_params, custom_outputs

    def _check_donations(self, args: Sequence[Array], donated: frozenset[int]) -> None:
        """Refuse to donate a buffer that DLPack exports or NumPy views still read."""
        for i in donated:
            if any(b.exports for b in args[i]._buffers):
                raise FailedPreconditionError(
                    f"argument {i} of {self.name} is donated, but DLPack exports or NumPy views "
                    "of it are alive: drop them first, or list the argument in "
                    "ExecuteOptions.non_donatable_input_indices")


