"""The job: joining it, its coordination service and key-value store, leaving it."""


from __future__ import annotations

import atexit
import math
import threading
import time
from typing import Any

from ifrtpy import _jaxlib
from ifrtpy.distributed import _coordinator, _join, clusters, jax_runtime
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError

__all__ = [
    "initialize", "shutdown", "is_initialized", "process_id", "num_processes",
    "key_value_store", "CoordinationStore", "attach_jax_runtime",
]


class CoordinationStore:
    """The coordination service's key-value store, under a key prefix, with the methods
    the PJRT callbacks call: ``get(key, timeout_ms)``, ``try_get(key)`` and ``put(key,
    value)``. Values are bytes. Errors are ``ifrtpy.errors`` classes (a get that times out
    raises DeadlineExceededError, a missing key in ``try_get`` NotFoundError).
    ``counts`` says how many calls of each kind went through."""

    def __init__(self, client: Any, prefix: str = "", counts: dict[str, int] | None = None):
        self._client = client
        self._prefix = prefix
        self.counts = {"get": 0, "try_get": 0, "put": 0} if counts is None else counts

    def with_prefix(self, prefix: str) -> CoordinationStore:
        """The same store under a longer prefix (sharing ``counts``)."""
        return CoordinationStore(self._client, self._prefix + prefix, self.counts)

    def get(self, key: str, timeout_ms: int) -> bytes:
        self.counts["get"] += 1
        value: bytes = _jaxlib.call(self._client.blocking_key_value_get_bytes,
                                    self._prefix + key, max(int(timeout_ms), 0))
        return value

    def try_get(self, key: str) -> bytes:
        self.counts["try_get"] += 1
        value: bytes = _jaxlib.call(self._client.key_value_try_get_bytes, self._prefix + key)
        return value

    def put(self, key: str, value: bytes) -> None:
        self.counts["put"] += 1
        _jaxlib.call(self._client.key_value_set_bytes, self._prefix + key, bytes(value))


class _State:
    def __init__(self, client: Any, address: str, num_processes: int, process_id: int,
                 membership: _join.Membership, backend: str, coordinator: Any,
                 jax_settings: dict[str, Any]):
        self.client = client
        self.address = address  # the coordinator's, its host an IP address
        self.coordinator = coordinator  # process 0: the coordinator's subprocess.Popen
        self.num_processes = num_processes
        self.process_id = process_id
        self.membership = membership  # the join's open connection
        self.backend = backend
        self.store = CoordinationStore(client)
        self.jax_settings = jax_settings  # jax_runtime.attach's keyword arguments
        self.jax_attached = False  # whether jax's runtime was handed the job


#: The default ``collective_timeout`` (jax's runtime in a job), in seconds.
COLLECTIVE_TIMEOUT_S = 300
_lock = threading.Lock()
_state: _State | None = None
_exit_hook_registered = False


