"""One default client per backend: ``get_client()`` without options returns it, and the
helpers that take no client (``from_jax``, ``from_dlpack``, ``device_put``) use it; with
options, a new client. Arrays of another client, and raw jax arrays, are refused with a
message naming both clients and the way to bring the array over."""

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.backends import default_client
from ifrtpy.errors import InvalidArgumentError

ADD_ONE = """
func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %y = stablehlo.add %x, %one : tensor<4xf32>
  return %y : tensor<4xf32>
}"""


@pytest.mark.parametrize("backend", ["pjrt", "reference", "jax", "cpu"])
def test_get_client_without_options_is_the_default(backend):
    client = ifrt.get_client(backend)
    assert client is ifrt.get_client(backend) is default_client(backend)
    with_options = ifrt.get_client(backend, **({"platform": "cpu"} if backend == "jax"
                                               else {"device_count": 2}))
    assert with_options is not client


def test_the_cpu_plugin_by_name_is_the_pjrt_default():
    assert ifrt.get_client("cpu") is ifrt.get_client("pjrt") is ifrt.get_client()


def test_the_default_cpu_client_has_the_cpu_device_count_jax_is_given():
    """tests/conftest.py gives jax 8 CPU devices through XLA_FLAGS: the default PjRt
    client has as many, so jax's device i is its device i."""
    jax = pytest.importorskip("jax")
    assert len(ifrt.get_client().devices()) == len(jax.devices("cpu")) == 8


def test_helpers_without_a_client_use_the_default():
    jax = pytest.importorskip("jax")
    client = ifrt.get_client()
    x = np.arange(4, dtype=np.float32)
    assert ifrt.device_put(x).client is client
    assert ifrt.device_put(x).sharding.devices[0] is client.addressable_devices()[0]
    assert ifrt.from_dlpack(x).client is client
    j = jax.numpy.arange(4.0, dtype=np.float32)
    assert ifrt.from_jax(j).client is client
    assert ifrt.device_put(j).client is client
    # What a jax user writes: the arrays from_jax makes run on get_client()'s executables.
    exe = client.compile(ifrt.HloProgram(ADD_ONE))
    out, = exe(ifrt.from_jax(j))
    np.testing.assert_array_equal(np.asarray(out), x + 1)


def test_an_array_of_another_client_names_both_clients_and_the_way_over():
    client = ifrt.get_client()
    other = ifrt.get_client("pjrt", device_count=2)
    exe = client.compile(ifrt.HloProgram(ADD_ONE))
    stranger = other.make_array_from_host_buffer(np.zeros(4, np.float32),
                                                 ifrt.SingleDeviceSharding(other.devices()[0]))
    with pytest.raises(InvalidArgumentError) as info:
        exe(stranger)
    message = str(info.value)
    assert f"{id(other):#x}" in message and f"{id(client):#x}" in message
    for fix in ("ifrt.from_jax(x, client)", "ifrt.device_put(np.asarray(array), sharding)",
                "copy_arrays", "ifrt.get_client() without options"):
        assert fix in message
    with pytest.raises(InvalidArgumentError, match="not an array of this client"):
        client.copy_arrays([stranger])


@pytest.mark.parametrize("backend", ["pjrt", "reference", "jax"])
def test_a_jax_array_passed_to_an_executable_points_to_from_jax(backend):
    jax = pytest.importorskip("jax")
    client = ifrt.get_client(backend)
    exe = client.compile(ifrt.HloProgram(ADD_ONE),
                         ifrt.CompileOptions(devices=client.devices()[:1]))
    with pytest.raises(InvalidArgumentError, match=r"is a jax\.Array, not an ifrtpy array: "
                       r"bring it in with ifrt\.from_jax\(x, client\)"):
        exe(jax.numpy.zeros(4, np.float32))
