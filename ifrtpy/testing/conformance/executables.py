"""IFRT's executable conformance cases (``executable_impl_test_lib.cc``), written against
the ifrtpy interfaces only.

Run them with :func:`~ifrtpy.testing.conformance.case_classes` from a backend's test
module that provides a ``client`` fixture (see :mod:`ifrtpy.testing.conformance`).

Every case runs twice, as in IFRT: on the executable as compiled (``direct``), and on the
one ``serialize()`` then ``client.deserialize_executable()`` gives back (``serialize``).
The programs are StableHLO text, written here. The common data is IFRT's: f32[2,3]
holding 0..5 on addressable device 0.
"""

from __future__ import annotations


import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.errors import FailedPreconditionError, IfrtError, UnimplementedError
from ifrtpy.sharding import Mesh, NamedSharding, PartitionSpec
from ifrtpy.shape import Shape
from ifrtpy.sharding import SingleDeviceSharding
from ifrtpy.user_context import UserContext, UserContextScope
from ifrtpy.testing.conformance._helpers import addressable_devices as _devices

F32 = ifrt.DType.from_numpy(np.float32)
SHAPE = Shape([2, 3])
TIMEOUT_S = 10.0

#: ``add_sub`` on 2 partitions: arg 0 split in rows, arg 1 replicated; the sum comes out
#: replicated and the difference split in rows.
ADD_SUB = """
module @add_sub {
  func.func @main(
      %arg0: tensor<2x3xf32> {mhlo.sharding = "{devices=[2,1]<=[2]}"},
      %arg1: tensor<2x3xf32> {mhlo.sharding = "{replicated}"})
      -> (tensor<2x3xf32> {mhlo.sharding = "{replicated}"},
          tensor<2x3xf32> {mhlo.sharding = "{devices=[2,1]<=[2]}"}) {
    %0 = stablehlo.add %arg0, %arg1 : tensor<2x3xf32>
    %1 = stablehlo.subtract %arg0, %arg1 : tensor<2x3xf32>
    return %0, %1 : tensor<2x3xf32>, tensor<2x3xf32>
  }
}
"""

#: ``add_one`` on one device.
ADD_ONE = """
module @add_one {
  func.func @main(%arg0: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %2 = stablehlo.add %arg0, %1 : tensor<2x3xf32>
    return %2 : tensor<2x3xf32>
  }
}
"""

#: Three parameters, 0 and 2 marked ``jax.buffer_donor``.
DONATABLE = """
module @donatable {
  func.func @main(
      %arg0: tensor<2x3xf32> {jax.buffer_donor = true},
      %arg1: tensor<2x3xf32>,
      %arg2: tensor<2x3xf32> {jax.buffer_donor = true})
      -> (tensor<2x3xf32>, tensor<2x3xf32>) {
    %0 = stablehlo.add %arg0, %arg1 : tensor<2x3xf32>
    %1 = stablehlo.subtract %arg2, %arg1 : tensor<2x3xf32>
    return %0, %1 : tensor<2x3xf32>, tensor<2x3xf32>
  }
}
"""

#: ``add_sub`` on one device with both parameters donors.
DONATE_BOTH = """
module @add_sub_donate {
  func.func @main(
      %arg0: tensor<2x3xf32> {jax.buffer_donor = true},
      %arg1: tensor<2x3xf32> {jax.buffer_donor = true})
      -> (tensor<2x3xf32>, tensor<2x3xf32>) {
    %0 = stablehlo.add %arg0, %arg1 : tensor<2x3xf32>
    %1 = stablehlo.subtract %arg0, %arg1 : tensor<2x3xf32>
    return %0, %1 : tensor<2x3xf32>, tensor<2x3xf32>
  }
}
"""

#: No parameters and no results.
NO_INPUT_OUTPUT = """
module @no_input_output {
  func.func @main() {
    return
  }
}
"""

SERIALIZE = pytest.mark.parametrize("serialize", [False, True], ids=["direct", "serialize"])


# -- helpers ------------------------------------------------------------------------------

def _iota(shape=(2, 3), dtype=np.float32) -> np.ndarray:
    return np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)


def _host(array) -> np.ndarray:
    return array.copy_to_host_buffer().result(timeout=TIMEOUT_S)


