"""The server's event loop runs no backend code (docs/proxy.md "How the server runs
requests"): every request runs on its session's worker thread, so a program that runs
for long, or for ever, in one session delays no other session's requests; and ``serve``
ends within 5 s of SIGTERM whatever runs."""

import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402

from proxy_helpers import (ADD_ONE, SERVICE, WAIT_S, Delegating, M, RawSession,  # noqa: E402
                           compile_request, execute_request, put_values, status_of,
                           version)
from slow_program import SLOW, slow_call  # noqa: E402

#: the server's event loop runs in this thread; each session's worker in one named
#: ``ifrtpy-proxy-session-N``
LOOP = "ifrtpy-proxy"
#: how long the long program runs (seconds, on this machine now)
LONG_S = 10.0
#: how long the serve command may take to end after SIGTERM (seconds)
STOP_S = 5.0

#: A program that never ends: i goes 0, 2, 4, ... (wrapping, always even), never 1.
ENDLESS = """module @endless { func.func public @main(%a: tensor<32x32xf32>)
    -> tensor<32x32xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %one = stablehlo.constant dense<1> : tensor<i32>
  %two = stablehlo.constant dense<2> : tensor<i32>
  %r:2 = stablehlo.while(%i = %c0, %x = %a) : tensor<i32>, tensor<32x32xf32>
    cond { %p = stablehlo.compare NE, %i, %one : (tensor<i32>, tensor<i32>) -> tensor<i1>
           stablehlo.return %p : tensor<i1> }
    do { %j = stablehlo.add %i, %two : tensor<i32>
         %y = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0]
             : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
         %z = stablehlo.tanh %y : tensor<32x32xf32>
         stablehlo.return %j, %z : tensor<i32>, tensor<32x32xf32> }
  return %r#1 : tensor<32x32xf32> } }"""


@pytest.fixture(scope="module")
def pjrt():
    return ifrt.get_client("pjrt", device_count=2)


class ThreadsClient(Delegating):
    """A Client whose executables record the thread each execute runs in (``threads``)
    and set ``started`` as one begins; ``inline``: each execute returns once its outputs
    are ready, as where the CPU plugin runs a program on the calling thread."""

    def __init__(self, inner, inline=False):
        super().__init__(inner)
        self.threads = []
        self.started = threading.Event()
        self.inline = inline

    def compile(self, *args, **kwargs):
        return ThreadsExecutable(self._inner.compile(*args, **kwargs), self)


class ThreadsExecutable(Delegating):
    def __init__(self, inner, client):
        super().__init__(inner)
        self._client = client

    def execute(self, *args, **kwargs):
        self._client.threads.append(threading.current_thread().name)
        self._client.started.set()
        result = self._inner.execute(*args, **kwargs)
        if self._client.inline:
            for output in result.outputs:
                output.ready_future().result()
        return result


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


def get_version(channel):
    call = channel.unary_unary(SERVICE + "GetVersion",
                               request_serializer=M.GrpcGetVersionRequest.SerializeToString,
                               response_deserializer=M.GrpcGetVersionResponse.FromString)
    answer = call(M.GrpcGetVersionRequest(min_version=version(16, 0),
                                          max_version=version(25, 3)), timeout=WAIT_S)
    assert answer.version.protocol_version == 25


class Others:
    """Another session, ready to call ``jit(x + 1)`` on ``device_id``; :meth:`timed`
    times a GetVersion, a new session's InitRequest and a synchronous call."""

    def __init__(self, channel, device_id):
        self.channel = channel
        self.session, self.add_one = add_one_session(channel, device_id)
        sync_call(self.session, self.add_one, 1)  # a first run may set things up

    def timed(self):
        """{what: seconds}."""
        seconds = {}
        start = time.perf_counter()
        get_version(self.channel)
        seconds["GetVersion"] = time.perf_counter() - start
        start = time.perf_counter()
        RawSession(self.channel).close()  # its InitRequest
        seconds["InitRequest"] = time.perf_counter() - start
        start = time.perf_counter()
        sync_call(self.session, self.add_one, 1)
        seconds["jit(x + 1)"] = time.perf_counter() - start
        return seconds

    def close(self):
        self.session.close()


def start_long(channel, program, arguments):
    """A session that runs ``program`` on ``arguments`` (values put on device 0) and asks
    whether its output is ready: (the session, a list that receives its two answers; the
    second, the readiness check's, once the run has ended)."""
    busy = RawSession(channel)
    exe = ok(busy.call("compile_request", compile_request(program)),
             "compile_response").loaded_executable_handle
    for handle, values in enumerate(arguments, 1):
        assert put_values(channel, busy, values, handle) == (0, "")
    busy.send("loaded_executable_execute_request",
              execute_request(exe, list(range(1, len(arguments) + 1)), 100))
    busy.send("check_value_ready_request", M.CheckValueReadyRequest(value_handles=[100]))
    answers = []

    def receive():
        try:
            answers.extend(busy.receive() for _ in range(2))
        except grpc.RpcError:  # the server stopped first
            pass

    threading.Thread(target=receive, daemon=True).start()
    return busy, answers


