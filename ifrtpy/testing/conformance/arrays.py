"""IFRT's array conformance cases (``array_impl_test_lib.cc``), written against the ifrtpy
interfaces only (the tuple cases are :mod:`~ifrtpy.testing.conformance.tuples`).

Run them with :func:`~ifrtpy.testing.conformance.case_classes` from a backend's test
module that provides a ``client`` fixture (see :mod:`ifrtpy.testing.conformance`).

The common data is IFRT's: f32[2,3] holding 0..5 on addressable device 0 in the
default memory kind. User contexts are checked where IFRT's cases check them
(creation, error arrays, assemble, disassemble, copy). String arrays hold ``str`` objects
(IFRT's ``absl::Cord``). The custom-layout cases use a column-major ``ifrtpy.Layout``.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.array import ArrayCopySemantics, ArraySpec, HostBufferSemantics
from ifrtpy.client import HostBufferShards
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from ifrtpy.shape import Shape
from ifrtpy.sharding import (
    ConcreteEvenSharding, ConcreteSharding, OpaqueSharding, ShardingParam, ShardingParamSharding,
    SingleDeviceSharding, SingleDeviceShardSemantics,
)
from ifrtpy.testing.conformance._helpers import addressable_devices as _devices
from ifrtpy.user_context import UserContext, UserContextScope

ALWAYS_COPY = ArrayCopySemantics.ALWAYS_COPY
REUSE_INPUT = ArrayCopySemantics.REUSE_INPUT
DONATE_INPUT = ArrayCopySemantics.DONATE_INPUT
ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
ONLY_DURING_CALL = HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
UNTIL_TRANSFER_COMPLETES = HostBufferSemantics.IMMUTABLE_UNTIL_TRANSFER_COMPLETES
ZERO_COPY = HostBufferSemantics.IMMUTABLE_ZERO_COPY

F32 = ifrt.DType.from_numpy(np.float32)
STRING = ifrt.DType(ifrt.DType.Kind.STRING)
SHAPE = Shape([2, 3])
#: How long to wait for something asynchronous (an on_done callback) before failing.
TIMEOUT_S = 10.0


# -- helpers ------------------------------------------------------------------------------

def _non_addressable(client, count: int = 1) -> list:
    devices = [d for d in client.devices() if not d.is_addressable]
    if len(devices) < count:
        pytest.skip(f"needs {count} non-addressable device(s), the client has {len(devices)}")
    return devices[:count]


def _memory_kinds(device) -> list:
    return [m.kind for m in device.memories()]


def _iota(shape=(2, 3), dtype=np.float32) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.int64).astype(dtype).reshape(shape)


def _aligned(values: np.ndarray, alignment: int = 64) -> np.ndarray:
    """A copy of ``values`` whose data starts on an ``alignment``-byte boundary (what a
    runtime needs to alias host memory instead of copying it)."""
    raw = np.empty(values.nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    out = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    return out


def _make(client, data=None, sharding=None, semantics=ONLY_DURING_CALL, on_done=None):
    if data is None:
        data = _iota()
    if sharding is None:
        sharding = SingleDeviceSharding(client.addressable_devices()[0])
    return client.make_array_from_host_buffer(data, sharding, semantics, on_done)


def _host(array, **kwargs) -> np.ndarray:
    return array.copy_to_host_buffer(**kwargs).result(timeout=TIMEOUT_S)


def _replicated(devices, shape=SHAPE, memory_kind=None) -> ConcreteEvenSharding:
    return ConcreteEvenSharding(devices, shape, shape, True, memory_kind)


def _assert_per_shard_data(array, dtype, shard_shape, per_shard, devices):
    """IFRT's ``AssertPerShardData``: the i-th addressable shard is on ``devices[i]``, of
    ``dtype`` and ``shard_shape``, and holds ``per_shard[i]``."""
    shards = array.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE)
    assert len(shards) == len(devices) == len(per_shard)
    for i, (shard, device, expected) in enumerate(zip(shards, devices, per_shard)):
        assert list(shard.sharding.devices) == [device], f"shard {i}"
        assert shard.dtype == dtype, f"shard {i}"
        assert shard.shape == Shape(shard_shape), f"shard {i}"
        np.testing.assert_array_equal(_host(shard), expected, err_msg=f"shard {i}")


def _error_of(future, timeout=TIMEOUT_S):
    """The exception a future fails with (waits); AssertionError if it succeeds."""
    exc = future.exception(timeout=timeout)
    assert exc is not None, "expected the future to fail"
    return exc


def _wait_for(event: threading.Event, timeout=TIMEOUT_S) -> bool:
    """Wait for ``event`` while collecting garbage, so that dropped arrays get freed."""
    deadline = time.monotonic() + timeout
    while not event.is_set() and time.monotonic() < deadline:
        gc.collect()
        event.wait(0.01)
    return event.is_set()


# -- host buffer creation -----------------------------------------------------------------

def _fingerprint(value):
    return None if value.user_context is None else value.user_context.fingerprint()


def test_make_array_from_host_buffer(client):
    sharding = SingleDeviceSharding(client.addressable_devices()[0])
    with UserContextScope(UserContext(100)):
        array = _make(client, sharding=sharding)
        again = _make(client, sharding=sharding)  # the backend's repeat of a put
    assert array.dtype == F32
    assert array.shape == SHAPE
    assert array.sharding is sharding
    assert _fingerprint(array) == _fingerprint(again) == 100
    assert _make(client, sharding=sharding).user_context is None


def test_make_array_from_host_buffer_with_custom_layout(client):
    """IFRT's case: the default layout, passed as a custom one, is the array's layout."""
    data = _iota()
    device = client.addressable_devices()[0]
    default = client.get_default_layout(F32, [2, 3], device)
    array = client.make_array_from_host_buffer(data, SingleDeviceSharding(device), ONLY_DURING_CALL,
                                               layout=default)
    assert array.layout in (None, default)
    np.testing.assert_array_equal(_host(array), data)


def test_make_array_from_host_buffer_with_a_column_major_layout(client):
    """A column-major layout (no tiles: the device tiles as it chooses) is the array's
    dimension order where the backend places it (else UnimplementedError), and
    its values, and a copy's, are the data's."""
    data = _iota()
    layout = ifrt.Layout.column_major(2)
    sharding = SingleDeviceSharding(client.addressable_devices()[0])
    array = client.make_array_from_host_buffer(data, sharding, ONLY_DURING_CALL, layout=layout)
    assert array.layout is not None and layout.accepts(array.layout), array.layout
    np.testing.assert_array_equal(_host(array), data)
    (copy,) = client.copy_arrays([array], None, None, ALWAYS_COPY)
    np.testing.assert_array_equal(_host(copy), data)


def test_make_array_from_host_buffer_with_addressable_and_non_addressable_device(client):
    non_addressable = _non_addressable(client)[0]
    addressable = client.addressable_devices()[0]
    sharding = _replicated([non_addressable, addressable])
    array = _make(client, sharding=sharding)
    assert array.sharding is sharding
    array.ready_future().result(timeout=TIMEOUT_S)


def test_a_replicated_array_with_non_addressable_devices_is_read_whole(client):
    """Beyond IFRT (whose PjRt CopyToHostBuffer refuses any array with shards elsewhere),
    as jax: this process's shards of a replicated array hold all of it, so it is read;
    one split over the other process's devices is refused."""
    non_addressable = _non_addressable(client)[0]
    addressable = client.addressable_devices()[:2]
    array = _make(client, sharding=_replicated([non_addressable, *addressable]))
    np.testing.assert_array_equal(_host(array), _iota())
    split = ConcreteEvenSharding([addressable[0], non_addressable], Shape([4, 3]), SHAPE)
    pieces = [_make(client, sharding=SingleDeviceSharding(addressable[0]))]
    halves = client.assemble_array_from_single_device_arrays(Shape([4, 3]), split, pieces)
    with pytest.raises((InvalidArgumentError, UnimplementedError)):
        _host(halves)


