"""Executables: IFRT's ``LoadedExecutable``, its options and results.

:class:`LoadedExecutable` is abstract (each backend subclasses it). :class:`CompileOptions`,
:class:`ExecuteOptions`, :class:`ExecuteResult` and :class:`CompiledMemoryStats` are plain
value types shared by every backend (ExecuteResult is defined in C, in ``_execute_result``).
"""

from __future__ import annotations

import abc
import dataclasses
import os
import threading
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

from ifrtpy._execute_result import ExecuteResult as ExecuteResult
from ifrtpy.array import GONE, Array, array_sequence
from ifrtpy.array_plans import check_of_client
from ifrtpy.dtypes import DType
from ifrtpy.layout import Layout
from ifrtpy.device import DeviceList
from ifrtpy.errors import (
    FailedPreconditionError, InternalError, InvalidArgumentError, UnimplementedError, check_int,
    check_type, invalid_argument,
)
from ifrtpy.sharding import (
    NamedSharding, OpaqueSharding, Sharding, SingleDeviceShardSemantics, SingleDeviceSharding,
    same_unreduced,
)
from ifrtpy.sharding.mesh import named_sharding_like
from ifrtpy.user_context import UserContext

if TYPE_CHECKING:
    from ifrtpy.client import Client
    from ifrtpy.device import Device
    from ifrtpy.future import Future
    from ifrtpy.program import TensorType
    from ifrtpy.shape import Shape

__all__ = [
    "CompileOptions",
    "ExecuteOptions",
    "ExecuteResult",
    "CompiledMemoryStats",
    "LoadedExecutable",
    "CheckedExecute",
    "ExecuteContract",
]

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _check_int(owner: str, name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int):  # numpy ints convert silently; options keep Python ints
        raise invalid_argument(f"{owner}.{name}", "an int", value)
    return check_int(value, f"{owner}.{name}", lo, hi)


def _check_bool(owner: str, name: str, value: Any, *, optional: bool = False) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        allowed = "a bool or None" if optional else "a bool"
        raise InvalidArgumentError(f"{owner}.{name} must be {allowed}, got {value!r}")


def _check_str_keys(owner: str, name: str, mapping: Any) -> dict[str, Any]:
    if not isinstance(mapping, Mapping):
        raise InvalidArgumentError(f"{owner}.{name} must be a mapping, got {mapping!r}")
    bad = [k for k in mapping if not isinstance(k, str)]
    if bad:
        raise InvalidArgumentError(f"{owner}.{name} keys must be str, got {bad[0]!r}")
    return dict(mapping)


