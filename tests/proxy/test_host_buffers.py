"""Host buffers are their session's own, bounded and safe to read: another session cannot
name them (unguessable session ids); a session's put files are read from the directory it
named only, into memory (a file shrunk afterwards cannot fault the server), and what is not
a regular file is refused without blocking, and the buffer it is read into becomes the
array's memory; a store grows as its bytes arrive, counted
against the session's limit and the server's; malformed host-buffer RPCs get
INVALID_ARGUMENT; two unmodified jax clients putting large arrays at once each get their
own data back."""

import gc
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
import ifrtpy_jax_plugin  # noqa: E402
from ifrtpy import proxy  # noqa: E402

from ifrtpy.proxy import local  # noqa: E402

from proxy_helpers import (SERVICE, STORE_HEADER, WAIT_S, Delegating, M,  # noqa: E402
                           RawSession, client_directory, delete, lookup, put_request, put_values,
                           raises_code, read_from_disk, status_of, store)

StatusCode = grpc.StatusCode
#: Generous bound on a hang, not a timing assertion (a process starts in seconds).
HANG_S = 240


@pytest.fixture(scope="module")
def pjrt():
    return ifrt.get_client("pjrt", device_count=1)


@pytest.fixture(scope="module")
def server(pjrt):
    with proxy.serve(pjrt, max_host_buffer_bytes=1 << 20) as running:
        yield running


@pytest.fixture
def channel(server):
    with grpc.insecure_channel(server.address) as ch:
        yield ch


def wait_for(predicate, what):
    deadline = time.monotonic() + WAIT_S  # a bound on a hang, not a timing assertion
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# -- isolation ------------------------------------------------------------------------------

def test_another_sessions_host_buffers_are_out_of_reach(server, channel):
    a, b = RawSession(channel), RawSession(channel)
    store(channel, a.id, 1, b"A's secret bytes")
    # the ids b might guess: its neighbours and small numbers (they once ran 1, 2, 3, ...)
    guesses = {b.id - 1, b.id + 1, a.id ^ 1, *range(1, 33)} - {a.id, b.id}
    for guess in guesses:
        assert "no live session" in raises_code(StatusCode.NOT_FOUND, lookup, channel, guess, 1)
        raises_code(StatusCode.NOT_FOUND, delete, channel, guess, 1)
        raises_code(StatusCode.NOT_FOUND, store, channel, guess, 2, b"planted")
    raises_code(StatusCode.NOT_FOUND, delete, channel, b.id, 1)  # b's own handle 1: none
    assert lookup(channel, a.id, 1) == b"A's secret bytes"
    a.close()
    b.close()


def test_puts_through_files_are_read_from_the_sessions_own_directory(server, channel):
    (dir_a, name_a), (dir_b, name_b) = client_directory(server.address), client_directory(
        server.address)
    a = RawSession(channel, transfer_directory=name_a)
    b = RawSession(channel, transfer_directory=name_b)
    plain = RawSession(channel)
    thief = RawSession(channel, transfer_directory=name_a)  # a's, while a is live
    for directory, text in ((dir_a, b"a's put"), (dir_b, b"b's put")):
        with open(os.path.join(directory, "lt_5"), "wb") as f:
            f.write(text)
    read_from_disk(channel, b.id, 5, 7)
    assert lookup(channel, b.id, 5) == b"b's put"
    assert os.listdir(dir_b) == [] and os.listdir(dir_a) == ["lt_5"]
    for session in (plain, thief):
        details = raises_code(StatusCode.FAILED_PRECONDITION, read_from_disk, channel,
                              session.id, 5, 7)
        assert "named no directory of its own" in details
    read_from_disk(channel, a.id, 5, 7)
    assert lookup(channel, a.id, 5) == b"a's put"
    # jaxlib names the file after the handle as a 32-bit C int: 2**32 - 5 is lt_-5
    values = np.arange(6, dtype=np.float32)
    with open(os.path.join(dir_a, "lt_-5"), "wb") as f:
        f.write(values.tobytes())
    read_from_disk(channel, a.id, (1 << 32) - 5, values.nbytes)
    assert lookup(channel, a.id, (1 << 32) - 5) == values.tobytes()
    # missing, or of another size than the request says: refused, and removed
    assert "lt_41" in raises_code(StatusCode.NOT_FOUND, read_from_disk, channel, a.id, 41, 24)
    with open(os.path.join(dir_a, "lt_42"), "wb") as f:
        f.write(bytes(20))
    details = raises_code(StatusCode.INVALID_ARGUMENT, read_from_disk, channel, a.id, 42, 24)
    assert "holds 20 bytes" in details and "24" in details
    assert os.listdir(dir_a) == []
    for session in (a, b, plain, thief):
        session.close()


