"""The PjRt backend's transfer fast paths: large puts staged in memory the layer owns and
aliased by their buffers, fresh get destinations mapped while the plugin copies, and the
cached single-device put."""

import ctypes
import gc
import mmap
import time
import weakref

import ml_dtypes
import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy import _pjrt
from ifrtpy._host_memory import PopulateBehind, populate_while_pending
from ifrtpy.array import HostBufferSemantics
from ifrtpy.backends.pjrt import array as pjrt_array
from ifrtpy.backends.pjrt import put as pjrt_put
from ifrtpy.cli.demo import DEMO_PROGRAM
from ifrtpy.errors import InvalidArgumentError
from pjrt_helpers import aligned_empty, compile_options, lower

MiB = 1 << 20
LARGE = pjrt_array._LARGE_BYTES
MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")
ONLY_DURING_CALL = HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
UNTIL_TRANSFER = HostBufferSemantics.IMMUTABLE_UNTIL_TRANSFER_COMPLETES


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)


@pytest.fixture
def staged(monkeypatch):
    """Records the copies each large put stages (a list of lists)."""
    calls = []
    real = pjrt_put._staged_copies

    def recording(pieces):
        copies = real(pieces)
        calls.append(copies)
        return copies

    monkeypatch.setattr(pjrt_put, "_staged_copies", recording)
    return calls


