"""JaxCompiler and JaxLoadedExecutable: HloPrograms compiled and run by jax's runtime.

Compilation goes through the runtime client's ``compile_and_load`` with the executable's
jax devices and the ``CompileOptions`` proto the PjRt backend builds; execution through
``execute_sharded``, after ifrtpy's checks of every argument (dtype, shape, devices and
shards against the compiled parameter shardings). Outputs get the compiled output
shardings as ifrtpy HloShardings. Portable executables are not supported (jax runs an
executable on the devices it was compiled for).

Custom calls: targets registered with :func:`ifrtpy.ffi.register_ffi_target` are
registered with jax's runtime too (jax's ``jax.ffi.register_ffi_target``), and jax's own
kernels are its runtime's. Host callbacks run with the program's Python callables, handed
to jax's compiler as jax hands them; a program that makes host callbacks without carrying
them is refused (jax's runtime would crash on it). Ordered effects (token parameters, as
jax lowers them: before the arrays) get a fresh token each execute, which waits for the
previous execute's tokens: their effects run in the order of the executes.
"""

from __future__ import annotations

import threading
from typing import Any, NoReturn, Sequence, cast

from ifrtpy.array import Array, ArrayCopySemantics
from ifrtpy.backends import serialized
from ifrtpy import _jaxlib, _xla, ffi
from ifrtpy.backends.jax._fastpath import JaxExecutableCore
from ifrtpy.backends.jax.array import JaxArray, jax_device, to_jax_sharding
from ifrtpy.backends.jax.calls import call_jax, translate
from ifrtpy.client import Compiler
from ifrtpy.device import DeviceList
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from ifrtpy.backends._array_fields import CheckedKinds
from ifrtpy.execute_checks import ArgumentChecks, CheckedExecute, ExecuteContract
from ifrtpy.executable import CompiledMemoryStats, CompileOptions, ExecuteResult, LoadedExecutable
from ifrtpy.future import Future, join_futures
from ifrtpy.sharding import HloSharding
from ifrtpy.layout import Layout
from ifrtpy.program import HloProgram, mlir
from ifrtpy.sharding import Sharding, SingleDeviceSharding
from ifrtpy.user_context import UserContext, current_user_context

_MAGIC = b"IFRTPY-JAX-EXECUTABLE-1\n"


def _devices_of(client: Any, options: CompileOptions) -> DeviceList:
    devices = options.resolve_devices(client)
    if devices is None:
        raise UnimplementedError(
            "the jax backend does not compile portable executables: jax runs an executable "
            "on the devices it was compiled for (give CompileOptions.devices)")
    return devices


def compile_program(client: Any, program: Any, options: CompileOptions | None
                    ) -> JaxLoadedExecutable:
    program = program if isinstance(program, HloProgram) else HloProgram(program)
    options = options if options is not None else CompileOptions()
    devices = _devices_of(client, options)
    proto = _jaxlib.compile_options(_xla.compile_options_proto(options, program, devices,
                                                             client.platform_name))
    jax_devices = _jaxlib.device_list([jax_device(d) for d in devices])
    _prepare(client, program)
    if program.host_callbacks:  # jaxlib takes them with a module only
        handle = call_jax(client.runtime.compile_and_load, mlir.parse(program.text), jax_devices,
                          proto, host_callbacks=list(program.host_callbacks))
    else:
        handle = call_jax(client.runtime.compile_and_load, program.text, jax_devices, proto)
    return JaxLoadedExecutable(client, handle, program, devices)


def _register_with_jax(target: ffi.Target) -> None:
    """A target registered with ifrtpy, registered with jax's runtime too."""
    import jax

    handlers = target.handlers if set(target.handlers) != {"execute"} else target.execute
    jax.ffi.register_ffi_target(target.name, handlers, platform=target.platform,
                                api_version=target.api_version)


ffi.add_listener(_register_with_jax)


