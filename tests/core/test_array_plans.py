"""The array contracts written once (ifrtpy.array_plans, ifrtpy.array, ifrtpy.bitcast):
every backend refuses the same inputs with the same error, because each calls the plan."""

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy import ArraySpec, DType, Shape
from ifrtpy.array_plans import plan_disassemble
from ifrtpy.bitcast import plan_bitcast
from ifrtpy.errors import FailedPreconditionError, InternalError, InvalidArgumentError
from ifrtpy.testing.example_backend import ExampleArray, create_client

ALL = ifrt.SingleDeviceShardSemantics.ALL_SHARDS
ADDRESSABLE = ifrt.SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
REUSE = ifrt.ArrayCopySemantics.REUSE_INPUT
DONATE = ifrt.ArrayCopySemantics.DONATE_INPUT


def _replicated(client):
    mesh = ifrt.Mesh(np.array(client.devices()[:4]), ("x",))
    return ifrt.NamedSharding(mesh, ifrt.PartitionSpec())


@pytest.fixture(scope="module", params=["example", "reference"])
def partly_addressable(request):
    """A client with 6 devices of which 4 are this process's."""
    if request.param == "example":
        return create_client(6, addressable_device_count=4)
    return ifrt.get_client("reference", device_count=6, addressable_device_count=4)


def test_disassemble_with_all_shards_is_refused_alike_where_devices_are_remote(partly_addressable):
    client = partly_addressable
    mesh = ifrt.Mesh(np.array(client.devices()), ("x",))
    array = client.make_array_from_host_buffer(
        np.arange(6.0), ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x")))
    with pytest.raises(InvalidArgumentError,
                       match=r"^disassemble with SingleDeviceShardSemantics.ALL_SHARDS needs "
                             r"every device addressable; NamedSharding"):
        array.disassemble_into_single_device_arrays(REUSE, ALL)
    assert len(array.disassemble_into_single_device_arrays(REUSE, ADDRESSABLE)) == 4


@pytest.mark.parametrize("backend", ["example", "reference", "pjrt"])
def test_a_deleted_array_is_refused_alike_by_disassemble(backend):
    client = (create_client(4) if backend == "example"
              else ifrt.get_client(backend, device_count=4))
    array = client.make_array_from_host_buffer(np.arange(4.0), _replicated(client))
    array.delete()
    with pytest.raises(FailedPreconditionError, match="^Array has been deleted or donated: "):
        array.disassemble_into_single_device_arrays()
    with pytest.raises(FailedPreconditionError, match="^Array has been deleted or donated: "):
        plan_disassemble(array, REUSE, ADDRESSABLE)


@pytest.mark.parametrize("backend", ["example", "reference", "pjrt"])
def test_the_replicated_shard_of_an_error_array_fails_with_its_error(backend):
    client = (create_client(4) if backend == "example"
              else ifrt.get_client(backend, device_count=4))
    error = InternalError("injected")
    spec = ArraySpec(DType.from_numpy(np.float32), Shape([3]), _replicated(client))
    (array,) = client.make_error_arrays(error, [spec])
    shard = array.fully_replicated_shard()
    assert shard.shape == Shape([3]) and list(shard.sharding.devices) == [client.devices()[0]]
    assert shard.ready_future().exception() is error


def test_plan_bitcast_refuses_a_deleted_array_after_every_shape_check():
    """A backend that carries out plan_bitcast needs no liveness check of its own; the
    shape checks of all arrays come first (the order the backends have always had)."""
    client = create_client(2)
    sharding = ifrt.SingleDeviceSharding(client.devices()[0])
    live = client.make_array_from_host_buffer(np.zeros(4, np.float32), sharding)
    gone = client.make_array_from_host_buffer(np.zeros(4, np.float32), sharding)
    gone.delete()
    f32, u8 = DType.from_numpy(np.float32), DType.from_numpy(np.uint8)
    fits = ArraySpec(u8, Shape([16]), sharding)
    with pytest.raises(FailedPreconditionError, match="deleted or donated"):
        plan_bitcast(client, [gone, live], [fits, fits], DONATE, ExampleArray)
    with pytest.raises(InvalidArgumentError, match="shard 0 of array 1"):
        plan_bitcast(client, [gone, live], [fits, ArraySpec(f32, Shape([3]), sharding)],
                     DONATE, ExampleArray)
    (plan,) = plan_bitcast(client, [live], [fits], DONATE, ExampleArray)
    assert plan.new_shards == ((16,),) and not live.is_deleted()


def test_plan_bitcast_refuses_an_array_of_another_class_of_the_client():
    client = create_client(2)
    sharding = ifrt.SingleDeviceSharding(client.devices()[0])
    array = client.make_array_from_host_buffer(np.zeros(4, np.float32), sharding)
    spec = ArraySpec(DType.from_numpy(np.int32), Shape([4]), sharding)

    class Other(ExampleArray):
        pass

    with pytest.raises(InvalidArgumentError, match="array 0 is not an array of this client"):
        plan_bitcast(client, [array], [spec], REUSE, Other)
