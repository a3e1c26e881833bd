"""Sessions isolated in time and counted: each session's requests run on a worker of its
own, so a program that blocks one session delays no other session's requests or host-buffer
transfers; sessions are counted against ``max_sessions`` (and per TCP connection); a session
that ends drops its queued requests and frees all it held; a client that never reads its
answers holds a bounded number of them."""

import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402

from proxy_helpers import (ADD_ONE, EXHAUSTED, SERVICE, SESSION_HEADER, WAIT_S,  # noqa: E402
                           Delegating, M, RawSession, SyncClient,
                           compile_request, execute_request, lookup,
                           put_request, put_values, raises_code, refused_session,
                           session_header, single_device_sharding, status_of, store,
                           wait_for)
from slow_program import SLOW, slow_call  # noqa: E402

#: How long session 1's program is made to run at first (seconds).
PROGRAM_S = 1.0


@pytest.fixture(scope="module")
def pjrt():
    return ifrt.get_client("pjrt", device_count=2)


def ok(response, kind):
    assert status_of(response) == (0, ""), status_of(response)
    return getattr(response, kind)


@pytest.mark.parametrize("backend", ["reference", "pjrt"])
def test_a_blocked_program_delays_no_other_session(backend, pjrt):
    """Session 1 runs a program on a backend whose execute blocks until its outputs are
    ready (the reference backend's interpreter, or PjRt's execute made to wait); session 2
    puts, runs, reads back and deletes, round after round, while it still runs (on the
    other device: on PjRt, programs on one device take turns). What is observed is the
    order of events, never how long anything took: where the program ends first (a machine
    so busy that it ran quicker than measured), it runs again four times longer."""
    client = pjrt if backend == "pjrt" else ifrt.get_client("reference", device_count=2)
    _, steps = slow_call(client, PROGRAM_S)
    while (rounds := _rounds_while_a_program_runs(client, steps)) < ROUNDS:
        assert steps < 2**29, f"session 2 ran {rounds} rounds while session 1's program ran"
        steps *= 4


#: The rounds (put, execute, read back, delete) session 2 must finish while session 1's
#: program runs: with requests that waited for that program, it would finish none.
ROUNDS = 3


def _rounds_while_a_program_runs(client, steps):
    """How many rounds session 2 finishes before session 1's program of ``steps`` ends."""
    with proxy.serve(SyncClient(client)) as server, grpc.insecure_channel(server.address) as ch:
        first, second = RawSession(ch), RawSession(ch)
        slow = ok(first.call("compile_request", compile_request(SLOW)),
                  "compile_response").loaded_executable_handle
        assert put_values(ch, first, np.eye(32, dtype=np.float32), 1) == (0, "")
        assert put_values(ch, first, np.array(steps, np.int32), 2) == (0, "")
        add_one = ok(second.call("compile_request", compile_request(ADD_ONE, (1,))),
                     "compile_response").loaded_executable_handle
        x = np.arange(4, dtype=np.float32)
        ended = threading.Event()
        answers = []
        first.send("loaded_executable_execute_request", execute_request(slow, [1, 2]))
        waiter = threading.Thread(target=lambda: (answers.append(first.receive()), ended.set()))
        waiter.start()
        rounds, handle = 0, 100
        while rounds < ROUNDS and not ended.is_set():
            handle += 3
            store(ch, second.id, handle, x.tobytes())
            put = put_request(handle, [4], handle)
            put.sharding.CopyFrom(single_device_sharding(1))
            ok(second.call("make_array_from_host_buffer_request", put),
               "make_array_from_host_buffer_response")
            ok(second.call("loaded_executable_execute_request",
                           execute_request(add_one, [handle], handle + 1)),
               "loaded_executable_execute_response")
            ok(second.call("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
                array_handle=handle + 1, host_buffer_handle=handle + 2)),
               "copy_to_host_buffer_response")
            np.testing.assert_array_equal(
                np.frombuffer(lookup(ch, second.id, handle + 2), np.float32), x + 1)
            ok(second.call("destruct_array_request", M.DestructArrayRequest(
                array_handle=[handle, handle + 1])), "destruct_array_response")
            rounds += not ended.is_set()
        waiter.join(10 * WAIT_S)  # a bound on a hang: the program runs to its end
        (answer,) = answers
        assert status_of(answer) == (0, "")
        first.close()
        second.close()
    return rounds


