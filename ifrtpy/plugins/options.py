"""Typed client-create options of the PJRT plugins ifrtpy knows.

Each known plugin (by name: ``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``, and the XLA CPU
builds of :mod:`ifrtpy.plugins.builds` by their distribution names) has a table of the options
its ``PJRT_Client_Create`` reads, with their PJRT value type. :func:`check_options` refuses
an unknown name, a value of the wrong type and a value out of range before the plugin
sees it (the official CPU plugin silently ignores unknown names). Options of a plugin not
in the tables pass through as they are (``ifrtpy._pjrt.create_client`` hands each value to
the plugin typed as given), but for ``cpu_device_count``, which
:func:`check_cpu_device_count` checks whatever the plugin. Where each option comes from is
said in ``docs/plugins.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from ifrtpy.errors import InvalidArgumentError

__all__ = ["OptionSpec", "MAX_CPU_DEVICE_COUNT", "WHY_DEVICE_LIMIT", "known_options", "check_options",
           "check_cpu_device_count"]

#: Most devices a CPU client may have. Creating a CPU client costs time quadratic in its
#: device count (measured on the official plugin, see docs/plugins.md): 2048 devices take
#: about 1 s, 4096 about 3 s, 8192 about 16 s and 0.8 GiB, 10**6 never return. 4096 is
#: the largest power of two that stays within seconds.
MAX_CPU_DEVICE_COUNT = 4096

#: Why the count is capped, as the errors about it say.
WHY_DEVICE_LIMIT = (
    "creating a CPU client costs time quadratic in its device count (about 3 s for 4096 "
    "devices, 16 s for 8192), so ifrtpy caps it"
)


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One create option: its PJRT value ``kind`` (``"int"``, ``"float"``, ``"bool"``,
    ``"str"`` or ``"int_list"``), a one-line ``doc``, and an optional ``check`` returning
    an error text (None when the value is fine)."""

    kind: str
    doc: str
    check: Callable[[Any], str | None] | None = None


