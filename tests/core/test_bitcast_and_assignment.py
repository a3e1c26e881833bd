"""Client.default_device_assignment and Client.bitcast_arrays on both backends, against
NumPy (``ndarray.view``) and each other."""

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy import ArraySpec, DType, Shape, errors

ALWAYS_COPY = ifrt.ArrayCopySemantics.ALWAYS_COPY
DONATE = ifrt.ArrayCopySemantics.DONATE_INPUT
REUSE = ifrt.ArrayCopySemantics.REUSE_INPUT


@pytest.fixture(scope="module", params=["pjrt", "reference"])
def client(request):
    return ifrt.get_client(request.param, device_count=4)


@pytest.mark.parametrize("replicas, partitions", [(1, 1), (4, 1), (1, 4), (2, 2)])
def test_default_device_assignment_agrees_across_backends(replicas, partitions):
    pjrt = ifrt.get_client("pjrt", device_count=4).default_device_assignment(replicas, partitions)
    ref = ifrt.get_client("reference", device_count=4).default_device_assignment(replicas, partitions)
    assert pjrt.shape == (replicas, partitions)
    np.testing.assert_array_equal(pjrt, ref)


@pytest.mark.parametrize("args, match", [
    ((0, 1), "num_replicas must be an int >= 1"), ((1, -2), "num_partitions"),
    ((True, 1), "num_replicas"), ((1.0, 1), "num_replicas"), ((3, 2), "needs 6 devices"),
])
def test_default_device_assignment_refuses_bad_counts(client, args, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        client.default_device_assignment(*args)


@pytest.mark.parametrize("src, dst, new_dims", [
    (np.float32, np.int32, (3, 2)),       # same width, new shape
    (np.float32, np.uint8, (24,)),        # narrower elements
    (np.int16, np.float64, (3,)),         # wider elements
    (np.complex64, np.float32, (6,)),
])
@pytest.mark.parametrize("semantics", [ALWAYS_COPY, REUSE, DONATE])
def test_bitcast_equals_numpy_view(client, src, dst, new_dims, semantics):
    count = 24 // np.dtype(src).itemsize
    x = (np.arange(count) * 1.5 + 1).astype(src).reshape(count // 3, 3)
    device = client.devices()[1]
    a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(device))
    spec = ArraySpec(DType.from_numpy(dst), Shape(new_dims), ifrt.SingleDeviceSharding(device))
    if client.runtime_type == "pjrt_ifrt" and np.dtype(src).kind == "c":
        with pytest.raises(errors.UnimplementedError, match="complex"):
            client.bitcast_arrays([a], [spec], semantics)
        assert not a.is_deleted()
        return
    (b,) = client.bitcast_arrays([a], [spec], semantics)
    np.testing.assert_array_equal(np.asarray(b), x.reshape(-1).view(dst).reshape(new_dims))
    assert b.sharding is spec.sharding and b.dtype == spec.dtype
    assert a.is_deleted() == (semantics == DONATE)


def test_bitcast_of_a_sharded_array_works_shard_by_shard(client):
    devices = client.devices()
    mesh = ifrt.Mesh(np.array(devices), ("x",))
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    a = client.make_array_from_host_buffer(x, ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x")))
    target = ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x"))
    (b,) = client.bitcast_arrays(
        [a], [ArraySpec(DType.from_numpy(np.uint16), Shape([4, 4]), target)])
    np.testing.assert_array_equal(np.asarray(b), x.view(np.uint16))


def test_bitcast_refusals_leave_the_inputs_alone(client):
    d0, d1 = client.devices()[:2]
    a = client.make_array_from_host_buffer(np.zeros((2, 3), np.float32), ifrt.SingleDeviceSharding(d0))
    f32 = DType.from_numpy(np.float32)
    cases = [
        ([a], [], errors.InvalidArgumentError, "1 arrays but 0 specs"),
        ([a], [ArraySpec(f32, Shape([6]), ifrt.SingleDeviceSharding(d1))],
         errors.InvalidArgumentError, "addressable devices"),
        ([a], [ArraySpec(f32, Shape([5]), ifrt.SingleDeviceSharding(d0))],
         errors.InvalidArgumentError, r"24 bytes.*20 bytes"),
        ([a], [ArraySpec(DType.from_numpy(np.dtype("int4")), Shape([48]),
                         ifrt.SingleDeviceSharding(d0))], errors.UnimplementedError, "whole number"),
        ([np.zeros(3)], [ArraySpec(f32, Shape([6]), ifrt.SingleDeviceSharding(d0))],
         errors.InvalidArgumentError, "array 0 must be an Array of this client"),
    ]
    for arrays, specs, error, match in cases:
        with pytest.raises(error, match=match):
            client.bitcast_arrays(arrays, specs, DONATE)
    assert not a.is_deleted()