def test_max_sessions_counts_sessions_and_refuses_the_next(pjrt):
    with proxy.serve(pjrt, max_sessions=2) as server, grpc.insecure_channel(server.address) as ch:
        first, second = RawSession(ch), RawSession(ch)
        # the InitRequest is answered with the refusal (jaxlib's client reports that one),
        # then the stream ends with it
        (code, message), details = refused_session(ch)
        assert code == EXHAUSTED and message == details
        assert "limit of 2 sessions" in details and "max_sessions" in details
        get = ch.unary_unary(SERVICE + "GetVersion")  # other RPCs still get through
        assert get(M.GrpcGetVersionRequest(
            min_version=M.IfrtProxyVersion(protocol_version=16),
            max_version=M.IfrtProxyVersion(protocol_version=25)).SerializeToString(),
            timeout=WAIT_S)
        first.close()
        wait_for(lambda: len(server.sessions()) == 1, "the closed session to go")
        third = RawSession(ch)
        assert {s.id for s in server.sessions()} == {second.id, third.id}
        second.close()
        third.close()


def test_a_jax_client_at_the_session_limit_is_told_so(pjrt):
    import os
    import subprocess
    import sys

    with proxy.serve(pjrt, max_sessions=1) as server, grpc.insecure_channel(server.address) as ch:
        holder = RawSession(ch)
        env = {k: v for k, v in os.environ.items() if not k.startswith("IFRT_PROXY_")}
        env.update(JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=f"grpc://{server.address}",
                   IFRTPY_PROXY_CONNECT_TIMEOUT_S="1")
        done = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                              capture_output=True, text=True, timeout=WAIT_S * 4)
        holder.close()
    assert done.returncode != 0  # jax's error (jaxlib may then abort as the process exits)
    assert "RESOURCE_EXHAUSTED" in done.stderr
    assert "the server is at its limit of 1 sessions (max_sessions)" in done.stderr


def test_idle_streams_of_one_connection_do_not_lock_others_out(pjrt):
    # 150 streams that send nothing, from one TCP connection (the old server's RPC slots
    # were 4 * max_sessions + 16 = 144): one connection holds at most 8 sessions
    import asyncio

    # (this process opens every connection: its own limit is not what is tested here)
    with proxy.serve(pjrt, "127.0.0.1:0", max_sessions_per_process=32) as server:
        started, release = threading.Event(), threading.Event()
        codes = []

        async def flood():
            async with grpc.aio.insecure_channel(server.address) as channel:
                calls = [channel.stream_stream(SERVICE + "IfrtSession")(
                    metadata=[(SESSION_HEADER, session_header())]) for _ in range(150)]
                while sum(call.done() for call in calls) < 142:  # the refused
                    await asyncio.sleep(0.01)
                codes.extend([await call.code() for call in calls if call.done()])
                started.set()
                await asyncio.get_running_loop().run_in_executor(None, release.wait, WAIT_S)
                for call in calls:
                    call.cancel()

        flooder = threading.Thread(target=asyncio.run, args=(flood(),))
        flooder.start()
        try:
            assert started.wait(WAIT_S)
            assert len(server.sessions()) == 8
            # another connection (a channel of its own) is served
            with grpc.insecure_channel(server.address,
                                       options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                other = RawSession(ch)
                assert other.id in {s.id for s in server.sessions()}
                other.close()
        finally:
            release.set()
            flooder.join(WAIT_S)
    assert codes and set(codes) == {grpc.StatusCode.RESOURCE_EXHAUSTED}


SESSION_OF_ANOTHER_PROCESS = """
import sys
import grpc
from proxy_helpers import RawSession
with grpc.insecure_channel(sys.argv[1]) as channel:
    session = RawSession(channel)
    print("served", session.id)
    session.close()
"""


def test_one_peer_process_cannot_take_every_session(pjrt):
    """Over loopback TCP the server finds the process at the other end of a connection:
    one process holds at most max_sessions_per_process sessions, whatever number of
    connections it opens, and another process is still served."""
    import os
    import pathlib
    import subprocess
    import sys

    with proxy.serve(pjrt, "127.0.0.1:0", max_sessions=4, max_sessions_per_process=2) as server:
        channels = [grpc.insecure_channel(server.address,
                                          options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(3)]  # a connection each
        try:
            held = [RawSession(ch) for ch in channels[:2]]
            (code, _), details = refused_session(channels[2])
            assert code == EXHAUSTED, details
            assert f"process {os.getpid()} holds 2 sessions" in details
            assert "max_sessions_per_process" in details
            helpers = pathlib.Path(__file__).resolve().parents[1] / "helpers"
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [str(helpers), os.environ.get("PYTHONPATH", "")]))
            done = subprocess.run([sys.executable, "-c", SESSION_OF_ANOTHER_PROCESS,
                                   server.address], env=env, capture_output=True, text=True,
                                  timeout=WAIT_S * 2)
            assert done.returncode == 0 and done.stdout.startswith("served "), done.stderr
            for session in held:
                session.close()
        finally:
            for ch in channels:
                ch.close()


