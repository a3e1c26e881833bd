"""The get as a pipeline and the memory the server reuses: CopyToHostBuffer is answered
once the copy has started, its lookup waits for the bytes (however long the copy takes)
and gets the copy's error if it fails; a deleted host buffer's memory is the next copy's
of its size, and never while something still refers to it; the server's step
timestamps."""

import concurrent.futures
import threading

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402
from ifrtpy.errors import DataLossError  # noqa: E402
from ifrtpy.future import Promise  # noqa: E402
from ifrtpy.proxy import pool, steps  # noqa: E402

from proxy_helpers import (WAIT_S, Delegating, M, RawSession, delete,  # noqa: E402
                           lookup, put_values, raises_code, status_of, wait_for)

StatusCode = grpc.StatusCode


class HeldCopy(Delegating):
    """An array whose copies to the host complete when the test says (``release``)."""

    def __init__(self, inner, gate):
        super().__init__(inner)
        self._gate = gate

    def copy_to_host_buffer(self, out=None, byte_strides=None):
        promise = Promise()
        real = self._inner.copy_to_host_buffer(out, byte_strides)

        def finish():
            self._gate["release"].wait(WAIT_S)
            error = self._gate.get("error")
            if error is not None:
                promise.set_exception(error)
            else:
                promise.set_result(real.result())

        threading.Thread(target=finish, daemon=True).start()
        return promise.future


class HeldClient(Delegating):
    def __init__(self, inner):
        super().__init__(inner)
        self.gate = {"release": threading.Event()}

    def make_array_from_host_buffer(self, *args, **kwargs):
        return HeldCopy(self._inner.make_array_from_host_buffer(*args, **kwargs), self.gate)


@pytest.fixture(scope="module")
def pjrt():
    return ifrt.get_client("pjrt", device_count=1)


@pytest.mark.parametrize("fails", [False, True])
def test_copy_to_host_buffer_is_answered_at_once_and_its_lookup_waits(pjrt, fails):
    held = HeldClient(pjrt)
    values = np.arange(1 << 16, dtype=np.float32)
    with proxy.serve(held) as server, grpc.insecure_channel(server.address) as ch:
        raw = RawSession(ch)
        assert put_values(ch, raw, values, 10) == (0, "")
        # answered while the copy is held: the client's lookup overlaps the copy
        answer = raw.call("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
            array_handle=10, host_buffer_handle=11))
        assert status_of(answer) == (0, "")
        got = {}

        def read():
            try:
                got["bytes"] = lookup(ch, raw.id, 11)
            except grpc.RpcError as error:
                got["error"] = error

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not got  # the lookup waits for the bytes
        if fails:
            held.gate["error"] = DataLossError("the device lost it")
        held.gate["release"].set()
        reader.join(WAIT_S)
        if fails:
            assert got["error"].code() == StatusCode.DATA_LOSS
            assert "the device lost it" in got["error"].details()
            delete(ch, raw.id, 11)  # a failed copy's handle is deleted as any other
            raises_code(StatusCode.NOT_FOUND, delete, ch, raw.id, 11)
        else:
            assert got["bytes"] == values.tobytes()
        assert server.host_buffer_bytes == (0 if fails else values.nbytes)
        raw.close()


def test_a_handle_in_use_or_copying_is_refused(pjrt):
    held = HeldClient(pjrt)
    with proxy.serve(held) as server, grpc.insecure_channel(server.address) as ch:
        raw = RawSession(ch)
        assert put_values(ch, raw, np.ones(8, np.float32), 10) == (0, "")
        copy = M.CopyToHostBufferRequest(array_handle=10, host_buffer_handle=11)
        assert status_of(raw.call("copy_to_host_buffer_request", copy)) == (0, "")
        code, message = status_of(raw.call("copy_to_host_buffer_request", copy))
        assert code == StatusCode.INVALID_ARGUMENT.value[0] and "already in use" in message
        delete(ch, raw.id, 11)  # while its copy runs: its bytes go when it ends
        held.gate["release"].set()
        assert status_of(raw.call("copy_to_host_buffer_request", copy)) == (0, "")
        assert lookup(ch, raw.id, 11) == np.ones(8, np.float32).tobytes()
        raw.close()


