"""Messages that name what is wrong and the fix, the same on every backend: a mesh in
another device order, a deleted or donated array on every use, keyword arguments to an
executable, and create options given twice."""

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError

BACKENDS = ["pjrt", "reference", "jax"]

IDENTITY = """func.func public @main(%x: tensor<8xf32> {mhlo.sharding = "{devices=[8]<=[8]}"})
    -> (tensor<8xf32> {mhlo.sharding = "{devices=[8]<=[8]}"}) {
  return %x : tensor<8xf32>
}"""
DONATING = """func.func public @main(%x: tensor<4xf32> {jax.buffer_donor = true}) -> tensor<4xf32> {
  %y = stablehlo.add %x, %x : tensor<4xf32>
  return %y : tensor<4xf32>
}"""


def _client(backend):
    return ifrt.get_client(backend, **({} if backend == "jax" else {"device_count": 8}))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mesh_in_another_device_order_says_so_and_reshard_fixes_it(backend):
    client = _client(backend)
    devices = client.devices()[:8]
    exe = client.compile(ifrt.HloProgram(IDENTITY),
                         ifrt.CompileOptions(devices=devices, num_partitions=8))
    mesh = ifrt.Mesh(np.array(devices[::-1]), ("x",))
    x = np.arange(8, dtype=np.float32)
    a = client.make_array_from_host_buffer(x, ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x")))
    with pytest.raises(InvalidArgumentError, match=r"argument 0 of main is on the devices the "
                       r"executable runs on, but in another order: .*reshard_arrays"):
        exe(a)
    # what the message says to do
    moved, = client.reshard_arrays(
        [a], [ifrt.ArraySpec(a.dtype, a.shape, exe.parameter_shardings()[0])])
    np.testing.assert_array_equal(np.asarray(exe(moved)[0]), x)
    other = ifrt.Mesh(np.array(devices[:4]), ("x",))
    b = client.make_array_from_host_buffer(x, ifrt.NamedSharding(other, ifrt.PartitionSpec("x")))
    with pytest.raises(InvalidArgumentError, match=r"argument 0 of main is on \[.*\], the "
                       r"executable runs on") as info:
        exe(b)
    assert "another order" not in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_deleted_and_donated_arrays_say_the_same_on_every_use(backend):
    client = _client(backend)
    device = client.devices()[0]
    exe = client.compile(ifrt.HloProgram(DONATING), ifrt.CompileOptions(devices=[device]))
    messages = set()
    for how in ("donated", "deleted"):
        a = client.make_array_from_host_buffer(np.ones(4, np.float32),
                                               ifrt.SingleDeviceSharding(device))
        if how == "donated":
            exe(a)
        else:
            a.delete()
        assert a.is_deleted()
        for use in (lambda: np.asarray(a), lambda: a.copy_to_host_buffer().result(),
                    lambda: a.ready_future().result(), a.block_until_ready,
                    a.disassemble_into_single_device_arrays, lambda: client.copy_arrays([a])):
            with pytest.raises(FailedPreconditionError) as info:
                use()
            messages.add(str(info.value))
        with pytest.raises(InvalidArgumentError, match="argument 0 of main has been deleted "
                           "or donated: delete.. frees an array; an execution takes"):
            exe.execute([a], ifrt.ExecuteOptions())
    assert len(messages) == 1, messages
    message = messages.pop()
    assert message.startswith("Array has been deleted or donated: ")
    for part in ("delete() frees an array", "non_donatable_input_indices", "DONATE_INPUT"):
        assert part in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyword_arguments_to_an_executable_are_refused_with_the_way_to_call_it(backend):
    client = _client(backend)
    device = client.devices()[0]
    exe = client.compile(ifrt.HloProgram(DONATING), ifrt.CompileOptions(devices=[device]))
    a = client.make_array_from_host_buffer(np.ones(4, np.float32), ifrt.SingleDeviceSharding(device))
    for _ in range(2):  # the second call is the one the C paths repeat
        with pytest.raises(TypeError, match=r"main takes its arguments by position, in the order "
                           r"of the program's parameters, not by keyword \(got x=\): call it as "
                           r"executable\(a, b, ...\)"):
            exe(x=a)
        out, = exe(a)
        a = out


def test_create_options_given_twice_are_refused():
    for kwargs, message in [
            ({"cpu_device_count": 3, "device_count": 4},
             "given twice, as cpu_device_count=3 and as device_count=4"),
            ({"options": {"cpu_device_count": 2}, "device_count": 4},
             r"given twice, as options\['cpu_device_count'\]=2 and as device_count=4"),
            ({"options": {"cpu_device_count": 2}, "cpu_device_count": 5},
             r"given twice, as options\['cpu_device_count'\]=2 and as cpu_device_count=5")]:
        with pytest.raises(InvalidArgumentError, match=message):
            ifrt.get_client("cpu", **kwargs)
    # the same value twice says the same thing: taken
    assert len(ifrt.get_client("cpu", cpu_device_count=3, device_count=3).devices()) == 3