@pytest.mark.parametrize("semantics", [ONLY_DURING_CALL, UNTIL_TRANSFER_COMPLETES, ZERO_COPY],
                         ids=lambda s: s.name)
def test_make_array_from_host_buffer_calls_on_done_with_host_buffer(client, semantics):
    data = _aligned(_iota())  # aligned, so that a runtime may really alias it
    done = threading.Event()
    array = _make(client, data, semantics=semantics, on_done=done.set)
    array.ready_future().result(timeout=TIMEOUT_S)
    if semantics == ZERO_COPY and not done.is_set():
        del array  # the runtime may use the data until the array is freed
    assert _wait_for(done), f"on_done was not called ({semantics.name})"
    # Once on_done has run the runtime must not read the host data any more.
    data[...] = -1
    if "array" in locals():
        np.testing.assert_array_equal(_host(array), _iota())
    del data
    gc.collect()


def test_make_array_from_host_buffer_immutable_only_during_call(client):
    finished = threading.Event()

    def on_done():
        time.sleep(0.2)  # an on_done that takes time must still finish before the call returns
        finished.set()

    array = _make(client, semantics=ONLY_DURING_CALL, on_done=on_done)
    assert finished.is_set()
    array.ready_future().result(timeout=TIMEOUT_S)


def test_make_array_from_host_buffer_immutable_until_transfer_completes(client):
    data = _iota()
    array = _make(client, data, semantics=UNTIL_TRANSFER_COMPLETES)
    array.ready_future().result(timeout=TIMEOUT_S)
    data[...] = -1  # the ready future is enough: the data may now be reused or freed
    del data
    gc.collect()
    np.testing.assert_array_equal(_host(array), _iota())


