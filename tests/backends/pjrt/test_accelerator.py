"""The PjRt backend on a real accelerator: layouts, dtypes, memories and the execute path,
against the plugin's own answers and NumPy.

Runs only where ``IFRTPY_TEST_PLUGIN`` names a plugin (``tpu``: libtpu, found as jax
finds it); CI has no accelerator, so it skips there. ``benchmarks/accelerator_check.py``
runs it with the conformance suite, jax's tests through the proxy and the speed table::

    IFRTPY_TEST_PLUGIN=tpu pytest -q tests/backends/pjrt/test_accelerator.py

One process holds a TPU at a time: run it alone, with one client (the plugin's default).
"""

import os

import ml_dtypes
import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.testing.strategies import DTYPES, SUB_BYTE_DTYPES

PLUGIN = os.environ.get("IFRTPY_TEST_PLUGIN")
pytestmark = pytest.mark.skipif(not PLUGIN, reason="IFRTPY_TEST_PLUGIN names no accelerator plugin")

SHAPES = [(), (8,), (2, 3), (256, 256), (3, 5, 7)]
ADD_ONE = """
func.func public @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<2x3xf32>
  %y = stablehlo.add %x, %one : tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}"""


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client(PLUGIN)


@pytest.fixture(scope="module")
def device(client):
    return client.addressable_devices()[0]


@pytest.fixture(scope="module")
def places_layouts(client):
    if client._host_platform:
        pytest.skip("the CPU plugin places the default layout only (docs/layouts.md)")


def _kinds(device):
    return [m.kind for m in device.memories()]


def test_arrays_have_the_default_layout_of_their_memory(client, device):
    for kind in _kinds(device):
        for dtype in DTYPES:
            for shape in SHAPES:
                array = client.make_array_from_host_buffer(
                    np.zeros(shape, dtype), ifrt.SingleDeviceSharding(device, kind))
                default = client.get_default_layout(array.dtype, shape, device, kind)
                assert array.layout == default, (kind, dtype, shape)


def test_unpinned_host_memory_is_row_major(client, device):
    if "unpinned_host" not in {str(k) for k in _kinds(device)}:
        pytest.skip("no unpinned_host memory")
    for shape in SHAPES:
        layout = client.get_default_layout(ifrt.DType.from_numpy(np.float32), shape, device,
                                           "unpinned_host")
        assert layout == ifrt.Layout.row_major(len(shape))


def test_a_column_major_put_keeps_values(client, device, places_layouts):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    wanted = ifrt.Layout.column_major(2)
    array = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(device), layout=wanted)
    assert wanted.accepts(array.layout), array.layout
    np.testing.assert_array_equal(np.asarray(array), x)
    (copy,) = client.copy_arrays([array], None, None)
    assert copy.layout == array.layout
    np.testing.assert_array_equal(np.asarray(copy), x)


def test_default_layouts_take_the_c_path_and_custom_ones_are_checked(client, device, places_layouts):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    exe = client.compile(ADD_ONE)
    default = client.get_default_layout(ifrt.DType.from_numpy(np.float32), (2, 3), device)
    assert exe.parameter_layouts() == exe.output_layouts() == [default]
    a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(device))
    (out,) = exe(a)
    assert exe._checked_kinds is not None  # later calls repeat without the Python checks
    (again,) = exe(out)
    np.testing.assert_array_equal(np.asarray(again), x + 2)
    column_major = client.make_array_from_host_buffer(
        x, ifrt.SingleDeviceSharding(device), layout=ifrt.Layout.column_major(2))
    with pytest.raises(ifrt.errors.InvalidArgumentError, match="argument 0 of main is in device layout"):
        exe(column_major)


def test_a_column_major_result_layout(client, device, places_layouts):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    exe = client.compile(ADD_ONE, ifrt.CompileOptions(
        argument_layouts=[None], result_layouts=[ifrt.Layout.column_major(2)]))
    (compiled,) = exe.output_layouts()
    assert ifrt.Layout.column_major(2).accepts(compiled)
    (out,) = exe(client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(device)))
    assert out.layout == compiled
    np.testing.assert_array_equal(np.asarray(out), x + 1)


def _values(dtype, rng, n=64):
    """Valid values of ``dtype``: random bytes, but for bool and the sub-byte dtypes."""
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(dtype)
    if dtype in SUB_BYTE_DTYPES:
        if dtype.name.startswith("float"):  # float4: any of its 16 codes
            return rng.integers(0, 16, n).astype(np.uint8).view(dtype)
        info = ml_dtypes.iinfo(dtype)
        return rng.integers(int(info.min), int(info.max) + 1, n).astype(np.int8).astype(dtype)
    return np.frombuffer(rng.bytes(n * dtype.itemsize), dtype).copy()


def test_every_dtype_comes_back_as_declared(client, device):
    """Bit for bit, or as the client declares (a TPU's f64 and c128: float32 pairs)."""
    rng = np.random.default_rng(0)
    for kind in _kinds(device):
        declared = client.inexact_dtypes(kind)
        for dtype in DTYPES:
            x = _values(dtype, rng)
            inexact = declared.get(ifrt.DType.from_numpy(dtype))
            if inexact is not None:
                x[np.isnan(x)] = 0  # no NaN payload is promised
            got = np.asarray(client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(device, kind)))
            expected = x if inexact is None else inexact.held_values(x)
            assert got.tobytes() == expected.tobytes(), (kind, dtype)


def test_tpu_devices_report_what_jax_does(client, device):
    if client.platform_name != "tpu":
        pytest.skip("not a TPU")
    assert device.coords == list(device.attributes["coords"]) and device.core_on_chip == 0
    assert device.to_string().startswith(f"TpuDevice(id={device.id}, process_index=0, coords=(")
    assert {str(m.kind) for m in device.memories()} == {"device", "pinned_host", "unpinned_host"}
    assert str(device.default_memory().kind) == "device"
