"""PjrtCompiler and PjrtLoadedExecutable: StableHLO compiled and run by a PJRT plugin.

The executable knows its program's global parameter and result types (from the
StableHLO signature) and, through its launch plan (:mod:`.launch_plan`), its compiled
shardings and layouts (from the optimized HLO module the plugin returns); every argument
is checked against them before dispatch: the plugin itself only compares byte sizes (it
runs an s32 buffer as an f32 parameter).
"""

from __future__ import annotations

import re

import threading
import weakref
from typing import Any

from ifrtpy import _jaxlib, _pjrt, _xla, compilation_cache
from ifrtpy.array_plans import canonical_kind
from ifrtpy.backends import serialized
from ifrtpy.backends.pjrt import ffi, seal
from ifrtpy.backends.pjrt._execute_launch import ExecutableCore
from ifrtpy.backends.pjrt.array import PjrtArray
from ifrtpy.backends.pjrt.launch_plan import LaunchPlan, optimized_module
from ifrtpy.backends.pjrt.layouts import check_byte_size
from ifrtpy.client import Compiler
from ifrtpy.device import DeviceList
from ifrtpy.future import Future
from ifrtpy.errors import (
    FailedPreconditionError, IfrtError, InvalidArgumentError, UnimplementedError, check_type,
)
from ifrtpy.execute_checks import ExecuteContract
from ifrtpy.executable import CompiledMemoryStats, CompileOptions, LoadedExecutable
from ifrtpy.layout import Layout
from ifrtpy.program import HloProgram, stablehlo_version
from ifrtpy.program.hlo import HOST_CALLBACK_TARGETS
from ifrtpy.user_context import current_user_context

_MAGIC = b"IFRTPY-EXECUTABLE-1\n"


def compile_program(client, program: Any, options: CompileOptions | None) -> PjrtLoadedExecutable:
    program = program if isinstance(program, HloProgram) else HloProgram(program)
    options = options if options is not None else CompileOptions()
    check_type(options, CompileOptions, "options", "a CompileOptions or None")
    for what, types in (("parameter", program.parameters), ("result", program.results)):
        for i, t in enumerate(types):
            check_byte_size(t.dtype, t.shape, f"{what} {i} of the program, {t},")
    if program.host_transfers:  # a run would wait for them forever
        raise UnimplementedError(
            f"{program.name}: the program has {', '.join(sorted(program.host_transfers))}, "
            "which wait for the host to feed or drain them; the PjRt backend has no infeed, "
            "outfeed or host send/recv")
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


#: XLA's verifier on a sharding over another device count than the compile's.
_TILE_COUNT = re.compile(r"tile_assignment should have (?P<should>\d+) devices but has (?P<has>\d+)")


def _compile(client, program: HloProgram, target, compile_options: bytes):
    code, how = program.serialize_for(target)
    try:
        return _pjrt.compile(client._handle, code, compile_options)
    except IfrtError as e:
        clearer = ffi.explain_compile_error(e)
        if clearer is not None:
            raise clearer from None
        tiles = _TILE_COUNT.search(str(e))
        if tiles is not None:
            raise type(e)(
                f"the program's shardings are for {tiles['has']} devices, the compile for "
                f"{tiles['should']} (num_replicas * num_partitions): compile it with "
                f"CompileOptions(devices=<{tiles['has']} devices>, num_partitions="
                f"{tiles['has']}), or lower it for {tiles['should']} devices\n(XLA: {e})") from None
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


class PjrtLoadedExecutable(ExecutableCore, LoadedExecutable):
    """A compiled program loaded on a PjrtClient's devices.

    Its fields and its ``execute`` live in the C-level ``ExecutableCore``: each call is
    checked (the interface's contract) and launched there, reading its launch plan
    (:class:`~ifrtpy.backends.pjrt.launch_plan.LaunchPlan`), or repeated without checks
    where its arguments are of the kinds of a checked call.
    """

    # LoadedExecutable.execute and __call__ (the contract, then ``_launch``) in C, with
    # calls of checked kinds repeated without the checks: bound here by name, not picked
    # by the order of the bases.
    execute = ExecutableCore.execute
    __call__ = ExecutableCore.__call__

    def __init__(self, client, handle, program: HloProgram, devices: DeviceList | None,
                 callbacks: int | None = None):
        self._client = client
        self._handle = handle
        self._program = program
        self._devices = devices
        self._addressable = [client.lookup_device(h.id) for h in handle.addressable_devices]
        self._deleted = False
        self._array_type = PjrtArray
        self._plan = plan = LaunchPlan(client, handle, program, devices)
        self._execute_contract = ExecuteContract(
            handle.name, client, PjrtArray, program.parameters, plan.parameter_shardings,
            program.results, plan.output_shardings, plan.donated)
        self._user_context = current_user_context()
        # Host callbacks: every execute passes their callables (the handle's execute
        # context, see ifrtpy.ffi). The plugin crashes on an execute of a program with host
        # callbacks without them.
        handle.needs_context = bool(program.custom_call_targets & HOST_CALLBACK_TARGETS)
        # The CPU plugin runs small programs inline: their outputs are known ready as the
        # execute returns, and waiting for them then asks the plugin nothing.
        handle.reads_completion = client._host_platform
        if callbacks is not None:
            handle.execute_context = ffi.execute_context(client._handle, program, callbacks)

    # -- properties -----------------------------------------------------------------------

    @property
    def client(self):
        return self._client

    def addressable_devices(self):
        return list(self._addressable)

    @property
    def num_devices(self) -> int:
        return len(self._devices) if self._devices is not None else 1

    def parameter_shardings(self):
        shardings = self._plan.parameter_shardings
        return None if shardings is None else list(shardings)

    def output_shardings(self):
        shardings = self._plan.output_shardings
        return None if shardings is None else list(shardings)

    def output_dtypes(self):
        return [r.dtype for r in self._program.results]

    def output_shapes(self):
        return [r.shape for r in self._program.results]

    def donatable_input_indices(self) -> frozenset[int]:
        return self._program.donated_inputs

    def parameter_layouts(self) -> list[Layout]:
        """From the entry computation layout of the optimized module (the launch plan's)."""
        return self._plan_layouts(self._plan.parameter_layouts)

    def output_layouts(self) -> list[Layout]:
        """From the entry computation layout of the optimized module (the launch plan's)."""
        return self._plan_layouts(self._plan.output_layouts)

    def _plan_layouts(self, layouts: list[Layout] | None) -> list[Layout]:
        if layouts is None:
            if self._plan.unread_module is not None:
                raise UnimplementedError(str(self._plan.unread_module))
            raise UnimplementedError(
                f"{self.name!r}: the plugin returns no HLO module with an entry computation "
                "of arrays (its optimized program), which the layouts are read from")
        return list(layouts)

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
        module = optimized_module(self._handle)
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
            shardings = self._plan.output_shardings
            if shardings is None:
                raise
            return [str(canonical_kind(s)) for s in shardings]

    def delete(self):
        if not self._deleted:
            self._deleted = True
            self._handle.delete()
        return Future.ready()
