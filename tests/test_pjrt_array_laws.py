"""Laws of PjRt arrays, checked against NumPy with hypothesis on an 8-device client.

Values are compared byte-wise (floats may hold NaNs). Every sharding kind of
``ifrtpy.testing.strategies.shardings`` is drawn, over random device subsets, orders and
memory kinds.
"""

import gc
import re
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.array import ArrayCopySemantics, ArraySpec, HostBufferSemantics
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import IndexDomain, Shape
from ifrtpy.sharding import SingleDeviceSharding, SingleDeviceShardSemantics
from ifrtpy.testing import strategies as S

ALWAYS_COPY = ArrayCopySemantics.ALWAYS_COPY
REUSE_INPUT = ArrayCopySemantics.REUSE_INPUT
DONATE_INPUT = ArrayCopySemantics.DONATE_INPUT
ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)


def _bytes(x) -> bytes:
    return np.ascontiguousarray(x).view(np.uint8).tobytes()


def _assert_same(actual: np.ndarray, expected: np.ndarray, what=""):
    assert actual.dtype == expected.dtype, what
    assert actual.shape == expected.shape, what
    assert _bytes(actual) == _bytes(expected), what


def _domains(sharding, shape):
    """The box of the global array each addressable shard holds, in device order."""
    count = len(sharding.devices.addressable_device_list())
    if sharding.is_fully_replicated:
        return [IndexDomain(Shape(shape))] * count
    return sharding.index_domains(Shape(shape), ADDRESSABLE)


@st.composite
def cases(draw, client, sub_byte=True, min_devices=1):
    """(host array, sharding) over the client's devices, in any memory kind."""
    devices = client.addressable_devices()
    dtype = draw(S.dtypes(sub_byte=sub_byte))
    shape = draw(S.shapes())
    x = draw(S.host_arrays(dtype, shape))
    sharding = draw(S.shardings(devices, shape, MEMORY_KINDS).filter(
        lambda s: len(s.devices) >= min_devices))
    return x, sharding


def _put(client, x, sharding):
    return client.make_array_from_host_buffer(x, sharding)


# -- host <-> array -------------------------------------------------------------------------

def _strided(x: np.ndarray, layout: str) -> np.ndarray:
    """An array equal to ``x`` laid out as ``layout`` says (a view with those strides)."""
    if x.ndim == 0:
        return x  # one element: every layout is the same
    if layout == "fortran":
        return np.asfortranarray(x)
    if layout == "reversed":  # negative strides
        index = (slice(None, None, -1),) * x.ndim
        return np.ascontiguousarray(x[index])[index]
    if layout == "padded":  # every dimension strided by 2 elements
        big = np.zeros([2 * n for n in x.shape], x.dtype)
        index = (slice(None, None, 2),) * x.ndim
        big[index] = x
        return big[index]
    return x


@given(data=st.data(), layout=st.sampled_from(["c", "fortran", "reversed", "padded"]))
def test_host_array_host_is_identity(client, data, layout):
    x, sharding = data.draw(cases(client))
    array = _put(client, _strided(x, layout), sharding)
    assert array.sharding is sharding
    assert array.dtype == ifrt.DType.from_numpy(x.dtype)
    assert array.shape == Shape(x.shape)
    _assert_same(np.asarray(array), x)
    out = _strided(np.zeros_like(x), data.draw(st.sampled_from(["fortran", "reversed", "padded"])))
    assert array.copy_to_host_buffer(out=out).result(timeout=10) is out
    _assert_same(out, x)


