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
from pjrt_helpers import assert_ends
from job_helpers import job_environment, use_environment

DEADLINE_S = 90

WORKER = textwrap.dedent("""
    import json, os, sys, time
    import ifrtpy as ifrt
    from ifrtpy import distributed, errors
    from ifrtpy._pjrt import _kv
    from ifrtpy.backends.pjrt.client import job_kv_callbacks

    address, count, pid, scenario = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    out = {}

    def process_ended(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (FileNotFoundError, ProcessLookupError):  # reaped between open and read
            return True

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
    callbacks = job_kv_callbacks("test")

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
    elif scenario in ("dies", "dies0"):  # process 1, or process 0
        victim = 0 if scenario == "dies0" else 1
        if pid == victim:
            os._exit(7)  # gone without a word: no shutdown, no heartbeats
        out["get"] = attempt(lambda: _kv.call_get(callbacks, f"from{victim}", 6000))
    elif scenario == "first-leaver":  # process 0 leaves (and ends) first, process 1 goes on
        if pid == 0:
            out["coordinator"] = distributed.job._state.coordinator.pid
            _kv.call_put(callbacks, "pid0", str(os.getpid()).encode())
            distributed.shutdown()
            out["left_at"] = time.monotonic()  # one clock for every process of the machine
            print("RESULT " + json.dumps(out), flush=True)
            sys.exit(0)
        first = int(_kv.call_get(callbacks, "pid0", 30000))
        deadline = time.monotonic() + 30  # about a hang only: process 0 waiting for this one
        while not process_ended(first) and time.monotonic() < deadline:
            time.sleep(0.05)
        _kv.call_put(callbacks, "late", b"still here")
        out["get"] = attempt(lambda: _kv.call_get(callbacks, "late", 5000))
        out["leaving_at"] = time.monotonic()
        print("RESULT " + json.dumps(out), flush=True)
        sys.exit(0)  # leaves the job at exit
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
    # it waited its 0.5 s (a deadline never ends early); the upper bound is about a hang only
    assert 0.4 < out["get"]["s"] < 60


@pytest.mark.parametrize("scenario, victim", [("dies", 1), ("dies0", 0)])
def test_a_process_that_dies_does_not_hang_the_others(scenario, victim):
    """Process 1, or process 0 (which started the job's coordinator), dies without a word:
    the other's get fails in bounded time and it leaves the job and exits normally."""
    start = time.monotonic()
    results = _run_job(2, scenario)
    code, out, _ = results[victim]
    assert code == 7 and out is None
    code, out, stderr = results[1 - victim]
    assert code == 0 and out is not None, stderr
    assert out["get"]["error"] in ("DeadlineExceededError", "UnavailableError", "AbortedError",
                                   "InternalError", "FailedPreconditionError")
    assert out["get"]["s"] < 60 and out["shutdown"] == "ok"  # bounds about a hang only
    assert time.monotonic() - start < DEADLINE_S


def test_process_0_leaving_first_leaves_the_service_to_the_others():
    """Process 0 leaves at once and ends; the service runs on in the job's coordinator
    process, so process 1 still uses it once process 0 has ended, and leaves normally; the
    coordinator ends once both have gone."""
    (code0, out0, stderr0), (code1, out1, stderr1) = _run_job(2, "first-leaver")
    assert code0 == 0 and out0 is not None, stderr0
    assert code1 == 0 and out1 is not None, stderr1
    # process 0 left before process 1 did (it did not wait for it), no timing asserted
    assert out0["left_at"] < out1["leaving_at"]
    assert out1["get"].get("value") == "still here", out1
    assert_ends(out0["coordinator"], within_s=30)


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
    # it waited its 2 s (never less); the upper bound is about a hang only
    assert 1.5 < out["initialize"]["s"] < 60
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
    ({"local_device_count": 0}, "local_device_count must be an int >= 1"),
    ({"collective_timeout": -1}, "collective_timeout must be a positive number"),
])
def test_bad_backend_arguments_are_refused(kwargs, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        distributed.initialize("127.0.0.1:1234", 2, 0, **kwargs)
    assert not distributed.is_initialized()


def test_without_arguments_or_a_launcher_initialize_says_what_it_looked_for(monkeypatch):
    use_environment(monkeypatch, job_environment({"IFRTPY_LOCAL_DEVICE_COUNT": "2"})[0])
    with pytest.raises(errors.InvalidArgumentError, match="needs coordinator_address .*SLURM"):
        distributed.initialize()
    monkeypatch.setenv("IFRTPY_LOCAL_DEVICE_COUNT", "two")
    with pytest.raises(errors.InvalidArgumentError, match="IFRTPY_LOCAL_DEVICE_COUNT"):
        distributed.initialize("127.0.0.1:1234", 2, 0)
    assert not distributed.is_initialized()


def test_not_initialized():
    assert not distributed.is_initialized()
    with pytest.raises(errors.FailedPreconditionError, match="not initialized"):
        distributed.key_value_store()
    distributed.shutdown()  # nothing to do


# -- the join before the service starts (ifrtpy.distributed._join), in threads of this process ---------

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
    from ifrtpy.distributed import _join

    address = f"127.0.0.1:{_free_loopback_port()}"
    coordinator = _in_thread(_join.serve, address, 3, 20)
    waits = [_in_thread(_join.join, address, 3, pid, 20) for pid in (2, 0, 1)]
    outcomes = [w() for w in waits]
    assert [kind for kind, _ in outcomes] == ["ok"] * 3
    kind, members = coordinator()
    assert kind == "ok"
    two, zero, one = (membership for _, membership in outcomes)
    # the connections stay open until a process leaves: the coordinator waits for that
    start = time.monotonic()
    assert members.wait_until_all_leave(0.3) == [0, 1, 2]
    assert 0.25 < time.monotonic() - start < 30  # waited its 0.3 s; no hang
    one.close()
    assert members.wait_until_all_leave(0.3) == [0, 2]
    two.close()
    zero.close()
    start = time.monotonic()
    assert members.wait_until_all_leave() == []
    assert time.monotonic() - start < 30  # about a hang only: everyone has left
    members.close()


def test_join_refuses_another_job_size_and_a_second_process_of_one_id():
    from ifrtpy.distributed import _join

    address = f"127.0.0.1:{_free_loopback_port()}"
    coordinator = _in_thread(_join.serve, address, 3, 3)
    first = _in_thread(_join.join, address, 3, 1, 20)
    with pytest.raises(errors.InvalidArgumentError, match="a job of 3 processes, not 2"):
        _join.join(address, 2, 1, 20)
    time.sleep(0.5)  # the first process 1 has joined by then
    with pytest.raises(errors.InvalidArgumentError, match="process_id 1 has already joined"):
        _join.join(address, 3, 1, 20)
    kind, error = coordinator()
    assert kind == "error" and isinstance(error, errors.DeadlineExceededError)
    assert "process(es) [0, 2] of 3 did not join" in str(error)
    kind, error = first()  # told by the coordinator
    assert kind == "error" and isinstance(error, errors.DeadlineExceededError)
    assert "process(es) [0, 2] of 3 did not join" in str(error)


def test_a_service_that_does_not_start_fails_every_join_with_its_error():
    from ifrtpy.distributed import _join

    def no_service():
        raise errors.UnavailableError("the port went to someone else")

    address = f"127.0.0.1:{_free_loopback_port()}"
    coordinator = _in_thread(_join.serve, address, 2, 20, lambda: None, no_service)
    joins = [_in_thread(_join.join, address, 2, pid, 20) for pid in (0, 1)]
    for outcome in [j() for j in joins] + [coordinator()]:
        kind, error = outcome
        assert kind == "error" and isinstance(error, errors.UnavailableError)
        assert "the port went to someone else" in str(error)


def test_join_at_an_address_that_is_not_an_ifrtpy_coordinator():
    from ifrtpy.distributed import _join

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        # the coordinator cannot listen where something else does
        with pytest.raises(errors.UnavailableError, match="cannot listen"):
            _join.serve(address, 2, 5)

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
    """Process 1 gives up before the others come; the coordinator does not count it (it
    would otherwise start a service one process would never reach), and a new process 1
    joins."""
    from ifrtpy.distributed import _join

    address = f"127.0.0.1:{_free_loopback_port()}"
    coordinator = _in_thread(_join.serve, address, 3, 20)
    with pytest.raises(errors.DeadlineExceededError, match="process 1 could not join"):
        _join.join(address, 3, 1, 0.5)
    late = [_in_thread(_join.join, address, 3, pid, 20) for pid in (2, 0)]
    time.sleep(0.3)  # processes 2 and 0 have joined: the coordinator still waits for a 1
    again = _in_thread(_join.join, address, 3, 1, 20)
    outcomes = [coordinator(), *(w() for w in late), again()]
    assert [kind for kind, _ in outcomes] == ["ok"] * 4
    for _, membership in outcomes:
        membership.close()
