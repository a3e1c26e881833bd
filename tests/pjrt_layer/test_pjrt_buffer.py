"""ifrtpy._pjrt buffers and events on the CPU plugin, checked against NumPy."""

import gc
import threading
import time
import weakref

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from ifrtpy import _pjrt, errors
from ifrtpy.dtypes import PJRT_BUFFER_TYPE_OF_NUMPY
from ifrtpy.plugins.builds import default_cpu_library
from pjrt_helpers import (
    BITS_OF_DTYPE, MEMORY_KINDS, PJRT_TYPE_NAME_OF_DTYPE, aligned_empty, assert_survives,
    client8, pjrt_buffer_types, plugin, put, random_array,
)  # noqa: F401

ALL_DTYPES = sorted(PJRT_BUFFER_TYPE_OF_NUMPY, key=str)
WAIT_S = 30  # upper bound for callbacks to arrive; never reached when things work


def test_every_host_dtype_is_covered_by_the_oracles():
    assert set(ALL_DTYPES) == set(PJRT_TYPE_NAME_OF_DTYPE)


# ------------------------------------------------------------------ round trips

@st.composite
def views(draw, dtype):
    """A random array of ``dtype`` and a random (often non-contiguous) view of it."""
    shape = draw(st.lists(st.integers(1, 5), min_size=0, max_size=4))
    if shape and draw(st.integers(0, 7)) == 0:
        shape[draw(st.integers(0, len(shape) - 1))] = 0
    base = random_array(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape, dtype)
    index = []
    for n in shape:
        step = draw(st.sampled_from([1, 2, 3, -1, -2]))
        lo, hi = 0, n  # elements lo..hi-1, never empty when n > 0
        if n and draw(st.booleans()):
            lo = draw(st.integers(0, n - 1))
            hi = draw(st.integers(lo + 1, n))
        index.append(slice(lo, hi, step) if step > 0 else
                     slice(hi - 1, lo - 1 if lo > 0 else None, step))
    index = tuple(index)
    view = base[index + (Ellipsis,)]  # a 0-d view, not a scalar, for rank 0
    if view.ndim > 1 and draw(st.booleans()):
        view = view.transpose(draw(st.permutations(range(view.ndim))))
    return base, view


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@given(data=st.data())
def test_round_trip_is_byte_exact(client8, dtype, data):
    base, view = data.draw(views(dtype))
    semantics = data.draw(st.integers(0, 3))
    device = client8.devices[data.draw(st.integers(0, 7))]
    expected = np.ascontiguousarray(view)
    buffer, _ = put(client8, view, device, semantics=semantics)
    assert buffer.dims == view.shape
    assert buffer.dtype == dtype
    result = buffer.to_numpy()
    assert result.dtype == dtype and result.shape == view.shape
    assert result.tobytes() == expected.tobytes()


def test_scalar_empty_and_fortran_round_trip(client8):
    fortran = np.asfortranarray(np.arange(24, dtype=np.uint16).reshape(2, 3, 4))
    for array in (np.array(3.5, np.float32), np.zeros((0,), np.int8),
                  np.zeros((2, 0, 3), np.complex64), np.zeros((0, 4), np.float64)[:, ::-2],
                  fortran, fortran[:, ::-1], np.asfortranarray(np.eye(3, dtype=bool))):
        buffer, _ = put(client8, array)
        result = buffer.to_numpy()
        assert result.shape == array.shape and result.dtype == array.dtype
        assert result.tobytes() == np.ascontiguousarray(array).tobytes()


def test_broadcast_view_with_zero_strides_round_trips(client8):
    view = np.broadcast_to(np.arange(3, dtype=np.int32), (4, 3))
    np.testing.assert_array_equal(put(client8, view)[0].to_numpy(), view)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_element_type_matches_the_c_header(client8, dtype):
    enum = pjrt_buffer_types()
    buffer, _ = put(client8, random_array(np.random.default_rng(0), (3,), dtype))
    assert buffer.element_type == enum[PJRT_TYPE_NAME_OF_DTYPE[dtype]]
    assert buffer.dtype == dtype


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_on_device_size_is_packed(client8, dtype):
    buffer, _ = put(client8, random_array(np.random.default_rng(0), (2, 4), dtype))
    assert buffer.on_device_size_in_bytes == 8 * BITS_OF_DTYPE[dtype] // 8


def test_on_device_size_examples(client8):
    assert put(client8, np.zeros((3, 4), np.float32))[0].on_device_size_in_bytes == 48
    assert put(client8, np.zeros(8, ml_dtypes.int4))[0].on_device_size_in_bytes == 4
    assert put(client8, np.zeros(8, ml_dtypes.uint2))[0].on_device_size_in_bytes == 2
    assert put(client8, np.zeros(0, np.float64))[0].on_device_size_in_bytes == 0


