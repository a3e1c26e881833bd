"""Multi-process runs of the jax backend: jax's distributed runtime (its coordination
service, and gloo collectives between CPU processes).

Every process calls :func:`initialize_distributed` before anything uses jax, then
``ifrtpy.get_client("jax")`` lists the devices of all processes (``is_addressable`` for
its own).

Failures end the processes, as jax does (their pending collectives could never complete):
when a process does not join within ``initialization_timeout_s``, the others end with
``DEADLINE_EXCEEDED ... RegisterTask`` on stderr; when a process dies later, the others'
coordination service notices within ``heartbeat_timeout_s`` and ends them with
``The following tasks are unhealthy (stopped sending heartbeats)``. Exit status: SIGABRT.
"""

from __future__ import annotations

from typing import Any

from ifrtpy import _jaxlib
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def initialize_distributed(coordinator_address: str, num_processes: int, process_id: int, *,
                           local_device_count: int | None = None,
                           initialization_timeout_s: int = 60,
                           heartbeat_timeout_s: int = 30) -> None:
    """Join this process to a run of ``num_processes`` processes over jax's runtime.

    ``coordinator_address`` (``host:port``) is where process 0 serves the coordination
    service and the others reach it. ``local_device_count`` sets this process's number of
    CPU devices (CPU only; default: jax's). CPU collectives between processes use gloo.
    Must be called before jax starts its runtime (FailedPreconditionError otherwise).
    Blocks until every process has joined; see the module docstring for failures.
    """
    if not isinstance(coordinator_address, str) or ":" not in coordinator_address:
        raise InvalidArgumentError(
            f"coordinator_address must be 'host:port', got {coordinator_address!r}")
    _check_int("num_processes", num_processes, 1)
    _check_int("process_id", process_id, 0)
    if process_id >= num_processes:
        raise InvalidArgumentError(
            f"process_id must be < num_processes={num_processes}, got {process_id}")
    if local_device_count is not None:
        _check_int("local_device_count", local_device_count, 1)
    _check_int("initialization_timeout_s", initialization_timeout_s, 1)
    _check_int("heartbeat_timeout_s", heartbeat_timeout_s, 1)
    import jax

    if _jaxlib.backends_are_initialized():
        raise FailedPreconditionError(
            "initialize_distributed must run before jax starts its runtime (before any "
            "get_client('jax'), jax.devices() or jax computation in this process)")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]
    if local_device_count is not None:
        jax.config.update("jax_num_cpu_devices", local_device_count)  # type: ignore[no-untyped-call]
    jax.distributed.initialize(
        coordinator_address, num_processes, process_id,
        initialization_timeout=initialization_timeout_s,
        heartbeat_timeout_seconds=heartbeat_timeout_s)