def test_make_array_from_host_buffer_zero_copy(client):
    data = _aligned(_iota())
    done = threading.Event()
    array = _make(client, data, semantics=ZERO_COPY, on_done=done.set)
    array.ready_future().result(timeout=TIMEOUT_S)
    np.testing.assert_array_equal(_host(array), _iota())
    data[0, 0] = 42  # probe: does the array alias the host data? (a copy is allowed too)
    aliased = _host(array)[0, 0] == 42
    data[0, 0] = 0
    if aliased:
        assert not done.is_set(), "on_done ran while the array still aliases the host data"
    del array
    assert _wait_for(done)
    del data  # after the array is gone the data may be freed
    gc.collect()


def test_make_array_from_host_buffer_default_layout(client):
    device = client.addressable_devices()[0]
    for kind in _memory_kinds(device):
        array = _make(client, sharding=SingleDeviceSharding(device, kind))
        get_default = getattr(client, "get_default_layout", None)
        default = None if get_default is None else get_default(F32, SHAPE.dims, device, kind)
        assert array.layout is None or array.layout == default, kind


# -- host round trips and byte strides ------------------------------------------------------

def test_make_array_from_host_buffer_and_copy_to_host_buffer(client):
    data = _iota()
    array = _make(client, data)
    np.testing.assert_array_equal(_host(array), data)
    out = np.zeros((2, 3), np.float32)
    assert _host(array, out=out) is out
    np.testing.assert_array_equal(out, data)


def test_make_array_from_host_buffer_with_byte_strides_and_copy_to_host_buffer(client):
    column_major = np.array([0, 3, 1, 4, 2, 5], np.float32)
    data = np.lib.stride_tricks.as_strided(column_major, shape=(2, 3), strides=(4, 8))
    array = _make(client, data)
    np.testing.assert_array_equal(_host(array), _iota())
    # The same, through a transposed view.
    array = _make(client, np.array([[0, 3], [1, 4], [2, 5]], np.float32).T)
    np.testing.assert_array_equal(_host(array), _iota())


def test_make_array_from_host_buffer_with_non_compact_byte_strides(client):
    padded = np.array([0, -1, 1, -1, 2, -1, 3, -1], np.int8)
    data = np.lib.stride_tricks.as_strided(padded, shape=(2, 2), strides=(2, 4))
    devices = client.addressable_devices()
    array = _make(client, data, _replicated(devices, Shape([2, 2])))
    expected = np.array([[0, 2], [1, 3]], np.int8)
    np.testing.assert_array_equal(_host(array), expected)
    _assert_per_shard_data(array, ifrt.DType.from_numpy(np.int8), [2, 2],
                           [expected] * len(devices), devices)