# ------------------------------------------------------------------ host buffer semantics

@pytest.mark.parametrize("semantics", [0, 1, 2, 3])
def test_each_semantics_returns_buffer_and_event(client8, semantics):
    x = np.arange(16, dtype=np.float32)
    buffer, event = put(client8, x, semantics=semantics)
    if semantics == 0:
        assert event is None
    else:
        assert isinstance(event, _pjrt.EventHandle)
    np.testing.assert_array_equal(buffer.to_numpy(), x)


@pytest.mark.parametrize("semantics", [-1, 4])
def test_bad_semantics_raises_invalid_argument(client8, semantics):
    with pytest.raises(errors.InvalidArgumentError):
        put(client8, np.zeros(2, np.float32), semantics=semantics)


@pytest.mark.parametrize("semantics", [2, 3])
def test_zero_copy_on_aligned_array_aliases(client8, semantics):
    x = aligned_empty((16,), np.float32)
    x[:] = np.arange(16)
    buffer, done = put(client8, x, semantics=semantics)
    assert buffer.unsafe_pointer == x.ctypes.data
    x[3] = 1000.0
    assert buffer.to_numpy()[3] == 1000.0
    assert not done.is_ready()
    del buffer
    done.await_()


@pytest.mark.parametrize("offset", [4, 16, 32])
@pytest.mark.parametrize("semantics", [2, 3])
def test_zero_copy_on_unaligned_array_copies(client8, semantics, offset):
    x = aligned_empty((16,), np.float32, offset=offset)
    x[:] = np.arange(16)
    buffer, done = put(client8, x, semantics=semantics)
    assert buffer.unsafe_pointer != x.ctypes.data
    x[3] = 1000.0
    np.testing.assert_array_equal(buffer.to_numpy(), np.arange(16, dtype=np.float32))
    done.await_()  # a copy: the host buffer is released at once
    assert done.is_ready()


@pytest.mark.parametrize("semantics", [0, 1])
def test_copying_semantics_do_not_alias(client8, semantics):
    x = aligned_empty((16,), np.float32)
    x[:] = 1.0
    buffer, _ = put(client8, x, semantics=semantics)
    assert buffer.unsafe_pointer != x.ctypes.data
    x[:] = 2.0
    np.testing.assert_array_equal(buffer.to_numpy(), np.ones(16, np.float32))


def test_awaiting_zero_copy_done_event_while_buffer_lives_raises(client8):
    x = aligned_empty((16,), np.float32)
    buffer, done = put(client8, x, semantics=2)
    with pytest.raises(errors.FailedPreconditionError):
        done.await_()
    assert not done.is_ready()
    del buffer
    done.await_()
    assert done.is_ready()
    assert done.error() is None


def test_zero_copy_done_event_fires_on_delete(client8):
    x = aligned_empty((16,), np.float32)
    buffer, done = put(client8, x, semantics=3)
    buffer.delete()
    done.await_()
    assert done.is_ready()


def test_error_of_pending_event_raises_and_the_process_lives():
    # PJRT_Event_Error CHECK-fails (abort) on an event that is not ready; the zero-copy
    # done event stays pending while its buffer lives.
    assert_survives("""
        client = _pjrt.create_client(_pjrt.load_plugin(default_cpu_library()), {"cpu_device_count": 1})
        raw = np.zeros(128, np.uint8)
        start = (-raw.ctypes.data) % 64
        x = raw[start:start + 64].view(np.float32)
        buffer, done = _pjrt.buffer_from_host_buffer(client, x, client.devices[0], semantics=2)
        assert not done.is_ready()
        try:
            done.error()
        except errors.IfrtError as e:
            print("refused", type(e).__name__)
        print("alive")
    """, "refused FailedPreconditionError")


@pytest.mark.parametrize("semantics", [1, 2, 3])
@pytest.mark.parametrize("aligned", [True, False])
def test_layer_keeps_the_host_array_alive(client8, semantics, aligned):
    x = aligned_empty((256,), np.float64, offset=0 if aligned else 8)
    x[:] = np.arange(256)
    ref = weakref.ref(x)
    buffer, done = put(client8, x, semantics=semantics)
    del x
    gc.collect()
    # Reuse freed memory, if any, with other data.
    junk = [np.full(256, -1.0) for _ in range(64)]
    np.testing.assert_array_equal(buffer.to_numpy(), np.arange(256, dtype=np.float64))
    del junk
    if semantics >= 2 and aligned:
        assert ref() is not None  # still aliased by the buffer
    del buffer
    done.await_()
    # The layer drops its reference when the done event's callback has run, which may
    # be on a plugin thread: wait for that (bounded).
    deadline = time.monotonic() + WAIT_S
    while ref() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.005)
    assert ref() is None


