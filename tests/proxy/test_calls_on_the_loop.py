"""The request path's fast path (DESIGN 20, docs/proxy.md "The request path"): a request
that cannot block is answered on the server's event loop while its session's worker is
idle (an execute where the backend's execute only dispatches, under its executions in
flight); everything else goes to the worker, and nothing overtakes a queued request."""

import statistics
import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402

from proxy_helpers import (ADD_ONE, WAIT_S, Delegating, M, RawSession, SyncClient,  # noqa: E402
                           compile_request, execute_request, put_values, status_of,
                           wait_for)
from slow_program import SLOW, slow_call  # noqa: E402

#: the server's event loop runs in this thread; each session's worker in one named
#: ``ifrtpy-proxy-session-N``
LOOP = "ifrtpy-proxy"


@pytest.fixture(scope="module")
def pjrt():
    return ifrt.get_client("pjrt", device_count=2)


class ThreadsClient(Delegating):
    """A Client whose executables record the thread each execute runs in (``threads``),
    and whose compiles wait for ``gate`` (set: they do not wait)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.threads = []
        self.gate = threading.Event()
        self.gate.set()

    def compile(self, *args, **kwargs):
        assert self.gate.wait(WAIT_S)
        return ThreadsExecutable(self._inner.compile(*args, **kwargs), self.threads)


class ThreadsExecutable(Delegating):
    def __init__(self, inner, threads):
        super().__init__(inner)
        self._threads = threads

    def execute(self, *args, **kwargs):
        self._threads.append(threading.current_thread().name)
        return self._inner.execute(*args, **kwargs)


def ok(response, kind):
    assert status_of(response) == (0, ""), status_of(response)
    return getattr(response, kind)


def add_one_session(channel, device_id=0):
    """A new session holding array 1, f32[4] on device ``device_id``, and ADD_ONE compiled
    for that device: (the session, the executable's handle)."""
    session = RawSession(channel)
    assert put_values(channel, session, np.arange(4, dtype=np.float32), 1,
                      device_id=device_id) == (0, "")
    add_one = ok(session.call("compile_request", compile_request(ADD_ONE, (device_id,))),
                 "compile_response").loaded_executable_handle
    return session, add_one


def sync_call(session, add_one, handle):
    """Execute ADD_ONE on array ``handle`` and wait for its output, as a synchronous jax
    call does (execute, then the readiness check); then drop the output."""
    session.send("loaded_executable_execute_request", execute_request(add_one, [handle], 50))
    session.send("check_value_ready_request", M.CheckValueReadyRequest(value_handles=[50]))
    ok(session.receive(), "loaded_executable_execute_response")
    ok(session.receive(), "check_value_ready_response")
    ok(session.call("destruct_array_request", M.DestructArrayRequest(array_handle=[50])),
       "destruct_array_response")


def test_an_execute_that_cannot_block_is_answered_on_the_loop(pjrt):
    """On PjRt (its execute only dispatches) an execute of an idle session runs on the
    loop; behind a request queued for the worker, or at the server's executions in
    flight, or on a backend whose execute may block, it runs on the worker."""
    client = ThreadsClient(pjrt)
    with proxy.serve(client) as server, grpc.insecure_channel(server.address) as ch:
        session, add_one = add_one_session(ch)
        sync_call(session, add_one, 1)
        assert client.threads == [LOOP]
        assert not pjrt.execute_may_block and pjrt.executions_in_flight_cap == 32

        # behind a compile (handled by the worker), in arrival order
        client.gate.clear()
        compile_op = session.send("compile_request", compile_request(ADD_ONE))
        execute_op = session.send("loaded_executable_execute_request",
                                  execute_request(add_one, [1], 60))
        wait_for(lambda: [s.pending_requests for s in server.sessions()] == [2],
                 "the server to read both requests")
        client.gate.set()
        answers = [session.receive().response_metadata for _ in range(2)]
        assert [(a.op_id, a.status.code) for a in answers] == [(compile_op, 0), (execute_op, 0)]
        assert client.threads[1].startswith(LOOP + "-session-"), client.threads

        # at half the executions in flight the backend allows, the worker
        executions, half = server._service.executions, pjrt.executions_in_flight_cap // 2
        others = [ifrt.Promise() for _ in range(half)]  # as if other sessions ran that many
        for running in others:
            executions.started(running.future)
        try:
            sync_call(session, add_one, 1)
        finally:
            for running in others:
                running.set_result(None)
        assert client.threads[2].startswith(LOOP + "-session-"), client.threads
        sync_call(session, add_one, 1)
        assert client.threads[3] == LOOP
        session.close()

    blocking = ThreadsClient(SyncClient(pjrt))  # it says its execute may block
    with proxy.serve(blocking) as server, grpc.insecure_channel(server.address) as ch:
        session, add_one = add_one_session(ch)
        sync_call(session, add_one, 1)
        assert blocking.threads[0].startswith(LOOP + "-session-"), blocking.threads
        session.close()


#: programs the busy session chains, and how long each is made to run (seconds)
CHAINED, PROGRAM_S = 100, 0.04
#: synchronous calls timed with the busy session idle, and while it runs its chain
CALLS = 15


def test_a_session_chaining_long_programs_delays_no_other_sessions_call(pjrt):
    """Session 1 sends 100 chained long programs at once (on the CPU plugin, device 0);
    session 2's synchronous calls (device 1) made while they run take less than one of
    those programs longer than the same calls with session 1 idle (or 50 ms: medians, and
    the programs' time, measured in this test, so that a busy machine slows both)."""
    _, steps = slow_call(pjrt, PROGRAM_S)
    with proxy.serve(pjrt) as server, grpc.insecure_channel(server.address) as ch:
        busy, (other, add_one) = RawSession(ch), add_one_session(ch, device_id=1)
        slow = ok(busy.call("compile_request", compile_request(SLOW)),
                  "compile_response").loaded_executable_handle
        assert put_values(ch, busy, np.eye(32, dtype=np.float32), 1) == (0, "")
        assert put_values(ch, busy, np.array(steps, np.int32), 2) == (0, "")

        def timed_calls():
            seconds = []
            for _ in range(CALLS):
                start = time.perf_counter()
                sync_call(other, add_one, 1)
                seconds.append(time.perf_counter() - start)
            return seconds

        idle = timed_calls()
        last = 1
        chain_start = time.perf_counter()
        for i in range(CHAINED):
            busy.send("loaded_executable_execute_request",
                      execute_request(slow, [last, 2], 1000 + i))
            last = 1000 + i
        ready = busy.send("check_value_ready_request", M.CheckValueReadyRequest(
            value_handles=[last]))
        answers = []
        receiver = threading.Thread(target=lambda: answers.extend(
            (busy.receive(), time.perf_counter()) for _ in range(CHAINED + 1)))
        receiver.start()
        meanwhile = timed_calls()
        calls_done = time.perf_counter()
        receiver.join(WAIT_S)
        assert [a.response_metadata.status.code for a, _ in answers] == [0] * (CHAINED + 1)
        (last_answer, chain_done) = answers[-1]
        assert last_answer.response_metadata.op_id == ready
        busy.close()
        other.close()
    assert chain_done > calls_done  # the calls were made while the chain ran
    delay = statistics.median(meanwhile) - statistics.median(idle)
    program_s = (chain_done - chain_start) / CHAINED  # one chained program, now
    assert delay < max(0.05, 1.25 * program_s), (program_s, sorted(idle), sorted(meanwhile))


#: a program with no outputs: nothing but its status tells when its run ends
NO_OUTPUTS = """module @no_outputs { func.func public @main(%a: tensor<4xf32>) -> () {
    return } }"""


class HeldStatusClient(Delegating):
    """A Client whose executables' runs end (their status completes) only once
    ``release`` is set."""

    def __init__(self, inner):
        super().__init__(inner)
        self.release = threading.Event()

    def compile(self, *args, **kwargs):
        return HeldStatusExecutable(self._inner.compile(*args, **kwargs), self.release)


class HeldStatusExecutable(Delegating):
    def __init__(self, inner, release):
        super().__init__(inner)
        self._release = release

    def execute(self, *args, **kwargs):
        result = self._inner.execute(*args, **kwargs)
        assert result.status is not None, "the server asked for no status"
        held = ifrt.Promise()
        result.status.add_done_callback(
            lambda _: threading.Thread(target=lambda: (self._release.wait(WAIT_S),
                                                       held.set_result())).start())
        return ifrt.ExecuteResult(held.future, result.outputs)


def test_a_run_with_no_outputs_counts_in_flight_until_it_ends(pjrt):
    """A program with no outputs, executed without ``fill_status``, is one of the server's
    executions in flight until its run ends, as any other."""
    client = HeldStatusClient(pjrt)
    with proxy.serve(client) as server, grpc.insecure_channel(server.address) as ch:
        session = RawSession(ch)
        assert put_values(ch, session, np.arange(4, dtype=np.float32), 1) == (0, "")
        exe = ok(session.call("compile_request", compile_request(NO_OUTPUTS)),
                 "compile_response").loaded_executable_handle
        executions = server._service.executions
        run = ok(session.call("loaded_executable_execute_request",
                              M.LoadedExecutableExecuteRequest(loaded_executable_handle=exe,
                                                               args_handles=[1])),
                 "loaded_executable_execute_response")
        assert list(run.outputs) == []
        assert executions.count == 1
        client.release.set()
        wait_for(lambda: executions.count == 0, "the run's end to be counted")
        session.close()


class NoStatusClient(Delegating):
    """A Client whose executables fill no status, even when asked."""

    def compile(self, *args, **kwargs):
        return NoStatusExecutable(self._inner.compile(*args, **kwargs))


class NoStatusExecutable(Delegating):
    def execute(self, *args, **kwargs):
        return ifrt.ExecuteResult(None, self._inner.execute(*args, **kwargs).outputs)


def test_a_run_without_a_status_counts_until_its_outputs_are_ready(pjrt):
    """A backend that fills no status although asked: the server counts the run among
    the executions in flight by its outputs' readiness, and serves on."""
    with proxy.serve(NoStatusClient(pjrt)) as server, grpc.insecure_channel(server.address) as ch:
        session, add_one = add_one_session(ch)
        for _ in range(3):
            sync_call(session, add_one, 1)
        wait_for(lambda: server._service.executions.count == 0, "the runs' ends to be counted")
        session.close()


def test_executions_in_flight_are_seen_to_end_by_asking_their_status():
    """The server's count of executions in flight asks each run's status whether it is
    done, when the count matters: it registers no callback, which would take the GIL on
    the backend's thread as each run ends."""
    from ifrtpy.proxy.session import Executions

    class Status:
        ended = False

        def done(self):
            return self.ended

        def add_done_callback(self, fn):
            raise AssertionError("the count registered a callback")

    executions = Executions(8)
    runs = [Status() for _ in range(4)]
    for run in runs:
        executions.started(run)
    assert executions.count == 4
    assert not executions.room()  # at half the cap
    runs[1].ended = True
    assert executions.room()
    assert executions.count == 3
    assert Executions(None).room()