def _compile(client, program: str, devices, serialize: bool, *, num_partitions=None,
             portable: bool = False, **options_fields):
    """Compile ``program`` on ``devices`` (SPMD over them), and with ``serialize`` return
    what serialize -> deserialize_executable gives back instead (with the same devices).
    ``options_fields`` are more CompileOptions fields."""
    if portable:
        options = ifrt.CompileOptions(compile_portable_executable=True, **options_fields)
    else:
        n = len(devices) if num_partitions is None else num_partitions
        options = ifrt.CompileOptions(devices=client.make_device_list(devices), num_partitions=n,
                                      **options_fields)
    executable = client.compile(program, options)
    if not serialize:
        return executable
    data = executable.serialize()
    assert isinstance(data, bytes) and data
    return client.deserialize_executable(data, None if portable else options)


def _domains(sharding, shape=SHAPE) -> list:
    return [(d, dom) for d, dom in zip(sharding.devices, sharding.index_domains(shape))]


def _assert_same_domains(actual, expected, what: str) -> None:
    """Same devices, each holding the same part of the array (not the same spelling)."""
    assert list(actual.devices) == list(expected.devices), what
    assert _domains(actual) == _domains(expected), f"{what}: {actual!r} vs {expected!r}"
    assert actual.is_fully_replicated == expected.is_fully_replicated, what


# -- properties ---------------------------------------------------------------------------

@SERIALIZE
def test_properties(client, serialize):
    devices = _devices(client, 2)
    executable = _compile(client, ADD_SUB, devices, serialize)
    assert executable.name == "add_sub"
    assert executable.num_devices == 2
    assert list(executable.devices()) == devices
    assert executable.client is client
    mesh = Mesh(np.array(devices, dtype=object), ("x",))
    tiled = NamedSharding(mesh, PartitionSpec("x", None))
    replicated = NamedSharding(mesh, PartitionSpec())
    params = executable.parameter_shardings()
    outputs = executable.output_shardings()
    if params is None or outputs is None:
        pytest.skip("the backend does not report shardings")
    assert len(params) == 2 and len(outputs) == 2
    _assert_same_domains(params[0], tiled, "parameter 0")
    _assert_same_domains(params[1], replicated, "parameter 1")
    _assert_same_domains(outputs[0], replicated, "output 0")
    _assert_same_domains(outputs[1], tiled, "output 1")
    assert executable.output_dtypes() == [F32, F32]
    assert executable.output_shapes() == [SHAPE, SHAPE]


@SERIALIZE
def test_output_memory_kinds(client, serialize):
    executable = _compile(client, ADD_SUB, _devices(client, 2), serialize)
    kinds = executable.output_memory_kinds()
    assert [str(getattr(k, "kind", k)) for k in kinds] == ["device", "device"]


@SERIALIZE
def test_parameter_and_output_layouts(client, serialize):
    """GetParameterLayouts/GetOutputLayouts: the default layout of each shard."""
    devices = _devices(client, 2)
    executable = _compile(client, ADD_SUB, devices, serialize)
    params, outputs = executable.parameter_layouts(), executable.output_layouts()
    default = client.get_default_layout(F32, [1, 3], devices[0])
    assert params == [default, client.get_default_layout(F32, [2, 3], devices[0])]
    assert outputs == [client.get_default_layout(F32, [2, 3], devices[0]), default]


@SERIALIZE
def test_compile_with_a_column_major_result_layout(client, serialize):
    """The executable reports a result layout of the dimension order it was compiled for
    (tiled as the device chooses), its output has that layout and the right values (a
    backend that cannot compile it raises UnimplementedError)."""
    device = _devices(client, 1)[0]
    column_major = ifrt.Layout.column_major(2)
    executable = _compile(client, ADD_ONE, [device], serialize,
                          argument_layouts=[None], result_layouts=[column_major])
    (compiled,) = executable.output_layouts()
    assert column_major.accepts(compiled), compiled
    assert executable.parameter_layouts() == [client.get_default_layout(F32, [2, 3], device)]
    x = client.make_array_from_host_buffer(_iota(), SingleDeviceSharding(device))
    (out,) = executable.execute([x]).outputs
    assert out.layout == compiled
    np.testing.assert_array_equal(_host(out), _iota() + 1)


@SERIALIZE
def test_get_hlo_modules(client, serialize):
    executable = _compile(client, ADD_SUB, _devices(client, 2), serialize)
    modules = executable.hlo_modules()
    assert len(modules) == 1
    assert "add" in modules[0].name


