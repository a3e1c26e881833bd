"""What the PjRt backend does around known faults of accelerator plugins, checked on the
CPU plugin standing in for them (the faults themselves are the TPU's: see
tests/backends/pjrt/test_accelerator.py, which runs on one)."""

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.backends.pjrt import put


@pytest.fixture
def client(monkeypatch):
    # As on libtpu 0.0.42: complex128 put into pinned_host comes back scrambled, so it
    # goes into device memory first and is copied there.
    monkeypatch.setattr(put, "_scrambles_complex128",
                        lambda client, sharding: sharding.memory_kind.value == "pinned_host")
    return ifrt.get_client("pjrt", device_count=2)


@pytest.mark.parametrize("dtype", [np.complex128, np.float64])
def test_a_put_into_pinned_host_memory_that_a_plugin_scrambles(client, dtype):
    device = client.devices()[0]
    x = (np.arange(6) + 1j * np.arange(6, 12) if dtype == np.complex128 else np.arange(6.0)).reshape(2, 3)
    done = []
    for sharding in [ifrt.SingleDeviceSharding(device, "pinned_host"),
                     ifrt.ConcreteEvenSharding(client.devices(), [2, 3], [2, 3], True, "pinned_host")]:
        for _ in range(2):  # the second put of a single-device sharding takes the fast path where cached
            array = client.make_array_from_host_buffer(x, sharding, on_done=lambda: done.append(1))
            assert array.sharding is sharding and not array.is_deleted()
            assert all(b.memory.kind == "pinned_host" for b in array.buffers)
            np.testing.assert_array_equal(np.asarray(array), x)
    assert len(done) == 4
    assert not any(s.memory_kind.value == "pinned_host" for s, _ in client._memory_cache.values())