def test_put_files_a_session_leaves_go_when_it_ends(server, channel):
    directory, name = client_directory(server.address)
    raw = RawSession(channel, transfer_directory=name)
    with open(os.path.join(directory, "lt_77"), "wb") as f:
        f.write(b"never read")
    raw.close()
    wait_for(lambda: not os.path.exists(os.path.join(directory, "lt_77")), "the file to go")
    assert os.path.isdir(directory)  # this process, which made it, is alive


def test_what_is_not_a_regular_file_is_refused_without_blocking(server, channel):
    directory, name = client_directory(server.address)
    raw = RawSession(channel, transfer_directory=name)
    os.mkfifo(os.path.join(directory, "lt_6"))  # opening it for reading would block
    os.mkdir(os.path.join(directory, "lt_7"))
    os.symlink("/etc/hostname", os.path.join(directory, "lt_8"))
    for handle in (6, 7):
        details = raises_code(StatusCode.INVALID_ARGUMENT, read_from_disk, channel, raw.id,
                              handle, 4)
        assert f"lt_{handle} is not a regular file" in details
    assert "lt_8" in raises_code(StatusCode.NOT_FOUND, read_from_disk, channel, raw.id, 8, 4)
    assert not os.path.lexists(os.path.join(directory, "lt_6"))
    assert not os.path.lexists(os.path.join(directory, "lt_8"))
    store(channel, raw.id, 9, b"still serving")
    assert lookup(channel, raw.id, 9) == b"still serving"
    raw.close()


def test_a_put_file_shrunk_after_it_was_read_cannot_fault_the_server(tmp_path):
    # the client keeps the file open and truncates it once the server has taken it: a
    # server that mapped it would die of SIGBUS reading it (so it runs in a process of its own)
    address = f"unix:{tmp_path}/s.sock"
    proc = subprocess.Popen([sys.executable, "-m", "ifrtpy", "serve", "--backend", "pjrt",
                             "--device-count", "1", "--address", address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("ifrtpy proxy: serving")
        values = np.random.default_rng(0).random(1 << 18, dtype=np.float32)  # 1 MiB
        with grpc.insecure_channel(address) as ch:
            directory, name = client_directory(address)
            raw = RawSession(ch, transfer_directory=name)
            fd = os.open(os.path.join(directory, "lt_3"), os.O_RDWR | os.O_CREAT, 0o600)
            os.write(fd, values.tobytes())
            read_from_disk(ch, raw.id, 3, values.nbytes)
            os.ftruncate(fd, 0)
            os.close(fd)
            assert status_of(raw.call("make_array_from_host_buffer_request",
                                      put_request(3, [values.size], 10))) == (0, "")
            assert status_of(raw.call("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
                array_handle=10, host_buffer_handle=11))) == (0, "")
            assert lookup(ch, raw.id, 11) == values.tobytes()
            raw.close()
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0


def test_a_put_files_buffer_becomes_the_arrays_memory_and_lives_as_long(pjrt, monkeypatch):
    # the aligned buffer the server read the file into is handed to the array, which the
    # CPU plugin aliases (no copy); the array keeps it alive, and the session's host-buffer
    # bytes go back to 0
    read, made = [], []
    original = local.read_put_file
    monkeypatch.setattr(local, "read_put_file",
                        lambda path, size: read.append(original(path, size)) or read[-1])

    class Recording(Delegating):
        def make_array_from_host_buffer(self, *args, **kwargs):
            made.append(self._inner.make_array_from_host_buffer(*args, **kwargs))
            return made[-1]

    values = np.random.default_rng(2).random(1 << 16, dtype=np.float32)
    with proxy.serve(Recording(pjrt)) as server, grpc.insecure_channel(server.address) as ch:
        directory, name = client_directory(server.address)
        raw = RawSession(ch, transfer_directory=name)
        with open(os.path.join(directory, "lt_3"), "wb") as f:
            f.write(values.tobytes())
        read_from_disk(ch, raw.id, 3, values.nbytes)
        assert status_of(raw.call("make_array_from_host_buffer_request",
                                  put_request(3, [values.size], 10))) == (0, "")
        assert made[0].unsafe_buffer_pointer() == read[0].ctypes.data
        assert server.host_buffer_bytes == 0
        del read[:], made[:]
        gc.collect()
        assert status_of(raw.call("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
            array_handle=10, host_buffer_handle=11))) == (0, "")
        assert lookup(ch, raw.id, 11) == values.tobytes()
        raw.close()