def test_session_ids_are_unguessable(pjrt):
    with proxy.serve(pjrt) as server, grpc.insecure_channel(server.address) as ch:
        sessions = [RawSession(ch) for _ in range(6)]
        ids = sorted(s.id for s in sessions)
        for s in sessions:
            s.close()
    assert all(i >= 1 << 32 for i in ids), ids  # random 63-bit (2**-31 each to be smaller)
    assert all(b - a > 1 for a, b in zip(ids, ids[1:])), ids


def session_threads():
    return [t for t in threading.enumerate() if t.name.startswith("ifrtpy-proxy-session-")]


def test_a_session_that_ends_drops_its_queued_requests_and_frees_all_it_held(pjrt):
    client = SyncClient(pjrt)
    with proxy.serve(client) as server, grpc.insecure_channel(server.address) as ch:
        raw = RawSession(ch)
        assert put_values(ch, raw, np.arange(4, dtype=np.float32), 1) == (0, "")
        ok(raw.call("compile_request", compile_request(ADD_ONE)), "compile_response")
        store(ch, raw.id, 2, bytes(1000))  # a host buffer nobody consumes
        # the worker waits for a host buffer the client never sends; compiles queue behind
        raw.send("make_array_from_host_buffer_request", put_request(999, [4], 3))
        for _ in range(3):
            raw.send("compile_request", compile_request(ADD_ONE))
        info, = server.sessions()
        assert info.handles["arrays"] == 1 and info.handles["executables"] == 1
        assert info.host_buffer_bytes == server.host_buffer_bytes == 1000
        wait_for(lambda: server.sessions()[0].pending_requests == 4, "the queued requests")
        compiled = client.compiles
        raw.cancel()  # the client goes away
        wait_for(lambda: not server.sessions(), "the session to close")
        wait_for(lambda: not session_threads(), "the session's worker to end")
        assert client.compiles == compiled  # the queued compiles never ran
        assert server.host_buffer_bytes == 0


def test_a_client_that_reads_no_answers_holds_a_bounded_number(pjrt):
    # each answer carries a 64 KiB error message; the client reads none until it has sent
    # 100 requests: the server stops reading its stream at 8 requests pending
    with proxy.serve(pjrt, max_pending_requests=8) as server, \
            grpc.insecure_channel(server.address) as ch:
        raw = RawSession(ch)
        error = M.StatusProto(code=9, message="x" * (64 << 10))
        spec = M.ArraySpecProto(dtype=M.DTypeProto(kind=M.DTypeProto.Kind.Value("KIND_F32")),
                                shape=M.ShapeProto(dims=[1]), sharding=single_device_sharding())
        made = raw.call("make_error_arrays_request", M.MakeErrorArraysRequest(
            error=error, array_specs=[spec])).make_error_arrays_response.array_handles[0]
        sent = [raw.send("check_value_ready_request", M.CheckValueReadyRequest(
            value_handles=[made])) for _ in range(100)]
        wait_for(lambda: server.sessions()[0].pending_requests == 8, "the server to stop reading")
        time.sleep(0.2)  # and it stays stopped
        assert server.sessions()[0].pending_requests == 8
        answers = [raw.receive() for _ in sent]  # all answered, in order, once read
        assert [a.response_metadata.op_id for a in answers] == sent
        assert {status_of(a) for a in answers} == {(9, error.message)}
        wait_for(lambda: server.sessions()[0].pending_requests == 0, "the answers to be written")
        raw.close()