def test_make_array_from_host_buffer_and_copy_to_host_buffer_with_byte_strides(client):
    array = _make(client)
    flat = np.zeros(6, np.float32)
    out = np.lib.stride_tricks.as_strided(flat, shape=(2, 3), strides=(4, 8))
    _host(array, out=out, byte_strides=(4, 8))
    np.testing.assert_array_equal(flat, [0, 3, 1, 4, 2, 5])
    # Letting the array allocate the strided buffer.
    result = _host(array, byte_strides=(4, 8))
    assert result.strides == (4, 8)
    np.testing.assert_array_equal(result, _iota())
    memory_order = np.lib.stride_tricks.as_strided(result, shape=(6,), strides=(4,))
    np.testing.assert_array_equal(memory_order, [0, 3, 1, 4, 2, 5])


def test_make_array_from_host_buffer_replicated(client):
    devices = client.addressable_devices()
    array = _make(client, sharding=_replicated(devices), semantics=UNTIL_TRANSFER_COMPLETES)
    shards = array.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE)
    assert len(shards) == len(devices)
    for i, (shard, device) in enumerate(zip(shards, devices)):
        assert list(shard.sharding.devices) == [device], i
        assert shard.shape == SHAPE
        np.testing.assert_array_equal(_host(shard), _iota(), err_msg=f"shard {i}")


# -- make_arrays_from_host_buffer_shards ----------------------------------------------------

def _two_way_split(devices, memory_kind=None) -> ShardingParamSharding:
    return ShardingParamSharding(ShardingParam([2, 1], [0], [2]), devices, memory_kind)


def test_make_arrays_from_host_buffer_shards_and_copy_to_host_buffer(client):
    devices = _devices(client, 2)
    sharding = _two_way_split(devices)
    top, bottom = np.array([[0, 1, 2]], np.float32), np.array([[3, 4, 5]], np.float32)
    spec = ArraySpec(F32, Shape([2, 3]), sharding)
    arrays = client.make_arrays_from_host_buffer_shards(
        [HostBufferShards([([0], top), ([1], bottom)], spec),
         HostBufferShards([([1], top), ([0], bottom)], spec)],
        ONLY_DURING_CALL)
    assert len(arrays) == 2
    for i, array in enumerate(arrays):
        assert array.sharding == sharding
        per_shard = [top if (i + j) % 2 == 0 else bottom for j in range(2)]
        _assert_per_shard_data(array, F32, [1, 3], per_shard, devices)


def _assert_invalid_now_or_later(make):
    """``make()`` raises InvalidArgumentError, or returns arrays whose ready futures fail
    with one (IFRT allows either)."""
    try:
        arrays = make()
    except InvalidArgumentError:
        return
    errors = [a.ready_future().exception(timeout=TIMEOUT_S) for a in arrays]
    assert any(isinstance(e, InvalidArgumentError) for e in errors), errors


def test_make_arrays_from_host_buffer_shards_with_different_devices(client):
    devices = _devices(client, 4)
    data = np.array([[0, 1, 2]], np.float32)
    specs = [HostBufferShards([([0, 1], data)],
                              ArraySpec(F32, Shape([2, 3]), _two_way_split(ds)))
             for ds in (devices[:2], devices[2:4])]
    _assert_invalid_now_or_later(
        lambda: client.make_arrays_from_host_buffer_shards(specs, ONLY_DURING_CALL))


def test_make_arrays_from_host_buffer_shards_with_different_memory_kinds(client):
    devices = _devices(client, 2)
    kinds = _memory_kinds(devices[0])
    if len(kinds) < 2:
        pytest.skip(f"needs 2 memory kinds, device 0 has {kinds}")
    data = np.array([[0, 1, 2]], np.float32)
    specs = [HostBufferShards([([0, 1], data)],
                              ArraySpec(F32, Shape([2, 3]), _two_way_split(devices, kind)))
             for kind in kinds[:2]]
    _assert_invalid_now_or_later(
        lambda: client.make_arrays_from_host_buffer_shards(specs, ONLY_DURING_CALL))


