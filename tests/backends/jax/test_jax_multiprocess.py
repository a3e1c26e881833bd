"""The jax backend over 2 processes x 4 CPU devices on loopback (ifrtpy's coordination
service handed to jax, gloo collectives), and what each process sees when another one
never comes, dies or leaves, process 0 included.

Each case starts the processes of tests/helpers/jax_multiprocess_worker.py, waits for them
with a time limit and kills any still running (no stray processes)."""

import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("jax")

from pjrt_helpers import assert_ends  # noqa: E402
from jax_multiprocess_worker import (
    COLLECTIVE_S, HEARTBEAT_S, INITIALIZATION_TIMEOUT_LONE_S,
)

WORKER = pathlib.Path(__file__).resolve().parents[2] / "helpers" / "jax_multiprocess_worker.py"



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(mode: str, process_ids, timeout_s: float) -> list[tuple[int, str, str, float]]:
    """(exit status, stdout, stderr, seconds from the start to its end) of each process,
    all started at once; the processes still running after ``timeout_s`` are killed and
    the case fails."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    port = str(_free_port())
    start = time.monotonic()
    processes = [subprocess.Popen([sys.executable, str(WORKER), str(i), port, mode],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for i in process_ids]
    ended: dict[int, float] = {}
    try:
        while len(ended) < len(processes):  # their end times (outputs are small: no deadlock)
            if time.monotonic() - start > timeout_s:
                pytest.fail(f"the {mode!r} processes did not end within {timeout_s} s")
            for i, p in enumerate(processes):
                if i not in ended and p.poll() is not None:
                    ended[i] = time.monotonic() - start
            time.sleep(0.02)
        results = []
        for i, p in enumerate(processes):
            out, err = p.communicate(timeout=10)
            results.append((p.returncode, out, err, ended[i]))
        return results
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.communicate()


def _error(out: str, what: str) -> tuple[str, float, str]:
    """(ifrtpy error class, seconds, message) the worker printed for ``what``."""
    match = re.search(rf"^ERROR (\w+) ([\d.]+) {what}: (.*)$", out, re.M)
    assert match, out
    return match.group(1), float(match.group(2)), match.group(3)


def test_global_array_spmd_collectives_and_resharding_across_processes():
    """Shards from each process make one array; psum and all_gather across the processes
    equal NumPy; resharding moves shards to the other process; a host copy of an array
    split over both processes is refused, one of a replicated array (psum's output) reads
    it whole, as jax does; the processes exchange values through the job's
    key-value store (the worker asserts each step); both leave the job at exit."""
    for status, out, err, _ in _run("spmd", [0, 1], timeout_s=120):
        assert status == 0 and "OK" in out, err[-3000:]
        assert "[Gloo]" not in out, out  # gloo's connection lines are hidden (docs/logging.md)


@pytest.mark.parametrize("process_id", [0, 1])
def test_a_process_that_never_joins_gives_the_waiting_one_a_deadline_exceeded_error(process_id):
    """Process 0 (which would serve the service) or process 1 (whose coordinator never
    comes) waits initialization_timeout, raises DeadlineExceededError, and exits normally
    with nothing left behind (the worker checks jax's state, XLA_FLAGS and the port)."""
    ((status, out, err, seconds),) = _run("lone", [process_id], timeout_s=60)
    assert status == 0 and "EXITING" in out, err[-3000:]
    cls, waited, message = _error(out, "initialize")
    assert cls == "DeadlineExceededError"
    assert ("process(es) [1] of 2 did not join" if process_id == 0
            else "process 1 could not join") in message
    # it waited its initialization_timeout (never less); the upper bound is about a hang only
    assert INITIALIZATION_TIMEOUT_LONE_S - 0.5 < waited < HANG_S


#: A collective with a process gone: UnavailableError when gloo saw its connection close,
#: DeadlineExceededError when it waited for it the collective timeout.
GLOO_FAILURES = ("UnavailableError", "DeadlineExceededError")
#: Bounds on how long a wait took are about hangs only (jaxlib's own defaults wait minutes;
#: each run is killed at 60 s): a loaded machine may take many times the timeouts set.
HANG_S = 45


@pytest.mark.parametrize("mode", ["dies-after", "dies-during", "coordinator-dies",
                                  "coordinator-leaves"])
def test_a_process_that_dies_or_leaves_fails_the_survivors_collectives_in_bounded_time(mode):
    """Process 1, or process 0 (which started the job's coordinator), dies before the
    other's next psum or while it is inside it, or leaves the job: the survivor's psum
    fails with an ifrtpy error within collective_timeout, the next one within twice that
    (at once, but where gloo sets up its connections again), and the survivor leaves the
    job and exits normally (the service lives on in the coordinator's
    process, which ends once both have gone)."""
    victim = 0 if mode.startswith("coordinator") else 1
    results = _run(mode, [0, 1], timeout_s=60)
    status, out, err, _ = results[victim]
    assert status == 0 and "FIRST OK" in out, err[-3000:]  # it left on purpose
    status, out, err, _ = results[1 - victim]
    assert status == 0 and "EXITING" in out, err[-3000:]
    cls, waited, message = _error(out, "execute")
    assert cls in GLOO_FAILURES and "Gloo" in message
    assert waited < HANG_S
    cls, waited, message = _error(out, "execute again")  # at once, or gloo connects anew
    assert cls in GLOO_FAILURES and waited < HANG_S
    shutdown_s = float(re.search(r"^SHUTDOWN ([\d.]+)$", out, re.M).group(1))
    assert shutdown_s < HANG_S
    if mode == "coordinator-leaves":
        leaving = results[0][1]
        assert float(re.search(r"^SHUTDOWN ([\d.]+)$", leaving, re.M).group(1)) < 1
        assert_ends(int(re.search(r"^COORDINATOR (\d+)$", leaving, re.M).group(1)), 30)


def test_process_0_failing_in_initialize_after_the_join_leaves_the_others_running():
    """initialize fails in process 0 after every process has joined: process 0 raises at
    once and exits; process 1, already in the job, keeps the service (it lives in the
    coordinator's process) and leaves normally."""
    (status0, out0, err0, _), (status1, out1, err1, _) = _run(
        "initialize-fails-in-0", [0, 1], timeout_s=60)
    assert status0 == 0 and "EXITING" in out0, err0[-3000:]
    failed = re.search(r"^FAILED ([\d.]+) injected failure$", out0, re.M)
    assert failed and float(failed.group(1)) < HANG_S, out0
    assert status1 == 0 and "EXITING" in out1, err1[-3000:]


def test_after_initialize_with_the_default_backend_get_client_jax_joins_the_job():
    """initialize(address, 2, pid) (backend "pjrt", the default), then get_client("jax"):
    jax's runtime is handed the job as it starts, so each process's client lists the 8
    devices of both (device_count=4 is this process's count); the processes exchange
    key-value entries and a psum over both equals NumPy's."""
    for status, out, err, _ in _run("default-backend", [0, 1], timeout_s=120):
        assert status == 0 and "OK" in out and "EXITING" in out, err[-3000:]
        assert "psum over 8 devices" in out


def test_get_client_jax_refuses_to_be_a_single_process_client_in_a_job():
    """jax started before initialize(): get_client("jax") raises FailedPreconditionError
    saying what to do, rather than giving each process a client of its own devices."""
    for status, out, err, _ in _run("jax-first", [0, 1], timeout_s=120):
        assert status == 0 and "EXITING" in out, err[-3000:]
        cls, _, message = _error(out, "get_client")
        assert cls == "FailedPreconditionError"
        assert "this process's devices only" in message and "before jax starts" in message


def test_a_failed_initialize_leaves_jax_and_the_port_as_they_were():
    """initialize(backend="jax") failing after its service and client started, and after
    jax's runtime started (FailedPreconditionError): jax's settings and distributed state,
    XLA_FLAGS and the port are as before (the worker asserts them)."""
    ((status, out, err, _),) = _run("half-state", [0], timeout_s=60)
    assert status == 0 and "EXITING" in out, err[-3000:]
    assert _error(out, "initialize after jax started")[0] == "FailedPreconditionError"