# -- stores and limits ----------------------------------------------------------------------

class OpenStore:
    """A HostBufferStore in flight: ``send(data)`` sends a chunk, ``end()`` its end;
    ``result()`` its outcome (None, or the RpcError)."""

    def __init__(self, channel, session_id, handle, size):
        self._chunks: queue.Queue = queue.Queue()
        header = M.GrpcHostBufferStoreMetadata(session_id=session_id, handle=handle,
                                               buffer_size=size).SerializeToString()
        call = channel.stream_unary(SERVICE + "HostBufferStore",
                                    request_serializer=M.GrpcHostBufferStoreRequest.SerializeToString)
        self._future = call.future(iter(self._chunks.get, None),
                                   metadata=[(STORE_HEADER, header)], timeout=WAIT_S)

    def send(self, data):
        self._chunks.put(M.GrpcHostBufferStoreRequest(data=data))

    def end(self):
        self._chunks.put(None)

    def done(self):
        return self._future.done()

    def result(self):
        try:
            self._future.result(timeout=WAIT_S)
        except grpc.RpcError as error:
            return error
        return None


def test_a_store_counts_its_bytes_as_they_arrive_and_frees_them_when_it_ends_short(
        server, channel):
    raw = RawSession(channel)
    pending = OpenStore(channel, raw.id, 1, 2 << 30)  # says 2 GiB (over the limit), sends 10
    pending.send(b"0123456789")
    wait_for(lambda: server.host_buffer_bytes == 10, "the first chunk")
    assert server.sessions()[-1].host_buffer_bytes == 10
    pending.end()
    error = pending.result()
    assert error.code() == StatusCode.INVALID_ARGUMENT
    assert "the header says 2147483648 bytes, the stream sent 10" in error.details()
    assert server.host_buffer_bytes == 0
    raw.close()


def test_concurrent_stores_stay_under_the_session_limit(server, channel):
    raw = RawSession(channel)
    piece, limit = bytes(100 << 10), 1 << 20
    stores = [OpenStore(channel, raw.id, handle, 600 << 10) for handle in (1, 2, 3)]
    for open_store in stores[:2]:
        for _ in range(4):
            open_store.send(piece)
    wait_for(lambda: server.host_buffer_bytes == 800 << 10, "two stores' first chunks")
    third = stores[2]
    sent = 0
    while not third.done() and sent < 6:
        third.send(piece)
        sent += 1
        time.sleep(0.05)
        assert server.host_buffer_bytes <= limit
    error = third.result()  # refused as its bytes arrived, before its end
    assert error.code() == StatusCode.RESOURCE_EXHAUSTED and str(limit) in error.details()
    for open_store in stores[:2]:
        open_store.end()
        assert open_store.result().code() == StatusCode.INVALID_ARGUMENT  # ended short
    assert server.host_buffer_bytes == 0
    raw.close()


def test_the_server_wide_host_buffer_limit(pjrt):
    with proxy.serve(pjrt, max_host_buffer_bytes=1 << 20,
                     max_total_host_buffer_bytes=3 << 19) as small, \
            grpc.insecure_channel(small.address) as ch:
        a, b = RawSession(ch), RawSession(ch)
        store(ch, a.id, 1, bytes(1 << 20), piece=1 << 16)
        details = raises_code(StatusCode.RESOURCE_EXHAUSTED, store, ch, b.id, 1,
                              bytes(1 << 20), piece=1 << 16)
        assert "the server would hold" in details and str(3 << 19) in details
        delete(ch, a.id, 1)
        store(ch, b.id, 1, bytes(1 << 20), piece=1 << 16)
        assert small.host_buffer_bytes == 1 << 20
        b.close()
        wait_for(lambda: small.host_buffer_bytes == 0, "b's buffer to be freed")
        a.close()


def test_host_buffer_rpcs_in_flight_are_bounded(pjrt):
    with proxy.serve(pjrt, max_host_buffer_rpcs=2) as small, \
            grpc.insecure_channel(small.address) as ch:
        raw = RawSession(ch)
        stores = [OpenStore(ch, raw.id, handle, 10) for handle in (1, 2)]
        for open_store in stores:
            open_store.send(b"01234")
        wait_for(lambda: small.host_buffer_bytes == 10, "two stores in flight")
        details = raises_code(StatusCode.RESOURCE_EXHAUSTED, lookup, ch, raw.id, 1)
        assert "max_host_buffer_rpcs" in details
        for open_store in stores:
            open_store.send(b"56789")
            open_store.end()
            assert open_store.result() is None
        assert lookup(ch, raw.id, 1) == b"0123456789"
        raw.close()