def _frozen(value: Any) -> Any:
    """A hashable stand-in for option values (dicts and lists become tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Options for compiling an XLA program (IFRT ``XlaCompileOptions``).

    ``devices`` are the devices the executable runs on, in replica-major then partition
    order (None: the backend picks ``num_replicas * num_partitions`` devices). With
    ``compile_portable_executable`` the executable is not bound to devices: give the
    device at execute time. ``use_spmd_partitioning``/``use_shardy_partitioner`` None
    keep XLA's defaults. ``debug_options`` maps ``xla.DebugOptions`` field names to
    values (sent with jaxlib's defaults for the others; with none, a PjRt plugin
    compiles with its own XLA's defaults); ``env_option_overrides`` maps XLA flag names
    (without ``--``) to str/bool/int/float values. ``compilation_cache_dir`` is this
    compile's persistent compilation cache: a directory, False for none, None for the
    configured one (see :mod:`ifrtpy.compilation_cache`); it does not change the
    executable.
    ``argument_layouts`` / ``result_layouts`` give the device layout of each parameter /
    result (None: all default; a None entry: that one default, row-major), one per
    parameter / result of the program, each of its rank (checked at compile); see
    docs/layouts.md for which backends place them.
    """

    devices: DeviceList | None = None
    num_replicas: int = 1
    num_partitions: int = 1
    use_spmd_partitioning: bool | None = None
    use_shardy_partitioner: bool | None = None
    compile_portable_executable: bool = False
    debug_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    env_option_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    compilation_cache_dir: str | os.PathLike[str] | bool | None = None
    argument_layouts: Sequence[Layout | None] | None = None
    result_layouts: Sequence[Layout | None] | None = None

    def __post_init__(self) -> None:
        owner = "CompileOptions"
        for name in ("argument_layouts", "result_layouts"):
            object.__setattr__(self, name, _check_layouts(owner, name, getattr(self, name)))
        cache = self.compilation_cache_dir
        if not (cache is None or cache is False or isinstance(cache, (str, os.PathLike))):
            raise InvalidArgumentError(
                f"{owner}.compilation_cache_dir must be a path, False or None, got {cache!r}")
        for name in ("num_replicas", "num_partitions"):
            value = getattr(self, name)
            _check_int(owner, name, value, *_INT64)
            if value < 1:
                raise InvalidArgumentError(f"{owner}.{name} must be >= 1, got {value}")
        _check_bool(owner, "use_spmd_partitioning", self.use_spmd_partitioning, optional=True)
        _check_bool(owner, "use_shardy_partitioner", self.use_shardy_partitioner, optional=True)
        _check_bool(owner, "compile_portable_executable", self.compile_portable_executable)
        object.__setattr__(
            self, "debug_options", _check_str_keys(owner, "debug_options", self.debug_options)
        )
        overrides = _check_str_keys(owner, "env_option_overrides", self.env_option_overrides)
        for key, value in overrides.items():
            if not isinstance(value, (str, bool, int, float)):
                raise InvalidArgumentError(
                    f"{owner}.env_option_overrides[{key!r}] must be str, bool, int or float, "
                    f"got {value!r}"
                )
        object.__setattr__(self, "env_option_overrides", overrides)
        num_devices = self.num_replicas * self.num_partitions
        if self.compile_portable_executable and num_devices != 1:
            raise InvalidArgumentError(
                f"{owner}: a portable executable needs num_replicas=1 and num_partitions=1, "
                f"got {self.num_replicas} and {self.num_partitions}"
            )
        if self.devices is not None:
            if not isinstance(self.devices, DeviceList):
                object.__setattr__(self, "devices", DeviceList(self.devices))
            self.devices.check_distinct(f"{owner}.devices")
            if len(self.devices) != num_devices:
                raise InvalidArgumentError(
                    f"{owner}: devices has {len(self.devices)} devices, but num_replicas * "
                    f"num_partitions = {self.num_replicas} * {self.num_partitions} = {num_devices}"
                )

    def resolve_devices(self, client: Client) -> DeviceList | None:
        """The devices a compile with these options runs on: None for a portable
        executable; ``devices``, each checked to be ``client``'s; or else the first
        ``num_replicas * num_partitions`` addressable devices of ``client``.
        InvalidArgumentError for a device of another client, or too few devices."""
        if self.compile_portable_executable:
            return None
        if self.devices is not None:
            for device in self.devices:
                if device.client is not client:
                    raise InvalidArgumentError(f"device {device} belongs to another client")
            return self.devices
        count = self.num_replicas * self.num_partitions
        available = client.addressable_devices()
        if count > len(available):
            raise InvalidArgumentError(
                f"the program needs {count} devices, the client has {len(available)} addressable")
        return DeviceList(available[:count])

    def __hash__(self) -> int:
        cached = self.__dict__.get("_hash")
        if cached is None:  # computed once: compiles look options up in a memo
            cached = hash(tuple(_frozen(getattr(self, f.name)) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached


def _check_layouts(owner: str, name: str, layouts: Any) -> tuple[Layout | None, ...] | None:
    if layouts is None:
        return None
    if isinstance(layouts, (str, bytes, Layout)) or not isinstance(layouts, Sequence):
        raise InvalidArgumentError(
            f"{owner}.{name} must be a sequence of Layout or None, got {layouts!r}")
    for i, layout in enumerate(layouts):
        if not (layout is None or isinstance(layout, Layout)):
            raise InvalidArgumentError(
                f"{owner}.{name}[{i}] must be a Layout or None, got {layout!r}")
    return tuple(layouts)


def program_layouts(options: CompileOptions, parameters: Sequence[TensorType],
                    results: Sequence[TensorType]
                    ) -> tuple[Sequence[Layout | None] | None, Sequence[Layout | None] | None]:
    """``options``' argument and result layouts, checked against the program's
    ``parameters`` and ``results``: one layout per value, of its rank (InvalidArgumentError
    naming the index, the rank and what it got)."""
    checked = []
    for name, values, layouts in (("argument_layouts", parameters, options.argument_layouts),
                                  ("result_layouts", results, options.result_layouts)):
        if layouts is not None:
            what = "parameters" if name == "argument_layouts" else "results"
            if len(layouts) != len(values):
                raise InvalidArgumentError(
                    f"CompileOptions.{name} has {len(layouts)} layouts, the program has "
                    f"{len(values)} {what}")
            for i, (layout, value) in enumerate(zip(layouts, values)):
                rank = len(value.shape.dims)
                if layout is not None and layout.rank != rank:
                    raise InvalidArgumentError(
                        f"CompileOptions.{name}[{i}] is {layout} of rank {layout.rank}, but "
                        f"{what[:-1]} {i} ({value}) has rank {rank}")
        checked.append(layouts)
    return checked[0], checked[1]


@dataclasses.dataclass(frozen=True)
class ExecuteOptions:
    """Options for one :meth:`LoadedExecutable.execute` call (IFRT ``ExecuteOptions``).

    ``launch_id`` (int32) detects mismatched launch order across hosts;
    ``non_donatable_input_indices`` are inputs not donated even if the program marks them
    donors; ``fill_status`` asks for ``ExecuteResult.status`` (otherwise it is None);
    executions with the same ``execution_stream_id`` run in program order;
    ``custom_options`` are backend-specific attributes (str -> str/bool/int/float/list[int]).
    """

    launch_id: int = 0
    non_donatable_input_indices: frozenset[int] = frozenset()
    fill_status: bool = False
    execution_stream_id: int = 0
    custom_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        owner = "ExecuteOptions"
        _check_int(owner, "launch_id", self.launch_id, *_INT32)
        _check_int(owner, "execution_stream_id", self.execution_stream_id, *_INT64)
        _check_bool(owner, "fill_status", self.fill_status)
        try:
            indices = frozenset(self.non_donatable_input_indices)
        except TypeError:
            raise InvalidArgumentError(
                f"{owner}.non_donatable_input_indices must be a set of ints, "
                f"got {self.non_donatable_input_indices!r}"
            ) from None
        for i in indices:
            _check_int(owner, "non_donatable_input_indices entry", i, 0, _INT64[1])
        object.__setattr__(self, "non_donatable_input_indices", indices)
        custom = _check_str_keys(owner, "custom_options", self.custom_options)
        for key, value in custom.items():
            ok = isinstance(value, (str, bool, int, float)) or (
                isinstance(value, (list, tuple))
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            )
            if not ok:
                raise InvalidArgumentError(
                    f"{owner}.custom_options[{key!r}] must be str, bool, int, float or a list "
                    f"of ints, got {value!r}"
                )
        object.__setattr__(self, "custom_options", custom)

    def __hash__(self) -> int:
        return hash(tuple(_frozen(getattr(self, f.name)) for f in dataclasses.fields(self)))


@dataclasses.dataclass(frozen=True)
class CompiledMemoryStats:
    """Memory an executable needs, in bytes (``xla::CompiledMemoryStats``)."""

    generated_code_size_in_bytes: int = 0
    argument_size_in_bytes: int = 0
    output_size_in_bytes: int = 0
    alias_size_in_bytes: int = 0
    temp_size_in_bytes: int = 0
    host_generated_code_size_in_bytes: int = 0
    host_argument_size_in_bytes: int = 0
    host_output_size_in_bytes: int = 0
    host_alias_size_in_bytes: int = 0
    host_temp_size_in_bytes: int = 0
    peak_memory_in_bytes: int = 0


class LoadedExecutable(abc.ABC):
    """A compiled program loaded onto devices, ready to run (IFRT ``LoadedExecutable``).

    Thread-safe: ``execute`` may be called concurrently from several threads. Abstract:
    ``client``, ``name``, ``devices``, ``addressable_devices``, the parameter/output
    queries (``output_memory_kinds`` among them), ``execute``, ``delete`` and
    ``is_deleted``. The optional queries default to UnimplementedError.
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def client(self) -> Client:
        """The client that compiled or loaded this executable."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The program's name (e.g. the StableHLO module name)."""

    @abc.abstractmethod
    def devices(self) -> DeviceList | None:
        """The devices it runs on; None for a portable executable."""

    @abc.abstractmethod
    def addressable_devices(self) -> list[Device]:
        """The devices of :meth:`devices` this process drives, in execution order."""

    @property
    def num_devices(self) -> int:
        """How many devices one execution spans (replicas x partitions)."""
        devices = self.devices()
        return 1 if devices is None else len(devices)

    @abc.abstractmethod
    def parameter_shardings(self) -> list[Sharding] | None:
        """The sharding each argument must have; None when the backend does not know."""

    @abc.abstractmethod
    def output_shardings(self) -> list[Sharding] | None:
        """The sharding of each output; None when the backend does not know."""

    @abc.abstractmethod
    def output_dtypes(self) -> list[DType]:
        """The element type of each output."""

    @abc.abstractmethod
    def output_shapes(self) -> list[Shape]:
        """The global shape of each output."""

    @abc.abstractmethod
    def output_memory_kinds(self) -> list[str]:
        """The memory kind each output is placed in (e.g. ``"device"``)."""

    def donatable_input_indices(self) -> frozenset[int]:
        """Indices of the arguments the program may donate (``jax.buffer_donor``, aliases).

        UnimplementedError where the backend cannot tell.
        """
        raise UnimplementedError(f"{type(self).__name__} does not report donatable inputs")

    @property
    def fingerprint(self) -> str | None:
        """A string identifying the compiled code; None when the backend has none."""
        return None

    @property
    def user_context(self) -> UserContext | None:
        """The :class:`~ifrtpy.user_context.UserContext` active at the compile (or
        deserialize) that made this executable; None outside any ``UserContextScope``, or
        where the backend keeps none. Outputs of ``execute`` carry the context active at
        the execute."""
        return None

    def serialize(self) -> bytes:
        """Bytes that ``Client.deserialize_executable`` turns back into this executable.

        UnimplementedError where the backend cannot serialize.
        """
        raise UnimplementedError(f"{type(self).__name__} cannot be serialized")

    def compiled_memory_stats(self) -> CompiledMemoryStats:
        """Memory use estimates; UnimplementedError where unknown."""
        raise UnimplementedError(f"{type(self).__name__} has no compiled memory stats")

    def cost_analysis(self) -> dict[str, Any]:
        """Cost estimates (e.g. ``"flops"``); UnimplementedError where unknown."""
        raise UnimplementedError(f"{type(self).__name__} has no cost analysis")

    def program_text(self, optimized: bool = False) -> str:
        """The compiled program as human-readable text, or with ``optimized`` what the
        compiler made of it; UnimplementedError where unknown."""
        raise UnimplementedError(f"{type(self).__name__} has no program text")

    def parameter_layouts(self) -> list[Layout]:
        """The device layout each argument must have, as compiled; UnimplementedError
        where the backend cannot tell."""
        raise UnimplementedError(f"{type(self).__name__} does not report parameter layouts")

    def output_layouts(self) -> list[Layout]:
        """The device layout of each output, as compiled; UnimplementedError where the
        backend cannot tell."""
        raise UnimplementedError(f"{type(self).__name__} does not report output layouts")

    def hlo_modules(self) -> list[Any]:
        """The optimized HLO modules the compiler produced (jaxlib ``HloModule`` objects:
        ``to_string()``, ``as_serialized_hlo_module_proto()``); UnimplementedError where the
        backend has none."""
        raise UnimplementedError(f"{type(self).__name__} has no HLO modules")

    #: The contract of :meth:`execute` for this executable (see :class:`ExecuteContract`),
    #: which the backend makes when it makes the executable.
    _execute_contract: ExecuteContract

    def execute(
        self,
        args: list[Array],
        options: ExecuteOptions | None = None,
        devices: DeviceList | None = None,
    ) -> ExecuteResult:
        """Enqueue one execution; returns at once with the (not yet ready) outputs.

        ``args`` must already be on the executable's devices, with the dtypes, shapes and
        shardings of :meth:`parameter_shardings` (InvalidArgumentError otherwise; checked
        before anything reaches the device). Donated arguments (donatable and not in
        ``options.non_donatable_input_indices``) report ``is_deleted()`` on return; reads
        enqueued before still see their data. ``devices`` runs a portable executable on
        those devices (InvalidArgumentError for a non-portable one). Errors during the
        run arrive through ``status`` (when ``options.fill_status``) and the outputs'
        ready futures. Raises FailedPreconditionError if the executable was deleted.

        The whole contract is checked here, once for every backend (the backend's
        ``_execute_contract``, an :class:`ExecuteContract`); the backend's :meth:`_launch`
        carries out the checked call.
        """
        return self._execute_checked(args, options, devices)

    def _execute_checked(self, args: Any, options: Any, devices: Any) -> ExecuteResult:
        """:meth:`execute` (what a backend's C path, which repeats calls of the kinds
        already checked, hands every other call to)."""
        return self._launch(self._execute_contract.check(self, args, options, devices))

    @abc.abstractmethod
    def _launch(self, call: CheckedExecute) -> ExecuteResult:
        """Carry out ``call``, an execute whose contract :meth:`execute` checked: run on
        ``call.device`` (a portable executable) or the executable's devices, give up the
        arguments in ``call.donated``, and return the outputs (in
        ``call.output_shardings`` where the backend knows them)."""

    @abc.abstractmethod
    def delete(self) -> Future[None]:
        """Unload the executable; idempotent. Running executions complete."""

    @abc.abstractmethod
    def is_deleted(self) -> bool:
        """Whether :meth:`delete` was called."""

    def __call__(self, *args: Array, **keywords: Any) -> list[Array]:
        """``execute(list(args)).outputs``: run with default options. Arguments are
        positional, in the order of the program's parameters."""
        if keywords:
            raise keyword_arguments_error(self, keywords)
        return self.execute(list(args)).outputs

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.num_devices} device(s)>"


# -- the argument checks of execute, shared by every backend --------------------------------

def keyword_arguments_error(executable: Any, keywords: Mapping[str, Any]) -> TypeError:
    """The error of ``executable(..., name=value)``: a TypeError (as Python's for a call
    it cannot bind) naming the keywords, and how to pass arguments and options."""
    names = ", ".join(f"{k}=" for k in keywords)
    return TypeError(
        f"{executable.name} takes its arguments by position, in the order of the program's "
        f"parameters, not by keyword (got {names}): call it as executable(a, b, ...), or "
        "executable.execute([a, b, ...], ExecuteOptions(...)) for options")


def check_execute_devices(executable: LoadedExecutable, devices: Any) -> Device | None:
    """The device a portable ``executable`` runs on (``devices`` must be one addressable
    device of its client), or None for an executable bound to devices, which ``devices``
    (when given) must equal. InvalidArgumentError otherwise."""
    compiled = executable.devices()
    name = executable.name
    if devices is not None:
        devices = DeviceList(devices)
    if compiled is None:
        if devices is None or len(devices) != 1:
            raise InvalidArgumentError(
                f"{name} is a portable executable: execute it with devices= one device")
        device: Device = devices[0]
        if device.client is not executable.client or not device.is_addressable:
            raise InvalidArgumentError(f"device {device} is not an addressable device of this client")
        return device
    if devices is not None and devices != compiled:
        raise InvalidArgumentError(
            f"{name} is compiled for {compiled.to_string()}; execute got {devices.to_string()}")
    return None


def check_argument_count(name: str, args: Any, parameters: Sequence[Any]) -> list[Any]:
    """``args`` (a sequence, not one array) as a list of as many arguments as the program
    of executable ``name`` has ``parameters``; InvalidArgumentError otherwise."""
    checked = array_sequence(args, "args")
    if len(checked) != len(parameters):
        raise InvalidArgumentError(f"{name} takes {len(parameters)} arguments, got {len(checked)}")
    return checked


def check_argument_live(name: str, i: int, arg: Any) -> None:
    """Argument ``i`` of executable ``name`` (an array) is not an error array and not
    deleted."""
    if arg.error is not None:
        raise InvalidArgumentError(f"argument {i} of {name} is an error array: {arg.error}")
    if arg.is_deleted():
        raise InvalidArgumentError(f"argument {i} of {name} has been deleted or donated: {GONE}")


def check_argument_value(name: str, i: int, arg: Any, param: Any) -> None:
    """Argument ``i`` of executable ``name`` (an array of the right client) is usable for
    parameter ``param``: live (:func:`check_argument_live`), of its dtype and shape."""
    check_argument_live(name, i, arg)
    if arg.dtype != param.dtype or arg.shape != param.shape:
        raise InvalidArgumentError(
            f"argument {i} of {name} is {arg.dtype}{list(arg.shape)}, the program's "
            f"parameter {i} is {param}")


def check_argument_placement(name: str, i: int, arg: Any, param: Any, sharding: Sharding, *,
                             compare_domains: bool = True) -> None:
    """Argument ``i`` lies on the devices of the compiled parameter sharding and (with
    ``compare_domains``) holds the same shard on each device."""
    if arg.sharding.devices != sharding.devices:
        held, wanted = arg.sharding.devices, sharding.devices
        if len(held) == len(wanted) and set(held) == set(wanted):
            raise InvalidArgumentError(
                f"argument {i} of {name} is on the devices the executable runs on, but in "
                f"another order: {held.to_string()}, the executable's order is "
                f"{wanted.to_string()} (a mesh built in another device order?). "
                f"client.reshard_arrays([array], [ArraySpec(array.dtype, array.shape, "
                f"executable.parameter_shardings()[{i}])]) moves it to the executable's "
                "order; or build the mesh in that order, or compile for the array's")
        raise InvalidArgumentError(
            f"argument {i} of {name} is on {held.to_string()}, the executable runs on "
            f"{wanted.to_string()}")
    if compare_domains and not same_domains(arg.sharding, sharding, param.shape):
        partial = arg.sharding.has_unreduced_axes or sharding.has_unreduced_axes
        raise InvalidArgumentError(
            f"argument {i} of {name} has sharding {arg.sharding!r}; the compiled "
            f"parameter {i} has sharding {sharding!r} ("
            f"{'partial values on one side only' if partial else 'different shards per device'})")


class ArgumentChecks:
    """The contract of execute for each argument, written once for every backend: an
    array of the executable's client (an instance of ``array_type``), not a STRING
    array, not an error array, not deleted, of its parameter's dtype and shape, on the
    devices of the parameter sharding and holding the same shard on each (not compared
    for an OpaqueSharding, which names no shards). The placement of an argument is
    worked out once per parameter, dtype, shape and sharding (the last ``ENTRIES``)."""

    ENTRIES = 256

    def __init__(self, name: str, client: Any, parameters: Sequence[TensorType],
                 array_type: type):
        self._name = name
        self._client = client
        self.parameters = list(parameters)
        self._array_type = array_type
        self._placed: dict[tuple[Any, ...], None] = {}

    def check(self, args: Any, shardings: Sequence[Sharding]) -> list[Any]:
        """``args`` as a list, each argument checked against its parameter placed by
        ``shardings``; InvalidArgumentError (UnimplementedError for a STRING array)
        naming the first argument that is not usable."""
        checked = check_argument_count(self._name, args, self.parameters)
        for i, (arg, sharding) in enumerate(zip(checked, shardings)):
            self.check_one(i, arg, sharding)
        return checked

    def check_one(self, i: int, arg: Any, sharding: Sharding) -> None:
        """Argument ``i`` checked against parameter ``i`` placed by ``sharding``."""
        name, param = self._name, self.parameters[i]
        if isinstance(arg, Array) and arg.dtype.kind == DType.Kind.STRING:
            raise UnimplementedError(
                f"argument {i} of {name} is a STRING array; XLA programs cannot take strings")
        check_of_client(self._client, arg, f"argument {i} of {name}", self._array_type)
        check_argument_value(name, i, arg, param)
        key = (i, arg.dtype, arg.shape, arg.sharding)
        if key in self._placed:
            return
        check_argument_placement(name, i, arg, param, sharding,
                                 compare_domains=not isinstance(sharding, OpaqueSharding))
        if len(self._placed) >= self.ENTRIES:
            self._placed.clear()
        self._placed[key] = None


class CheckedExecute(NamedTuple):
    """One call of execute, its contract checked (:meth:`ExecuteContract.check`)."""

    #: The arguments, each checked against its parameter.
    args: list[Any]
    #: The call's options (the defaults for None).
    options: ExecuteOptions
    #: The device a portable executable runs on; None for one bound to devices.
    device: Device | None
    #: The arguments the call gives up: donatable, not in the options' non-donatable ones.
    donated: frozenset[int]
    #: The sharding of each output (named as the arguments' meshes); None where unknown.
    output_shardings: list[Sharding] | None


class ExecuteContract:
    """The contract of :meth:`LoadedExecutable.execute`, written once for every backend:
    the executable is not deleted; ``options`` is an ExecuteOptions or None (the
    defaults); ``devices`` is a portable executable's one addressable device, or else
    None or the compiled devices; there are as many arguments as ``parameters``, each
    checked by :class:`ArgumentChecks` against its parameter placed by
    ``parameter_shardings`` (a portable executable's: its device); and the call donates
    the ``donatable`` arguments that ``options.non_donatable_input_indices`` leaves.

    ``parameters`` None is a program whose parameter types the backend does not know
    (e.g. a Python function): each argument is then checked to be a live array of the
    client, and nothing is donated. ``output_shardings`` (None where unknown) are named
    after the arguments' meshes (:class:`NamedOutputs`)."""

    def __init__(self, name: str, client: Any, array_type: type,
                 parameters: Sequence[TensorType] | None,
                 parameter_shardings: Sequence[Sharding] | None = None,
                 results: Sequence[TensorType] = (),
                 output_shardings: Sequence[Sharding] | None = None,
                 donatable: frozenset[int] = frozenset()):
        self._name = name
        self._client = client
        self._array_type = array_type
        self._parameter_shardings = (None if parameter_shardings is None
                                     else list(parameter_shardings))
        self._results = list(results)
        self._donatable = frozenset(donatable)
        self.arguments = (None if parameters is None
                          else ArgumentChecks(name, client, parameters, array_type))
        self.named_outputs = (None if output_shardings is None
                              else NamedOutputs(output_shardings, results))

    def check(self, executable: LoadedExecutable, args: Any, options: Any,
              devices: Any) -> CheckedExecute:
        """The call ``executable.execute(args, options, devices)`` checked; the first
        broken rule raises (FailedPreconditionError for a deleted executable,
        InvalidArgumentError naming the argument or option otherwise)."""
        if executable.is_deleted():
            raise FailedPreconditionError(f"executable {self._name!r} has been deleted")
        if options is None:
            options = _DEFAULT_EXECUTE_OPTIONS
        elif type(options) is not ExecuteOptions:
            check_type(options, ExecuteOptions, "options", "an ExecuteOptions or None")
        device = check_execute_devices(executable, devices)
        if self.arguments is None:
            checked = array_sequence(args, "args")
            for i, arg in enumerate(checked):
                check_of_client(self._client, arg, f"argument {i} of {self._name}",
                                self._array_type)
                check_argument_live(self._name, i, arg)
            return CheckedExecute(checked, options, device, frozenset(), None)
        shardings = self._parameter_shardings
        if device is not None:  # portable: every parameter and output on that device
            single = SingleDeviceSharding(device)
            shardings = [single] * len(self.arguments.parameters)
            outputs: list[Sharding] | None = [single] * len(self._results)
        elif shardings is None:  # only a portable executable has none, and it has a device
            raise InternalError(f"{self._name}: a bound executable without parameter shardings")
        checked = self.arguments.check(args, shardings)
        if device is None:
            outputs = None if self.named_outputs is None else self.named_outputs(checked)
        donated = self._donatable
        if donated and options.non_donatable_input_indices:
            donated = donated - options.non_donatable_input_indices
        return CheckedExecute(checked, options, device, donated, outputs)


_DEFAULT_EXECUTE_OPTIONS = ExecuteOptions()


def _holds_whole(sharding: Sharding, shape: Shape) -> bool:
    """Whether every device of ``sharding`` holds the whole array."""
    if sharding.is_fully_replicated:
        return True
    try:
        return sharding.shard_shape(shape) == shape
    except InvalidArgumentError:
        return False


def same_domains(a: Sharding, b: Sharding, shape: Shape) -> bool:
    """Whether ``a`` and ``b`` put the same values of an array of ``shape`` on each
    (addressable) device: the same partial values or none (:func:`same_unreduced`), and
    both hold the whole array everywhere or their index domains match."""
    if not same_unreduced(a, b):
        return False
    if _holds_whole(a, shape) and _holds_whole(b, shape):
        return True
    semantics = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
    try:
        return list(a.index_domains(shape, semantics)) == list(b.index_domains(shape, semantics))
    except InvalidArgumentError:
        return False


class NamedOutputs:
    """The output shardings of an executable for arguments of given shardings, as jax
    names them: a compiled output sharding that is a NamedSharding over the mesh of an
    argument's NamedSharding becomes that NamedSharding (axis names included); the others
    stay as compiled. Worked out once per tuple of argument shardings (the last
    ``ENTRIES``), so that a repeated execute pays one dict lookup."""

    ENTRIES = 64

    def __init__(self, shardings: Sequence[Sharding], results: Sequence[TensorType]):
        self._shardings = list(shardings)
        self._results = list(results)
        self._found: dict[tuple[Sharding, ...], list[Sharding]] = {}
        self._lock = threading.Lock()

    def __call__(self, args: Sequence[Any]) -> list[Sharding]:
        key = tuple(a.sharding for a in args)
        found = self._found.get(key)
        if found is None:
            if len(self._found) >= self.ENTRIES:
                self._found.clear()
            found = self._found[key] = self._work_out(key)
        return found

    def specs(self, args: Sequence[Any]) -> tuple[tuple[Any, Any, Sharding], ...]:
        """The (dtype, shape, sharding) of each output of a call with ``args``."""
        return tuple((r.dtype, r.shape, sharding)
                     for r, sharding in zip(self._results, self(args)))

    def accept(self, core: Any, args: Sequence[Any]) -> tuple[tuple[Any, Any, Sharding], ...]:
        """For a backend whose C path repeats calls with arguments of the kinds it last
        checked: set ``core._accepted`` to the (dtype, shape, sharding) of each of
        ``args`` and ``core._outputs_spec`` to those of the outputs they give, as a pair
        the C path (reading both at once) never sees half set; returns the latter."""
        outputs = self.specs(args)
        accepted = [(a.dtype, a.shape, a.sharding) for a in args]
        with self._lock:
            core._accepted = None
            core._outputs_spec = outputs
            core._accepted = accepted
        return outputs

    def _work_out(self, argument_shardings: tuple[Sharding, ...]) -> list[Sharding]:
        meshes = list(dict.fromkeys(s.mesh for s in argument_shardings
                                    if isinstance(s, NamedSharding)))
        out = []
        for sharding, result in zip(self._shardings, self._results):
            named = None
            for mesh in meshes:
                named = named_sharding_like(sharding, mesh, result.shape)
                if named is not None:
                    break
            out.append(sharding if named is None else named)
        return out