@SERIALIZE
def test_program_text(client, serialize):
    executable = _compile(client, ADD_SUB, _devices(client, 2), serialize)
    text = executable.program_text()
    assert "add" in text


@SERIALIZE
def test_analysis(client, serialize):
    executable = _compile(client, ADD_SUB, _devices(client, 2), serialize)
    try:
        stats = executable.compiled_memory_stats()
        cost = executable.cost_analysis()
    except UnimplementedError as e:
        if serialize:
            pytest.skip(f"UNIMPLEMENTED for a deserialized executable: {e}")
        raise
    assert stats.argument_size_in_bytes > 0
    assert cost


@SERIALIZE
def test_fingerprint_survives_serialization(client, serialize):
    devices = _devices(client, 2)
    original = _compile(client, ADD_SUB, devices, False)
    executable = _compile(client, ADD_SUB, devices, serialize)
    if original.fingerprint is None:
        pytest.skip("the backend has no fingerprints")
    assert isinstance(original.fingerprint, str)
    assert executable.fingerprint == original.fingerprint


@SERIALIZE
def test_get_donatable_input_indices(client, serialize):
    executable = _compile(client, DONATABLE, _devices(client, 1), serialize)
    indices = executable.donatable_input_indices()
    assert set(indices) == {0, 2}


# -- execution ----------------------------------------------------------------------------

def _add_one_input(client, device=None):
    device = client.addressable_devices()[0] if device is None else device
    return client.make_array_from_host_buffer(_iota(), SingleDeviceSharding(device))


@SERIALIZE
def test_compile_and_execute(client, serialize):
    executable = _compile(client, ADD_ONE, _devices(client, 1), serialize)
    array = _add_one_input(client)
    result = executable.execute([array], ifrt.ExecuteOptions(fill_status=True))
    result.status.result(timeout=TIMEOUT_S)
    assert len(result.outputs) == 1
    [out] = result.outputs
    assert out.dtype == F32 and out.shape == SHAPE
    assert list(out.sharding.devices) == [client.addressable_devices()[0]]
    np.testing.assert_array_equal(_host(out), _iota() + 1)
    assert not array.is_deleted()  # add_one donates nothing


@SERIALIZE
def test_compile_and_execute_user_context(client, serialize):
    """IFRT's ``CompileAndExecute`` with user contexts: the executable carries the context
    of its compile (20), its outputs that of the execute (100), with the fast repeat of an
    accepted call too; arrays made outside any scope carry none."""
    with UserContextScope(UserContext(20)):
        executable = _compile(client, ADD_ONE, _devices(client, 1), serialize)
    assert executable.user_context is not None
    assert executable.user_context.fingerprint() == 20
    array = _add_one_input(client)
    assert array.user_context is None
    for _ in range(2):  # the second call repeats an accepted one
        with UserContextScope(UserContext(100)):
            result = executable.execute([array], ifrt.ExecuteOptions(fill_status=True))
            [called] = executable(array)
        result.status.result(timeout=TIMEOUT_S)
        [out] = result.outputs
        assert out.user_context is not None and out.user_context.fingerprint() == 100
        assert called.user_context is not None and called.user_context.fingerprint() == 100
        np.testing.assert_array_equal(_host(out), _iota() + 1)
    [outside] = executable(array)
    assert outside.user_context is None


@SERIALIZE
def test_compile_and_execute_portable(client, serialize):
    device = client.addressable_devices()[0]
    executable = _compile(client, ADD_ONE, None, serialize, portable=True)
    assert executable.devices() is None
    array = _add_one_input(client, device)
    result = executable.execute([array], ifrt.ExecuteOptions(fill_status=True),
                                devices=client.make_device_list([device]))
    result.status.result(timeout=TIMEOUT_S)
    [out] = result.outputs
    assert list(out.sharding.devices) == [device]
    np.testing.assert_array_equal(_host(out), _iota() + 1)


@SERIALIZE
def test_cancel_execution(client, serialize):
    executable = _compile(client, ADD_ONE, _devices(client, 1), serialize)
    result = executable.execute([_add_one_input(client)], ifrt.ExecuteOptions(fill_status=True))
    first = client.cancel_execution(result)
    second = client.cancel_execution(result)  # harmless
    assert isinstance(first, bool) and isinstance(second, bool)
    [out] = result.outputs
    if first:  # cancelled: the status fails
        with pytest.raises(IfrtError):
            result.status.result(timeout=TIMEOUT_S)
    else:  # it had finished: the outputs stand
        result.status.result(timeout=TIMEOUT_S)
        np.testing.assert_array_equal(_host(out), _iota() + 1)