def test_negative_stride_zero_copy_reads_correctly(client8):
    x = np.arange(64, dtype=np.float32)
    buffer, done = put(client8, x[::-1], semantics=2)
    np.testing.assert_array_equal(buffer.to_numpy(), x[::-1])
    x[:] = 0  # the layer copied the reversed view first: no aliasing of x
    np.testing.assert_array_equal(buffer.to_numpy(), np.arange(64, dtype=np.float32)[::-1])
    del buffer
    done.await_()


# ------------------------------------------------------------------ placement

def test_put_on_a_chosen_device(client8):
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    for device in client8.devices:
        buffer, _ = put(client8, x, device)
        assert buffer.device is device
        assert buffer.memory is device.default_memory
        assert repr(buffer) == f"<BufferHandle int32[2, 3] on device {device.id}>"
        np.testing.assert_array_equal(buffer.to_numpy(), x)


@pytest.mark.parametrize("kind", MEMORY_KINDS)
def test_put_into_each_memory_kind(client8, kind):
    device = client8.devices[2]
    memory = next(m for m in device.memories if m.kind == kind)
    x = np.arange(10, dtype=np.float64)
    buffer, _ = put(client8, x, memory=memory)
    assert buffer.memory is memory
    assert buffer.device is device
    np.testing.assert_array_equal(buffer.to_numpy(), x)


def test_device_and_memory_are_exclusive(client8):
    x = np.zeros(2, np.float32)
    device = client8.devices[0]
    with pytest.raises(errors.InvalidArgumentError):
        _pjrt.buffer_from_host_buffer(client8, x, device, device.default_memory)
    with pytest.raises(errors.InvalidArgumentError):
        _pjrt.buffer_from_host_buffer(client8, x)


def test_copy_to_device(client8):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    source, _ = put(client8, x, client8.devices[0])
    for device in client8.devices[1:]:
        copy = source.copy_to_device(device)
        assert copy.device is device
        assert copy.unsafe_pointer != source.unsafe_pointer
        np.testing.assert_array_equal(copy.to_numpy(), x)
    assert not source.is_deleted()
    np.testing.assert_array_equal(source.to_numpy(), x)


@pytest.mark.parametrize("kind", MEMORY_KINDS)
def test_copy_to_memory(client8, kind):
    x = np.arange(5, dtype=np.int64)
    source, _ = put(client8, x, client8.devices[1])
    target = next(m for m in client8.devices[4].memories if m.kind == kind)
    copy = source.copy_to_memory(target)
    assert copy.memory is target
    assert copy.device is client8.devices[4]
    np.testing.assert_array_equal(copy.to_numpy(), x)


def test_device_of_another_client_raises_invalid_argument(client8, plugin):
    other = _pjrt.create_client(plugin, {"cpu_device_count": 2})
    x = np.zeros(2, np.float32)
    with pytest.raises(errors.InvalidArgumentError):
        _pjrt.buffer_from_host_buffer(client8, x, other.devices[0])
    with pytest.raises(errors.InvalidArgumentError):
        _pjrt.buffer_from_host_buffer(client8, x, memory=other.devices[0].memories[1])
    buffer, _ = put(client8, x)
    with pytest.raises(errors.InvalidArgumentError):
        buffer.copy_to_device(other.devices[0])
    with pytest.raises(errors.InvalidArgumentError):
        buffer.copy_to_memory(other.devices[0].default_memory)


@pytest.mark.parametrize("array", [
    np.array([object(), 1]), np.array(["a", "b"]), np.array([b"a"]),
    np.zeros(2, ">f4"), np.zeros(2, ">i8"), np.zeros(2, "datetime64[s]"),
    np.zeros(2, [("a", np.int32)]),
], ids=lambda a: str(a.dtype))
def test_unsupported_dtypes_raise_invalid_argument(client8, array):
    with pytest.raises(errors.InvalidArgumentError):
        put(client8, array)


# ------------------------------------------------------------------ deletion

def test_delete_marks_buffer_deleted(client8):
    buffer, _ = put(client8, np.arange(4, dtype=np.float32))
    assert buffer.is_deleted() is False
    buffer.delete()
    assert buffer.is_deleted() is True
    assert repr(buffer) == "<BufferHandle deleted>"
    buffer.delete()  # idempotent
    assert buffer.dims == (4,)
    for use in (buffer.to_numpy, lambda: buffer.ready_event().await_(),
                lambda: buffer.unsafe_pointer,
                lambda: buffer.copy_to_device(client8.devices[1]),
                lambda: buffer.copy_to_memory(client8.devices[0].memories[1])):
        with pytest.raises(errors.InvalidArgumentError):
            use()
    event = buffer.ready_event()  # an event carrying the error
    assert event.is_ready()
    assert isinstance(event.error(), errors.InvalidArgumentError)