def _prepare(client: Any, program: HloProgram) -> None:
    """Refuse what jax's runtime would crash on or cannot thread (host callbacks without
    their callables, token parameters or results after arrays), and make jaxlib's
    kernels ready (jax does when it lowers linear algebra; its runtime crashes running
    them in a process that never did)."""
    if program.custom_call_targets and client.platform_name in ffi.PLATFORMS:
        ffi.load_jaxlib_kernels(client.platform_name, program.custom_call_targets)
    ffi.check_host_callables(program)
    for what, tokens in (("parameters", program.token_parameters), ("results", program.token_results)):
        if tokens != tuple(range(len(tokens))):
            raise UnimplementedError(
                f"the jax backend runs programs whose token {what} come first (as jax lowers "
                f"them); this one has them at {list(tokens)}")


def deserialize_executable(client: Any, data: bytes, options: CompileOptions | None
                           ) -> JaxLoadedExecutable:
    """Load what :meth:`JaxLoadedExecutable.serialize` wrote, with the same jaxlib."""
    text, device_ids, payload = serialized.unpack(_MAGIC, data, "ifrtpy jax executable")
    program = HloProgram(text)
    _prepare(client, program)
    devices = DeviceList([client.lookup_device(i) for i in device_ids or ()])
    if options is not None and options.devices is not None and options.devices != devices:
        raise InvalidArgumentError(
            f"the executable was compiled for {devices.to_string()}; it cannot be loaded onto "
            f"{options.devices.to_string()} (compile it again)")
    jax_devices = _jaxlib.device_list([jax_device(d) for d in devices])
    handle = call_jax(client.runtime.deserialize_executable, payload, jax_devices, None)
    return JaxLoadedExecutable(client, handle, program, devices)


class JaxCompiler(Compiler):
    """The jax client's compiler: HloPrograms (or anything HloProgram takes)."""

    def __init__(self, client: Any):
        self._client = client

    def compile(self, program: Any, options: CompileOptions | None = None
                ) -> JaxLoadedExecutable:
        return compile_program(self._client, program, options)

    def deserialize_loaded_executable(self, data: bytes, options: CompileOptions | None = None
                                      ) -> JaxLoadedExecutable:
        return deserialize_executable(self._client, data, options)