def test_undecodable_session_bytes_end_the_stream_with_invalid_argument(pjrt):
    with proxy.serve(pjrt) as server, grpc.insecure_channel(server.address) as ch:
        stream = ch.stream_stream(SERVICE + "IfrtSession")
        details = raises_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: list(stream(
            iter([b"\xff\xff\xff\xff not a message"]), metadata=[(SESSION_HEADER, session_header())],
            timeout=WAIT_S)))
        assert "a request of the session stream" in details
        assert "xla.ifrt.proxy.IfrtRequest" in details
        details = raises_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: list(stream(
            iter([]), metadata=[(SESSION_HEADER, b"\xff\xff garbage")], timeout=WAIT_S)))
        assert "GrpcIfrtSessionMetadata" in details


class TracingClient(Delegating):
    """A Client whose executes say when they start (``entered``), wait for ``gate`` if
    one is given, and keep the error each failed with (``errors``)."""

    def __init__(self, inner, gate=None):
        super().__init__(inner)
        self.entered, self.gate = threading.Event(), gate
        self.errors = []

    def compile(self, *args, **kwargs):
        return TracingExecutable(self._inner.compile(*args, **kwargs), self)


class TracingExecutable(Delegating):
    def __init__(self, inner, client):
        super().__init__(inner)
        self._client = client

    def execute(self, *args, **kwargs):
        self._client.entered.set()
        if self._client.gate is not None:
            assert self._client.gate.wait(WAIT_S)
        result = self._inner.execute(*args, **kwargs)  # blocks until the outputs are ready
        error = result.status.exception(WAIT_S) if result.status is not None else None
        if error is not None:
            self._client.errors.append(error)
        return result


def start_execute(channel, session, client, then=None):
    """Send an execute of ADD_ONE (and ``then``, a compile, behind it) and return once
    ``client`` (a TracingClient) has started it."""
    assert put_values(channel, session, np.arange(4, dtype=np.float32), 1) == (0, "")
    add_one = ok(session.call("compile_request", compile_request(ADD_ONE)),
                 "compile_response").loaded_executable_handle
    session.send("loaded_executable_execute_request", execute_request(add_one, [1]))
    if then is not None:
        session.send("compile_request", then)
    assert client.entered.wait(WAIT_S)


def test_a_departed_clients_running_execute_counts_until_it_ends(pjrt):
    """The session of a client that has gone stays counted (and holds what it held)
    until its worker has finished the request it runs: the limits bound what runs."""
    client = TracingClient(SyncClient(pjrt), gate=threading.Event())
    with proxy.serve(client, max_sessions=1) as server, grpc.insecure_channel(server.address) as ch:
        raw = RawSession(ch)
        start_execute(ch, raw, client, then=compile_request(ADD_ONE))  # it never runs
        compiled = client.compiles
        raw.cancel()  # the client goes, its execute running
        wait_for(lambda: [s.closing for s in server.sessions()] == [True], "the session to close")
        info, = server.sessions()
        assert info.handles["arrays"] == 1 and info.handles["executables"] == 1
        (code, message), details = refused_session(ch)  # still counted
        assert code == EXHAUSTED and "limit of 1 sessions" in details
        client.gate.set()
        wait_for(lambda: not server.sessions(), "the session to end with its execute")
        wait_for(lambda: not session_threads(), "the session's worker to end")
        assert client.compiles == compiled
        other = RawSession(ch)  # a slot is free again
        assert [s.id for s in server.sessions()] == [other.id]
        other.close()