def test_make_arrays_from_host_buffer_shards_with_layout(client):
    devices = _devices(client, 2)
    data = _iota((2, 3))
    layout = ifrt.Layout.column_major(2)
    spec = HostBufferShards([([0], data), ([1], data + 6)],
                            ArraySpec(F32, Shape([4, 3]), _two_way_split(devices), layout))
    (array,) = client.make_arrays_from_host_buffer_shards([spec], ONLY_DURING_CALL)
    assert array.layout == layout
    assert [s.layout for s in array.disassemble_into_single_device_arrays()] == [layout] * 2
    np.testing.assert_array_equal(_host(array), _iota((4, 3)))


# -- strings, memory kinds, sub-byte types --------------------------------------------------

def _strings(shape, start=0) -> np.ndarray:
    """IFRT's string data: "string-k" for k = start, start + 1, ... (an object array)."""
    values = [f"string-{k}" for k in range(start, start + int(np.prod(shape)))]
    return np.array(values, dtype=object).reshape(shape)


def test_make_array_from_host_buffer_and_copy_to_host_buffer_with_string(client):
    data = _strings((2, 3))
    sharding = SingleDeviceSharding(client.addressable_devices()[0])
    array = _make(client, data, sharding)
    assert array.dtype == STRING and array.shape == SHAPE
    assert array.sharding is sharding
    result = _host(array)
    assert result.dtype == np.dtype(object) and result.shape == (2, 3)
    assert result.tolist() == data.tolist()


def test_make_arrays_from_host_buffer_shards_and_copy_to_host_buffer_with_string(client):
    devices = _devices(client, 2)
    sharding = _two_way_split(devices)
    top, bottom = _strings((1, 3)), _strings((1, 3), start=3)
    spec = ArraySpec(STRING, Shape([2, 3]), sharding)
    (array,) = client.make_arrays_from_host_buffer_shards(
        [HostBufferShards([([0], top), ([1], bottom)], spec)], ONLY_DURING_CALL)
    assert array.dtype == STRING and array.shape == SHAPE and array.sharding is sharding
    _assert_per_shard_data(array, STRING, [1, 3], [top, bottom], devices)
    assert _host(array).tolist() == _strings((2, 3)).tolist()


def test_host_buffer_round_trip_all_memory_kinds(client):
    device = client.addressable_devices()[0]
    for kind in _memory_kinds(device):
        sharding = SingleDeviceSharding(device, kind)
        array = _make(client, sharding=sharding)
        assert array.sharding == sharding
        assert array.sharding.memory_kind == kind
        np.testing.assert_array_equal(_host(array), _iota(), err_msg=str(kind))


def test_host_buffer_int4(client):
    devices = client.addressable_devices()
    data = np.array([[1, 2], [3, 4]], ml_dtypes.int4)
    for kind in _memory_kinds(devices[0]):
        array = _make(client, data, _replicated(devices, Shape([2, 2]), kind))
        result = _host(array)
        assert result.dtype == data.dtype, kind
        np.testing.assert_array_equal(result, data, err_msg=str(kind))


# -- error arrays ---------------------------------------------------------------------------

def test_make_error_arrays(client):
    devices = _devices(client, 2)
    error = InvalidArgumentError("injected error")
    specs = [ArraySpec(F32, SHAPE, SingleDeviceSharding(devices[0])),
             ArraySpec(np.int8, Shape([4]), _replicated(devices, Shape([4])))]
    with UserContextScope(UserContext(100)):
        arrays = client.make_error_arrays(error, specs)
    assert len(arrays) == 2
    for array, spec in zip(arrays, specs):
        assert array.dtype == spec.dtype and array.shape == spec.shape
        assert array.sharding is spec.sharding
        assert _fingerprint(array) == 100
        assert "injected error" in str(_error_of(array.ready_future()))


def test_make_error_arrays_with_addressable_and_non_addressable_device(client):
    non_addressable = _non_addressable(client)[0]
    sharding = _replicated([non_addressable, client.addressable_devices()[0]])
    arrays = client.make_error_arrays(InvalidArgumentError("injected error"),
                                      [ArraySpec(F32, SHAPE, sharding)] * 2)
    for array in arrays:
        assert "injected error" in str(_error_of(array.ready_future()))


# -- assemble and disassemble -----------------------------------------------------------------

def _single_device_arrays(client, devices, data=None):
    return [_make(client, data, SingleDeviceSharding(d)) for d in devices]