def test_the_pool_keeps_the_flat_blocks_it_is_given():
    """The pool keeps a block NumPy owns, flat and in its size range, whatever refers to
    it: whether anything still reads the memory is its caller's to know (the host-buffer
    store: tests/proxy/test_host_buffer_ownership.py), not a reference count's."""
    kept = pool.HostPool(limit=8 << 20)
    small = [np.empty(1000, np.uint8)]
    assert not kept.give(small)  # malloc's to reuse
    assert not kept.give([bytearray(4 << 20)])
    assert not kept.give([np.empty(16 << 20, np.uint8)])  # over the limit
    assert kept.kept == 0
    fresh = np.empty((1 << 20,), np.float32)
    address = fresh.ctypes.data
    held = [fresh.reshape(-1).view(np.uint8)]
    del fresh
    assert kept.give(held) and kept.kept == 4 << 20 and held == []
    assert kept.take(3 << 20) is None  # sizes match exactly
    block = kept.take(4 << 20)
    assert block.ctypes.data == address and block.nbytes == 4 << 20 and kept.kept == 0
    for _ in range(3):  # past the limit the oldest go
        assert kept.give([np.empty(4 << 20, np.uint8)])
    assert kept.kept == 8 << 20


def test_a_deleted_copys_memory_is_the_next_copys(pjrt):
    pool.POOL.clear()
    values = np.random.default_rng(0).random(1 << 20, dtype=np.float32)  # 4 MiB
    with proxy.serve(pjrt) as server, grpc.insecure_channel(
            server.address, [("grpc.max_receive_message_length", -1)]) as ch:
        raw = RawSession(ch)
        assert put_values(ch, raw, values, 10) == (0, "")
        for handle in (11, 12, 13):
            assert status_of(raw.call("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
                array_handle=10, host_buffer_handle=handle))) == (0, "")
            assert lookup(ch, raw.id, handle) == values.tobytes()
            assert pool.POOL.kept == 0  # the copy took the memory the last one left
            delete(ch, raw.id, handle)
            assert pool.POOL.kept == values.nbytes
        raw.close()
    pool.POOL.clear()


def test_the_server_records_each_step_of_a_get():
    steps.LOG.start()
    try:
        client = ifrt.get_client("pjrt", device_count=1)
        values = np.arange(1 << 18, dtype=np.float32)
        with proxy.serve(client) as server, grpc.insecure_channel(server.address) as ch:
            raw = RawSession(ch)
            assert put_values(ch, raw, values, 10) == (0, "")
            assert status_of(raw.call("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
                array_handle=10, host_buffer_handle=11))) == (0, "")
            assert lookup(ch, raw.id, 11) == values.tobytes()
            raw.close()
    finally:
        steps.LOG.stop()
    found = steps.spans(steps.LOG.take(), "copy arrived", "last piece written")
    assert len(found) == 1
    nbytes, seconds, marks = found[0]
    assert nbytes == values.nbytes and seconds > 0
    assert set(marks) == {"copy arrived", "copy answered", "copy done", "lookup arrived",
                          "first piece written", "last piece written"}
    assert marks["copy arrived"] <= marks["copy answered"] <= marks["lookup arrived"]
    assert marks["copy done"] <= marks["first piece written"] <= marks["last piece written"]


class CopyingClient(Delegating):
    """A backend that copies every put and lets the host memory go before it returns (as a
    device with memory of its own does once the transfer is done)."""

    def make_array_from_host_buffer(self, data, sharding, semantics=None, **kwargs):
        return self._inner.make_array_from_host_buffer(np.array(data), sharding, **kwargs)


def _put_file(ch, raw, directory, values, buffer, array):
    from proxy_helpers import put_request, read_from_disk

    values.tofile(f"{directory}/lt_{buffer}")
    read_from_disk(ch, raw.id, buffer, values.nbytes)
    assert status_of(raw.call("make_array_from_host_buffer_request",
                              put_request(buffer, [values.size], array))) == (0, "")


