"""The whole conformance suite (arrays, tuples, clients, executables, remaps and the
NumPy laws) against the reference backend: 8 virtual CPU devices, all addressable; and
the array cases again on a client where only 4 of 6 devices are addressable, for the
cases that need non-addressable devices."""

import pytest

import ifrtpy as ifrt
from ifrtpy.testing.conformance import ONE_PROCESS_SKIPS, case_classes, cases, declaration_of

#: What the reference backend does not do: the declaration it ships
#: (ifrtpy/backends/reference/conformance.py), which the plugin's runs use too.
DECLARATION = declaration_of("reference")
globals().update(case_classes(expected_skips=DECLARATION))


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("reference", device_count=8)


class TestArraysWithNonAddressableDevices:
    """IFRT's fake fixture: 6 devices, the first 4 addressable."""

    locals().update({name: staticmethod(test)
                     for name, test in cases("arrays", ONE_PROCESS_SKIPS).items()})

    @pytest.fixture(scope="class")
    @classmethod
    def client(cls):
        return ifrt.get_client("reference", device_count=6, addressable_device_count=4)


# -- the reference backend's own paths --------------------------------------------------------

from ifrtpy.program.mlir import ELEMENT_TYPES  # noqa: E402
from ifrtpy.testing import strategies as S  # noqa: E402
from ifrtpy.testing.asserts import assert_array_matches  # noqa: E402


@pytest.mark.parametrize("dtype", S.DTYPES, ids=str)
def test_every_dtype_passes_through_the_interpreter(client, dtype):
    """Parameters and results of every element type reach the interpreter and come back
    bit for bit (the wrapper converts what the interpreter's bindings cannot pass)."""
    import numpy as np

    kind = ifrt.DType.from_numpy(dtype).kind
    element = next(k for k, v in ELEMENT_TYPES.items() if v == kind)
    tensor = f"tensor<2x3x{element}>"
    program = (f"module @identity {{ func.func @main(%a: {tensor}, %b: {tensor}) -> ({tensor}, "
               f"{tensor}) {{ return %b, %a : {tensor}, {tensor} }} }}")
    x = np.arange(6).astype(dtype).reshape(2, 3)
    y = x[::-1].copy()
    device = client.addressable_devices()[1]
    executable = client.compile(program, ifrt.CompileOptions(devices=[device]))
    sharding = ifrt.SingleDeviceSharding(device)
    a, b = (client.make_array_from_host_buffer(v, sharding) for v in (x, y))
    first, second = executable.execute([a, b]).outputs
    assert_array_matches(first, y, sharding=sharding)
    assert_array_matches(second, x, sharding=sharding)


def test_custom_calls_and_replicas_of_partitions_are_unimplemented(client):
    program = """module @cc { func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
      %0 = stablehlo.custom_call @my_kernel(%a) : (tensor<2xf32>) -> tensor<2xf32>
      return %0 : tensor<2xf32> } }"""
    with pytest.raises(ifrt.errors.UnimplementedError, match="my_kernel"):
        client.compile(program)
    with pytest.raises(ifrt.errors.UnimplementedError, match="num_partitions=1 only"):
        client.compile("module { func.func @main() { return } }",
                       ifrt.CompileOptions(num_replicas=2, num_partitions=2))


@pytest.mark.parametrize("body", [
    '%0 = "stablehlo.dot"(%a, %a) : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>',
    "%0 = chlo.erf %a : tensor<2x2xf32> -> tensor<2x2xf32>",
    '%0 = "stablehlo.einsum"(%a, %a) {einsum_config = "ab,bc->ac"} : '
    "(tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>",
], ids=["dot", "chlo", "einsum"])
def test_ops_the_interpreter_would_abort_on_are_refused_at_compile_time(client, body):
    program = (f"module @m {{ func.func @main(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {{\n"
               f"{body}\n return %0 : tensor<2x2xf32> }} }}")
    with pytest.raises(ifrt.errors.UnimplementedError, match="does not run"):
        client.compile(program)
