"""The options of executables: :class:`CompileOptions` (what a compile takes) and
:class:`ExecuteOptions` (what one execute takes), value types shared by every backend and
checked when made. Re-exported by :mod:`ifrtpy.executable`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ifrtpy.device import DeviceList
from ifrtpy.errors import InvalidArgumentError, check_int, invalid_argument
from ifrtpy.layout import Layout

if TYPE_CHECKING:
    from ifrtpy.client import Client
    from ifrtpy.program import TensorType

__all__ = ["CompileOptions", "ExecuteOptions", "program_layouts"]

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _check_int(owner: str, name: str, value: Any, lo: int, hi: int) -> int:
    if type(value) is int and lo <= value <= hi:
        return value
    if not isinstance(value, int):  # numpy ints convert silently; options keep Python ints
        raise invalid_argument(f"{owner}.{name}", "an int", value)
    return check_int(value, f"{owner}.{name}", lo, hi)


def _check_bool(owner: str, name: str, value: Any, *, optional: bool = False) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        allowed = "a bool or None" if optional else "a bool"
        raise InvalidArgumentError(f"{owner}.{name} must be {allowed}, got {value!r}")


def _check_str_keys(owner: str, name: str, mapping: Any) -> dict[str, Any]:
    if type(mapping) is not dict and not isinstance(mapping, Mapping):
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
        indices = self.non_donatable_input_indices
        try:
            if type(indices) is not frozenset:
                indices = frozenset(indices)
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