def test_a_failed_puts_error_does_not_keep_its_host_buffer_alive(server, channel):
    raw = RawSession(channel)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store(channel, raw.id, 1, bytes(1 << 20), piece=1 << 16)
        held = tracemalloc.get_traced_memory()[0]
        code, message = status_of(raw.call("make_array_from_host_buffer_request",
                                           put_request(1, [3], 600)))
        assert code == 3 and "bytes" in message
        # the error is bound to the result handle the client minted ...
        assert status_of(raw.call("is_array_deleted_request", M.IsArrayDeletedRequest(
            array_handle=600))) == (code, message)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # ... and the megabyte it failed to put is gone
    assert held - before >= 1 << 20
    assert after - before < 256 << 10, (before, held, after)
    assert server.host_buffer_bytes == 0
    raw.close()


# -- malformed host-buffer RPCs ----------------------------------------------------------------

def test_malformed_requests_get_invalid_argument_naming_what_was_wrong(server, channel):
    garbage = b"\xff\xff\xff\xff not a message"
    for method, message in (("GetVersion", "GrpcGetVersionRequest"),
                            ("HostBufferLookup", "GrpcHostBufferLookupRequest"),
                            ("HostBufferDelete", "GrpcHostBufferDeleteRequest"),
                            ("HostBufferReadFromDisk", "GrpcHostBufferReadFromDiskRequest")):
        call = (channel.unary_stream if method == "HostBufferLookup" else channel.unary_unary)(
            SERVICE + method)
        details = raises_code(StatusCode.INVALID_ARGUMENT,
                              lambda: list(call(garbage, timeout=WAIT_S))
                              if method == "HostBufferLookup" else call(garbage, timeout=WAIT_S))
        assert message in details, (method, details)
    stream = channel.stream_unary(SERVICE + "HostBufferStore")
    details = raises_code(StatusCode.INVALID_ARGUMENT, stream, iter([]), timeout=WAIT_S)
    assert STORE_HEADER in details
    details = raises_code(StatusCode.INVALID_ARGUMENT, stream, iter([]), timeout=WAIT_S,
                          metadata=[(STORE_HEADER, garbage)])
    assert "GrpcHostBufferStoreMetadata" in details
    raw = RawSession(channel)
    header = M.GrpcHostBufferStoreMetadata(session_id=raw.id, handle=1, buffer_size=4)
    details = raises_code(StatusCode.INVALID_ARGUMENT, stream, iter([garbage]), timeout=WAIT_S,
                          metadata=[(STORE_HEADER, header.SerializeToString())])
    assert "HostBufferStore chunk" in details and "GrpcHostBufferStoreRequest" in details
    raw.close()


# -- two unmodified jax clients ----------------------------------------------------------------

#: Each client waits for a line, then puts 4 MiB arrays holding its own number and reads
#: them back.
PUTTER = """
import json, sys, jax, numpy as np
me = int(sys.argv[1])
jax.devices()
print("READY", flush=True)
sys.stdin.readline()
xs = [np.full(1 << 20, me * 1000 + i, dtype=np.float32) for i in range(12)]
ys = [jax.device_put(x) for x in xs]
wrong = [[i, float(np.asarray(y)[0])] for i, (x, y) in enumerate(zip(xs, ys))
         if not (np.asarray(y) == x).all()]
print("RESULT " + json.dumps(wrong), flush=True)
"""


def test_two_jax_clients_putting_large_arrays_at_once_get_their_own(pjrt):
    with proxy.serve(pjrt) as server:
        outputs, clients = put_at_once(server.address)
        for (out, err), child in zip(outputs, clients):
            assert child.returncode == 0 and "RESULT " in out, err[-3000:]
            assert out.split("RESULT ", 1)[1].strip() == "[]"
        directory = ifrtpy_jax_plugin.shared_directory(server.address)
        assert os.listdir(directory) == ["server.pid"]  # no put file, no client directory