class JaxLoadedExecutable(JaxExecutableCore, LoadedExecutable):
    """A program compiled by jax's runtime onto ``devices`` (``handle`` is jaxlib's
    LoadedExecutable).

    ``execute`` repeats calls whose arguments are of the kinds of a checked call in C
    (``JaxExecutableCore``); every other call is checked by the interface's contract and
    launched here, in ``_launch``."""

    def __init__(self, client: Any, handle: Any, program: HloProgram, devices: DeviceList):
        self._client = client
        self._handle = handle
        self._program = program
        self._devices = devices
        self._params = program.parameters
        self._results = program.results
        self._donated = program.donated_inputs
        self._execute_sharded = handle.execute_sharded
        kinds = handle.get_output_memory_kinds()
        self._memory_kinds = [str(k) for k in kinds[0]] if kinds else []
        # Token parameters and results come first (checked at compile): skip them.
        params_ops, output_ops = handle.get_parameter_shardings(), handle.get_output_shardings()
        tokens_in, tokens_out = len(program.token_parameters), len(program.token_results)
        self._memory_kinds = self._memory_kinds[tokens_out:]
        self._parameter_shardings = self._shardings(params_ops and params_ops[tokens_in:],
                                                    len(self._params), None)
        self._output_shardings = self._shardings(output_ops and output_ops[tokens_out:],
                                                 len(self._results), self._memory_kinds)
        self._execute_contract = ExecuteContract(
            self.name, client, JaxArray, self._params, self._parameter_shardings,
            self._results, self._output_shardings, self._donated)
        self._array_type = JaxArray
        self._user_context = current_user_context()
        self._handlers = [
            _jaxlib.result_handler(r.dtype.to_numpy(), tuple(r.shape.dims), to_jax_sharding(s))
            for r, s in zip(self._results, self._output_shardings)]
        self._tokens = _Tokens(self) if program.token_parameters or program.token_results else None

    def _shardings(self, ops: Any, count: int, kinds: list[str] | None) -> list[Sharding]:
        devices = self._devices
        out: list[Sharding] = []
        for i in range(count):
            kind = kinds[i] if kinds and i < len(kinds) else None
            if len(devices) == 1:
                out.append(SingleDeviceSharding(devices[0], kind))
            else:
                out.append(HloSharding(devices, ops[i] if ops else "{replicated}", kind))
        return out

    # -- properties -----------------------------------------------------------------------

    @property
    def client(self) -> Any:
        return self._client

    @property
    def name(self) -> str:
        return self._program.name

    def devices(self) -> DeviceList:
        return self._devices

    def addressable_devices(self) -> list[Any]:
        return list(self._devices.addressable_device_list())

    def parameter_shardings(self) -> list[Sharding]:
        return list(self._parameter_shardings)

    def output_shardings(self) -> list[Sharding]:
        return list(self._output_shardings)

    def output_dtypes(self) -> list[Any]:
        return [r.dtype for r in self._results]

    def output_shapes(self) -> list[Any]:
        return [r.shape for r in self._results]

    def output_memory_kinds(self) -> list[str]:
        """The memory kind of each output."""
        return list(self._memory_kinds)

    def donatable_input_indices(self) -> frozenset[int]:
        return self._program.donated_inputs

    @property
    def user_context(self) -> UserContext | None:
        return self._user_context

    @property
    def fingerprint(self) -> str | None:
        fingerprint = self._live_handle().fingerprint
        if fingerprint is None:
            return None
        return fingerprint.hex() if isinstance(fingerprint, bytes) else str(fingerprint)

    def serialize(self) -> bytes:
        payload = call_jax(self._client.runtime.serialize_executable,
                           self._live_handle())
        return serialized.pack(_MAGIC, self._program.text, [d.id for d in self._devices],
                                payload)

    def compiled_memory_stats(self) -> CompiledMemoryStats:
        stats = self._live_handle().get_compiled_memory_stats()
        return CompiledMemoryStats(**{
            name: int(getattr(stats, name)) for name in CompiledMemoryStats.__dataclass_fields__
            if hasattr(stats, name)})

    def cost_analysis(self) -> dict[str, Any]:
        return dict(self._live_handle().cost_analysis())

    def program_text(self, optimized: bool = False) -> str:
        """The StableHLO program compiled, or with ``optimized`` the HLO jax's compiler made
        of it (after its passes and SPMD partitioning: one device's program)."""
        if not optimized:
            return self._program.text
        return "\n".join(module.to_string() for module in self.hlo_modules())

    def parameter_layouts(self) -> list[Layout]:
        """From the entry computation layout of the optimized module (:meth:`hlo_modules`)."""
        return _xla.module_layouts(self.hlo_modules()[0])[0]

    def output_layouts(self) -> list[Layout]:
        """From the entry computation layout of the optimized module (:meth:`hlo_modules`)."""
        return _xla.module_layouts(self.hlo_modules()[0])[1]

    def hlo_modules(self) -> list[Any]:
        """The optimized HLO modules (``jaxlib`` HloModule objects) of jaxlib's executable;
        UnimplementedError where that jaxlib's executable does not offer them."""
        handle = self._live_handle()
        modules = getattr(handle, "hlo_modules", None)
        if modules is None:
            raise UnimplementedError(
                f"this jaxlib's LoadedExecutable ({type(handle).__module__}."
                f"{type(handle).__qualname__}) offers no hlo_modules(): the jax backend has no "
                f"optimized program text")
        return list(call_jax(modules))

    def _live_handle(self) -> Any:
        handle = self._handle
        if handle is None:
            raise FailedPreconditionError(f"executable {self.name!r} has been deleted")
        return handle

    def delete(self) -> Future[None]:
        self._handle = None
        self._execute_sharded = None
        return Future.ready(None)

    def is_deleted(self) -> bool:
        return self._handle is None

    # -- execution ------------------------------------------------------------------------

    def _launch(self, call: CheckedExecute) -> ExecuteResult:
        execute_sharded = self._execute_sharded
        checked: list[JaxArray] = call.args
        options = call.options
        values = [arg.jax_value for arg in checked]
        shardings = call.output_shardings or self._output_shardings  # bound: always known
        kinds = CheckedKinds(checked, tuple(
            (r.dtype, r.shape, sharding) for r, sharding in zip(self._results, shardings)))
        if self._tokens is None:  # a token program never takes the C path
            self._checked_kinds = kinds
        donated = call.donated
        for i in self._donated - donated:
            values[i] = checked[i]._take(ArrayCopySemantics.ALWAYS_COPY)  # jax donates the copy
        for i in donated:
            checked[i].wait_for_reads()  # reads enqueued before the donation see the data
        try:
            if self._tokens is not None:
                outputs = self._tokens.execute(execute_sharded, values, options.launch_id,
                                               self._handlers)
            elif options.launch_id:
                outputs = execute_sharded(values, launch_id=options.launch_id
                                          ).consume_with_handlers(self._handlers)
            else:
                outputs = execute_sharded(values).consume_with_handlers(self._handlers)
        except Exception as e:
            self._launch_failed(checked, values, e)
        for i in donated:
            checked[i].delete()  # jax took its buffer
        arrays = self._outputs(kinds, outputs)
        status = join_futures([a.ready_future() for a in arrays]) if options.fill_status else None
        return ExecuteResult(status, arrays)

    def _launch_failed(self, args: Sequence[Array], values: list[Any], error: Exception
                       ) -> NoReturn:
        """Raise for jax's refusal of a launch: an argument deleted through jax itself is
        refused as a deleted argument; anything else is jax's error as ifrtpy's."""
        arguments = cast(ArgumentChecks, self._execute_contract.arguments)  # types known
        for i, value in enumerate(values):
            if value.is_deleted():
                arguments.check_one(i, args[i], self._parameter_shardings[i])
        raise translate(error) from None