def _large(dtype=np.float32, rows=8, nbytes=LARGE):
    """A random array of ``rows`` rows, ``nbytes`` bytes or a little more in all; a row is
    not a multiple of 64 bytes, so row blocks start off 64-byte boundaries."""
    dtype = np.dtype(dtype)
    cols = -(-nbytes // (rows * dtype.itemsize)) + 3
    rng = np.random.default_rng(0)
    return rng.integers(0, 100, (rows, cols)).astype(dtype)


def _root(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _sharded(client, spec=("x",), devices=8):
    mesh = ifrt.Mesh(np.array(client.devices()[:devices]), ("x",))
    return ifrt.NamedSharding(mesh, ifrt.PartitionSpec(*spec))


# -- large puts -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", MEMORY_KINDS)
@pytest.mark.parametrize("semantics", [ONLY_DURING_CALL, UNTIL_TRANSFER], ids=lambda s: s.name)
def test_large_put_aliases_only_memory_the_layer_owns(client, staged, kind, semantics):
    data = _large()
    sharding = ifrt.SingleDeviceSharding(client.devices()[1], ifrt.MemoryKind(kind))
    array = client.make_array_from_host_buffer(data, sharding, semantics)
    [[copy]] = staged
    (buffer,) = array.buffers
    assert buffer.unsafe_pointer == copy.ctypes.data  # aliased, not copied again
    assert buffer.unsafe_pointer % 64 == 0
    assert not np.shares_memory(copy, data)
    assert buffer.memory.kind == kind and buffer.device.id == 1
    np.testing.assert_array_equal(np.asarray(array), data)


@pytest.mark.parametrize("semantics", [ONLY_DURING_CALL, UNTIL_TRANSFER], ids=lambda s: s.name)
@pytest.mark.parametrize("size", [1024, LARGE], ids=["small", "large"])
def test_changing_the_host_array_after_a_put_leaves_the_array_alone(client, semantics, size):
    data = np.arange(size // 4, dtype=np.float32)
    expected = data.copy()
    array = client.make_array_from_host_buffer(data, ifrt.SingleDeviceSharding(client.devices()[0]),
                                               semantics)
    array.block_until_ready()
    data[:] = -1
    del data
    gc.collect()
    np.testing.assert_array_equal(np.asarray(array), expected)


def test_large_put_keeps_its_copy_exactly_as_long_as_the_buffer(client, staged):
    # The buffer holds its staging block while it lives; then the block goes back to the
    # staging pool (for the next large put), which release_staging_memory empties.
    pjrt_put.release_staging_memory()
    array = client.make_array_from_host_buffer(_large(), ifrt.SingleDeviceSharding(client.devices()[0]))
    root = weakref.ref(_root(staged[0][0]))
    staged.clear()
    gc.collect()
    assert root() is not None
    assert not pjrt_put._STAGING._free
    np.asarray(array)
    array.delete()
    del array
    gc.collect()
    # The block comes back when the plugin fires the buffer's done event, on its own thread.
    deadline = time.monotonic() + 30
    while not pjrt_put._STAGING._free and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [b.ctypes.data for b in pjrt_put._STAGING._free] == [root().ctypes.data]
    pjrt_put.release_staging_memory()
    gc.collect()
    assert root() is None


def test_a_released_staging_block_serves_the_next_large_put(client):
    pjrt_put.release_staging_memory()
    device = ifrt.SingleDeviceSharding(client.devices()[0])
    first = client.make_array_from_host_buffer(_large(), device)
    address = first.buffers[0].unsafe_pointer
    first.delete()
    del first
    gc.collect()
    deadline = time.monotonic() + 30  # the block comes back on the plugin's thread
    while not pjrt_put._STAGING._free and time.monotonic() < deadline:
        time.sleep(0.01)
    data = _large() + 1
    second = client.make_array_from_host_buffer(data, device)
    assert abs(second.buffers[0].unsafe_pointer - address) < 64  # the same block, realigned
    data[:] = 0  # the put copied: the caller's array is its own
    np.testing.assert_array_equal(np.asarray(second), _large() + 1)
    pjrt_put.release_staging_memory()


def test_sharded_large_put_gives_each_shard_its_own_aligned_copy(client, staged):
    data = _large(rows=16, nbytes=8 * LARGE)  # 2 rows per shard
    sharding = _sharded(client)
    array = client.make_array_from_host_buffer(data, sharding)
    [copies] = staged
    assert len(copies) == 8 and len({id(_root(c)) for c in copies}) == 1  # one allocation
    pointers = [b.unsafe_pointer for b in array.buffers]
    assert pointers == [c.ctypes.data for c in copies]
    assert all(p % 64 == 0 for p in pointers)
    for i, (copy, shard) in enumerate(zip(copies, array.disassemble_into_single_device_arrays())):
        np.testing.assert_array_equal(copy, data[2 * i:2 * i + 2])
        np.testing.assert_array_equal(np.asarray(shard), data[2 * i:2 * i + 2])
        assert not np.shares_memory(copy, data)
    for a, b in zip(copies, copies[1:]):
        assert not np.shares_memory(a, b)
    np.testing.assert_array_equal(np.asarray(array), data)


def test_replicated_large_put_copies_once_per_device(client, staged):
    data = _large()
    array = client.make_array_from_host_buffer(data, _sharded(client, (), devices=3))
    [copies] = staged
    assert len(copies) == 3
    assert len({b.unsafe_pointer for b in array.buffers}) == 3  # never shared between buffers
    for shard in array.disassemble_into_single_device_arrays():
        np.testing.assert_array_equal(np.asarray(shard), data)


def test_shards_under_the_threshold_are_left_to_the_plugin(client, staged):
    data = _large(rows=16, nbytes=8 * LARGE - 1024)[:, :-3]  # shards just under LARGE
    for semantics in (ONLY_DURING_CALL, UNTIL_TRANSFER):
        array = client.make_array_from_host_buffer(data, _sharded(client), semantics)
        np.testing.assert_array_equal(np.asarray(array), data)
    assert staged == [[None] * 8] * 2


def test_on_done_of_a_staged_put_runs_before_the_call_returns(client, staged):
    done = []
    data = _large()
    array = client.make_array_from_host_buffer(data, _sharded(client, (), 2), UNTIL_TRANSFER,
                                               lambda: done.append(True))
    assert done == [True] and staged
    np.testing.assert_array_equal(np.asarray(array), data)


@pytest.mark.parametrize("dtype", [np.bool_, ml_dtypes.bfloat16, np.complex64, np.int8])
def test_large_put_of_any_whole_byte_dtype_round_trips(client, staged, dtype):
    data = _large(dtype)
    array = client.make_array_from_host_buffer(data, ifrt.SingleDeviceSharding(client.devices()[0]))
    assert staged and array.buffers[0].unsafe_pointer == staged[0][0].ctypes.data
    out = np.asarray(array)
    assert out.dtype == data.dtype
    assert out.tobytes() == data.tobytes()


def test_large_sub_byte_put_is_not_staged(client, staged):
    data = (np.arange(2 * LARGE) % 8).astype(ml_dtypes.int4)
    array = client.make_array_from_host_buffer(data, ifrt.SingleDeviceSharding(client.devices()[0]))
    assert not staged
    np.testing.assert_array_equal(np.asarray(array), data)


def test_large_strided_and_reversed_puts_copy_the_values(client):
    base = _large(rows=16, nbytes=3 * LARGE)
    for data in (base[::2, ::-1], base.T, base[:, 1:]):
        array = client.make_array_from_host_buffer(data, ifrt.SingleDeviceSharding(client.devices()[0]))
        np.testing.assert_array_equal(np.asarray(array), data)


def test_zero_copy_semantics_still_alias_the_callers_array(client, staged):
    data = aligned_empty((LARGE // 4,), np.float32)
    data[:] = 7
    array = client.make_array_from_host_buffer(
        data, ifrt.SingleDeviceSharding(client.devices()[0]), HostBufferSemantics.IMMUTABLE_ZERO_COPY)
    assert not staged
    assert array.buffers[0].unsafe_pointer == data.ctypes.data


def test_a_run_that_donates_a_staged_buffer_leaves_the_host_array_alone(client):
    data = np.arange(LARGE // 4, dtype=np.float32)
    expected = data.copy()
    text = lower(lambda x: x + 1, np.zeros(data.shape, np.float32), donate_argnums=0)
    exe = _pjrt.compile(client._handle, text, compile_options())
    array = client.make_array_from_host_buffer(data, ifrt.SingleDeviceSharding(client.devices()[0]))
    (buffer,) = array.buffers
    outputs, events = exe.execute([[buffer]])
    events[0].await_()
    assert buffer.is_deleted()
    np.testing.assert_array_equal(outputs[0][0].to_numpy(), expected + 1)
    np.testing.assert_array_equal(data, expected)
    del outputs, array, buffer
    gc.collect()


def test_put_through_another_clients_sharding_is_refused(client):
    other = ifrt.get_client("pjrt", device_count=2)
    data = np.zeros(4, np.float32)
    foreign = ifrt.SingleDeviceSharding(other.devices()[0])
    other.make_array_from_host_buffer(data, foreign)  # cached by the other client
    with pytest.raises(InvalidArgumentError):
        client.make_array_from_host_buffer(data, foreign)


def test_equal_single_device_shardings_share_the_fast_path(client):
    data = np.arange(4, dtype=np.float32)
    for kind in (None, *MEMORY_KINDS):
        for _ in range(2):  # new, equal sharding objects
            sharding = ifrt.SingleDeviceSharding(client.devices()[2], ifrt.MemoryKind(kind))
            array = client.make_array_from_host_buffer(data, sharding)
            assert array.sharding is sharding
            assert array.buffers[0].memory.kind == (kind or "device")
            np.testing.assert_array_equal(np.asarray(array), data)


# -- large gets -------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [("x",), (None, "x"), ()], ids=["rows", "columns", "replicated"])
def test_large_gets_of_sharded_arrays(client, spec):
    data = _large(rows=16, nbytes=8 * LARGE)[:, :LARGE // 8]
    array = client.make_array_from_host_buffer(data, _sharded(client, spec))
    out = array.copy_to_host_buffer().result(timeout=60)
    np.testing.assert_array_equal(out, data)
    given = np.full_like(data, -1)
    assert array.copy_to_host_buffer(given).result(timeout=60) is given
    np.testing.assert_array_equal(given, data)
    strided = array.copy_to_host_buffer(byte_strides=(data.itemsize, data.itemsize * 16)).result(timeout=60)
    np.testing.assert_array_equal(strided, data)


def test_get_of_an_array_still_being_computed_does_not_wait(client):
    data = np.arange(LARGE // 4, dtype=np.float32)
    text = lower(lambda x: x * 2, np.zeros(data.shape, np.float32))
    exe = _pjrt.compile(client._handle, text, compile_options())
    array = client.make_array_from_host_buffer(data, ifrt.SingleDeviceSharding(client.devices()[0]))
    outputs, events = exe.execute([[array.buffers[0]]])
    result = ifrt.backends.pjrt.array.PjrtArray(client, array.dtype, array.shape, array.sharding,
                                                (outputs[0][0],))
    np.testing.assert_array_equal(result.copy_to_host_buffer().result(timeout=60), data * 2)


@pytest.mark.parametrize("kind", MEMORY_KINDS)
def test_a_ready_array_is_copied_from_its_view_at_once(client, kind):
    """A single-device array whose data is ready is copied by NumPy from its host view:
    the future is done when returned (a plugin copy runs on the plugin's threads), and
    the copy is the caller's (its layout as asked; the array may go right after)."""
    data = np.arange(24, dtype=np.float32).reshape(4, 6)
    array = client.make_array_from_host_buffer(data, ifrt.SingleDeviceSharding(client.devices()[1], kind))
    array.block_until_ready()
    future = array.copy_to_host_buffer()
    assert future.done()
    out = future.result()
    np.testing.assert_array_equal(out, data)
    assert out.flags.writeable and out.flags.owndata
    fortran = np.empty((4, 6), np.float32, order="F")
    assert array.copy_to_host_buffer(out=fortran).result() is fortran
    np.testing.assert_array_equal(fortran, data)
    strided = array.copy_to_host_buffer(byte_strides=(4, 16)).result()
    assert strided.strides == (4, 16)
    np.testing.assert_array_equal(strided, data)
    array.delete()
    np.testing.assert_array_equal(out, data)


SHARDED_READS = {  # mesh shape, PartitionSpec
    "rows": ((8,), ("a",)),
    "columns": ((8,), (None, "a")),
    "2-D mesh": ((4, 2), ("a", "b")),
    "rows, replicated over b": ((4, 2), ("a",)),
    "replicated": ((8,), ()),
}


@pytest.mark.parametrize("kind", ["device", "pinned_host"])
@pytest.mark.parametrize("case", SHARDED_READS)
def test_a_ready_sharded_array_is_copied_from_its_views_at_once(client, case, kind):
    """Each distinct shard of a ready sharded array in host memory is copied by NumPy
    from its view straight into its place in the destination (any strides): the future
    is done when returned, and the copy is the caller's."""
    mesh_shape, spec = SHARDED_READS[case]
    mesh = ifrt.Mesh(np.array(client.devices()).reshape(mesh_shape), ("a", "b")[:len(mesh_shape)])
    data = np.random.default_rng(0).random((16, 24), dtype=np.float32)
    array = client.make_array_from_host_buffer(
        data, ifrt.NamedSharding(mesh, ifrt.PartitionSpec(*spec), memory_kind=kind))
    array.block_until_ready()
    for out, strides in [(None, None), (np.full((16, 24), -1, np.float32, order="F"), None),
                         (None, (4, 64))]:
        future = array.copy_to_host_buffer(out, strides)
        assert future.done()
        result = future.result()
        assert out is None or result is out
        assert strides is None or result.strides == strides
        np.testing.assert_array_equal(result, data)
    result = np.asarray(array)
    assert result.flags.writeable and result.flags.owndata
    array.delete()
    np.testing.assert_array_equal(result, data)


def test_np_asarray_of_a_sharded_output_waits_and_reads_every_shard(client):
    """``np.asarray`` of a sharded output whose program may still run waits for it (the
    GIL released), then reads every shard; the output's next read completes at once."""
    exe = client.compile(ifrt.HloProgram(DEMO_PROGRAM.format(rows=64, n=8)),
                         ifrt.CompileOptions(devices=client.devices(), num_partitions=8))
    data = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    array = client.make_array_from_host_buffer(data, _sharded(client))
    for _ in range(20):
        out, = exe(array)
        np.testing.assert_array_equal(np.asarray(out), data * 2 + 1)
        assert out.copy_to_host_buffer().done()


def test_the_read_plan_is_made_once_per_sharding_and_shape(client, monkeypatch):
    calls = []
    real = pjrt_array.distinct_shards
    monkeypatch.setattr(pjrt_array, "distinct_shards", lambda *a: calls.append(1) or real(*a))
    client._read_plans.clear()
    data = np.arange(64, dtype=np.float32).reshape(16, 4)
    for sharding in (_sharded(client), _sharded(client)):  # equal shardings: one plan
        for _ in range(2):
            np.testing.assert_array_equal(np.asarray(client.make_array_from_host_buffer(data, sharding)), data)
    assert len(calls) == 1
    np.testing.assert_array_equal(
        np.asarray(client.make_array_from_host_buffer(data[:8], _sharded(client))), data[:8])
    assert len(calls) == 2


# -- the Cython helpers ----------------------------------------------------------------

def _madvise_populate_write_works():
    """Whether this kernel maps pages on MADV_POPULATE_WRITE (Linux 5.14), asked of
    madvise itself on one fresh page."""
    page = mmap.mmap(-1, mmap.PAGESIZE)
    view = np.frombuffer(page, np.uint8)
    ok = LIBC.madvise(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(mmap.PAGESIZE),
                      MADV_POPULATE_WRITE) == 0
    del view
    page.close()
    return ok


LIBC = ctypes.CDLL(None, use_errno=True)
MADV_POPULATE_WRITE = 23  # <linux/mman.h>
KERNEL_POPULATES = _madvise_populate_write_works()


def _fresh(nbytes):
    """A C-contiguous uint8 array over fresh anonymous pages, none of them mapped yet."""
    return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)


def _resident_pages(array):
    """How many of the pages under ``array`` are mapped (mincore)."""
    start = array.ctypes.data & ~(mmap.PAGESIZE - 1)
    length = array.ctypes.data + array.nbytes - start
    vec = (ctypes.c_ubyte * -(-length // mmap.PAGESIZE))()
    assert LIBC.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0
    return sum(v & 1 for v in vec)


def test_populate_while_pending_maps_the_pages_while_an_event_is_pending(client):
    pending_host = aligned_empty((16,), np.float32)
    buffer, done = _pjrt.buffer_from_host_buffer(client._handle, pending_host,
                                                 client._handle.devices[0], semantics=2)
    assert not done.is_ready()  # fires when the zero-copy buffer is destroyed
    out = _fresh(3 * MiB + 4096)
    assert _resident_pages(out) == 0
    assert populate_while_pending(out, [done], chunk=1 << 16) is KERNEL_POPULATES
    assert _resident_pages(out) == (out.nbytes // mmap.PAGESIZE if KERNEL_POPULATES else 0)
    assert not out.any()  # mapped, not written
    idle = _fresh(MiB)
    assert populate_while_pending(idle, []) is KERNEL_POPULATES  # nothing pending
    assert _resident_pages(idle) == 0
    del buffer
    gc.collect()


def test_populate_while_pending_writes_nothing(client):
    pending_host = aligned_empty((16,), np.float32)
    buffer, done = _pjrt.buffer_from_host_buffer(client._handle, pending_host,
                                                 client._handle.devices[0], semantics=2)
    assert not done.is_ready()  # fires when the zero-copy buffer is destroyed
    x = np.random.default_rng(1).random(3 * MiB + 5)
    expected = x.copy()
    assert populate_while_pending(x, [done], chunk=1 << 16) is KERNEL_POPULATES
    np.testing.assert_array_equal(x, expected)
    assert populate_while_pending(x, []) is KERNEL_POPULATES  # nothing pending: at once
    with pytest.raises(InvalidArgumentError):
        populate_while_pending(x[::2], [])
    with pytest.raises(InvalidArgumentError):
        populate_while_pending(x, [], chunk=0)
    with pytest.raises(AttributeError):  # not an event: it has no is_ready()
        populate_while_pending(x, [object()])
    del buffer
    gc.collect()
    done.await_()


def test_populate_behind_writes_nothing_and_joins():
    x = np.random.default_rng(2).random(5 * MiB)
    expected = x.copy()
    with PopulateBehind(x) as p:
        assert p is not None
    np.testing.assert_array_equal(x, expected)
    y = np.empty(5 * MiB)
    with PopulateBehind(y):
        y[:] = expected
    np.testing.assert_array_equal(y, expected)
    with pytest.raises(InvalidArgumentError):
        PopulateBehind(x[::2])
    PopulateBehind(np.empty(0))  # never entered: nothing to join


def test_the_put_fast_path_makes_whole_arrays(client):
    # The fast path fills a bare PjrtArray: one starts with no error and not deleted.
    bare = pjrt_array.PjrtArray.__new__(pjrt_array.PjrtArray)
    assert bare._error is None and bare._deleted is False
    data = np.arange(6, dtype=np.int32).reshape(2, 3)
    sharding = ifrt.SingleDeviceSharding(client.devices()[0])
    for _ in range(2):  # the second put takes the fast path
        array = client.make_array_from_host_buffer(data, sharding)
        assert array.client is client and array.sharding is sharding
        assert array.dtype == ifrt.DType.from_numpy(data.dtype) and array.shape == ifrt.Shape([2, 3])
        assert not array.is_deleted() and array.ready_future().result(timeout=120) is None
        np.testing.assert_array_equal(np.asarray(array), data)
    with pytest.raises(InvalidArgumentError):
        client.make_array_from_host_buffer(data, sharding, 7)


def test_only_a_large_get_by_one_copy_maps_its_destination_ahead(client, monkeypatch):
    calls = []
    real = pjrt_array.populate_while_pending
    monkeypatch.setattr(pjrt_array, "populate_while_pending",
                        lambda out, events: calls.append((out.nbytes, len(events))) or real(out, events))
    data = np.arange(pjrt_array._FRESH_BYTES // 4, dtype=np.float32).reshape(8, -1)
    single = client.make_array_from_host_buffer(data, ifrt.SingleDeviceSharding(client.devices()[0]))
    np.testing.assert_array_equal(single.copy_to_host_buffer().result(timeout=60), data)  # a new array
    assert calls == [(data.nbytes, 1)]
    np.testing.assert_array_equal(np.asarray(client.make_array_from_host_buffer(data, _sharded(client))), data)
    small = data[:, :-16]
    np.testing.assert_array_equal(np.asarray(client.make_array_from_host_buffer(
        small, ifrt.SingleDeviceSharding(client.devices()[0]))), small)
    out = np.empty_like(data)
    single.copy_to_host_buffer(out).result(timeout=60)  # the caller's array: left alone
    assert calls == [(data.nbytes, 1)]


def test_small_puts_through_equal_shardings_use_each_their_own_memory(client):
    # The fast path caches memories by sharding identity: equal sharding objects, and
    # shardings of other devices and memory kinds, each find their own memory.
    x = np.arange(16, dtype=np.float32)
    devices = client.devices()
    for device, kind in [(devices[0], None), (devices[0], None), (devices[1], "pinned_host"),
                         (devices[1], "unpinned_host")]:
        for _ in range(2):  # the second put takes the cached path
            sharding = ifrt.SingleDeviceSharding(device, kind)
            array = client.make_array_from_host_buffer(x, sharding)
            buffer = array.buffers[0]
            assert buffer.device.id == device.id
            assert buffer.memory.kind == (kind or "device")
            np.testing.assert_array_equal(np.asarray(array), x)