def put_at_once(address):
    """Two jax clients of ``address`` running PUTTER at once: their (stdout, stderr)s and
    processes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IFRT_PROXY_")}
    env.update(JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=f"grpc://{address}")
    clients = [subprocess.Popen([sys.executable, "-c", PUTTER, str(me)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for me in (1, 2)]
    try:
        for child in clients:
            assert child.stdout.readline().strip() == "READY", child.stderr.read()[-2000:]
        outputs = [None, None]

        def run(i):
            outputs[i] = clients[i].communicate("go\n", timeout=HANG_S)

        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_S)
    finally:
        for child in clients:
            if child.poll() is None:
                child.kill()
                child.wait()
    return outputs, clients


@pytest.mark.parametrize("threads", [0, 4])
def test_a_large_put_file_is_read_on_several_threads_where_pages_cannot_be_mapped(
        tmp_path, monkeypatch, threads):
    """Where the kernel cannot map pages without writing them (``PREFAULT_THREADS`` > 1),
    a put file of 32 MiB or more is read in that many slices at once, each thread taking
    its page faults; the bytes are the file's either way, small files are read whole, and
    a file that shrinks under any slice is refused."""
    from ifrtpy import _host_memory

    calls, real = [], local._read_range
    monkeypatch.setattr(_host_memory, "PREFAULT_THREADS", threads)
    monkeypatch.setattr(local, "_read_range",
                        lambda fd, view, start, stop: calls.append(stop - start) or real(
                            fd, view, start, stop))
    data = np.random.default_rng(0).integers(0, 256, (32 << 20) + 5, dtype=np.uint8)
    for size in ((32 << 20) + 5, 1 << 20):
        path = tmp_path / f"lt_{size}"
        data[:size].tofile(path)
        read = local.read_put_file(str(path), size)
        assert np.array_equal(read, data[:size]) and not path.exists()
    big = [(32 << 20) // 4 + 4096] * 3 + [(32 << 20) + 5 - 3 * ((32 << 20) // 4 + 4096)]
    # the slices' threads may record in any order; the small file is read after them
    assert sorted(calls[:-1]) == sorted(big if threads else [(32 << 20) + 5])
    assert calls[-1] == 1 << 20
    path = tmp_path / "lt_short"
    data.tofile(path)
    writer = os.open(path, os.O_RDWR)  # the client's: it shrinks the file once read starts
    monkeypatch.setattr(local, "_read_range", lambda fd, view, start, stop: (
        os.ftruncate(writer, 1 << 20) if start == 0 else None) or real(fd, view, start, stop))
    try:
        with pytest.raises(ifrt.errors.InvalidArgumentError, match="shrank"):
            local.read_put_file(str(path), data.size)
    finally:
        os.close(writer)


def test_serving_the_reference_backend_loads_nothing_of_the_pjrt_backend(tmp_path):
    """The server sits on the public Client interface (DESIGN decision 15): serving the
    reference backend, with every module of ifrtpy.proxy imported and a put file read,
    loads neither the PjRt backend nor the C layer under it."""
    program = f"""
import importlib, pkgutil, sys
import numpy as np
import ifrtpy, ifrtpy.proxy
from ifrtpy import proxy
for found in pkgutil.iter_modules(ifrtpy.proxy.__path__):
    importlib.import_module("ifrtpy.proxy." + found.name)
path = {str(tmp_path / "lt_1")!r}
np.arange(64, dtype=np.uint8).tofile(path)
assert proxy.local.read_put_file(path, 64).tolist() == list(range(64))
with proxy.serve(ifrtpy.get_client("reference", device_count=1)):
    pass
print(sorted(m for m in sys.modules if m.startswith(("ifrtpy._pjrt", "ifrtpy.backends.pjrt"))))
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_unread_lookups_are_counted_and_refused_past_the_budget(pjrt):
    """Each lookup's piece in flight (the server's message and gRPC's copy of it) is
    counted against the session's host-buffer budget while the client has not read it:
    lookups nobody reads are refused past the budget, and the server's memory stays
    bounded by it; the lookups it took still read the buffer whole."""
    budget, size, count = 24 << 20, 16 << 20, 48
    data = np.random.default_rng(3).integers(0, 256, size, dtype=np.uint8).tobytes()
    with proxy.serve(pjrt, max_host_buffer_bytes=budget) as small, \
            grpc.insecure_channel(small.address, [("grpc.max_receive_message_length", -1)]) as ch:
        raw = RawSession(ch)
        store(ch, raw.id, 1, data, piece=1 << 20)
        call = ch.unary_stream(SERVICE + "HostBufferLookup",
                               request_serializer=M.GrpcHostBufferLookupRequest.SerializeToString,
                               response_deserializer=M.GrpcHostBufferLookupResponse.FromString)
        gc.collect()
        before = _rss_bytes()
        calls = [call(M.GrpcHostBufferLookupRequest(session_id=raw.id, handle=1), timeout=WAIT_S)
                 for _ in range(count)]  # started, never read
        wait_for(lambda: sum(c.done() for c in calls) >= count // 2, "lookups refused")
        time.sleep(0.5)  # let the others reach the client's flow-control window
        held = small.sessions()[0].host_buffer_bytes
        grown = _rss_bytes() - before
        refused = [c for c in calls if c.done()]
        assert held <= budget
        assert all(c.code() == StatusCode.RESOURCE_EXHAUSTED for c in refused)
        assert "over its limit of" in refused[0].details()
        # without the count each lookup pinned a 4 MiB piece and gRPC's copy: 384 MiB here
        assert grown < 4 * budget, f"the server grew by {grown >> 20} MiB"
        for c in calls:
            if c not in refused:
                assert b"".join(r.data for r in c) == data
        wait_for(lambda: small.sessions()[0].host_buffer_bytes == size, "pieces uncounted")
        raw.close()


def _physical_memory():
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) << 10  # MemTotal, in kiB