def _aligned_copy(x: np.ndarray, alignment: int = 64) -> np.ndarray:
    raw = np.empty(x.nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    out = raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


@given(data=st.data(), semantics=st.sampled_from(list(HostBufferSemantics)))
def test_on_done_runs_once_and_then_the_host_data_is_free(client, data, semantics):
    x, sharding = data.draw(cases(client))
    host = _aligned_copy(x)  # aligned, so that zero-copy really may alias it
    calls = []
    done = threading.Event()

    def on_done():
        calls.append(threading.get_ident())
        done.set()

    array = client.make_array_from_host_buffer(host, sharding, semantics, on_done)
    if semantics == HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL:
        assert len(calls) == 1
    array.ready_future().result(timeout=10)
    if not done.is_set() and semantics >= HostBufferSemantics.IMMUTABLE_ZERO_COPY:
        del array  # a zero-copy array may use the data until it is freed
    deadline = time.monotonic() + 10
    while not done.is_set() and time.monotonic() < deadline:
        gc.collect()
        done.wait(0.01)
    assert len(calls) == 1
    host.reshape(-1).view(np.uint8)[...] = 0xAB  # the runtime must not read it any more
    if "array" in locals():
        _assert_same(np.asarray(array), x)
    gc.collect()
    assert len(calls) == 1


@given(data=st.data(), semantics=st.sampled_from(list(HostBufferSemantics)))
def test_the_array_keeps_python_host_data_alive_as_long_as_it_needs_it(client, data, semantics):
    x, sharding = data.draw(cases(client))
    host = _aligned_copy(x)
    array = client.make_array_from_host_buffer(host, sharding, semantics)
    del host  # the only reference: a zero-copy array must keep the memory alive itself
    gc.collect()
    _ = [np.full(64, 0xCD, np.uint8) for _ in range(64)]  # reuse freed memory, if any
    _assert_same(np.asarray(array), x)


@given(data=st.data())
def test_each_shard_is_the_numpy_slice_of_its_index_domain(client, data):
    x, sharding = data.draw(cases(client))
    array = _put(client, x, sharding)
    shards = array.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE)
    devices = sharding.devices.addressable_device_list()
    domains = _domains(sharding, x.shape)
    assert len(shards) == len(devices) == len(domains)
    for i, (shard, device, domain) in enumerate(zip(shards, devices, domains)):
        assert list(shard.sharding.devices) == [device], i
        assert shard.sharding.memory_kind == sharding.memory_kind, i
        _assert_same(np.asarray(shard), x[domain.slices()], f"shard {i} at {domain}")


# -- assemble / disassemble -------------------------------------------------------------------

@given(data=st.data(),
       split=st.sampled_from(list(ArrayCopySemantics)),
       join=st.sampled_from(list(ArrayCopySemantics)))
def test_assemble_of_disassemble_is_identity(client, data, split, join):
    x, sharding = data.draw(cases(client))
    array = _put(client, x, sharding)
    shards = array.disassemble_into_single_device_arrays(split, ADDRESSABLE)
    assert array.is_deleted() == (split == DONATE_INPUT)
    again = client.assemble_array_from_single_device_arrays(
        Shape(x.shape), sharding, shards, join, ADDRESSABLE)
    assert again.sharding is sharding
    for i, shard in enumerate(shards):
        if shard is not again:  # a one-shard assemble may hand back its input
            assert shard.is_deleted() == (join == DONATE_INPUT), i
    _assert_same(np.asarray(again), x)


# -- reshard ----------------------------------------------------------------------------------

@given(data=st.data(), semantics=st.sampled_from([ALWAYS_COPY, DONATE_INPUT]))
def test_reshard_keeps_every_value(client, data, semantics):
    x, source = data.draw(cases(client))
    target = data.draw(S.shardings(client.addressable_devices(), x.shape, MEMORY_KINDS))
    array = _put(client, x, source)
    dtype = ifrt.DType.from_numpy(x.dtype)
    (out,) = client.reshard_arrays([array], [ArraySpec(dtype, Shape(x.shape), target)], semantics)
    assert out.sharding is target
    assert array.is_deleted() == (semantics == DONATE_INPUT)
    _assert_same(np.asarray(out), x)
    for i, (shard, domain) in enumerate(zip(
            out.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE),
            _domains(target, x.shape))):
        _assert_same(np.asarray(shard), x[domain.slices()], f"shard {i}")
    if semantics == ALWAYS_COPY:
        _assert_same(np.asarray(array), x)


# -- copy_arrays ------------------------------------------------------------------------------

@given(data=st.data(), semantics=st.sampled_from(list(ArrayCopySemantics)))
def test_copy_arrays_to_other_devices_keeps_every_value(client, data, semantics):
    x, sharding = data.draw(cases(client))
    devices = data.draw(st.permutations(client.addressable_devices()))[:len(sharding.devices)]
    kind = data.draw(st.sampled_from([None, *MEMORY_KINDS]))
    array = _put(client, x, sharding)
    (out,) = client.copy_arrays([array], devices, kind, semantics)
    assert out.sharding == sharding.with_device_assignment(devices, kind)
    assert list(out.sharding.devices) == devices
    assert array.is_deleted() == (semantics == DONATE_INPUT)
    _assert_same(np.asarray(out), x)
    if semantics != DONATE_INPUT:
        _assert_same(np.asarray(array), x)