def test_a_departed_clients_program_is_stopped_on_the_reference_backend():
    """The reference backend runs programs in worker processes: the program of a session
    whose client has gone is stopped (its worker killed), and the session ends."""
    from ifrtpy.backends.reference import pool
    from ifrtpy.errors import CancelledError

    reference = ifrt.get_client("reference", device_count=2)
    _, steps = slow_call(reference, 30 * WAIT_S)  # far longer than the test waits
    client = TracingClient(reference)
    with proxy.serve(client, max_sessions=1) as server, grpc.insecure_channel(server.address) as ch:
        raw = RawSession(ch)
        slow = ok(raw.call("compile_request", compile_request(SLOW)),
                  "compile_response").loaded_executable_handle
        assert put_values(ch, raw, np.eye(32, dtype=np.float32), 1) == (0, "")
        assert put_values(ch, raw, np.array(steps, np.int32), 2) == (0, "")
        workers = set(pool.worker_pids())
        raw.send("loaded_executable_execute_request", execute_request(slow, [1, 2]))
        assert client.entered.wait(WAIT_S)
        raw.cancel()
        wait_for(lambda: client.errors, "the program to be stopped")
        wait_for(lambda: not server.sessions(), "the session to end")
        RawSession(ch).close()  # served
    error, = client.errors
    assert isinstance(error, CancelledError), error
    assert "its program was stopped" in str(error)
    killed = workers - set(pool.worker_pids())
    assert len(killed) == 1, (workers, pool.worker_pids())


