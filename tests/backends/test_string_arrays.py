"""STRING arrays (IFRT's kString) on the reference and PjRt backends, against NumPy.

Their host form is a NumPy object array of ``str``/``bytes`` (NumPy 2 ``StringDType``
arrays are taken too); the PjRt backend holds them on the host (``BasicStringArray``),
as PjRt-IFRT does, since PJRT buffers hold no strings.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.array import ArrayCopySemantics, ArraySpec
from ifrtpy.backends.pjrt.array import PjrtArray
from ifrtpy.backends.pjrt.strings import BasicStringArray
from ifrtpy.dtypes import host_form
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from ifrtpy.shape import IndexDomain, Shape
from ifrtpy.sharding import SingleDeviceSharding, SingleDeviceShardSemantics
from ifrtpy.testing import strategies as S

STRING = ifrt.DType(ifrt.DType.Kind.STRING)
ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
ALWAYS_COPY = ArrayCopySemantics.ALWAYS_COPY
REUSE_INPUT = ArrayCopySemantics.REUSE_INPUT
DONATE_INPUT = ArrayCopySemantics.DONATE_INPUT
BACKENDS = ["reference", "pjrt"]
IDENTITY = """
module @identity {
  func.func public @main(%arg0: tensor<2xf32>) -> tensor<2xf32> {
    return %arg0 : tensor<2xf32>
  }
}
"""


@pytest.fixture(scope="module")
def clients():
    return {name: ifrt.get_client(name, device_count=8) for name in BACKENDS}


@pytest.fixture(params=BACKENDS)
def client(request, clients):
    return clients[request.param]


def _strings(shape, start=0) -> np.ndarray:
    values = [f"s{k}" for k in range(start, start + int(np.prod(shape, dtype=np.int64)))]
    return np.array(values, dtype=object).reshape(shape)


def _put(client, data, device=0):
    return client.make_array_from_host_buffer(
        data, SingleDeviceSharding(client.addressable_devices()[device]))


def _host(array) -> np.ndarray:
    out = array.copy_to_host_buffer().result(timeout=30)
    assert out.dtype == np.dtype(object)
    return out


def _same(actual: np.ndarray, expected: np.ndarray) -> None:
    """Same shape and the same elements, of the same Python types."""
    assert actual.shape == expected.shape
    assert [(type(a), a) for a in actual.flat] == [(type(e), e) for e in expected.flat]


def _domains(sharding, shape):
    count = len(sharding.devices.addressable_device_list())
    if sharding.is_fully_replicated:
        return [IndexDomain(Shape(shape))] * count
    return sharding.index_domains(Shape(shape), ADDRESSABLE)


def _assert_holds(array, data: np.ndarray) -> None:
    """``array`` is a STRING array holding ``data``, and each shard holds its slice."""
    assert array.dtype == STRING and array.shape == Shape(data.shape)
    _same(_host(array), data)
    shards = array.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE)
    devices = array.sharding.devices.addressable_device_list()
    for i, (shard, domain) in enumerate(zip(shards, _domains(array.sharding, data.shape))):
        assert shard.dtype == STRING, i
        assert list(shard.sharding.devices) == [devices[i]], i
        _same(_host(shard), data[(*domain.slices(), ...)])


# -- host form ----------------------------------------------------------------------------

def test_string_host_form_is_an_object_array():
    assert STRING.to_numpy() == np.dtype(object)
    data, dtype = host_form(np.array(["a", "bé"], dtype=np.dtypes.StringDType()))
    assert dtype == STRING and data.dtype == np.dtype(object) and data.tolist() == ["a", "bé"]
    data = np.array([b"x", "y"], dtype=object)
    assert host_form(data)[0] is data
    numbers = np.arange(3, dtype=np.int32)
    assert host_form(numbers) == (numbers, ifrt.DType.from_numpy(np.int32))


def test_object_arrays_of_other_things_are_refused(client):
    data = np.array([["a", "b"], ["c", 3]], dtype=object)
    with pytest.raises(InvalidArgumentError, match=r"element \[1, 1\] .* is int: 3"):
        _put(client, data)
    with pytest.raises(InvalidArgumentError, match="DType STRING"):
        ifrt.DType.from_numpy(object)  # the dtype alone does not say: the elements do


# -- both backends ------------------------------------------------------------------------

def test_string_dtype_input_round_trips_as_object_str(client):
    data = np.array([["x", "ÿ", ""], ["long " * 20, "🙂", "z"]], dtype=np.dtypes.StringDType())
    array = _put(client, data)
    _assert_holds(array, data.astype(object))
    np.testing.assert_array_equal(np.asarray(array), data.astype(object))


@pytest.mark.parametrize("data", [
    np.array([["x", "ÿ", ""], ["long " * 5, "🙂", "z"]]),      # fixed-width unicode
    np.array([b"\x00\xff", b"text", b"", b"a\x00b"]),          # fixed-width bytes
])
def test_fixed_width_input_round_trips_as_object_str_or_bytes(client, data):
    array = _put(client, data)
    assert array.dtype == STRING
    expected = data.astype(object)  # NumPy's own conversion (trailing NULs stripped)
    _assert_holds(array, expected)
    np.testing.assert_array_equal(np.asarray(array), expected)
    assert type(np.asarray(array).flat[0]) is type(data.flat[0].item())


def test_bytes_and_str_elements_are_kept_as_given(client):
    data = np.array([b"\x00\xff", "text", b""], dtype=object)
    _assert_holds(_put(client, data), data)


def test_repeated_string_puts_and_numeric_puts_on_one_sharding(client):
    """The PjRt put caches per sharding and dtype; strings never take the numeric path."""
    sharding = SingleDeviceSharding(client.addressable_devices()[1])
    for _ in range(3):
        strings = client.make_array_from_host_buffer(_strings((2,)), sharding)
        numbers = client.make_array_from_host_buffer(np.arange(2, dtype=np.float32), sharding)
        _same(_host(strings), _strings((2,)))
        np.testing.assert_array_equal(numbers.copy_to_host_buffer().result(), [0, 1])
    if client.runtime_type == "pjrt_ifrt":
        assert isinstance(strings, BasicStringArray) and isinstance(numbers, PjrtArray)


def test_execute_refuses_string_arguments(client):
    devices = client.make_device_list(client.addressable_devices()[:1])
    executable = client.compile(IDENTITY, ifrt.CompileOptions(devices=devices))
    with pytest.raises(UnimplementedError, match="STRING"):
        executable.execute([_put(client, _strings((2,)))], ifrt.ExecuteOptions())


def test_bitcast_refuses_strings(client):
    array = _put(client, _strings((2,)))
    with pytest.raises(UnimplementedError, match="string"):
        client.bitcast_arrays([array], [ArraySpec(STRING, Shape([2]), array.sharding)])


def test_copy_arrays_donation_and_delete(client):
    devices = client.addressable_devices()
    array = _put(client, _strings((3,)), 0)
    (moved,) = client.copy_arrays([array], [devices[3]], None, DONATE_INPUT)
    assert array.is_deleted() and list(moved.sharding.devices) == [devices[3]]
    _same(_host(moved), _strings((3,)))
    moved.delete()
    assert moved.is_deleted()
    with pytest.raises(FailedPreconditionError, match="deleted"):
        moved.copy_to_host_buffer()


def test_string_error_arrays(client):
    sharding = SingleDeviceSharding(client.addressable_devices()[0])
    (array,) = client.make_error_arrays(InvalidArgumentError("injected"),
                                        [ArraySpec(STRING, Shape([2]), sharding)])
    assert array.dtype == STRING
    assert "injected" in str(array.ready_future().exception(timeout=30))


def test_remap_moves_string_shards(client):
    """Shards of two 2-device arrays regrouped into one 4-device array (IFRT RemapPlan)."""
    from ifrtpy.device import DeviceList
    from ifrtpy.remap import Mapping, RemapPlan
    from ifrtpy.sharding import ConcreteEvenSharding

    devices = client.addressable_devices()

    def spec(indices):
        shape = Shape([len(indices), 3])
        return ArraySpec(STRING, shape, ConcreteEvenSharding(
            DeviceList([devices[i] for i in indices]), shape, Shape([1, 3])))

    inputs = [spec([0, 1]), spec([2, 3])]
    data = [_strings((2, 3)), _strings((2, 3), start=6)]
    arrays = [client.make_arrays_from_host_buffer_shards(
        [ifrt.HostBufferShards([([0], d[:1]), ([1], d[1:])], s)])[0]
        for d, s in zip(data, inputs)]
    plan = RemapPlan(inputs, [spec([0, 1, 2, 3])],
                     [Mapping(0, 0, [(0, 2)], [(0, 2)]), Mapping(1, 0, [(0, 2)], [(2, 4)])])
    (out,) = client.remap_arrays(plan, arrays, DONATE_INPUT)
    assert all(a.is_deleted() for a in arrays)
    assert out.dtype == STRING
    shards = out.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE)
    expected = np.concatenate(data)
    assert [list(s.sharding.devices) for s in shards] == [[d] for d in devices[:4]]
    for row, shard in enumerate(shards):
        _same(_host(shard), expected[row:row + 1])


# -- PjRt only ----------------------------------------------------------------------------

def test_pjrt_string_arrays_have_no_device_memory(clients):
    array = _put(clients["pjrt"], _strings((2,)))
    assert isinstance(array, BasicStringArray)
    for call in (array.__dlpack__, array.__dlpack_device__, array.unsafe_buffer_pointer):
        with pytest.raises(UnimplementedError, match="no PJRT buffer"):
            call()
    with pytest.raises(UnimplementedError):
        np.from_dlpack(array)


def test_pjrt_string_and_numeric_arrays_do_not_mix(clients):
    client = clients["pjrt"]
    arrays = [_put(client, np.arange(2, dtype=np.float32)), _put(client, _strings((2,)))]
    with pytest.raises(InvalidArgumentError, match="array 0 is not a STRING array"):
        client.copy_arrays(arrays, None, None, ALWAYS_COPY)


# -- properties: random strings, shapes and shardings ---------------------------------------

_ELEMENTS = st.one_of(st.text(max_size=12), st.binary(max_size=6))


@st.composite
def _cases(draw, devices):
    shape = draw(S.shapes(max_rank=3, max_side=4))
    values = draw(st.lists(_ELEMENTS, min_size=int(np.prod(shape, dtype=np.int64)),
                           max_size=int(np.prod(shape, dtype=np.int64))))
    data = np.empty(len(values), dtype=object)
    data[:] = values
    data = data.reshape(shape)
    return data, draw(S.shardings(devices, shape)), draw(S.shardings(devices, shape))


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_random_string_arrays_agree_with_numpy(client, data):
    devices = client.addressable_devices()
    values, sharding, target = data.draw(_cases(devices))
    array = client.make_array_from_host_buffer(values, sharding)
    assert array.sharding is sharding
    _assert_holds(array, values)
    # disassemble / assemble round trip
    shards = array.disassemble_into_single_device_arrays(ALWAYS_COPY, ADDRESSABLE)
    whole = client.assemble_array_from_single_device_arrays(
        array.shape, sharding, shards, DONATE_INPUT, ADDRESSABLE)
    assert all(s.is_deleted() for s in shards)
    _assert_holds(whole, values)
    # from host shards
    pieces = [([i], values[(*d.slices(), ...)]) for i, d in enumerate(_domains(sharding, values.shape))]
    (made,) = client.make_arrays_from_host_buffer_shards(
        [ifrt.HostBufferShards(pieces, ArraySpec(STRING, array.shape, sharding))])
    _assert_holds(made, values)
    # copy to other devices, the same count in reverse order
    moved_to = list(reversed(sharding.devices))
    (moved,) = client.copy_arrays([array], moved_to, None, ALWAYS_COPY)
    assert list(moved.sharding.devices) == moved_to
    _assert_holds(moved, values)
    # reshard to another random sharding
    (resharded,) = client.reshard_arrays([array], [ArraySpec(STRING, array.shape, target)],
                                         ALWAYS_COPY)
    assert resharded.sharding is target
    _assert_holds(resharded, values)
    _same(_host(array), values)  # the source is untouched