def _between(low: int | float, high: int | float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be in [{low}, {high}]"

    return check


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {', '.join(map(repr, choices))}"

    return check


def _non_negative_ids(value: Any) -> str | None:
    if any(v < 0 for v in value):
        return "must hold device ordinals >= 0"
    if len(set(value)) != len(value):
        return "must not repeat a device"
    return None


def _cpu_device_count_problem(n: int) -> str | None:
    """Why ``n`` (an int) is no CPU device count: the plugin makes a client without devices
    below 1, and takes time quadratic in the count above."""
    if 1 <= n <= MAX_CPU_DEVICE_COUNT:
        return None
    why = "a client needs a device" if n < 1 else WHY_DEVICE_LIMIT
    return f"must be in [1, {MAX_CPU_DEVICE_COUNT}] ({why})"


_CPU_DEVICE_COUNT = OptionSpec("int", "number of CPU devices (default 4)", _cpu_device_count_problem)

#: What every XLA CPU build reads (xla-cpu-pjrt 0.0.1, PJRT 0.81, and
#: fastatomstruct-xla-cpu, PJRT 0.106, read only this and ignore any other name).
_CPU = {"cpu_device_count": _CPU_DEVICE_COUNT}

#: lammps-jax-pjrt-cpu (PJRT 0.115) also reads these, and refuses any other name.
_CPU_0_115 = {
    **_CPU,
    "asynchronous": OptionSpec(
        "bool", "false: run every computation on the calling thread (default true)"),
    "process_id": OptionSpec(
        "int", "this process's index, the high bits of its device ids", _between(0, 2**31 - 1)),
}

_GPU = {
    "platform_name": OptionSpec("str", "StreamExecutor platform, e.g. 'cuda' or 'rocm'"),
    "allocator": OptionSpec(
        "str", "device allocator", _one_of("default", "platform", "bfc", "cuda_async")),
    "memory_fraction": OptionSpec(
        "float", "fraction of device memory the BFC allocator may take", _between(0.0, 1.0)),
    "preallocate": OptionSpec("bool", "allocate memory_fraction of the memory at creation"),
    "collective_memory_size": OptionSpec(
        "int", "bytes reserved for collectives", _between(0, 2**63 - 1)),
    "visible_devices": OptionSpec(
        "int_list", "local device ordinals the client uses (default: all)", _non_negative_ids),
    "node_id": OptionSpec("int", "this process's index among num_nodes", _between(0, 2**31 - 1)),
    "num_nodes": OptionSpec("int", "number of processes sharing the devices", _between(1, 2**31 - 1)),
    "should_stage_host_to_device_transfers": OptionSpec(
        "bool", "stage host-to-device copies through pinned host memory"),
    "abort_collectives_on_failure": OptionSpec("bool", "abort collectives when a peer fails"),
    "use_tfrt_gpu_client": OptionSpec("bool", "use the TFRT GPU client implementation"),
    "enable_mock_nccl": OptionSpec("bool", "mock NCCL (testing multi-node topologies)"),
    "mock_gpu_topology": OptionSpec("str", "topology for enable_mock_nccl"),
    "partition_index": OptionSpec("int", "index of this partition (slice)", _between(0, 2**31 - 1)),
}

#: libtpu (measured on 0.0.42.1, PJRT 0.112): its PJRT_Client_Create itself refuses an
#: unknown name ("Unexpected option name passed to PJRT_Client_Create") and a wrongly typed
#: value ("has type index 0 but expected type index 1"). max_inflight_computations is
#: what jax's make_tpu_client documents ("Defaults to allowing 32 in-flight
#: computations"); ml_framework_name / ml_framework_version are what jax passes
#: (jax/_src/cloud_tpu_init.py: "JAX" and its version).
_TPU = {
    "max_inflight_computations": OptionSpec(
        "int", "computations the client keeps in flight (default 32)", _between(1, 2**31 - 1)),
    "ml_framework_name": OptionSpec("str", "the framework using the client, e.g. 'JAX'"),
    "ml_framework_version": OptionSpec("str", "that framework's version"),
}

_KNOWN: dict[str, Mapping[str, OptionSpec]] = {
    "cpu": _CPU, "xla-cpu-pjrt": _CPU, "fastatomstruct-xla-cpu": _CPU,
    "lammps-jax-pjrt-cpu": _CPU_0_115, "cuda": _GPU, "rocm": _GPU, "tpu": _TPU,
}


def known_options(plugin: str) -> Mapping[str, OptionSpec] | None:
    """The option table of the plugin named ``plugin``; None for a plugin not known."""
    return _KNOWN.get(plugin)


def _kind_of(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "int_list"
    return None


def check_cpu_device_count(options: Mapping[str, Any]) -> None:
    """Refuse a ``cpu_device_count`` that is no int in [1, :data:`MAX_CPU_DEVICE_COUNT`],
    whatever the plugin (one without a table in ifrtpy too): InvalidArgumentError naming
    the option, the range and why. An XLA CPU plugin aborts the process on a count of
    another PJRT type (a str, a float, a bool, a list)."""
    if "cpu_device_count" not in options:
        return
    count = options["cpu_device_count"]
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidArgumentError(
            f"client option 'cpu_device_count' must be an int (an XLA CPU plugin aborts on "
            f"another type), got {type(count).__name__} {count!r}")
    problem = _cpu_device_count_problem(count)
    if problem is not None:
        raise InvalidArgumentError(f"client option 'cpu_device_count' {problem}, got {count}")


def check_options(plugin: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` checked against the table of ``plugin`` (a dict, list values as lists).

    InvalidArgumentError naming the option and what it got for an unknown name (listing
    the known ones), a wrong type or a value out of range. An int is accepted for a float
    option. A plugin without a table gets ``dict(options)`` back unchecked.
    """
    table = known_options(plugin)
    if table is None:
        return dict(options)
    out: dict[str, Any] = {}
    for name, value in options.items():
        spec = table.get(name)
        if spec is None:
            raise InvalidArgumentError(
                f"the {plugin!r} plugin has no create option {name!r}; "
                f"known options: {', '.join(sorted(table))}"
            )
        kind = _kind_of(value)
        if spec.kind == "float" and kind == "int":
            try:
                value, kind = float(value), "float"
            except OverflowError:
                raise InvalidArgumentError(
                    f"create option {name!r} of the {plugin!r} plugin must be a float, got "
                    f"an int too large for one ({value})") from None
        if kind != spec.kind:
            raise InvalidArgumentError(
                f"create option {name!r} of the {plugin!r} plugin must be of type "
                f"{spec.kind}, got {type(value).__name__} {value!r}"
            )
        if kind == "int_list":
            value = list(value)
        problem = spec.check(value) if spec.check is not None else None
        if problem is not None:
            raise InvalidArgumentError(
                f"create option {name!r} of the {plugin!r} plugin {problem}, got {value!r}"
            )
        out[name] = value
    return out
