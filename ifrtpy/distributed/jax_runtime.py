"""Multi-process runs of the jax backend: jax's runtime over ifrtpy's coordination service
(and gloo collectives between CPU processes).

Every process calls ``ifrtpy.distributed.initialize()`` before anything uses jax; then
``ifrtpy.get_client("jax")`` hands the job to jax's runtime as it starts it
(:func:`ifrtpy.distributed.attach_jax_runtime`; ``initialize(backend="jax")`` does it at
once), and lists the devices of all processes (``is_addressable`` for its own). The
coordination client is the one :mod:`ifrtpy.distributed` makes (of jaxlib's service,
started *recoverable* in the job's coordinator process), handed to jax in place of the one
``jax.distributed.initialize`` would make; so a process that fails, process 0 included,
does not end the others, which get Python errors instead (see
:func:`ifrtpy.distributed.initialize_distributed` for which, and when).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from ifrtpy import _jaxlib
from ifrtpy.distributed import _gloo_lines
from ifrtpy.errors import FailedPreconditionError

__all__ = ["check_can_start", "attach", "detach", "with_collective_timeout"]

#: The XLA flag bounding each CPU collective's wait for the other processes (gloo's timeout).
COLLECTIVE_TIMEOUT_FLAG = "--xla_cpu_collective_timeout_seconds"


def check_can_start() -> None:
    """FailedPreconditionError when jax has started its runtime, or its distributed runtime
    is up (then jax would not use ours)."""
    if _jaxlib.backends_are_initialized():
        raise FailedPreconditionError(
            "jax's runtime has started already, so it cannot join the job (it would see "
            "this process's devices only): ifrtpy.distributed.initialize() must run before "
            "jax starts its runtime (before any get_client('jax'), jax.devices() or jax "
            "computation in this process)")
    if _jaxlib.jax_distributed_state().client is not None:
        raise FailedPreconditionError(
            "jax's distributed runtime is already initialized (jax.distributed.initialize): "
            "jax is in a job of its own")


def attach(client: Any, coordinator_address: str, num_processes: int,
           process_id: int, *, local_device_count: int | None, initialization_timeout_s: int,
           collective_timeout_s: int) -> None:
    """Make jax's runtime use ``client`` (connected; the service runs in the job's
    coordinator), with gloo collectives bounded by ``collective_timeout_s`` and the CPU topology
    exchange by ``initialization_timeout_s`` (whole minutes, at least 1). When it raises,
    jax's state and settings and ``XLA_FLAGS`` are as they were (the client is the
    caller's to stop)."""
    import jax

    minutes = max(1, math.ceil(initialization_timeout_s / 60))
    settings: dict[str, Any] = {
        "jax_cpu_collectives_implementation": "gloo",
        # the wait of get_client('jax') for the other processes' devices
        "jax_cpu_get_local_topology_timeout_minutes": minutes,
        "jax_cpu_get_global_topology_timeout_minutes": minutes + 1,  # jax: must be greater
    }
    if local_device_count is not None:
        settings["jax_num_cpu_devices"] = local_device_count
    state = _jaxlib.jax_distributed_state()
    fields = ("service", "client", "process_id", "num_processes", "coordinator_address")
    saved_state = {name: getattr(state, name) for name in fields}
    saved_settings: dict[str, Any] = {}
    saved_flags = os.environ.get("XLA_FLAGS")

    def undo() -> None:
        for name, value in saved_state.items():
            setattr(state, name, value)
        for name, value in saved_settings.items():
            jax.config.update(name, value)  # type: ignore[no-untyped-call]
        if saved_flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = saved_flags

    try:
        for name, value in settings.items():
            saved_settings[name] = getattr(jax.config, name)
            jax.config.update(name, value)  # type: ignore[no-untyped-call]
        os.environ["XLA_FLAGS"] = with_collective_timeout(saved_flags, collective_timeout_s)
        for name, value in zip(fields, (None, client, process_id, num_processes,
                                        coordinator_address)):
            setattr(state, name, value)
    except BaseException:
        undo()
        raise
    _gloo_lines.start()  # gloo's connection lines off, as the other native log lines


def with_collective_timeout(xla_flags: str | None, seconds: int) -> str:
    """``XLA_FLAGS`` with the CPU collective timeout (one already there wins). XLA reads
    these flags once per process, when first needed: when jax starts its runtime."""
    flags = xla_flags or ""
    if re.search(rf"(^|\s){re.escape(COLLECTIVE_TIMEOUT_FLAG)}=", flags):
        return flags
    return f"{flags} {COLLECTIVE_TIMEOUT_FLAG}={seconds}".strip()


def detach() -> None:
    """jax's distributed state cleared, as the job is left (jax's runtime, once started,
    keeps its devices and its reference to the client)."""
    _gloo_lines.stop()
    state = _jaxlib.jax_distributed_state()
    state.service = None
    state.client = None
