"""PyTorch and TensorFlow both ways through DLPack (skipped where the package is absent).

Addresses prove zero-copy: ``data_ptr()`` for torch; for TensorFlow, which shows no
address, a round trip ifrtpy -> TensorFlow -> ifrtpy that lands on the same address.
"""

import numpy as np
import pytest

import ifrtpy as ifrt


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=2)


def _put(client, x):
    return client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(client.devices()[1]))


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint8", "int64", "bool",
                                   "complex64", "bfloat16", "float16"])
def test_torch_both_ways(client, dtype):
    torch = pytest.importorskip("torch")
    t = torch.arange(24).reshape(2, 3, 4).to(getattr(torch, dtype))
    a = ifrt.from_dlpack(t, client)
    assert a.unsafe_buffer_pointer() == t.data_ptr()  # torch allocates 64-byte aligned
    u = torch.from_dlpack(a)
    assert u.data_ptr() == a.unsafe_buffer_pointer()
    assert u.dtype == t.dtype and torch.equal(u, t)
    strided = t.transpose(0, 2)[::2]
    b = ifrt.from_dlpack(strided, client)  # one copy
    assert torch.equal(torch.from_dlpack(b), strided.contiguous())
    del t, strided
    assert torch.equal(u, torch.arange(24).reshape(2, 3, 4).to(getattr(torch, dtype)))


@pytest.mark.torch
def test_torch_tensors_keep_ifrtpy_memory(client):
    torch = pytest.importorskip("torch")
    x = np.arange(1000, dtype=np.float32)
    a = _put(client, x)
    t = torch.from_dlpack(a)
    a.delete()  # deferred while torch holds the buffer
    np.testing.assert_array_equal(t.numpy(), x)


@pytest.mark.tensorflow
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.uint8, np.complex128, np.bool_])
def test_tensorflow_both_ways(client, dtype):
    tf = pytest.importorskip("tensorflow")
    x = (np.arange(24) % 2 if dtype is np.bool_ else np.arange(24)).astype(dtype).reshape(4, 6)
    a = _put(client, x)
    t = tf.experimental.dlpack.from_dlpack(a.__dlpack__())  # TensorFlow takes legacy capsules
    np.testing.assert_array_equal(t.numpy(), x)
    back = ifrt.from_dlpack(tf.experimental.dlpack.to_dlpack(t), client)
    np.testing.assert_array_equal(np.asarray(back), x)
    assert back.unsafe_buffer_pointer() == a.unsafe_buffer_pointer()  # aliased both ways
    c = ifrt.from_dlpack(tf.constant(x), client)  # a producer object (__dlpack__)
    np.testing.assert_array_equal(np.asarray(c), x)