def _seconds(name: str, value: float) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
            or not math.isfinite(value)):
        raise InvalidArgumentError(f"{name} must be a positive number of seconds, got {value!r}")
    return max(1, math.ceil(value))


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, backend: str = "pjrt",
               local_device_count: int | None = None, initialization_timeout: float = 300,
               heartbeat_timeout: float = 100, shutdown_timeout: float = 300,
               collective_timeout: float | None = None) -> None:
    """Join the job: process 0 starts the job's coordinator at ``coordinator_address``
    (``host:port``, bound exactly there; a process of its own), every process joins there,
    and once all have, connects to the coordination service it then serves. Timeouts are
    in seconds.

    What is not given is found in the environment the processes were started in
    (:mod:`ifrtpy.distributed.clusters`): ``python -m ifrtpy launch``, Open MPI's
    ``mpirun``, SLURM's ``srun``, a Kubernetes Indexed Job; so in such a job
    ``initialize()`` needs no arguments. ``local_device_count`` defaults to
    ``IFRTPY_LOCAL_DEVICE_COUNT`` (``launch --devices-per-process``).

    Every client made afterwards joins the job: PJRT clients get its key-value store
    (and ``node_id`` / ``num_nodes``), and jax's runtime is handed the job when
    ``get_client("jax")`` first starts it (:func:`attach_jax_runtime`): gloo for CPU
    collectives, each waiting for the other processes at most ``collective_timeout``
    (default 300), ``local_device_count`` CPU devices in this process (default: jax's).
    ``backend="jax"`` hands the job to jax's runtime at once instead, so that a jax
    already started is reported here (and PJRT clients are not given the job);
    ``backend="pjrt"`` is the default. Its failures are told in
    :mod:`ifrtpy.distributed.jax_runtime`.

    Blocks until all ``num_processes`` processes have joined, at most
    ``initialization_timeout``: then every waiting process raises DeadlineExceededError
    naming the missing ones (jaxlib's own connect would abort it). A process that dies
    later, process 0 included, does not take the others down (the service runs in the
    coordinator's process, recoverable): their key-value gets end with
    DeadlineExceededError at their timeout. The coordinator stops the service and exits
    once every process has left the job or died. Raises InvalidArgumentError for bad
    arguments or variables (naming them), FailedPreconditionError when already
    initialized, UnavailableError when the coordinator's host does not resolve or the
    coordinator cannot listen at the address (saying where the address came from). When
    it raises, it leaves nothing started (and jax's settings as they were).
    """
    global _state, _exit_hook_registered
    job = clusters.resolve(coordinator_address, num_processes, process_id)
    if backend not in ("pjrt", "jax"):
        raise InvalidArgumentError(f"backend must be 'pjrt' or 'jax', got {backend!r}")
    if local_device_count is None:
        local_device_count = job.local_device_count
    if local_device_count is not None and (
            isinstance(local_device_count, bool) or not isinstance(local_device_count, int)
            or local_device_count < 1):
        raise InvalidArgumentError(
            f"local_device_count must be an int >= 1, got {local_device_count!r}")
    init_s = _seconds("initialization_timeout", initialization_timeout)
    heartbeat_s = _seconds("heartbeat_timeout", heartbeat_timeout)
    shutdown_s = _seconds("shutdown_timeout", shutdown_timeout)
    collective_s = _seconds("collective_timeout", COLLECTIVE_TIMEOUT_S
                            if collective_timeout is None else collective_timeout)
    count, pid = job.num_processes, job.process_id
    with _lock:
        if _state is not None:
            raise FailedPreconditionError(
                "ifrtpy.distributed is already initialized; call shutdown() first")
        if backend == "jax":
            jax_runtime.check_can_start()
        deadline, join_by = time.monotonic() + init_s, time.time() + init_s
        origin = f"coordinator_address from {job.origins['coordinator_address']}"
        try:
            address = _join.numeric_address(job.coordinator_address, init_s)
            # Meet first: jaxlib's connect() ends the process when a peer never comes.
            coordinator = (_coordinator.start(address, count, init_s, heartbeat_s, shutdown_s,
                                              join_by) if pid == 0 else None)
        except UnavailableError as e:
            raise UnavailableError(f"{e} ({origin})") from None
        membership: _join.Membership | None = None
        connected: Any = None
        jax_settings = {"local_device_count": local_device_count,
                        "initialization_timeout_s": init_s, "collective_timeout_s": collective_s}
        try:
            membership = _join.join(address, count, pid, max(1.0, deadline - time.monotonic()))
            client = _jaxlib.call(_jaxlib.distributed_runtime_client, address, pid,
                                  init_timeout=init_s, heartbeat_timeout=heartbeat_s,
                                  shutdown_timeout=shutdown_s, shutdown_on_destruction=False)
            _jaxlib.call(client.connect)
            connected = client
            state = _State(client, address, count, pid, membership, backend, coordinator,
                           jax_settings)
            if backend == "jax":
                _attach(state)
        except BaseException:
            _abandon(coordinator, membership, connected, count)
            raise
        _state = state
        if not _exit_hook_registered:
            atexit.register(_shutdown_at_exit)
            _exit_hook_registered = True


def _attach(state: _State) -> None:
    jax_runtime.attach(state.client, state.address, state.num_processes, state.process_id,
                       **state.jax_settings)
    state.jax_attached = True