def test_assemble_array(client):
    devices = _devices(client, 2)
    arrays = _single_device_arrays(client, devices)
    sharding = OpaqueSharding(devices)
    assembled = client.assemble_array_from_single_device_arrays(
        Shape([4, 3]), sharding, arrays, ALWAYS_COPY, ADDRESSABLE)
    assert assembled.dtype == F32
    assert assembled.shape == Shape([4, 3])
    assert assembled.sharding is sharding


@pytest.mark.parametrize("kind", ["concrete_even", "sharding_param"])
def test_assemble_and_disassemble_array(client, kind):
    devices = _devices(client, 2)
    arrays = _single_device_arrays(client, devices)
    shape = Shape([4, 3])
    sharding = (ConcreteEvenSharding(devices, shape, SHAPE) if kind == "concrete_even"
                else _two_way_split(devices))
    with UserContextScope(UserContext(100)):
        assembled = client.assemble_array_from_single_device_arrays(
            shape, sharding, arrays, ALWAYS_COPY, ADDRESSABLE)
    assert assembled.sharding is sharding
    assert _fingerprint(assembled) == 100
    with UserContextScope(UserContext(101)):
        pieces = assembled.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE)
    assert len(pieces) == 2
    assert [_fingerprint(p) for p in pieces] == [101, 101]
    for piece, original in zip(pieces, arrays):
        assert piece.dtype == original.dtype
        assert piece.shape == original.shape
        assert list(piece.sharding.devices) == list(original.sharding.devices)
        np.testing.assert_array_equal(_host(piece), _iota())


def test_assemble_and_disassemble_single_device_array(client):
    device = client.addressable_devices()[0]
    sharding = SingleDeviceSharding(device)
    array = _make(client, sharding=sharding)
    assembled = client.assemble_array_from_single_device_arrays(
        SHAPE, sharding, [array], REUSE_INPUT, ADDRESSABLE)
    assert assembled.dtype == array.dtype and assembled.shape == array.shape
    assert assembled.sharding == sharding
    np.testing.assert_array_equal(_host(assembled), _iota())
    pieces = assembled.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE)
    assert len(pieces) == 1
    assert list(pieces[0].sharding.devices) == [device]
    np.testing.assert_array_equal(_host(pieces[0]), _iota())


def test_assemble_and_disassemble_non_addressable_array(client):
    devices = _non_addressable(client, 2)
    sharding = ConcreteEvenSharding(devices, Shape([4, 3]), SHAPE)
    assembled = client.assemble_array_from_single_device_arrays(
        Shape([4, 3]), sharding, [], ALWAYS_COPY, ADDRESSABLE, dtype=F32)
    assert assembled.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE) == []


# -- copy_arrays ------------------------------------------------------------------------------

def test_copy_to_same_devices(client):
    devices = client.addressable_devices()
    array = _make(client, sharding=_replicated(devices))
    (copy,) = client.copy_arrays([array], devices, None, ALWAYS_COPY)
    assert copy.sharding == array.sharding
    np.testing.assert_array_equal(_host(copy), _iota())
    assert not array.is_deleted()


def test_bitcast_arrays(client):
    devices = _devices(client, 2)
    scalar = client.make_array_from_host_buffer(
        np.float32(3), _replicated(devices, Shape([])), ONLY_DURING_CALL)
    split = ShardingParamSharding(ShardingParam([2], [0], [2]), devices)
    spec = ArraySpec(F32, Shape([2]), split)
    (array,) = client.bitcast_arrays([scalar], [spec], ALWAYS_COPY)
    assert array.sharding is split
    assert array.layout in (None, client.get_default_layout(F32, [1], devices[0]))
    for shard in array.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE):
        np.testing.assert_array_equal(_host(shard), np.array([3], np.float32))
    np.testing.assert_array_equal(_host(array), np.array([3, 3], np.float32))


def test_bitcast_arrays_refuses_a_different_byte_count(client):
    device = client.addressable_devices()[0]
    array = _make(client, sharding=SingleDeviceSharding(device))
    spec = ArraySpec(F32, Shape([7]), SingleDeviceSharding(device))
    with pytest.raises(InvalidArgumentError, match="bytes"):
        client.bitcast_arrays([array], [spec], ALWAYS_COPY)
    assert not array.is_deleted()