@pytest.mark.parametrize("copies", [True, False])
def test_a_copied_puts_memory_is_the_next_put_files_and_an_aliased_ones_is_not(pjrt, copies):
    from proxy_helpers import client_directory

    pool.POOL.clear()
    first, second = (np.random.default_rng(i).random(1 << 20, dtype=np.float32)
                     for i in (1, 2))
    with proxy.serve(CopyingClient(pjrt) if copies else pjrt) as server, grpc.insecure_channel(
            server.address, [("grpc.max_receive_message_length", -1)]) as ch:
        directory, name = client_directory(server.address)
        raw = RawSession(ch, transfer_directory=name)
        _put_file(ch, raw, directory, first, 1, 10)
        assert raw.call("check_value_ready_request", M.CheckValueReadyRequest(
            value_handles=[10])).response_metadata.status.code == 0
        # the backend copied the first put: its memory is kept for the next put file; an
        # array that aliases it (the CPU plugin's zero copy) keeps it its own
        kept = first.nbytes + 64 if copies else 0
        # the pool gets it in a callback of the array's readiness, which may run after the
        # readiness check has seen the future done and answered (on the server's loop)
        wait_for(lambda: pool.POOL.kept == kept, "the put's memory to be kept")
        _put_file(ch, raw, directory, second, 2, 20)
        for array, values in ((10, first), (20, second)):
            copy = M.CopyToHostBufferRequest(array_handle=array, host_buffer_handle=array + 1)
            assert status_of(raw.call("copy_to_host_buffer_request", copy)) == (0, "")
            assert lookup(ch, raw.id, array + 1) == values.tobytes()
        assert pool.POOL.kept == kept  # the second put file was read into the first's memory
        raw.close()
    pool.POOL.clear()


class LingeringFutures(concurrent.futures.ThreadPoolExecutor):
    """An executor whose finished futures stay referred to (as they are until its thread,
    which set their result, is scheduled again: on a busy machine, after the put)."""

    def __init__(self):
        super().__init__(2)
        self.futures = []

    def submit(self, fn, *args, **kwargs):
        future = super().submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future


def test_a_put_files_memory_is_the_session_alone_once_the_read_is_answered(pjrt):
    """The server's thread that read a put file may not have run again when the put
    comes: nothing of the read still refers to the memory (the pool would refuse it)."""
    from proxy_helpers import client_directory

    pool.POOL.clear()
    values = np.random.default_rng(7).random(1 << 20, dtype=np.float32)
    with proxy.serve(CopyingClient(pjrt)) as server, grpc.insecure_channel(
            server.address, [("grpc.max_receive_message_length", -1)]) as ch:
        lingering = server._service.files = LingeringFutures()
        directory, name = client_directory(server.address)
        raw = RawSession(ch, transfer_directory=name)
        for buffer, array in ((1, 10), (2, 20)):
            _put_file(ch, raw, directory, values, buffer, array)
            assert raw.call("check_value_ready_request", M.CheckValueReadyRequest(
                value_handles=[array])).response_metadata.status.code == 0
            assert pool.POOL.kept == values.nbytes + 64
        assert len(lingering.futures) == 2
        raw.close()
    lingering.shutdown()
    pool.POOL.clear()


def test_a_buffer_deleted_while_its_lookup_streams_is_not_reused_under_it(pjrt):
    """A client that deletes a host buffer while its lookup still streams it: its memory
    is not kept for another copy (another session's bytes would reach this lookup)."""
    pool.POOL.clear()
    values = np.random.default_rng(5).random(4 << 20, dtype=np.float32)  # 16 MiB
    other = np.random.default_rng(6).random(4 << 20, dtype=np.float32)
    with proxy.serve(pjrt) as server, grpc.insecure_channel(
            server.address, [("grpc.max_receive_message_length", -1)]) as ch:
        raw, thief = RawSession(ch), RawSession(ch)
        assert put_values(ch, raw, values, 10) == (0, "")
        assert put_values(ch, thief, other, 10) == (0, "")
        copy = M.CopyToHostBufferRequest(array_handle=10, host_buffer_handle=11)
        assert status_of(raw.call("copy_to_host_buffer_request", copy)) == (0, "")
        call = ch.unary_stream("/xla.ifrt.proxy.GrpcIfrtService/HostBufferLookup",
                               request_serializer=M.GrpcHostBufferLookupRequest.SerializeToString,
                               response_deserializer=M.GrpcHostBufferLookupResponse.FromString)
        pieces = call(M.GrpcHostBufferLookupRequest(session_id=raw.id, handle=11),
                      timeout=WAIT_S)
        first = next(pieces).data  # the lookup has started streaming, and holds the buffer
        delete(ch, raw.id, 11)
        assert pool.POOL.kept == 0
        assert status_of(thief.call("copy_to_host_buffer_request", copy)) == (0, "")
        assert lookup(ch, thief.id, 11) == other.tobytes()
        assert first + b"".join(r.data for r in pieces) == values.tobytes()
        raw.close()
        thief.close()
    pool.POOL.clear()
