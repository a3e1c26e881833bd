"""A host buffer's bytes are its own (ifrtpy.proxy.host_buffers): a copy deleted while it
runs never fills its handle again, memory a lookup still streams is not reused, and a
session that makes no progress (a stalled store included) is idle."""

import sys
import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402

from proxy_helpers import (SERVICE, WAIT_S, Delegating, M, RawSession,  # noqa: E402
                           delete, lookup, put_request, single_device_sharding, status_of,
                           store, wait_for)
from test_host_buffers import OpenStore  # noqa: E402


@pytest.fixture(scope="module")
def pjrt():
    return ifrt.get_client("pjrt", device_count=1)


def put(channel, session, values, handle):
    """Array ``handle`` of f32 ``values`` (stored in 1 MiB pieces, then made)."""
    store(channel, session.id, handle, values.tobytes(), piece=1 << 20)
    request = put_request(handle, [values.size], handle)
    request.sharding.CopyFrom(single_device_sharding(0))
    assert status_of(session.call("make_array_from_host_buffer_request", request)) == (0, "")


def copy_out(session, array, buffer):
    assert status_of(session.call("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
        array_handle=array, host_buffer_handle=buffer))) == (0, "")


class HeldCopies(Delegating):
    """A Client whose arrays' copies out end only when the test opens their gate
    (``gates``, one per copy, in order)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.gates = []

    def make_array_from_host_buffer(self, *args, **kwargs):
        return HeldArray(self._inner.make_array_from_host_buffer(*args, **kwargs), self.gates)


class HeldArray(Delegating):
    def __init__(self, inner, gates):
        super().__init__(inner)
        self._gates = gates

    def copy_to_host_buffer(self, *args, **kwargs):
        copied, done, gate = self._inner.copy_to_host_buffer(*args, **kwargs), ifrt.Promise(), \
            threading.Event()
        self._gates.append(gate)

        def finish():
            gate.wait(WAIT_S)
            done.set_result(copied.result())

        threading.Thread(target=finish, daemon=True).start()
        return done.future


def test_a_copy_deleted_while_it_runs_never_fills_its_handle(pjrt):
    """Copy array A to host buffer 7, delete 7 while the copy runs, copy array B to 7:
    when A's copy ends first, its bytes are dropped (and uncounted); 7 holds B's."""
    a, b = (np.full(1024, v, np.float32) for v in (1.0, 2.0))
    client = HeldCopies(pjrt)
    with proxy.serve(client) as server, grpc.insecure_channel(server.address) as ch:
        session = RawSession(ch)
        put(ch, session, a, 1)
        put(ch, session, b, 2)
        copy_out(session, 1, 7)
        delete(ch, session.id, 7)
        copy_out(session, 2, 7)
        assert server.sessions()[0].host_buffer_bytes == 2 * a.nbytes  # both copies count
        client.gates[0].set()  # A's copy ends: no one expects it any more
        wait_for(lambda: server.sessions()[0].host_buffer_bytes == a.nbytes,
                 "the deleted copy's bytes to be dropped")
        client.gates[1].set()
        assert lookup(ch, session.id, 7) == b.tobytes()
        session.close()


def test_memory_a_lookup_streams_is_not_reused_while_it_streams(pjrt, monkeypatch):
    """A lookup reads part of a copied-out buffer; the buffer is deleted and another array
    of its size is copied out: the rest of the lookup still reads the first array's bytes.
    Reference counts decide nothing (they read as Python 3.14 may: lower than held)."""
    monkeypatch.setattr(sys, "getrefcount", lambda obj: 2)
    size = 8 << 20  # f32: 32 MiB, eight lookup pieces
    first, second = (np.random.default_rng(seed).random(size, dtype=np.float32)
                     for seed in (1, 2))
    with proxy.serve(pjrt) as server, grpc.insecure_channel(
            server.address, [("grpc.max_receive_message_length", -1)]) as ch:
        session = RawSession(ch)
        put(ch, session, first, 1)
        put(ch, session, second, 2)
        copy_out(session, 1, 11)
        call = ch.unary_stream(SERVICE + "HostBufferLookup",
                               request_serializer=M.GrpcHostBufferLookupRequest.SerializeToString,
                               response_deserializer=M.GrpcHostBufferLookupResponse.FromString)
        streaming = call(M.GrpcHostBufferLookupRequest(session_id=session.id, handle=11),
                         timeout=WAIT_S)
        pieces = [next(streaming).data]
        delete(ch, session.id, 11)
        copy_out(session, 2, 12)
        assert lookup(ch, session.id, 12) == second.tobytes()  # its copy has ended
        pieces += [r.data for r in streaming]
        assert b"".join(pieces) == first.tobytes()
        session.close()


def test_a_stalled_store_is_idle(pjrt):
    """With idle_timeout_s, a session whose only activity is a HostBufferStore that sent
    1 byte of 100 and then nothing is idle: it ends, its store ends, its slot is free."""
    with proxy.serve(pjrt, idle_timeout_s=1.0, max_sessions=1) as server, \
            grpc.insecure_channel(server.address) as ch:
        stalled = RawSession(ch)
        held = OpenStore(ch, stalled.id, 5, 100)
        held.send(b"x")
        error = held.result()  # ends with the session
        assert error is not None and error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
        assert f"session {stalled.id} ended" in error.details()
        with pytest.raises(grpc.RpcError) as ended:
            stalled.receive()
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "idle for 1 s" in ended.value.details()
        wait_for(lambda: not server.sessions(), "the idle session to leave the count")
        RawSession(ch).close()  # its slot is free


def test_a_session_running_a_request_is_not_idle(pjrt):
    """A request the server has not answered yet (its program runs, here a wait for a
    host buffer) is the server's work, not the client's silence: no idle end."""
    with proxy.serve(pjrt, idle_timeout_s=1.0) as server, \
            grpc.insecure_channel(server.address) as ch:
        session = RawSession(ch)
        waiting = session.send("make_array_from_host_buffer_request", put_request(9, [4], 9))
        time.sleep(2.5)  # past the idle timeout, the request still waiting
        assert len(server.sessions()) == 1
        store(ch, session.id, 9, np.arange(4, dtype=np.float32).tobytes())
        answer = session.receive()
        assert answer.response_metadata.op_id == waiting
        assert status_of(answer) == (0, "")
        session.close()
