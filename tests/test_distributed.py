"""ifrtpy.distributed: the coordination service and the PJRT key-value callbacks across
local processes (loopback only), called through their C function pointers as a plugin
calls them; a process that dies, a get that times out. Every process runs in a subprocess
with a deadline and is reaped."""

import json
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from ifrtpy import distributed, errors

DEADLINE_S = 90

WORKER = textwrap.dedent("""
    import json, os, sys, time
    import ifrtpy as ifrt
    from ifrtpy import distributed, errors
    from ifrtpy._pjrt import _kv

    address, count, pid, scenario = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    out = {}
    distributed.initialize(address, count, pid, initialization_timeout=60,
                           heartbeat_timeout=3, shutdown_timeout=5)
    callbacks = distributed._client_kv_callbacks("test")

    def attempt(fn):
        start = time.monotonic()
        try:
            return {"value": fn().decode(), "s": time.monotonic() - start}
        except errors.IfrtError as e:
            return {"error": type(e).__name__, "message": str(e)[:200],
                    "s": time.monotonic() - start}

    if scenario == "exchange":
        _kv.call_put(callbacks, f"from{pid}", f"hello from {pid}".encode())
        out["others"] = [attempt(lambda q=q: _kv.call_get(callbacks, f"from{q}", 30000))
                         for q in range(count) if q != pid]
        out["missing"] = attempt(lambda: _kv.call_try_get(callbacks, "never-written"))
        client = ifrt.get_client("cpu", cpu_device_count=2)
        out["client"] = [client.process_index(), client.device_count(),
                         client._handle.kv_callbacks is not None]
    elif scenario == "timeout":
        out["get"] = attempt(lambda: _kv.call_get(callbacks, "never-written", 500))
    elif scenario == "dies":
        if pid == 1:
            os._exit(7)  # gone without a word: no shutdown, no heartbeats
        out["get"] = attempt(lambda: _kv.call_get(callbacks, "from1", 6000))
    out["counts"] = distributed.key_value_store().counts
    try:
        distributed.shutdown()
        out["shutdown"] = "ok"
    except errors.IfrtError as e:
        out["shutdown"] = type(e).__name__
    print("RESULT " + json.dumps(out), flush=True)
""")


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_job(count: int, scenario: str) -> list[tuple[int, dict | None, str]]:
    """Run ``count`` worker processes; (return code, result, stderr tail) of each."""
    address = f"127.0.0.1:{_free_loopback_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, address, str(count), str(pid), scenario],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
             for pid in range(count)]
    results = []
    try:
        end = time.monotonic() + DEADLINE_S
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=max(1, end - time.monotonic()))
            line = next((l for l in stdout.splitlines() if l.startswith("RESULT ")), None)
            results.append((proc.returncode, json.loads(line[7:]) if line else None, stderr[-2000:]))
    finally:
        for proc in procs:  # no stray processes, whatever happened
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_processes_exchange_through_the_pjrt_callbacks():
    results = _run_job(3, "exchange")
    for pid, (code, out, stderr) in enumerate(results):
        assert code == 0 and out is not None, stderr
        assert [o["value"] for o in out["others"]] == [
            f"hello from {q}" for q in range(3) if q != pid]
        assert out["missing"]["error"] == "NotFoundError"
        # The CPU plugin is single-process: it takes the callbacks and ignores them.
        assert out["client"] == [0, 2, True]
        assert out["counts"]["put"] == 1 and out["counts"]["get"] == 2
        assert out["shutdown"] == "ok"


def test_a_get_that_times_out_fails_in_bounded_time():
    [(code, out, stderr)] = _run_job(1, "timeout")
    assert code == 0 and out is not None, stderr
    assert out["get"]["error"] == "DeadlineExceededError"
    assert "never-written" in out["get"]["message"]
    assert 0.4 < out["get"]["s"] < 10


def test_a_process_that_dies_does_not_hang_the_others():
    start = time.monotonic()
    (code0, out0, stderr0), (code1, out1, _) = _run_job(2, "dies")
    assert code1 == 7 and out1 is None
    assert code0 == 0 and out0 is not None, stderr0
    assert out0["get"]["error"] in ("DeadlineExceededError", "UnavailableError", "AbortedError",
                                    "InternalError", "FailedPreconditionError")
    assert out0["get"]["s"] < 15
    assert time.monotonic() - start < DEADLINE_S


@pytest.mark.parametrize("args, match", [
    (("localhost", 2, 0), "host:port"), (("127.0.0.1:0", 2, 0), "port in 1..65535"),
    ((5, 2, 0), "str"), (("127.0.0.1:1234", 0, 0), "num_processes >= 1"),
    (("127.0.0.1:1234", 2, 2), "process_id < num_processes"),
    (("127.0.0.1:1234", 2, True), "process_id must be an int"),
])
def test_bad_arguments_are_refused_before_anything_starts(args, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        distributed.initialize(*args)
    assert not distributed.is_initialized()


@pytest.mark.parametrize("kwargs, match", [
    ({"backend": "tpu"}, "backend must be 'pjrt' or 'jax'"),
    ({"local_device_count": 4}, "local_device_count is for backend='jax'"),
])
def test_bad_backend_arguments_are_refused(kwargs, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        distributed.initialize("127.0.0.1:1234", 2, 0, **kwargs)
    assert not distributed.is_initialized()


def test_not_initialized():
    assert not distributed.is_initialized()
    with pytest.raises(errors.FailedPreconditionError, match="not initialized"):
        distributed.key_value_store()
    distributed.shutdown()  # nothing to do