@given(data=st.data(), semantics=st.sampled_from(list(ArrayCopySemantics)))
def test_copy_arrays_of_several_arrays(client, data, semantics):
    x, sharding = data.draw(cases(client))
    y = data.draw(S.host_arrays(x.dtype, x.shape))
    devices = list(reversed(sharding.devices))
    arrays = [_put(client, x, sharding), _put(client, y, sharding)]
    outs = client.copy_arrays(arrays, devices, None, semantics)
    assert [a.is_deleted() for a in arrays] == [semantics == DONATE_INPUT] * 2
    _assert_same(np.asarray(outs[0]), x)
    _assert_same(np.asarray(outs[1]), y)


# -- donation -----------------------------------------------------------------------------

@pytest.mark.parametrize("semantics", list(ArrayCopySemantics), ids=lambda s: s.name)
def test_donation_deletes_exactly_the_donated_inputs(client, semantics):
    devices = client.addressable_devices()[:4]
    x = np.arange(8, dtype=np.int32).reshape(4, 2)
    sharding = ifrt.NamedSharding(ifrt.Mesh(devices, "x"), ifrt.PartitionSpec("x"))
    donated = semantics == DONATE_INPUT
    bystander = _put(client, x, sharding)

    array = _put(client, x, sharding)
    shards = array.disassemble_into_single_device_arrays(semantics)
    assert array.is_deleted() == donated
    assembled = client.assemble_array_from_single_device_arrays(
        Shape([4, 2]), sharding, shards, semantics)
    assert [s.is_deleted() for s in shards] == [donated] * 4
    (copied,) = client.copy_arrays([assembled], devices[::-1], None, semantics)
    assert assembled.is_deleted() == donated
    np.testing.assert_array_equal(np.asarray(copied), x)
    if donated:
        for value in (array, assembled, *shards):
            assert value.ready_future().exception(timeout=10) is not None
    assert not bystander.is_deleted() and not copied.is_deleted()
    np.testing.assert_array_equal(np.asarray(bystander), x)


# -- validation errors ---------------------------------------------------------------------

def _flat(message: str) -> str:
    return re.sub(r"\s", "", message)


@given(data=st.data(),
       fault=st.sampled_from(["count", "device", "dtype", "shape"]),
       semantics=st.sampled_from(list(ArrayCopySemantics)))
def test_bad_assemble_raises_and_leaves_inputs_intact(client, data, fault, semantics):
    x, sharding = data.draw(cases(client, sub_byte=False, min_devices=2))
    shape = Shape(x.shape)
    shards = _put(client, x, sharding).disassemble_into_single_device_arrays(ALWAYS_COPY)
    i = data.draw(st.integers(0, len(shards) - 1))
    expected_device = sharding.devices[i]
    shard_shape = shards[i].shape
    if fault == "count":
        shards = shards[:i] + shards[i + 1:]
        names = [str(len(shards) + 1), str(len(shards))]
    elif fault == "device":
        other = next(d for d in client.addressable_devices() if d is not expected_device)
        (moved,) = client.copy_arrays([shards[i]], [other], None, ALWAYS_COPY)
        shards[i] = moved
        names = [str(other), str(expected_device)]
    elif fault == "dtype":
        wrong = np.dtype(np.float32 if x.dtype != np.float32 else np.int32)
        shards[i] = _put(client, np.zeros(shard_shape.dims, wrong),
                         SingleDeviceSharding(expected_device, sharding.memory_kind))
        names = [str(ifrt.DType.from_numpy(wrong)), str(ifrt.DType.from_numpy(x.dtype))]
    else:
        bad = Shape([*shard_shape.dims, 1])
        shards[i] = _put(client, np.zeros(bad.dims, x.dtype),
                         SingleDeviceSharding(expected_device, sharding.memory_kind))
        names = [",".join(map(str, bad.dims)), ",".join(map(str, shard_shape.dims))]
    with pytest.raises(InvalidArgumentError) as info:
        client.assemble_array_from_single_device_arrays(shape, sharding, shards, semantics)
    for name in names:
        assert _flat(name) in _flat(str(info.value)), (name, str(info.value))
    for shard in shards:
        assert not shard.is_deleted()
        shard.ready_future().result(timeout=10)


@pytest.mark.parametrize("semantics", list(ArrayCopySemantics), ids=lambda s: s.name)
def test_bad_copy_arrays_raises_and_leaves_inputs_intact(client, semantics):
    devices = client.addressable_devices()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = _put(client, x, ifrt.ConcreteEvenSharding(devices[:2], [2, 3], [2, 3], True))
    b = _put(client, x, ifrt.ConcreteEvenSharding(devices[2:4], [2, 3], [2, 3], True))
    with pytest.raises(InvalidArgumentError, match="3.*2|2.*3"):
        client.copy_arrays([a], devices[:3], None, semantics)  # 3 devices for 2 shards
    with pytest.raises(InvalidArgumentError):
        client.copy_arrays([a, b], None, None, semantics)  # inputs on different devices
    for value in (a, b):
        assert not value.is_deleted()
        np.testing.assert_array_equal(np.asarray(value), x)


