"""Executables: IFRT's ``LoadedExecutable``, its options and results.

:class:`LoadedExecutable` is abstract (each backend subclasses it). :class:`CompileOptions`,
:class:`ExecuteOptions` (defined in :mod:`ifrtpy.executable_options`), :class:`ExecuteResult`
(defined in C, in ``_execute_result``) and :class:`CompiledMemoryStats` are plain value types
shared by every backend. The contract of ``execute`` is :mod:`ifrtpy.execute_checks`
(:class:`ExecuteContract` and :class:`CheckedExecute` are re-exported here).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

from ifrtpy._execute_result import ExecuteResult as ExecuteResult
from ifrtpy._execute_result import Outputs as Outputs
from ifrtpy.array import Array
from ifrtpy.device import DeviceList
from ifrtpy.errors import UnimplementedError
from ifrtpy.execute_checks import CheckedExecute as CheckedExecute
from ifrtpy.execute_checks import ExecuteContract as ExecuteContract
from ifrtpy.executable_options import CompileOptions as CompileOptions
from ifrtpy.executable_options import ExecuteOptions as ExecuteOptions
from ifrtpy.layout import Layout
from ifrtpy.user_context import UserContext

if TYPE_CHECKING:
    from ifrtpy.client import Client
    from ifrtpy.device import Device
    from ifrtpy.dtypes import DType
    from ifrtpy.future import Future
    from ifrtpy.shape import Shape
    from ifrtpy.sharding import Sharding

__all__ = [
    "CompileOptions",
    "ExecuteOptions",
    "ExecuteResult",
    "Outputs",
    "CompiledMemoryStats",
    "LoadedExecutable",
    "CheckedExecute",
    "ExecuteContract",
]

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

        An execute is two steps: the call is checked, once for every backend (the
        backend's ``_execute_contract``, an :class:`ExecuteContract`), then launched: the
        backend's :meth:`_launch` carries out the checked call. (A backend with a C path
        may launch a call whose arguments are of the kinds of a checked call without
        checking it again: ``ifrtpy.backends._array_fields``.)
        """
        return self._launch(self._execute_contract.check(self, args, options, devices))

    @abc.abstractmethod
    def _launch(self, call: CheckedExecute) -> ExecuteResult:
        """Launch ``call``, an execute whose contract :meth:`execute` checked: run on
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




def keyword_arguments_error(executable: Any, keywords: Mapping[str, Any]) -> TypeError:
    """The error of ``executable(..., name=value)``: a TypeError (as Python's for a call
    it cannot bind) naming the keywords, and how to pass arguments and options."""
    names = ", ".join(f"{k}=" for k in keywords)
    return TypeError(
        f"{executable.name} takes its arguments by position, in the order of the program's "
        f"parameters, not by keyword (got {names}): call it as executable(a, b, ...), or "
        "executable.execute([a, b, ...], ExecuteOptions(...)) for options")