def attach_jax_runtime() -> None:
    """Hand the job to jax's runtime before it starts: what ``get_client("jax")`` does
    first, so that its client spans the job's processes. Nothing happens outside a job,
    when it was done already, or in a job of one process whose jax has started (that
    runtime is the whole job). Every process must then start jax's runtime within
    ``initialization_timeout`` (its devices are exchanged).

    FailedPreconditionError when jax's runtime has started already (it would see this
    process's devices only: initialize the job before anything uses jax), or jax is in
    a job of its own (``jax.distributed.initialize``)."""
    with _lock:
        state = _state
        if state is None or state.jax_attached:
            return
        if state.num_processes == 1 and _jaxlib.backends_are_initialized():
            return
        jax_runtime.check_can_start()
        _attach(state)


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None, *,
                           local_device_count: int | None = None,
                           initialization_timeout: float = 60,
                           heartbeat_timeout: float = 30,
                           shutdown_timeout: float = 300,
                           collective_timeout: float = 300) -> None:
    """Join this process to a run of ``num_processes`` processes over jax's runtime:
    ``ifrtpy.distributed.initialize(..., backend="jax")`` with these default timeouts
    (seconds; the same names, as jax's ``initialization_timeout``).

    ``coordinator_address`` (``host:port``) is where process 0 starts the job's
    coordinator (a process of its own, serving the coordination service) and every
    process reaches it; what is not given is found in the environment, as
    :func:`initialize` finds it. ``local_device_count`` sets this process's number of
    CPU devices (CPU only; default: jax's). CPU collectives between processes use gloo.
    Must be called before jax starts its runtime (FailedPreconditionError otherwise).

    What the other processes see when one fails (ifrtpy errors, the process goes on):

    * It never joins: each waiting process raises DeadlineExceededError naming it after
      ``initialization_timeout``.
    * It dies after joining: a program whose collectives need it fails within
      ``collective_timeout`` (gloo's wait, set through ``XLA_FLAGS``;
      DeadlineExceededError or UnavailableError "Gloo ... failed: ...", raised where the
      results are read), the next ones at once (UnavailableError).
      The first collective over a set of devices sets up gloo's connections, which waits
      30 s for a dead process (jaxlib's fixed timeout) instead. Dead before
      ``get_client("jax")``: that raises InternalError (the topology exchange) after
      ``initialization_timeout`` rounded up to whole minutes.
    * Process 0 dies or leaves: as any other process (the service runs in the
      coordinator's process, which ends once every process has left or died). Only the
      coordinator's own end (killed) would end the others: jaxlib's client terminates a
      process whose service is gone (SIGABRT, "Terminating process because the JAX
      distributed service detected fatal errors").
    """
    initialize(coordinator_address, num_processes, process_id, backend="jax",
               local_device_count=local_device_count,
               initialization_timeout=initialization_timeout, heartbeat_timeout=heartbeat_timeout,
               shutdown_timeout=shutdown_timeout, collective_timeout=collective_timeout)


def _abandon(coordinator: Any, membership: _join.Membership | None, client: Any,
             num_processes: int) -> None:
    """Undo a failed ``initialize``: the connected ``client`` leaves the service, the join
    connection closes. The coordinator this process started ends by itself once every
    process has left: it is waited for when no other process is in the job (this one
    never joined, or is alone), and ended after 15 s if it has not; once the others have
    joined it is left to serve them. Errors here give way to the one being raised."""
    try:
        if client is not None:
            client.shutdown()
    except Exception:  # noqa: BLE001 - the failure of initialize is what is reported
        pass
    finally:
        if membership is not None:
            membership.close()
        if coordinator is not None and (membership is None or num_processes == 1):
            try:
                coordinator.wait(timeout=15)
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
                coordinator.kill()
                coordinator.wait()


def shutdown() -> None:
    """Leave the job, at once: this process's client leaves the service, then its join
    connection closes (the coordinator stops the service once every process has left or
    died). Runs at exit when not called. Nothing happens when not initialized."""
    global _state
    with _lock:
        state, _state = _state, None
    if state is not None:
        _leave(state)


def _leave(state: _State) -> None:
    """The client leaves the service (and jax's runtime, for backend="jax"), then the join
    connection closes, which tells the coordinator."""
    try:
        if state.jax_attached:
            jax_runtime.detach()
        _jaxlib.call(state.client.shutdown)
    finally:
        state.membership.close()


def _shutdown_at_exit() -> None:
    try:
        shutdown()
    except Exception:  # noqa: BLE001 - nothing to report to at exit
        pass


def is_initialized() -> bool:
    return _state is not None


def job_backend() -> str | None:
    """What the job was initialized for: ``"pjrt"`` (the PJRT clients made afterwards join
    it, and jax's runtime when ``get_client("jax")`` starts it), ``"jax"`` (jax's runtime
    was handed it at once), or None when not initialized."""
    state = _state
    return None if state is None else state.backend


def _current() -> _State:
    state = _state
    if state is None:
        raise FailedPreconditionError("ifrtpy.distributed is not initialized")
    return state


def process_id() -> int:
    """This process's index in the job. FailedPreconditionError when not initialized."""
    return _current().process_id


def num_processes() -> int:
    """The number of processes in the job. FailedPreconditionError when not initialized."""
    return _current().num_processes


def key_value_store() -> CoordinationStore:
    """The job's key-value store (with ``backend="jax"`` too, where jax's runtime keeps its
    own keys in the same store: choose keys of your own). FailedPreconditionError when not
    initialized."""
    return _current().store
