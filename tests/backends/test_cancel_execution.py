"""Client.cancel_execution: the PjRt backend says why it cannot cancel; the reference
backend's executions have always finished (False), and the outputs stand."""

from __future__ import annotations

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.errors import InvalidArgumentError, UnimplementedError
from pjrt_helpers import ADD_ONE_F32_4

ADD_ONE = ADD_ONE_F32_4
X = np.arange(4, dtype=np.float32)


def execute(client):
    exe = client.compile(ifrt.HloProgram(ADD_ONE))
    arg = client.make_array_from_host_buffer(X, ifrt.SingleDeviceSharding(client.devices()[0]))
    return exe.execute([arg], ifrt.ExecuteOptions(fill_status=True))


def test_the_pjrt_backend_says_it_cannot_cancel():
    client = ifrt.get_client(device_count=1)
    result = execute(client)
    with pytest.raises(UnimplementedError, match="PJRT C API .* has no call to cancel"):
        client.cancel_execution(result)
    result.status.result(timeout=120)  # a bound on a hang
    np.testing.assert_array_equal(np.asarray(result.outputs[0]), X + 1)


def test_the_reference_backend_has_always_finished():
    client = ifrt.get_client("reference", device_count=1)
    result = execute(client)
    assert client.cancel_execution(result) is False
    assert client.cancel_execution(result, ifrt.errors.CancelledError("again")) is False
    np.testing.assert_array_equal(np.asarray(result.outputs[0]), X + 1)
    with pytest.raises(InvalidArgumentError, match="ExecuteResult"):
        client.cancel_execution("not a result")