@SERIALIZE
def test_do_not_fill_status(client, serialize):
    executable = _compile(client, ADD_ONE, _devices(client, 1), serialize)
    result = executable.execute([_add_one_input(client)], ifrt.ExecuteOptions(fill_status=False))
    assert result.status is None
    [out] = result.outputs
    np.testing.assert_array_equal(_host(out), _iota() + 1)


@SERIALIZE
def test_no_input_output(client, serialize):
    executable = _compile(client, NO_INPUT_OUTPUT, _devices(client, 1), serialize)
    result = executable.execute([], ifrt.ExecuteOptions(fill_status=True))
    result.status.result(timeout=TIMEOUT_S)
    assert result.outputs == []


@SERIALIZE
def test_donation(client, serialize):
    device = _devices(client, 1)[0]
    executable = _compile(client, DONATE_BOTH, [device], serialize)
    sharding = SingleDeviceSharding(device)
    arg0 = client.make_array_from_host_buffer(_iota(), sharding)
    arg1 = client.make_array_from_host_buffer(_iota(), sharding)
    early_copy = arg0.copy_to_host_buffer()  # enqueued before the donation
    result = executable.execute(
        [arg0, arg1],
        ifrt.ExecuteOptions(non_donatable_input_indices=frozenset({1}), fill_status=True))
    assert arg0.is_deleted()
    assert arg0.ready_future().exception(timeout=TIMEOUT_S) is not None
    assert not arg1.is_deleted()
    arg1.ready_future().result(timeout=TIMEOUT_S)
    np.testing.assert_array_equal(early_copy.result(timeout=TIMEOUT_S), _iota())
    result.status.result(timeout=TIMEOUT_S)
    add, sub = result.outputs
    np.testing.assert_array_equal(_host(add), _iota() * 2)
    np.testing.assert_array_equal(_host(sub), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(_host(arg1), _iota())


@SERIALIZE
def test_execute_add_sub_on_two_devices(client, serialize):
    """``ExecutableSerialization``'s run: arg 0 assembled from 2 row shards (donated into
    the assembly), arg 1 replicated; the sum whole, the difference 2 shards of zeros."""
    devices = _devices(client, 2)
    executable = _compile(client, ADD_SUB, devices, serialize)
    params = executable.parameter_shardings()
    if params is None:
        pytest.skip("the backend does not report shardings")
    data = _iota()
    shards = [client.make_array_from_host_buffer(data[i:i + 1], SingleDeviceSharding(d))
              for i, d in enumerate(devices)]
    arg0 = client.assemble_array_from_single_device_arrays(
        SHAPE, params[0], shards, ifrt.ArrayCopySemantics.DONATE_INPUT)
    arg1 = client.make_array_from_host_buffer(data, params[1])
    result = executable.execute([arg0, arg1], ifrt.ExecuteOptions(fill_status=True))
    result.status.result(timeout=TIMEOUT_S)
    add, sub = result.outputs
    np.testing.assert_array_equal(_host(add), data * 2)
    pieces = sub.disassemble_into_single_device_arrays(ifrt.ArrayCopySemantics.REUSE_INPUT)
    assert [list(p.sharding.devices) for p in pieces] == [[d] for d in devices]
    for piece in pieces:
        np.testing.assert_array_equal(_host(piece), np.zeros((1, 3), np.float32))


# -- lifetime (older versions of the library) ---------------------------------------------

@SERIALIZE
def test_delete(client, serialize):
    executable = _compile(client, ADD_ONE, _devices(client, 1), serialize)
    assert not executable.is_deleted()
    future = executable.delete()
    assert executable.is_deleted()
    future.result(timeout=TIMEOUT_S)
    executable.delete().result(timeout=TIMEOUT_S)  # idempotent
    assert executable.is_deleted()


@SERIALIZE
def test_execute_after_delete_fails(client, serialize):
    executable = _compile(client, ADD_ONE, _devices(client, 1), serialize)
    array = _add_one_input(client)
    executable.delete()
    with pytest.raises(FailedPreconditionError):
        executable.execute([array])
    assert not array.is_deleted()
    np.testing.assert_array_equal(_host(array), _iota())


def test_deserialize_garbage_fails(client):
    with pytest.raises(IfrtError):
        client.deserialize_executable(b"not an executable")