@pytest.mark.parametrize("semantics", list(ArrayCopySemantics), ids=lambda s: s.name)
def test_bad_reshard_raises_and_leaves_inputs_intact(client, semantics):
    devices = client.addressable_devices()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = _put(client, x, SingleDeviceSharding(devices[0]))
    target = SingleDeviceSharding(devices[1])
    bad_specs = [ArraySpec(np.float32, Shape([3, 2]), target),
                 ArraySpec(np.int32, Shape([2, 3]), target)]
    for spec in bad_specs:
        with pytest.raises(InvalidArgumentError):
            client.reshard_arrays([a], [spec], semantics)
    if semantics == REUSE_INPUT:
        with pytest.raises(InvalidArgumentError, match="REUSE_INPUT"):
            client.reshard_arrays([a], [ArraySpec(np.float32, Shape([2, 3]), target)], semantics)
    assert not a.is_deleted()
    np.testing.assert_array_equal(np.asarray(a), x)


# -- error arrays ----------------------------------------------------------------------------

def _error_array(client, sharding, shape=(2, 3)):
    spec = ArraySpec(np.float32, Shape(shape), sharding)
    (array,) = client.make_error_arrays(InvalidArgumentError("injected error"), [spec])
    return array


def _assert_injected(future):
    exc = future.exception(timeout=10)
    assert exc is not None and "injected error" in str(exc), exc


@pytest.mark.parametrize("op", ["copy", "reshard", "disassemble", "assemble"])
def test_an_error_array_poisons_what_is_made_from_it(client, op):
    """Errors of an array travel through the futures of the arrays made from it (IFRT's
    PjRt arrays hold error buffers), they are not raised at the call."""
    devices = client.addressable_devices()
    if op == "assemble":
        shard = _error_array(client, SingleDeviceSharding(devices[0]))
        sharding = ifrt.ConcreteEvenSharding(devices[:1], [2, 3], [2, 3])
        outs = [client.assemble_array_from_single_device_arrays([2, 3], sharding, [shard])]
    else:
        sharding = ifrt.ConcreteEvenSharding(devices[:2], [2, 3], [2, 3], True)
        array = _error_array(client, sharding)
        if op == "copy":
            outs = client.copy_arrays([array], devices[2:4], None, ALWAYS_COPY)
        elif op == "reshard":
            spec = ArraySpec(np.float32, Shape([2, 3]), SingleDeviceSharding(devices[3]))
            outs = client.reshard_arrays([array], [spec], ALWAYS_COPY)
        else:
            outs = array.disassemble_into_single_device_arrays(REUSE_INPUT)
            assert len(outs) == 2
    for out in outs:
        _assert_injected(out.ready_future())
        _assert_injected(out.copy_to_host_buffer())


@pytest.mark.parametrize("op", ["copy", "reshard", "disassemble"])
def test_donating_an_error_array_deletes_it(client, op):
    devices = client.addressable_devices()
    array = _error_array(client, SingleDeviceSharding(devices[0]))
    if op == "copy":
        client.copy_arrays([array], devices[1:2], None, DONATE_INPUT)
    elif op == "reshard":
        spec = ArraySpec(np.float32, Shape([2, 3]), SingleDeviceSharding(devices[1]))
        client.reshard_arrays([array], [spec], DONATE_INPUT)
    else:
        try:
            array.disassemble_into_single_device_arrays(DONATE_INPUT)
        except InvalidArgumentError:  # raised at the call (test_an_error_array_poisons_...)
            assert not array.is_deleted()  # a call that raises consumes nothing
            return
    assert array.is_deleted()


def test_assemble_rejects_one_array_given_twice_before_donating_anything(client):
    device = client.addressable_devices()[0]
    array = _put(client, np.arange(6, dtype=np.float32).reshape(2, 3), SingleDeviceSharding(device))
    sharding = ifrt.ConcreteEvenSharding([device, device], [2, 3], [2, 3], True)
    with pytest.raises(InvalidArgumentError):
        client.assemble_array_from_single_device_arrays(
            [2, 3], sharding, [array, array], DONATE_INPUT)
    assert not array.is_deleted()
