"""Laws of PjRt arrays beyond the conformance suite's (which
tests/backends/pjrt/test_conformance_pjrt.py runs), checked against NumPy with hypothesis
on an 8-device client.

Values are compared byte-wise (floats may hold NaNs). Every sharding kind of
``ifrtpy.testing.strategies.shardings`` is drawn, over random device subsets, orders and
memory kinds.
"""

import gc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.array import ArrayCopySemantics, ArraySpec, HostBufferSemantics
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import Shape
from ifrtpy.sharding import SingleDeviceSharding
from ifrtpy.testing import strategies as S

DONATE_INPUT = ArrayCopySemantics.DONATE_INPUT
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

def _aligned_copy(x: np.ndarray, alignment: int = 64) -> np.ndarray:
    raw = np.empty(x.nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    out = raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


@given(data=st.data(), semantics=st.sampled_from(list(HostBufferSemantics)))
def test_the_array_keeps_python_host_data_alive_as_long_as_it_needs_it(client, data, semantics):
    x, sharding = data.draw(cases(client))
    host = _aligned_copy(x)
    array = client.make_array_from_host_buffer(host, sharding, semantics)
    del host  # the only reference: a zero-copy array must keep the memory alive itself
    gc.collect()
    _ = [np.full(64, 0xCD, np.uint8) for _ in range(64)]  # reuse freed memory, if any
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


def _error_array(client, sharding, shape=(2, 3)):
    spec = ArraySpec(np.float32, Shape(shape), sharding)
    (array,) = client.make_error_arrays(InvalidArgumentError("injected error"), [spec])
    return array


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
    device, other = client.addressable_devices()[:2]
    array = _put(client, np.arange(6, dtype=np.float32).reshape(2, 3), SingleDeviceSharding(device))
    sharding = ifrt.ConcreteEvenSharding([device, other], [2, 3], [2, 3], True)
    with pytest.raises(InvalidArgumentError, match="more than once"):
        client.assemble_array_from_single_device_arrays(
            [2, 3], sharding, [array, array], DONATE_INPUT)
    assert not array.is_deleted()