def test_every_request_runs_on_its_sessions_worker(pjrt):
    """An execute of an idle session on the PjRt backend, whose execute may run the
    program on the calling thread, runs on the session's worker, never on the loop."""
    client = ThreadsClient(pjrt)
    with proxy.serve(client) as server, grpc.insecure_channel(server.address) as ch:
        session, add_one = add_one_session(ch)
        for _ in range(3):
            sync_call(session, add_one, 1)
        session.close()
    assert len(client.threads) == 3
    assert all(t.startswith(LOOP + "-session-") for t in client.threads), client.threads


def test_requests_are_decoded_on_the_sessions_worker(pjrt, monkeypatch):
    """The loop decodes no request of a session stream (a large one, 1 M argument
    handles here, would hold it while parsed and walked): each is decoded, and its
    handles resolved, on its session's worker."""
    from ifrtpy.proxy import wire

    decoded, parse = [], wire.parse

    def recording(cls, raw, what):
        if what == "a request of the session stream":
            decoded.append(threading.current_thread().name)
        return parse(cls, raw, what)

    monkeypatch.setattr(wire, "parse", recording)
    with proxy.serve(pjrt) as server, grpc.insecure_channel(
            server.address, [("grpc.max_send_message_length", -1)]) as ch:
        session, add_one = add_one_session(ch)
        huge = execute_request(add_one, [1] * (1 << 20), 60)
        assert session.call("loaded_executable_execute_request", huge).response_metadata \
            .status.code == 3  # INVALID_ARGUMENT: 1 M arguments for a program of one
        sync_call(session, add_one, 1)
        session.close()
    assert decoded and all(t.startswith(LOOP + "-session-") for t in decoded), set(decoded)


def test_a_long_program_delays_no_other_session(pjrt):
    """While one session runs a program of about 10 s (on the CPU plugin, device 0; its
    execute holding the calling thread as long), another session's GetVersion, InitRequest and synchronous call (device
    1) are answered, and all of it before the long program's run has ended."""
    _, steps = slow_call(pjrt, LONG_S)
    client = ThreadsClient(pjrt, inline=True)
    with proxy.serve(client) as server, grpc.insecure_channel(server.address) as ch:
        others = Others(ch, device_id=1)
        busy, answers = start_long(ch, SLOW, [np.eye(32, dtype=np.float32),
                                              np.array(steps, np.int32)])
        assert client.started.wait(WAIT_S)
        seconds = others.timed()
        still_running = len(answers) < 2
        busy.close()
        others.close()
        deadline = time.monotonic() + WAIT_S
        while len(answers) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert still_running, (seconds, answers)  # the calls ended while the program ran
    assert [a.response_metadata.status.code for a in answers] == [0, 0]
    # a bound on a wait behind the program (seconds), not a speed test (1-50 ms so far)
    assert max(seconds.values()) < LONG_S / 4, seconds


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


@pytest.mark.parametrize("program, backend", [
    ("long", "pjrt"), ("endless", "pjrt"), ("endless", "proxy_helpers:sync_pjrt_client")])
def test_sigterm_ends_serve_within_5_s_whatever_runs(pjrt, tmp_path, program, backend):
    """``serve`` runs a 10 s program, or one that never ends, in one session; another
    session is served meanwhile; SIGTERM ends the command within 5 s. The CPU plugin
    runs these programs on threads of its own: the stop is clean (status 0). A backend
    whose execute holds the session's worker in the program (as a plugin running it on
    the calling thread does) cannot be stopped: the command says so and exits at once
    with 128 + SIGTERM."""
    if program == "long":
        _, steps = slow_call(pjrt, LONG_S)
        text, arguments = SLOW, [np.eye(32, dtype=np.float32), np.array(steps, np.int32)]
    else:
        text, arguments = ENDLESS, [np.eye(32, dtype=np.float32)]
    address = f"unix:{tmp_path}/proxy.sock"
    helpers = os.path.dirname(sys.modules["proxy_helpers"].__file__)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [helpers, *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-m", "ifrtpy", "serve", "--backend", backend,
                             "--device-count", "2", "--address", address],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().startswith("ifrtpy proxy: serving ")
        with grpc.insecure_channel(address) as ch:
            others = Others(ch, device_id=1)
            busy, answers = start_long(ch, text, arguments)
            seconds = others.timed()
            assert len(answers) < 2, (seconds, answers)  # the program runs on
            assert max(seconds.values()) < LONG_S / 4, seconds
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=STOP_S + WAIT_S)  # a bound on a hang; the measure is next
            took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
    assert took < STOP_S, (took, err)
    # 0 where the backend ran the program on its own threads, so no session's worker was
    # held in it; else a forced stop, which the command says
    forced = re.search(r"a session still runs a program the backend cannot stop: exiting "
                       rf"without it \(status {128 + signal.SIGTERM}\)", err)
    assert proc.returncode == (128 + signal.SIGTERM if forced else 0), (proc.returncode, err)
    assert bool(forced) == (backend != "pjrt"), err
    assert not (tmp_path / "proxy.sock").exists()