def _replicated_by_assembly(client, devices, sharding):
    arrays = _single_device_arrays(client, devices)
    return client.assemble_array_from_single_device_arrays(
        SHAPE, sharding, arrays, DONATE_INPUT, ADDRESSABLE)


@pytest.mark.parametrize("kind", ["concrete", "concrete_even"])
def test_copy_to_different_device(client, kind):
    devices = _devices(client, 2)
    if kind == "concrete":
        sharding = ConcreteSharding(devices, SHAPE, [SHAPE] * len(devices))
    else:
        sharding = _replicated(devices)
    array = _replicated_by_assembly(client, devices, sharding)
    reversed_devices = client.make_device_list(list(reversed(devices)))
    with UserContextScope(UserContext(100)):
        (copy,) = client.copy_arrays([array], reversed_devices, None, ALWAYS_COPY)
    assert copy.sharding == sharding.with_device_assignment(reversed_devices)
    assert _fingerprint(copy) == 100
    _assert_per_shard_data(copy, F32, SHAPE, [_iota()] * len(devices), list(reversed_devices))


def test_copy_mixed_source_devices(client):
    devices = _devices(client, 2)
    arrays = _single_device_arrays(client, devices)
    with pytest.raises(InvalidArgumentError):
        client.copy_arrays(arrays, None, None, ALWAYS_COPY)
    assert not any(a.is_deleted() for a in arrays)


def test_copy_mixed_source_memory_kind(client):
    device = client.addressable_devices()[0]
    kinds = _memory_kinds(device)
    if len(kinds) < 2:
        pytest.skip(f"needs 2 memory kinds, device 0 has {kinds}")
    arrays = [_make(client, sharding=SingleDeviceSharding(device, k)) for k in kinds[:2]]
    with pytest.raises(InvalidArgumentError):
        client.copy_arrays(arrays, None, None, ALWAYS_COPY)


def test_copy_preserves_default_layouts(client):
    """IFRT's case: for every pair of memories, the array and its copy each have the
    default layout of their own memory (None is that default)."""
    device = client.addressable_devices()[0]
    kinds = _memory_kinds(device)
    for src, dst in itertools.product(kinds, kinds):
        array = _make(client, sharding=SingleDeviceSharding(device, src))
        (copy,) = client.copy_arrays([array], None, dst, ALWAYS_COPY)
        assert array.layout in (None, client.get_default_layout(F32, [2, 3], device, src)), src
        assert copy.layout in (None, client.get_default_layout(F32, [2, 3], device, dst)), (src, dst)
        np.testing.assert_array_equal(_host(copy), _iota())


def test_make_and_copy_zero_sized_buffers(client):
    devices = client.addressable_devices()
    data = np.zeros((0, 1), np.float32)
    array = _make(client, data, SingleDeviceSharding(devices[0]))
    array.ready_future().result(timeout=TIMEOUT_S)
    for device in devices:
        (copy,) = client.copy_arrays([array], [device], None, REUSE_INPUT)
        copy.ready_future().result(timeout=TIMEOUT_S)
        out = _host(copy)
        assert out.shape == (0, 1) and out.dtype == np.float32


def test_poisoned_zero_sized_buffers(client):
    devices = client.addressable_devices()
    spec = ArraySpec(F32, Shape([0, 1]), SingleDeviceSharding(devices[0]))
    (array,) = client.make_error_arrays(InvalidArgumentError("injected error"), [spec])
    assert "injected error" in str(_error_of(array.copy_to_host_buffer()))
    healthy = _make(client, np.zeros((0, 1), np.float32), spec.sharding)
    for device in devices:
        client.copy_arrays([healthy], [device], None, REUSE_INPUT)
        (copy,) = client.copy_arrays([array], [device], None, REUSE_INPUT)
        assert "injected error" in str(_error_of(copy.ready_future()))
        assert "injected error" in str(_error_of(copy.copy_to_host_buffer()))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.int4], ids=["f32", "s4"])
