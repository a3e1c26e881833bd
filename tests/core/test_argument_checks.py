"""The per-argument contract of execute (``ifrtpy.execute_checks.ArgumentChecks``): one
check for every backend, with a bounded memo of the placements it accepted."""

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
