"""The jax backend over 2 processes x 4 CPU devices on loopback (jax.distributed, gloo).

Each case starts the processes of tests/jax_multiprocess_worker.py, waits for them with
a time limit and kills any still running (no stray processes)."""

import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("jax")

WORKER = pathlib.Path(__file__).with_name("jax_multiprocess_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(mode: str, process_ids, timeout_s: float, *extra: str) -> list[tuple[int, str, str]]:
    """(exit status, stdout, stderr) of each process, all started at once; the processes
    still running after ``timeout_s`` are killed and the case fails."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    port = str(_free_port())
    processes = [subprocess.Popen([sys.executable, str(WORKER), str(i), port, mode, *extra],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for i in process_ids]
    deadline = time.monotonic() + timeout_s
    try:
        results = []
        for p in processes:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((p.returncode, out, err))
        return results
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {mode!r} processes did not end within {timeout_s} s")
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_global_array_spmd_collectives_and_resharding_across_processes():
    """Shards from each process make one array; psum and all_gather across the processes
    equal NumPy; resharding moves shards to the other process; a host copy of an array
    spanning both processes is refused (the worker asserts each step)."""
    for status, out, err in _run("spmd", [0, 1], timeout_s=180):
        assert status == 0 and "OK" in out, err[-3000:]


def test_a_process_that_never_joins_ends_its_peer_within_the_timeout():
    start = time.monotonic()
    ((status, out, err),) = _run("spmd", [0], 90, "lone")  # process 1 never starts
    assert status != 0 and "OK" not in out
    assert "DEADLINE_EXCEEDED" in err and "RegisterTask" in err, err[-3000:]
    assert time.monotonic() - start < 90


def test_a_process_that_dies_ends_its_peer_within_the_heartbeat_timeout():
    (status0, out0, err0), (status1, _, _) = _run("die", [0, 1], timeout_s=90)
    assert status1 == 0  # it left on purpose, right after joining
    assert status0 != 0 and "NOT ENDED" not in out0
    assert "stopped sending heartbeats" in err0, err0[-3000:]