def test_ok_answers_are_numbered_in_the_order_they_are_sent(pjrt):
    """Two threads answer a session's requests (its worker; a thread completing a future
    an answer waits on): the numbers (seq_num) go out in the order the answers do, even
    when the first answer's send is slow."""
    from ifrtpy.proxy.session import Budget, Limits, Session

    sent, in_send, second_sent = [], threading.Event(), threading.Event()

    def send(answer):
        if threading.current_thread().name == "first":
            in_send.set()
            second_sent.wait(1.0)  # a bound: the second answer may overtake this one
        sent.append(M.IfrtResponse.FromString(answer).response_metadata.seq_num)
        if threading.current_thread().name == "second":
            second_sent.set()

    session = Session(1, "test", pjrt, Limits(), 25, send, Budget(1 << 30, "the server"))
    reply = M.CheckFutureResponse()

    def second():
        assert in_send.wait(WAIT_S)
        session.answer(2, "check_future_request", reply)

    threads = [threading.Thread(target=session.answer, name="first",
                                args=(1, "check_future_request", reply)),
               threading.Thread(target=second, name="second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert sent == [1, 2]


def test_a_link_in_place_of_a_sessions_directory_is_not_followed(pjrt, tmp_path):
    """A session's put-file directory is used through a descriptor opened when the session
    named it: a link put in its place later is followed neither to read puts nor to
    empty the directory at the session's end."""
    import os

    from proxy_helpers import client_directory, read_from_disk

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "lt_5").write_bytes(b"not the server's")
    with proxy.serve(pjrt) as server, grpc.insecure_channel(server.address) as ch:
        directory, name = client_directory(server.address)
        raw = RawSession(ch, transfer_directory=name)
        with open(os.path.join(directory, "lt_6"), "wb") as f:
            f.write(b"left behind")
        os.rename(directory, directory + "-moved")
        os.symlink(victim, directory)
        raises_code(grpc.StatusCode.NOT_FOUND, read_from_disk, ch, raw.id, 5, 16)
        raw.close()
        wait_for(lambda: not server.sessions(), "the session to end")
        assert sorted(os.listdir(victim)) == ["lt_5"]
        assert os.listdir(directory + "-moved") == []  # the directory named was emptied
        assert os.path.islink(directory)
        os.unlink(directory)
        os.rmdir(directory + "-moved")


def test_idle_timeout_ends_an_idle_session_and_no_busy_one(pjrt):
    """With idle_timeout_s, a session that has had nothing to do that long ends (its
    client is told why); one whose request runs past it goes on."""
    client = TracingClient(SyncClient(pjrt), gate=threading.Event())
    with proxy.serve(client, idle_timeout_s=1.0) as server, \
            grpc.insecure_channel(server.address) as ch:
        busy = RawSession(ch)
        start_execute(ch, busy, client)
        idle = RawSession(ch)
        store(ch, idle.id, 7, b"dropped with the session")
        wait_for(lambda: idle.id not in {s.id for s in server.sessions()}, "the idle session to end")
        details = raises_code(grpc.StatusCode.UNAVAILABLE, idle.receive)
        assert f"session {idle.id} was idle for 1 s" in details and "idle_timeout_s" in details
        assert [(s.id, s.closing) for s in server.sessions()] == [(busy.id, False)]
        client.gate.set()
        assert status_of(busy.receive()) == (0, "")
        wait_for(lambda: not server.sessions(), "the other session to end once idle")


def test_a_jax_client_waiting_for_a_departed_clients_slot_is_served_once_it_ends(pjrt, caplog):
    """A departed client's running execute holds its slot; a jax client refused meanwhile
    says so at once and is served at its next attempt after the execute ends (jaxlib
    tries again every second, whatever status refused it)."""
    import logging
    import os
    import subprocess
    import sys

    caplog.set_level(logging.INFO, logger="ifrtpy.proxy")
    client = TracingClient(SyncClient(pjrt), gate=threading.Event())
    with proxy.serve(client, max_sessions=1) as server, grpc.insecure_channel(server.address) as ch:
        raw = RawSession(ch)
        start_execute(ch, raw, client)
        raw.cancel()
        wait_for(lambda: [s.closing for s in server.sessions()] == [True], "the session to close")
        env = {k: v for k, v in os.environ.items() if not k.startswith("IFRT_PROXY_")}
        env.update(JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=f"grpc://{server.address}",
                   IFRTPY_PROXY_CONNECT_TIMEOUT_S=str(WAIT_S * 2))
        jax = subprocess.Popen([sys.executable, "-c", "import jax; print(jax.device_count())"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: any("refused a session" in r.getMessage() for r in caplog.records),
                     "the jax client to be refused")
            client.gate.set()  # the departed client's execute ends: its slot frees
            out, err = jax.communicate(timeout=WAIT_S * 4)
        finally:
            jax.kill()
    assert jax.returncode == 0 and out.strip() == "2", err
    assert "refused a session (RESOURCE_EXHAUSTED" in err and "max_sessions" in err


def test_a_request_kind_is_one_record(pjrt, monkeypatch):
    """What the server knows of a request kind is one record (handler, field number,
    result fields): a failure of a kind is bound to the result handles its record names."""
    import dataclasses

    from ifrtpy.errors import InvalidArgumentError
    from ifrtpy.proxy import session as session_module
    from ifrtpy.proxy.fields import expected

    kinds = session_module.kinds()
    record = kinds["make_error_arrays_request"]
    assert (record.number, record.results) == (26, ("array_handles",))
    assert expected()["xla.ifrt.proxy.IfrtRequest"]["make_error_arrays_request"] == (26, "message")

    def refuse(session, request):
        raise InvalidArgumentError("refused by the test's record")

    monkeypatch.setitem(kinds, "make_error_arrays_request",
                        dataclasses.replace(record, handler=refuse))
    sent = []
    session = session_module.Session(1, "test", pjrt, proxy.Limits(), 25, sent.append,
                                     session_module.Budget(1 << 30, "the server"))
    request = M.IfrtRequest(make_error_arrays_request=M.MakeErrorArraysRequest(
        array_handles=[41, 42]))
    request.request_metadata.op_id = 7
    session.handle(request)
    assert status_of(M.IfrtResponse.FromString(sent[0]))[1] == "refused by the test's record"
    for handle in (41, 42):
        with pytest.raises(InvalidArgumentError, match="refused by the test's record"):
            session.value(handle)


def test_the_directory_of_a_killed_client_goes_with_its_session(pjrt):
    """A client process killed and not yet reaped (a zombie) puts no more: its put-file
    directory goes when its session ends."""
    import os
    import signal
    import subprocess

    from proxy_helpers import client_directory

    with proxy.serve(pjrt) as server, grpc.insecure_channel(server.address) as ch:
        child = subprocess.Popen(["sleep", "600"])
        try:
            directory, name = client_directory(server.address)
            named = name.replace(f"client-{os.getpid()}-", f"client-{child.pid}-")
            os.rename(directory, directory.replace(name, named))
            directory = directory.replace(name, named)
            raw = RawSession(ch, transfer_directory=named)
            os.kill(child.pid, signal.SIGKILL)
            wait_for(lambda: open(f"/proc/{child.pid}/stat").read().split(")")[-1].split()[0]
                     == "Z", "the child to be a zombie")
            raw.cancel()
            wait_for(lambda: not server.sessions(), "the session to end")
            assert not os.path.exists(directory)
        finally:
            child.kill()
            child.wait()