def test_the_default_budgets_fit_the_machines_memory():
    limits = proxy.Limits()
    assert limits.max_total_host_buffer_bytes <= _physical_memory() // 2
    assert limits.max_host_buffer_bytes <= limits.max_total_host_buffer_bytes // 2
    assert limits.max_host_buffer_bytes >= 64 << 20  # room for a large put still


@pytest.mark.parametrize("layout", ["all hole", "hole at the end", "hole in the middle"])
def test_a_sparse_put_file_is_refused_before_it_costs_the_server_memory(pjrt, layout):
    """A file of holes costs its writer nothing: the server refuses it without reading
    it (nothing counted, nothing allocated), and still serves the session."""
    size = 256 << 20
    with proxy.serve(pjrt, max_host_buffer_bytes=1 << 30) as big, \
            grpc.insecure_channel(big.address) as ch:
        directory, name = client_directory(big.address)
        raw = RawSession(ch, transfer_directory=name)
        path = os.path.join(directory, "lt_4")
        with open(path, "wb") as f:
            if layout == "hole in the middle":
                f.write(b"x" * 4096)
                f.seek(size - 4096)
                f.write(b"y" * 4096)
            else:
                f.write(b"x" * (4096 if layout == "hole at the end" else 0))
                f.truncate(size)
        gc.collect()
        before = _rss_bytes()
        details = raises_code(StatusCode.INVALID_ARGUMENT, read_from_disk, ch, raw.id, 4, size)
        assert "has a hole at byte" in details and "sparse" in details
        assert _rss_bytes() - before < size // 4
        assert big.host_buffer_bytes == 0 and not os.path.exists(path)
        with open(path, "wb") as f:  # a file written whole is read
            f.write(b"z" * 4096)
        read_from_disk(ch, raw.id, 4, 4096)
        assert lookup(ch, raw.id, 4) == b"z" * 4096
        raw.close()


def test_a_copy_out_whose_lookup_could_not_stream_is_refused_at_the_copy(pjrt):
    """A copy out leaves room for its lookup's least piece in flight (twice: the message
    and gRPC's copy) within the session's budget: an array that fits the budget but not
    beside that piece is refused at ``CopyToHostBuffer``, not after, at its lookup; one
    that fits beside it streams whole."""
    budget, least = 1 << 20, 2 * (64 << 10)
    with proxy.serve(pjrt, max_host_buffer_bytes=budget) as small, \
            grpc.insecure_channel(small.address) as ch:
        raw = RawSession(ch)
        for handle, nbytes in ((1, budget - least), (2, budget - least // 2)):
            values = np.arange(nbytes // 4, dtype=np.float32)
            assert put_values(ch, raw, values, handle) == (0, "")
        fits = raw.call("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
            array_handle=1, host_buffer_handle=11))
        assert status_of(fits) == (0, "")
        expected = np.arange((budget - least) // 4, dtype=np.float32).tobytes()
        assert lookup(ch, raw.id, 11) == expected
        delete(ch, raw.id, 11)
        code, message = status_of(raw.call("copy_to_host_buffer_request",
                                           M.CopyToHostBufferRequest(array_handle=2,
                                                                     host_buffer_handle=12)))
        assert code == StatusCode.RESOURCE_EXHAUSTED.value[0], message
        assert f"takes a host buffer of {budget - least // 2} bytes and {least} more" in message
        raw.close()
