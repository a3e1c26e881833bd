"""The coordination service of a multi-process job, in a process of its own.

jaxlib's coordination client terminates its process (SIGABRT) once the service it talks to
is gone. Were the service in process 0, as jax has it, process 0's end (a crash, or simply
leaving first) would end every other process. So process 0 starts the service in a child
process (:func:`start`), which:

1. listens at the job's address for the join of every process, ``0 .. N-1``, until
   ``JOIN_BY`` (the time, in seconds since the epoch, when process 0's
   ``initialization_timeout`` ends: its own start does not add to it), 1 s at least
   (:func:`ifrtpy.distributed._join.serve`), and says ``READY`` on its standard output once it does;
2. once all have joined, starts jaxlib's service there (recoverable: a process that
   stops is not reported to the others as fatal) and lets them go on;
3. stops the service and exits once every process has left the job or died (their join
   connections closed); exits at once when they do not all join in time.

No process's end takes the service from the others; only this process's would (it does
nothing but serve). It is started in a session of its own, so that an interrupt aimed at
process 0's terminal does not reach it, and writes nothing once ready.

    python -m ifrtpy.distributed._coordinator ADDRESS NUM_PROCESSES INIT_S HEARTBEAT_S \
        SHUTDOWN_S JOIN_BY
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

from ifrtpy import _jaxlib
from ifrtpy.distributed import _join
from ifrtpy.errors import IfrtError, UnavailableError

__all__ = ["start"]

_READY = "READY"
#: The service runs in jaxlib's "recoverable" mode: a process that stops sending
#: heartbeats is not reported to the others as a fatal error (jaxlib's client would then
#: terminate them); they see their gets time out instead.
RECOVERABLE = True
#: How long process 0 waits for the coordinator to listen (a Python start and an import).
_START_TIMEOUT_S = 120.0
#: The coordinator listens for joins this long at least, even when it started so late that
#: ``JOIN_BY`` has passed: the processes waiting already hear its verdict.
_MIN_JOIN_S = 1.0


def start(address: str, num_processes: int, init_s: int, heartbeat_s: int,
          shutdown_s: int, join_by: float) -> subprocess.Popen[str]:
    """Start the coordinator of a job at ``address`` and return once it listens there;
    UnavailableError (its reason) when it cannot. The processes must have joined by
    ``join_by`` (``time.time()``'s clock). A thread reaps it when it ends."""
    env = dict(os.environ)
    # this ifrtpy, where the child would not find it otherwise (last: nothing is shadowed)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), root) if p)
    process = subprocess.Popen(
        [sys.executable, "-m", "ifrtpy.distributed._coordinator", address, str(num_processes),
         str(init_s), str(heartbeat_s), str(shutdown_s), repr(join_by)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=env, start_new_session=True)
    assert process.stdout is not None
    try:
        ready, _, _ = select.select([process.stdout], [], [], _START_TIMEOUT_S)
        line = process.stdout.readline().strip() if ready else ""
    except BaseException:  # interrupted: no coordinator is left listening
        process.kill()
        process.wait()
        raise
    finally:
        process.stdout.close()
    if line != _READY:
        if process.poll() is None:
            process.kill()
        process.wait()
        raise UnavailableError(
            f"the coordination service of the job could not start at {address}: "
            f"{line.removeprefix('ERROR ') or 'its process said nothing'}")
    threading.Thread(target=process.wait, name="ifrtpy-coordinator-reaper", daemon=True).start()
    return process


def _serve(address: str, num_processes: int, init_s: int, heartbeat_s: int,
           shutdown_s: int, join_by: float) -> None:
    service: list[Any] = []

    def ready() -> None:
        print(_READY, flush=True)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # process 0 stops reading: nothing more goes there
        os.close(devnull)

    def start_service() -> None:
        service.append(_jaxlib.call(_jaxlib.distributed_runtime_service, address, num_processes,
                             heartbeat_timeout=heartbeat_s, cluster_register_timeout=init_s,
                             shutdown_timeout=shutdown_s, recoverable=RECOVERABLE))

    membership = _join.serve(address, num_processes, max(_MIN_JOIN_S, join_by - time.time()),
                             on_listening=ready,
                             start=start_service)
    try:
        membership.wait_until_all_leave()
    finally:
        service[0].shutdown()
        membership.close()


def main(argv: Sequence[str]) -> int:
    address, num_processes, init_s, heartbeat_s, shutdown_s, join_by = argv
    try:
        _serve(address, int(num_processes), int(init_s), int(heartbeat_s), int(shutdown_s),
               float(join_by))
    except UnavailableError as e:  # cannot listen: process 0 is told on standard output
        print(f"ERROR {e}", flush=True)
        return 1
    except IfrtError:  # not all joined, or no service: the processes that came were told
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