def test_copy_arrays_exhaustive(client, dtype):
    """Every source memory kind x destination device x destination memory kind
    (``CopyArraysExhaustive`` and, for s4, ``CopyArraysSubByteDType``)."""
    devices = _devices(client, 2)
    data = (np.arange(6) % 8).astype(dtype).reshape(2, 3)
    for src_kind in _memory_kinds(devices[0]):
        for dst_device in devices:
            for dst_kind in _memory_kinds(dst_device):
                array = _make(client, data, SingleDeviceSharding(devices[0], src_kind))
                (copy,) = client.copy_arrays([array], [dst_device], dst_kind, ALWAYS_COPY)
                where = (str(src_kind), dst_device.id, str(dst_kind))
                assert list(copy.sharding.devices) == [dst_device], where
                assert copy.sharding.memory_kind == dst_kind, where
                result = _host(copy)
                assert result.dtype == data.dtype, where
                np.testing.assert_array_equal(result, data, err_msg=str(where))


def test_copy_poisoned_array(client):
    devices = _devices(client, 2)
    for src_kind in _memory_kinds(devices[0]):
        spec = ArraySpec(F32, SHAPE, SingleDeviceSharding(devices[0], src_kind))
        (array,) = client.make_error_arrays(InvalidArgumentError("injected error"), [spec])
        healthy = _make(client, sharding=spec.sharding)
        for dst_device in devices:
            for dst_kind in _memory_kinds(dst_device):
                client.copy_arrays([healthy], [dst_device], dst_kind, ALWAYS_COPY)
                (copy,) = client.copy_arrays([array], [dst_device], dst_kind, ALWAYS_COPY)
                assert "injected error" in str(_error_of(copy.ready_future())), (
                    src_kind, dst_device, dst_kind)


def test_copy_arrays_with_partial_reuse(client):
    devices = _devices(client, 4)
    sharding = ShardingParamSharding(ShardingParam([4, 1], [0], [4]), devices)
    shards = [_make(client, np.full((1, 1), i, np.float32), SingleDeviceSharding(d))
              for i, d in enumerate(devices)]
    array = client.assemble_array_from_single_device_arrays(
        Shape([4, 1]), sharding, shards, DONATE_INPUT, ADDRESSABLE)
    dst = [devices[0], devices[2], devices[1], devices[3]]
    (copy,) = client.copy_arrays([array], dst, None, REUSE_INPUT)
    _assert_per_shard_data(copy, F32, [1, 1], [np.full((1, 1), i, np.float32) for i in range(4)],
                           dst)


# -- readiness and deletion -------------------------------------------------------------------

def test_get_ready_future(client):
    assert _make(client).ready_future().result(timeout=TIMEOUT_S) is None


def test_batched_get_ready_future(client):
    devices = client.addressable_devices()
    values = [_make(client, sharding=SingleDeviceSharding(devices[i % len(devices)]))
              for i in range(4)]
    client.get_ready_future(values).result(timeout=TIMEOUT_S)


def test_batched_get_ready_future_fails_with_an_input_error(client):
    values = [_make(client)]
    values += client.make_error_arrays(InvalidArgumentError("injected error"),
                                       [ArraySpec(F32, SHAPE, values[0].sharding)])
    assert "injected error" in str(_error_of(client.get_ready_future(values)))


def test_delete(client):
    """The deletion succeeds; then the array is deleted and its data gone: its ready future
    and a read fail with FailedPreconditionError (the read may raise it at the call)."""
    array = _make(client)
    assert array.delete().result(timeout=TIMEOUT_S) is None
    assert array.is_deleted()
    assert isinstance(_error_of(array.ready_future()), FailedPreconditionError)
    try:
        read = _error_of(array.copy_to_host_buffer())
    except FailedPreconditionError as e:
        read = e
    assert isinstance(read, FailedPreconditionError), read


def test_delete_is_idempotent(client):
    array = _make(client)
    first, second = array.delete(), array.delete()
    assert first.exception(timeout=TIMEOUT_S) is None
    assert second.exception(timeout=TIMEOUT_S) is None
    assert array.is_deleted()


def test_is_deleted(client):
    array = _make(client)
    assert not array.is_deleted()
    future = array.delete()
    assert array.is_deleted()  # before the deletion is awaited
    future.result(timeout=TIMEOUT_S)
    assert array.is_deleted()


__all__ = sorted(name for name in dir() if name.startswith("test_"))
