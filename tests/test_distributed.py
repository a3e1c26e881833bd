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
    if scenario == "lone":  # started alone in a job of 2: the other never comes
        start = time.monotonic()
        try:
            distributed.initialize(address, 2, pid, initialization_timeout=2)
        except errors.IfrtError as e:
            out["initialize"] = {"error": type(e).__name__, "message": str(e)[:200],
                                 "s": time.monotonic() - start}
        out["initialized"] = distributed.is_initialized()
        print("RESULT " + json.dumps(out), flush=True)
        sys.exit(0)
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
    elif scenario == "late-leaver":  # process 1 leaves 2 s after process 0 asked to
        if pid == 1:
            time.sleep(2)
            print("RESULT " + json.dumps(out), flush=True)
            sys.exit(0)  # leaves the job at exit
        start = time.monotonic()
        distributed.shutdown()
        out["shutdown_s"] = time.monotonic() - start
        print("RESULT " + json.dumps(out), flush=True)
        sys.exit(0)
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


def _run_job(count: int, scenario: str, pids=None) -> list[tuple[int, dict | None, str]]:
    """Run ``count`` worker processes (those of ``pids`` only, when given); (return code,
    result, stderr tail) of each."""
    address = f"127.0.0.1:{_free_loopback_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, address, str(count), str(pid), scenario],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
             for pid in (range(count) if pids is None else pids)]
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


def test_process_0_leaves_after_the_others():
    """Process 0 serves the service: its shutdown() waits until process 1 has left (at exit,
    2 s later), which would otherwise be terminated by jaxlib once the service is gone."""
    (code0, out0, stderr0), (code1, out1, stderr1) = _run_job(2, "late-leaver")
    assert code1 == 0 and out1 is not None, stderr1
    assert code0 == 0 and out0 is not None, stderr0
    assert 1.5 < out0["shutdown_s"] < 5


@pytest.mark.parametrize("pid", [0, 1])
def test_a_process_that_never_joins_gives_the_other_a_deadline_exceeded_error(pid):
    """Process 0 (which would serve the service) or process 1 (whose coordinator never
    comes) raises DeadlineExceededError after initialization_timeout, and exits normally
    (jaxlib's own connect would abort it)."""
    [(code, out, stderr)] = _run_job(2, "lone", pids=[pid])
    assert code == 0 and out is not None, stderr
    assert out["initialize"]["error"] == "DeadlineExceededError"
    expected = "process(es) [1] of 2 did not join" if pid == 0 else "process 1 could not join"
    assert expected in out["initialize"]["message"]
    assert 1.5 < out["initialize"]["s"] < 6
    assert out["initialized"] is False


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


# -- the join before the service starts (ifrtpy._join), in threads of this process ---------

def _in_thread(fn, *args):
    """Start ``fn(*args)`` in a thread; a callable that joins it and returns its outcome
    (("ok", value) or ("error", exception))."""
    import threading

    outcome = []

    def run():
        try:
            outcome.append(("ok", fn(*args)))
        except Exception as e:  # noqa: BLE001 - reported to the test
            outcome.append(("error", e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result():
        thread.join(30)
        assert outcome, "the join did not end"
        return outcome[0]
    return result


def test_join_returns_once_every_process_has_come():
    from ifrtpy import _join

    address = f"127.0.0.1:{_free_loopback_port()}"
    waits = [_in_thread(_join.join, address, 3, pid, 20) for pid in (2, 0, 1)]
    outcomes = [w() for w in waits]
    assert [kind for kind, _ in outcomes] == ["ok"] * 3
    two, zero, one = (membership for _, membership in outcomes)
    # the connections stay open until a process leaves: process 0 waits for that
    start = time.monotonic()
    assert zero.wait_until_the_others_leave(0.3) == [1, 2]
    assert 0.25 < time.monotonic() - start < 3
    one.close()
    assert zero.wait_until_the_others_leave(0.3) == [2]
    two.close()
    start = time.monotonic()
    assert zero.wait_until_the_others_leave(10) == []
    assert time.monotonic() - start < 1
    zero.close()


def test_join_refuses_another_job_size_and_a_second_process_of_one_id():
    from ifrtpy import _join

    address = f"127.0.0.1:{_free_loopback_port()}"
    leader = _in_thread(_join.join, address, 3, 0, 3)
    first = _in_thread(_join.join, address, 3, 1, 20)
    with pytest.raises(errors.InvalidArgumentError, match="a job of 3 processes, not 2"):
        _join.join(address, 2, 1, 20)
    time.sleep(0.5)  # the first process 1 has joined by then
    with pytest.raises(errors.InvalidArgumentError, match="process_id 1 has already joined"):
        _join.join(address, 3, 1, 20)
    kind, error = leader()
    assert kind == "error" and isinstance(error, errors.DeadlineExceededError)
    assert "process(es) [2] of 3 did not join" in str(error)
    kind, error = first()  # told by process 0
    assert kind == "error" and isinstance(error, errors.DeadlineExceededError)
    assert "process(es) [2] of 3 did not join" in str(error)


def test_join_at_an_address_that_is_not_an_ifrtpy_coordinator():
    from ifrtpy import _join

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        # process 0 cannot listen where something else does
        with pytest.raises(errors.UnavailableError, match="cannot listen"):
            _join.join(address, 2, 0, 5)

        def answer():
            conn, _ = server.accept()
            with conn:
                conn.recv(100)
                conn.sendall(b"HTTP/1.1 400 Bad Request\n")
        reply = _in_thread(answer)
        with pytest.raises(errors.UnavailableError, match="not an ifrtpy coordinator"):
            _join.join(address, 2, 1, 5)
        assert reply() == ("ok", None)


def test_join_forgets_a_process_that_gave_up_waiting():
    """Process 1 gives up before process 2 comes; process 0 does not count it (it would
    otherwise start a service one process would never reach), and a new process 1 joins."""
    from ifrtpy import _join

    address = f"127.0.0.1:{_free_loopback_port()}"
    leader = _in_thread(_join.join, address, 3, 0, 20)
    with pytest.raises(errors.DeadlineExceededError, match="process 1 could not join"):
        _join.join(address, 3, 1, 0.5)
    late = _in_thread(_join.join, address, 3, 2, 20)
    time.sleep(0.3)  # process 2 has joined: process 0 still waits for a process 1
    again = _in_thread(_join.join, address, 3, 1, 20)
    outcomes = [leader(), late(), again()]
    assert [kind for kind, _ in outcomes] == ["ok"] * 3
    for _, membership in outcomes:
        membership.close()