_token_lock = threading.Lock()
#: (client, device id) -> the token arrays on that device of the executes with ordered
#: effects there that may still be running.
_pending_tokens: dict[tuple[int, int], list[Any]] = {}


class _Tokens:
    """The token parameters and results of a program with ordered effects on jax's
    runtime: each execute takes fresh tokens (a bool[0] array on every device, as jax
    makes them) once the token results of the earlier executes on each of its devices
    are ready (ordering is per device, as jax's is). No lock is held while waiting or
    executing."""

    def __init__(self, executable: JaxLoadedExecutable):
        devices = executable._devices
        whole = (SingleDeviceSharding(devices[0]) if len(devices) == 1
                 else HloSharding(devices, "{replicated}"))
        self._sharding = to_jax_sharding(whole)
        self._client_key = id(executable._client)
        self._keys = [(self._client_key, d.id) for d in devices]
        self._count_in = len(executable._program.token_parameters)
        self._count_out = len(executable._program.token_results)

    def execute(self, execute_sharded: Any, values: list[Any], launch_id: int,
                handlers: list[Any]) -> Any:
        import jax
        import numpy as np

        with _token_lock:
            previous = [t for key in self._keys for t in _pending_tokens.get(key, ())]
        for token in previous:
            token.block_until_ready()
        tokens = [jax.device_put(np.zeros(0, np.bool_), self._sharding) for _ in range(self._count_in)]
        kwargs = {"launch_id": launch_id} if launch_id else {}
        results = execute_sharded(tokens + list(values), **kwargs)
        if self._count_out:
            returned = results.disassemble_prefix_into_single_device_arrays(self._count_out)
            self._keep_pending([a for per_token in returned for a in per_token])
        return results.consume_with_handlers(handlers)

    def _keep_pending(self, tokens: list[Any]) -> None:
        """Add ``tokens`` (single-device arrays) to their devices' pending tokens, dropping
        those already ready."""
        with _token_lock:
            for key in self._keys:
                _pending_tokens[key] = [t for t in _pending_tokens.get(key, ()) if not t.is_ready()]
            for token in tokens:
                (device,) = token.devices()
                _pending_tokens.setdefault((self._client_key, device.id), []).append(token)
