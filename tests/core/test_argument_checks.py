"""The per-argument contract of execute (``ifrtpy.execute_checks.ArgumentChecks``): one
check for every backend, with a bounded memo of the placements it accepted."""

import re

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy import errors
from ifrtpy.execute_checks import ArgumentChecks

ADD_ONE = """func.func public @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %c = stablehlo.constant dense<1.0> : tensor<8xf32>
  %y = stablehlo.add %x, %c : tensor<8xf32>
  return %y : tensor<8xf32>
}"""


@pytest.fixture(params=["pjrt", "reference"])
def client(request):
    return ifrt.get_client(request.param, device_count=8)


def test_the_memo_of_placements_stays_bounded_and_checks_after_it_is_cleared(client, monkeypatch):
    monkeypatch.setattr(ArgumentChecks, "ENTRIES", 3)
    exe = client.compile(ifrt.HloProgram(ADD_ONE),
                         ifrt.CompileOptions(compile_portable_executable=True))
    x = np.arange(8, dtype=np.float32)
    devices = client.devices()
    for device in devices:  # one placement per device: more than the memo holds
        a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(device))
        out = exe.execute([a], devices=ifrt.DeviceList([device])).outputs[0]
        np.testing.assert_array_equal(np.asarray(out), x + 1)
        assert len(exe._execute_contract.arguments._placed) <= 3
    a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(devices[0]))
    with pytest.raises(errors.InvalidArgumentError, match="argument 0"):
        exe.execute([a], devices=ifrt.DeviceList([devices[1]]))


def test_a_string_array_is_refused_by_name(client):
    exe = client.compile(ifrt.HloProgram(ADD_ONE))
    strings = client.make_array_from_host_buffer(
        np.array(["a"] * 8, dtype=object), ifrt.SingleDeviceSharding(client.devices()[0]))
    with pytest.raises(errors.UnimplementedError, match="argument 0 .* STRING"):
        exe(strings)


def test_a_backend_that_does_not_know_its_parameters_still_gets_the_contract():
    # The example backend's programs are Python functions (ExecuteContract with parameters
    # None): execute still refuses a deleted executable, a deleted or foreign argument and
    # a device for a bound executable before its launch runs.
    from ifrtpy.testing.example_backend import create_client

    client, other = create_client(2), create_client(2)
    calls = []
    exe = client.compile(lambda a: calls.append(a) or [a + 1])
    x = np.arange(4.0)
    a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(client.devices()[0]))
    np.testing.assert_array_equal(np.asarray(exe(a)[0]), x + 1)
    gone = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(client.devices()[0]))
    gone.delete()
    with pytest.raises(errors.InvalidArgumentError, match="argument 0 of .* deleted"):
        exe(gone)
    foreign = other.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(other.devices()[0]))
    with pytest.raises(errors.InvalidArgumentError, match="not an array of this client"):
        exe(foreign)
    with pytest.raises(errors.InvalidArgumentError, match="compiled for"):
        exe.execute([a], devices=ifrt.DeviceList([client.devices()[1]]))
    exe.delete()
    with pytest.raises(errors.FailedPreconditionError, match="deleted"):
        exe(a)
    assert len(calls) == 1  # only the first call reached the launch


#: x + 1 over two devices, its parameter split in two
SPLIT_ADD_ONE = """func.func public @main(%x: tensor<8xf32> {mhlo.sharding = "{devices=[2]<=[2]}"})
    -> (tensor<8xf32> {mhlo.sharding = "{devices=[2]<=[2]}"}) {
  %c = stablehlo.constant dense<1.0> : tensor<8xf32>
  %y = stablehlo.add %x, %c : tensor<8xf32>
  return %y : tensor<8xf32>
}"""


def test_an_argument_on_other_devices_is_refused_saying_how_to_copy_it(client):
    exe = client.compile(ifrt.HloProgram(ADD_ONE))  # on device 0
    x = np.arange(8, dtype=np.float32)
    a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(client.devices()[1]))
    hint = "client.copy_arrays([array], devices=executable.devices()) copies it there"
    with pytest.raises(errors.InvalidArgumentError, match=re.escape(hint)):
        exe.execute([a])
    (moved,) = client.copy_arrays([a], devices=exe.devices())  # what it says, done
    np.testing.assert_array_equal(np.asarray(exe.execute([moved]).outputs[0]), x + 1)


def test_an_argument_in_another_sharding_is_refused_saying_how_to_reshard_it(client):
    devices = client.make_device_list(client.devices()[:2])
    exe = client.compile(ifrt.HloProgram(SPLIT_ADD_ONE), ifrt.CompileOptions(devices=devices, num_partitions=2))
    x = np.arange(8, dtype=np.float32)
    mesh = ifrt.Mesh(np.array(client.devices()[:2]), ("x",))
    a = client.make_array_from_host_buffer(x, ifrt.NamedSharding(mesh, ifrt.PartitionSpec()))
    hint = ("client.reshard_arrays([array], [ArraySpec(array.dtype, array.shape, "
            "executable.parameter_shardings()[0])]) reshards it as the executable takes it")
    with pytest.raises(errors.InvalidArgumentError, match=re.escape(hint)):
        exe.execute([a])
    (moved,) = client.reshard_arrays([a], [ifrt.ArraySpec(a.dtype, a.shape, exe.parameter_shardings()[0])])
    np.testing.assert_array_equal(np.asarray(exe.execute([moved]).outputs[0]), x + 1)
