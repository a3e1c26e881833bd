"""Device layouts: the Layout value type, Array.layout on both backends, the laws against
NumPy, and what the CPU plugin does with a requested device layout."""

import ctypes
import itertools
import pickle

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy import _pjrt, errors
from ifrtpy.layout import Layout


@pytest.fixture(scope="module", params=["pjrt", "reference"])
def client(request):
    return ifrt.get_client(request.param, device_count=2)


# -- the value type ------------------------------------------------------------------------

def test_layout_is_an_immutable_value():
    a = Layout((0, 1))
    assert a == Layout([0, 1]) == Layout.column_major(2) and hash(a) == hash(Layout((0, 1)))
    assert a != Layout.row_major(2) and Layout((1, 0), [(8, 128)]) != Layout((1, 0))
    with pytest.raises(AttributeError):
        a.minor_to_major = (1, 0)
    assert pickle.loads(pickle.dumps(Layout((1, 0), ((8, 128),)))) == Layout((1, 0), ((8, 128),))
    assert repr(Layout((1, 0), ((8, 128),))) == "Layout(minor_to_major=(1, 0), tiles=((8, 128),))"
    assert str(Layout((1, 0), ((8, 128), (2,)))) == "{1,0:T(8,128)T(2)}"
    assert Layout.row_major(0) == Layout(())


@pytest.mark.parametrize("args, match", [
    (((0, 0),), "permutation"), (((1, 2),), "permutation"), ((("a",),), "ints"),
    (((0,), [()]), "tiles"), (((0,), [(0,)]), "tiles"), (((0,), [(True,)]), "tiles"),
])
def test_bad_layouts_are_refused(args, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        Layout(*args)


@pytest.mark.parametrize("order", ["C", "F"])
def test_byte_strides_equal_numpy(order):
    x = np.empty((2, 3, 5), np.float64, order=order)
    layout = Layout.row_major(3) if order == "C" else Layout.column_major(3)
    assert layout.byte_strides(x.shape, x.itemsize) == x.strides
    with pytest.raises(errors.InvalidArgumentError, match="tiled"):
        Layout((1, 0), [(8, 128)]).byte_strides((16, 128), 4)


# -- Array.layout ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (2, 3, 4)])
def test_ordinary_arrays_have_the_default_layout(client, shape):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    device = client.devices()[0]
    a = client.make_array_from_host_buffer(np.array(x, order="F"), ifrt.SingleDeviceSharding(device))
    default = client.get_default_layout(a.dtype, shape, device)
    assert a.layout == default == Layout.row_major(len(shape))


def test_default_layout_given_explicitly_is_accepted(client):
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    sharding = ifrt.SingleDeviceSharding(client.devices()[1])
    a = client.make_array_from_host_buffer(x, sharding, layout=Layout.row_major(2))
    assert a.layout == Layout.row_major(2)
    np.testing.assert_array_equal(np.asarray(a), x)


@pytest.mark.parametrize("layout, error", [
    (Layout((0,)), errors.InvalidArgumentError), ("F", errors.InvalidArgumentError)])
def test_layout_of_another_rank_or_type_is_refused(client, layout, error):
    sharding = ifrt.SingleDeviceSharding(client.devices()[0])
    with pytest.raises(error, match="layout"):
        client.make_array_from_host_buffer(np.zeros((2, 3), np.float32), sharding, layout=layout)


def test_column_major_host_copy(client):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(client.devices()[0]))
    out = np.empty_like(x, order="F")
    assert a.copy_to_host_buffer(out).result() is out
    np.testing.assert_array_equal(out, x)


# -- laws against NumPy where the backend places a device layout ---------------------------

@pytest.mark.parametrize("minor_to_major", list(itertools.permutations(range(3))))
def test_reference_layout_law(minor_to_major):
    client = ifrt.get_client("reference", device_count=2)
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    layout = Layout(minor_to_major)
    a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(client.devices()[0]),
                                           layout=layout)
    assert a.layout == layout
    np.testing.assert_array_equal(np.asarray(a), x)           # round trip: equal values
    (shard,) = a.shards                                       # the memory, in its order
    major_to_minor = minor_to_major[::-1]
    np.testing.assert_array_equal(shard.ravel(order="K"), x.transpose(major_to_minor).ravel())
    if minor_to_major == (0, 1, 2):
        np.testing.assert_array_equal(shard.ravel(order="K"), np.asfortranarray(x).ravel(order="K"))
    (copy,) = client.copy_arrays([a], None, None, ifrt.ArrayCopySemantics.ALWAYS_COPY)
    assert copy.layout == layout


def test_pjrt_cpu_refuses_a_column_major_device_layout():
    client = ifrt.get_client("cpu", cpu_device_count=1)
    sharding = ifrt.SingleDeviceSharding(client.devices()[0])
    with pytest.raises(errors.UnimplementedError, match=r"CPU PJRT plugin .* \{0,1\}"):
        client.make_array_from_host_buffer(np.zeros((2, 3), np.float32), sharding,
                                           layout=Layout.column_major(2))


def test_cpu_plugin_reports_a_column_major_layout_but_keeps_row_major_memory():
    """Why the PjRt backend refuses non-default layouts on CPU: the official plugin takes
    ``device_layout`` (0, 1), reports it back, yet its memory holds row-major order. If a
    plugin version fixes this, this test fails and the refusal can go."""
    plugin = _pjrt.load_plugin()
    handle = _pjrt.create_client(plugin, {"cpu_device_count": 1})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    buffer, _ = _pjrt.buffer_from_host_buffer(handle, x, handle.devices[0], None, 0, ((0, 1), ()))
    buffer.ready_event().await_()
    assert buffer.memory_layout == ((0, 1), ())
    memory = np.frombuffer((ctypes.c_float * 6).from_address(buffer.unsafe_pointer), np.float32)
    np.testing.assert_array_equal(memory, x.ravel())            # row-major, not Fortran order
    assert not np.array_equal(memory, np.asfortranarray(x).ravel(order="K"))
    np.testing.assert_array_equal(buffer.to_numpy(), x)
    with pytest.raises(errors.UnimplementedError, match="non-default layout"):
        _pjrt.buffer_from_host_buffer(handle, np.zeros((16, 128), np.float32), handle.devices[0],
                                      None, 0, ((1, 0), ((8, 128),)))
    with pytest.raises(errors.InvalidArgumentError, match="permutation"):
        _pjrt.buffer_from_host_buffer(handle, x, handle.devices[0], None, 0, ((0, 0), ()))