# ------------------------------------------------------------------ events

def test_ready_event(client8):
    buffer, _ = put(client8, np.arange(4, dtype=np.float32))
    event = buffer.ready_event()
    assert event.await_() is None
    assert event.is_ready() is True
    assert event.error() is None


def test_event_handle_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        _pjrt.EventHandle()


def test_on_ready_of_fired_event_runs_once_with_none(client8):
    event = put(client8, np.zeros(2))[0].ready_event()
    event.await_()
    calls = []
    event.on_ready(calls.append)
    event.on_ready(calls.append)
    assert calls == [None, None]  # once per registration, at once on this thread


def test_on_ready_registered_from_another_thread(client8):
    event = put(client8, np.zeros(2))[0].ready_event()
    calls, gate = [], threading.Event()

    def callback(exc):
        calls.append(exc)
        gate.set()

    worker = threading.Thread(target=event.on_ready, args=(callback,))
    worker.start()
    worker.join()
    assert gate.wait(WAIT_S)
    assert calls == [None]


def test_on_ready_registered_before_the_event_fires(client8):
    x = aligned_empty((16,), np.float32)
    buffer, done = put(client8, x, semantics=2)
    calls, gate = [], threading.Event()

    def callback(exc):
        calls.append(exc)
        gate.set()

    done.on_ready(callback)
    assert calls == [] and not done.is_ready()
    del buffer  # destroying the aliasing buffer fires the event
    assert gate.wait(WAIT_S)
    done.await_()
    gc.collect()
    assert calls == [None]


def test_on_ready_callbacks_from_many_threads_each_run_once(client8):
    x = aligned_empty((16,), np.float32)
    buffer, done = put(client8, x, semantics=2)
    counts = [0] * 8
    lock, gate = threading.Lock(), threading.Event()

    def register(i):
        def callback(exc):
            with lock:
                counts[i] += 1
                if sum(counts) == len(counts):
                    gate.set()
        done.on_ready(callback)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == [0] * 8
    del buffer
    assert gate.wait(WAIT_S)
    done.await_()
    assert counts == [1] * 8


def test_on_ready_callback_exception_goes_to_unraisablehook(client8, monkeypatch):
    seen = []
    monkeypatch.setattr("sys.unraisablehook", seen.append)
    event = put(client8, np.zeros(2))[0].ready_event()
    event.await_()
    event.on_ready(lambda exc: 1 / 0)
    assert len(seen) == 1
    assert seen[0].exc_type is ZeroDivisionError
    assert isinstance(seen[0].exc_value, ZeroDivisionError)
    event.on_ready(seen.append)  # later callbacks still run
    assert seen[-1] is None


# ------------------------------------------------------------------ to_host_buffer

def test_to_host_buffer_into_callers_array(client8):
    x = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    buffer, _ = put(client8, x)
    out = np.zeros_like(x)
    result, event = buffer.to_host_buffer(out)
    assert result is out
    event.await_()
    np.testing.assert_array_equal(out, x)


def test_to_host_buffer_default_allocates(client8):
    x = np.arange(6, dtype=ml_dtypes.bfloat16)
    out, event = put(client8, x)[0].to_host_buffer()
    event.await_()
    assert out.dtype == x.dtype and out.tobytes() == x.tobytes()


@pytest.mark.parametrize("make_out", [
    lambda: np.zeros((2, 3), np.float64),             # wrong dtype
    lambda: np.zeros((3, 2), np.float32),             # wrong shape
    lambda: np.zeros(6, np.float32),                  # wrong rank
    lambda: np.zeros((2, 6), np.float32)[:, ::2],     # not contiguous
    lambda: np.zeros((3, 2), np.float32).T,           # Fortran order
    lambda: np.zeros((2, 3), ">f4"),                  # byte order
    lambda: [[0.0] * 3] * 2,                          # not an array
], ids=["dtype", "shape", "rank", "strided", "fortran", "big_endian", "list"])
def test_to_host_buffer_rejects_bad_destinations(client8, make_out):
    buffer, _ = put(client8, np.zeros((2, 3), np.float32))
    with pytest.raises(errors.InvalidArgumentError):
        buffer.to_host_buffer(make_out())


def test_to_host_buffer_rejects_read_only_destination(client8):
    buffer, _ = put(client8, np.zeros((2, 3), np.float32))
    out = np.zeros((2, 3), np.float32)
    out.flags.writeable = False
    with pytest.raises(errors.InvalidArgumentError):
        buffer.to_host_buffer(out)
    assert not out.any()
