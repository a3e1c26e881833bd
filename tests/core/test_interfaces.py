"""The abstract interfaces (Value, Array, LoadedExecutable, Client, Compiler), their
derived defaults, the option/value types, Tuple semantics and the backend registry.

The example backend (``ifrtpy.testing.example_backend``) is the "minimal subclass": it
implements only the abstract methods (and ``Client.make_error_arrays``) and relies on every
other default.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ifrtpy import backends as client_mod
from ifrtpy.array import (
    Array,
    ArrayCopySemantics,
    ArraySpec,
    HostBufferSemantics,
    Tuple,
    Value,
)
from ifrtpy.backends import get_client, register_backend, registered_backends
from ifrtpy.client import Client, Compiler, HostBufferShards
from ifrtpy.device import Device, DeviceList, Memory
from ifrtpy.dtypes import DType
from ifrtpy.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    UnimplementedError,
)
from ifrtpy.executable import (
    CompiledMemoryStats,
    CompileOptions,
    ExecuteOptions,
    ExecuteResult,
    LoadedExecutable,
)
from ifrtpy.future import Future
from ifrtpy.shape import Shape
from ifrtpy.sharding import (
    OpaqueSharding,
    ShardingParam,
    ShardingParamSharding,
    SingleDeviceShardSemantics,
    SingleDeviceSharding,
)
from ifrtpy.testing.example_backend import (
    ExampleArray,
    ExampleClient,
    ExampleCompiler,
    create_client,
)

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS

# -- the minimal backend: ifrtpy.testing.example_backend -----------------------------------------


@pytest.fixture(scope="module")
def client():
    return create_client(device_count=4)


@pytest.fixture
def x():
    return np.arange(6, dtype=np.float32).reshape(2, 3)


def single(client, i=0):
    return SingleDeviceSharding(client.devices()[i])


def error_array(client, x, sharding):
    """An array of ``x``'s dtype and shape on ``sharding`` that failed with "injected error"."""
    spec = ArraySpec(DType.from_numpy(x.dtype), Shape(x.shape), sharding)
    return client.make_error_arrays(InternalError("injected error"), [spec])[0]


@pytest.fixture
def compiler_calls(monkeypatch):
    """(method, program or data, options) of each call the example backend's compiler gets
    during the test."""
    calls = []

    def recording(name):
        method = getattr(ExampleCompiler, name)

        def record(self, program, options=None):
            calls.append((name, program, options))
            return method(self, program, options)
        return record

    for name in ("compile", "deserialize_loaded_executable"):
        monkeypatch.setattr(ExampleCompiler, name, recording(name))
    return calls


# -- ABCs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [Value, Array, LoadedExecutable, Client, Compiler])
def test_abcs_refuse_instantiation(cls):
    with pytest.raises(TypeError, match="abstract"):
        cls()


def test_abstract_method_sets_are_the_documented_core():
    assert Value.__abstractmethods__ == {
        "client", "ready_future", "delete", "is_deleted", "debug_string"}
    assert Array.__abstractmethods__ == {
        "client", "ready_future", "delete", "is_deleted", "dtype", "shape", "sharding",
        "disassemble_into_single_device_arrays", "copy_to_host_buffer"}
    assert LoadedExecutable.__abstractmethods__ == {
        "client", "name", "devices", "addressable_devices", "parameter_shardings",
        "output_shardings", "output_dtypes", "output_shapes", "output_memory_kinds", "_launch",
        "delete", "is_deleted"}
    assert Client.__abstractmethods__ == {
        "runtime_type", "platform_name", "platform_version", "platform_id", "process_index",
        "devices", "make_array_from_host_buffer", "assemble_array_from_single_device_arrays",
        "copy_arrays", "default_compiler"}
    assert Compiler.__abstractmethods__ == {"compile", "deserialize_loaded_executable"}


def test_the_example_backend_overrides_only_abstract_methods():
    """What these tests call beyond the abstract methods is the interfaces' own code (but
    for the user context values record, and error arrays); the array is a StoredArray,
    whose fields give the abstract properties and whose ``_take`` the copy semantics."""
    from ifrtpy.array import StoredArray
    from ifrtpy.testing import example_backend as example

    pairs = [(example.ExampleArray, StoredArray), (example.ExampleClient, Client),
             (example.ExampleCompiler, Compiler), (example.ExampleExecutable, LoadedExecutable),
             (example.ExampleDevice, Device), (example.ExampleMemory, Memory)]
    for cls, interface in pairs:
        inherited = {name for base in interface.__mro__ if base is not object
                     for name in vars(base) if not name.startswith("__")}
        overridden = {name for name in vars(cls) if name in inherited} - {"_abc_impl"}
        expected = ({"make_error_arrays"} if interface is Client else
                    {"user_context"} if interface is LoadedExecutable else set())
        assert overridden - interface.__abstractmethods__ == expected, cls


def test_partial_subclass_still_refused():
    class Half(Array):  # implements only some of the abstract methods
        @property
        def dtype(self):
            return DType(DType.Kind.F32)

        def copy_to_host_buffer(self, out=None, byte_strides=None):
            return Future.ready(out)

    with pytest.raises(TypeError, match="abstract"):
        Half()
    assert "copy_to_host_buffer" not in Half.__abstractmethods__
    assert "sharding" in Half.__abstractmethods__


def test_register_virtual_subclass():
    class Foreign:  # e.g. a cdef class that cannot inherit from the ABC
        pass

    Array.register(Foreign)
    assert isinstance(Foreign(), Array) and isinstance(Foreign(), Value)


# -- Client defaults ---------------------------------------------------------------------------


def test_minimal_client_works_and_derives_counts(client):
    assert client.device_count() == 4 == client.addressable_device_count()
    assert client.lookup_device(client.devices()[2].id) is client.devices()[2]
    with pytest.raises(NotFoundError):
        client.lookup_device(7)
    assert client.attributes() == {}
    assert "ExampleClient" in repr(client) and "4 device(s)" in repr(client)


def test_make_device_list(client):
    dl = client.make_device_list(client.devices()[:2] + client.devices()[:1])
    assert isinstance(dl, DeviceList) and len(dl) == 3 and dl[2] is client.devices()[0]


def test_get_ready_future_joins_values(client, x):
    a = client.make_array_from_host_buffer(x, single(client))
    b = client.make_array_from_host_buffer(x, single(client, 1))
    assert client.get_ready_future([a, b]).result() is None
    assert client.get_ready_future([]).done()
    bad = error_array(client, x, single(client))
    with pytest.raises(InternalError, match="injected error"):
        client.get_ready_future([a, bad, b]).result()


def test_compile_goes_through_default_compiler(client, compiler_calls):
    def add_one(a):
        return [a + 1]

    exe = client.compile(add_one)
    assert client.compiler is client.default_compiler()
    kind, program, options = compiler_calls[-1]
    assert kind == "compile" and program is add_one and options == CompileOptions()
    opts = CompileOptions(num_partitions=2)
    client.compile(add_one, opts)
    assert compiler_calls[-1][2] is opts
    assert isinstance(exe, LoadedExecutable)
    with pytest.raises(UnimplementedError):
        client.deserialize_executable(b"blob", opts)
    assert compiler_calls[-1] == ("deserialize_loaded_executable", b"blob", opts)


@pytest.mark.parametrize(
    "call",
    [
        lambda c, a: c.reshard_arrays([a], [ArraySpec(a.dtype, a.shape, a.sharding)]),
        # the interface's default (the example backend implements make_error_arrays)
        lambda c, a: Client.make_error_arrays(
            c, InternalError("e"), [ArraySpec(a.dtype, a.shape, a.sharding)]),
    ],
    ids=["reshard_arrays", "make_error_arrays"],
)
def test_optional_client_operations_default_to_unimplemented(client, x, call):
    a = client.make_array_from_host_buffer(x, single(client))
    with pytest.raises(UnimplementedError, match="ExampleClient"):
        call(client, a)


def test_make_array_calls_on_done_and_keeps_sharding_object(client, x):
    calls = []
    sh = single(client)
    a = client.make_array_from_host_buffer(x, sh, on_done=lambda: calls.append(1))
    assert calls == [1] and a.sharding is sh
    assert a.dtype == DType(DType.Kind.F32) and a.shape == Shape([2, 3])


# -- make_arrays_from_host_buffer_shards default ------------------------------------------------


def two_way(client):
    return ShardingParamSharding(ShardingParam([2, 1], [0], [2]), client.devices()[:2])


def test_make_arrays_from_host_buffer_shards_default(client):
    # IFRT MakeArraysFromHostBufferShardsAndCopyToHostBuffer: two specs, buffers swapped.
    sh = two_way(client)
    spec = ArraySpec(np.float32, (2, 3), sh)
    lo = np.array([[0, 1, 2]], np.float32)
    hi = np.array([[3, 4, 5]], np.float32)
    a, b = client.make_arrays_from_host_buffer_shards(
        [HostBufferShards([([0], lo), ([1], hi)], spec), ([([0], hi), ([1], lo)], spec)]
    )
    np.testing.assert_array_equal(np.asarray(a), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(np.asarray(b), [[3, 4, 5], [0, 1, 2]])
    assert a.sharding is sh
    shards = a.disassemble_into_single_device_arrays()
    assert [s.sharding.devices[0] for s in shards] == client.devices()[:2]


def test_make_arrays_from_host_buffer_shards_one_buffer_many_shards(client):
    sh = ShardingParamSharding(ShardingParam([1, 1], [0], [2]), client.devices()[:2])
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    (a,) = client.make_arrays_from_host_buffer_shards(
        [HostBufferShards([([0, 1], x)], ArraySpec(np.int32, (2, 3), sh))])
    np.testing.assert_array_equal(np.asarray(a), x)


@pytest.mark.parametrize(
    "buffers, message",
    [
        ([([0], np.zeros((1, 3), np.float32))], r"no host buffer for shards \[1\]"),
        ([([0, 0], np.zeros((1, 3), np.float32))], "given twice"),
        ([([0, 2], np.zeros((1, 3), np.float32))], "out of range"),
        ([([0, 1], np.zeros((2, 3), np.float32))], r"float32\[1, 3\].*float32\[2, 3\]"),
        ([([0, 1], np.zeros((1, 3), np.int32))], "int32"),
    ],
)
def test_make_arrays_from_host_buffer_shards_errors(client, buffers, message):
    spec = ArraySpec(np.float32, (2, 3), two_way(client))
    with pytest.raises(InvalidArgumentError, match=message):
        client.make_arrays_from_host_buffer_shards([HostBufferShards(buffers, spec)])


def test_make_arrays_from_host_buffer_shards_checks_everything_before_transfers():
    calls = []

    class Counting(ExampleClient):
        def make_array_from_host_buffer(self, data, sharding, *args, **kwargs):
            calls.append(sharding)
            return super().make_array_from_host_buffer(data, sharding, *args, **kwargs)

    c = Counting(device_count=4)
    spec = ArraySpec(np.float32, (2, 3), two_way(c))
    good = HostBufferShards([([0, 1], np.zeros((1, 3), np.float32))], spec)
    bad = HostBufferShards([([0], np.zeros((1, 3), np.float32))], spec)
    with pytest.raises(InvalidArgumentError, match="spec 1"):
        c.make_arrays_from_host_buffer_shards([good, bad])
    assert calls == []


def test_make_arrays_from_host_buffer_shards_needs_same_devices(client):
    lo = np.zeros((1, 3), np.float32)
    s0 = ArraySpec(np.float32, (2, 3), two_way(client))
    other = ShardingParamSharding(ShardingParam([2, 1], [0], [2]), client.devices()[2:])
    s1 = ArraySpec(np.float32, (2, 3), other)
    with pytest.raises(InvalidArgumentError, match="same devices"):
        client.make_arrays_from_host_buffer_shards(
            [([([0, 1], lo)], s0), ([([0, 1], lo)], s1)])


# -- Array defaults --------------------------------------------------------------------------


def test_array_defaults(client, x):
    a = client.make_array_from_host_buffer(x, single(client))
    assert a.layout is None
    assert a.block_until_ready() is a
    np.testing.assert_array_equal(np.asarray(a), x)
    assert np.asarray(a, dtype=np.float64).dtype == np.float64
    assert np.array(a).dtype == np.float32
    with pytest.raises(ValueError):
        np.asarray(a, copy=False)
    assert a.debug_string().startswith("ExampleArray(dtype=f32, shape=[2, 3], sharding=")
    assert repr(a).startswith("ExampleArray([[0., 1., 2.],") and "SingleDeviceSharding" in repr(a)
    a.delete()
    assert "<deleted or donated>" in repr(a)
    with pytest.raises(FailedPreconditionError):
        a.block_until_ready()


def test_block_until_ready_raises_the_arrays_error(client, x):
    bad = error_array(client, x, single(client))
    with pytest.raises(InternalError, match="injected error"):
        bad.block_until_ready()


def test_values_are_not_copyable(client, x):
    a = client.make_array_from_host_buffer(x, single(client))
    with pytest.raises(TypeError, match="not copyable"):
        copy.copy(a)
    with pytest.raises(TypeError, match="not copyable"):
        copy.deepcopy(a)


def test_fully_replicated_shard(client, x):
    replicated = ShardingParamSharding(ShardingParam([1, 1], [0], [2]), client.devices()[:2])
    a = client.make_array_from_host_buffer(x, replicated)
    shard = a.fully_replicated_shard()
    assert shard.sharding.devices[0] is client.devices()[0]
    np.testing.assert_array_equal(np.asarray(shard), x)
    sharded = client.make_array_from_host_buffer(x, two_way(client))
    with pytest.raises(InvalidArgumentError, match="fully replicated"):
        sharded.fully_replicated_shard()


def test_copy_to_host_buffer_into_given_out(client, x):
    a = client.make_array_from_host_buffer(x, single(client))
    out = np.zeros((2, 3), np.float32)
    fut = a.copy_to_host_buffer(out)
    assert fut.result() is out
    np.testing.assert_array_equal(out, x)
    out_f = np.zeros((2, 3), np.float32, order="F")  # any strides
    a.copy_to_host_buffer(out_f).result()
    np.testing.assert_array_equal(out_f, x)


@pytest.mark.parametrize(
    "strides, flat",
    [
        ((12, 4), [0, 1, 2, 3, 4, 5]),  # dense major-to-minor
        ((4, 8), [0, 3, 1, 4, 2, 5]),  # column-major (IFRT ...WithByteStrides)
    ],
)
def test_copy_to_host_buffer_with_byte_strides(client, x, strides, flat):
    a = client.make_array_from_host_buffer(x, single(client))
    out = a.copy_to_host_buffer(byte_strides=strides).result()
    assert out.strides == strides
    np.testing.assert_array_equal(out, x)
    memory = np.frombuffer(out.base, np.float32) if out.base is not None else out.ravel("K")
    np.testing.assert_array_equal(memory, flat)


@pytest.mark.parametrize("strides", [(-12, 4), (4, -8), (24, 4), (16, 4)])
def test_copy_to_host_buffer_negative_and_padded_strides(client, x, strides):
    a = client.make_array_from_host_buffer(x, single(client))
    base_bytes = 4 + sum(abs(s) * (d - 1) for s, d in zip(strides, x.shape))
    for _ in range(8):  # freed memory of that size, as the buffer might get
        np.full(base_bytes, 0x5A, np.uint8)
    out = a.copy_to_host_buffer(byte_strides=strides).result()
    assert out.strides == strides
    np.testing.assert_array_equal(out, x)
    base = out.base
    assert base.nbytes == base_bytes
    # the bytes between the elements are zeros
    offset = out.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    mine = np.zeros(base_bytes, np.uint8)
    np.ndarray(out.shape, np.int32, buffer=mine, offset=offset, strides=strides)[...] = -1
    assert not base[mine == 0].any()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(out=np.zeros((3, 2), np.float32)), r"float32\[3, 2\]"),
        (dict(out=np.zeros((2, 3), np.float64)), "float64"),
        (dict(out=[[0] * 3] * 2), "numpy.ndarray"),
        (dict(byte_strides=(4,)), "1 entries for a rank-2"),
        (dict(byte_strides=(6, 2)), "multiples of the element size 4"),
        (dict(out=np.zeros((2, 3), np.float32), byte_strides=(4, 8)), "differ from out.strides"),
    ],
)
def test_copy_to_host_buffer_rejects_bad_out(client, x, kwargs, message):
    a = client.make_array_from_host_buffer(x, single(client))
    with pytest.raises(InvalidArgumentError, match=message):
        a.copy_to_host_buffer(**kwargs)


def test_copy_to_host_buffer_rejects_readonly_out(client, x):
    a = client.make_array_from_host_buffer(x, single(client))
    out = np.zeros((2, 3), np.float32)
    out.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="not writeable"):
        a.copy_to_host_buffer(out)


def test_copy_to_host_buffer_zero_sized(client):
    a = client.make_array_from_host_buffer(np.zeros((0, 1), np.float32), single(client))
    assert a.copy_to_host_buffer(byte_strides=(4, 4)).result().shape == (0, 1)


def test_gather_to_host_buffer_tiled_2x2(client):
    x = np.arange(24, dtype=np.int32).reshape(4, 6)
    sh = ShardingParamSharding(ShardingParam([2, 2], [0, 1], [2, 2]), client.devices())
    a = client.make_array_from_host_buffer(x, sh)
    np.testing.assert_array_equal(np.asarray(a), x)
    out = np.zeros((4, 6), np.int32, order="F")
    assert a.copy_to_host_buffer(out).result() is out
    np.testing.assert_array_equal(out, x)
    strided = a.copy_to_host_buffer(byte_strides=(-24, 4)).result()
    assert strided.strides == (-24, 4)
    np.testing.assert_array_equal(strided, x)


@pytest.mark.parametrize("strides", [None, ()])
def test_gather_to_host_buffer_of_a_rank_0_array_on_several_devices(client, strides):
    """A rank-0 array's every shard is the whole value: the helper copies it into a 0-d
    ``out`` (a view of it, never the NumPy scalar that indexing a 0-d array gives)."""
    sharding = ShardingParamSharding(ShardingParam([], [0], [4]), client.devices())
    a = client.make_array_from_host_buffer(np.float32(2.5), sharding)
    got = a._gather_to_host_buffer(None, strides).result()
    assert isinstance(got, np.ndarray) and got.shape == () and got == np.float32(2.5)
    out = np.zeros((), np.float32)
    assert a._gather_to_host_buffer(out).result() is out and out == np.float32(2.5)


def test_gather_copies_each_replicated_domain_once(client, monkeypatch):
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    # dim 0 split in 2, the other mesh axis (2) replicates: 4 devices, 2 distinct domains
    sh = ShardingParamSharding(ShardingParam([2, 1], [0, 1], [2, 2]), client.devices())
    a = client.make_array_from_host_buffer(x, sh)
    native_copies = []  # single-device copy_to_host_buffer calls
    copy = ExampleArray.copy_to_host_buffer

    def counting(self, out=None, byte_strides=None):
        if len(self.sharding.devices) == 1:
            native_copies.append(self)
        return copy(self, out, byte_strides)

    monkeypatch.setattr(ExampleArray, "copy_to_host_buffer", counting)
    np.testing.assert_array_equal(np.asarray(a), x)
    assert len(native_copies) == 2


def test_gather_propagates_shard_errors(client, x):
    bad = error_array(client, x, two_way(client))
    with pytest.raises(InternalError, match="injected error"):
        bad.copy_to_host_buffer().result()


def test_gather_refuses_partly_addressable_arrays(x):
    client = create_client(device_count=2, addressable_device_count=1)
    remote = client.devices()[1]
    sh = ShardingParamSharding(ShardingParam([2, 1], [0], [2]), [client.devices()[0], remote])
    a = client.make_array_from_host_buffer(x, sh)  # holds the addressable shard only
    with pytest.raises(UnimplementedError, match="hold 3 of the 6 elements"):
        a.copy_to_host_buffer()


def test_gather_refuses_opaque_sharding(client, x):
    shards = [client.make_array_from_host_buffer(x[i:i + 1], single(client, i)) for i in range(2)]
    a = client.assemble_array_from_single_device_arrays(
        x.shape, OpaqueSharding(client.devices()[:2]), shards)
    with pytest.raises(InvalidArgumentError, match="OpaqueSharding"):
        np.asarray(a)


def test_disassemble_assemble_round_trip(client, x):
    sh = two_way(client)
    a = client.make_array_from_host_buffer(x, sh)
    shards = a.disassemble_into_single_device_arrays()
    assert [s.shape for s in shards] == [Shape([1, 3])] * 2
    b = client.assemble_array_from_single_device_arrays(a.shape, sh, shards)
    np.testing.assert_array_equal(np.asarray(b), x)


# -- enums and ArraySpec -------------------------------------------------------------------


def test_enum_values():
    # HostBufferSemantics values are PJRT_HostBufferSemantics.
    assert [(m.name, m.value) for m in HostBufferSemantics] == [
        ("IMMUTABLE_ONLY_DURING_CALL", 0), ("IMMUTABLE_UNTIL_TRANSFER_COMPLETES", 1),
        ("IMMUTABLE_ZERO_COPY", 2), ("MUTABLE_ZERO_COPY", 3)]
    assert [m.name for m in ArrayCopySemantics] == ["ALWAYS_COPY", "REUSE_INPUT", "DONATE_INPUT"]
    assert [m.name for m in SingleDeviceShardSemantics] == ["ADDRESSABLE_SHARDS", "ALL_SHARDS"]


def test_array_spec_is_an_immutable_picklable_value(client):
    sh = SingleDeviceSharding(client.devices()[1])
    spec = ArraySpec(DType(DType.Kind.F32), Shape([2, 3]), sh)
    assert spec.layout is None
    assert spec == ArraySpec(np.float32, (2, 3), SingleDeviceSharding(client.devices()[1]))
    assert isinstance(ArraySpec(np.float32, [2, 3], sh).shape, Shape)
    assert hash(spec) == hash(ArraySpec(np.dtype("float32"), [2, 3], sh))
    assert spec != ArraySpec(np.int32, (2, 3), sh)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.dtype = DType(DType.Kind.S32)
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and hash(back) == hash(spec)
    assert back.sharding.devices[0] is client.devices()[1]
    with pytest.raises(InvalidArgumentError):
        ArraySpec(object, (2,), sh)


# -- Tuple (IFRT tuple_impl_test_lib) ------------------------------------------------------


def arrays(client, n=3):
    return [client.make_array_from_host_buffer(np.full((2,), i, np.int32), single(client))
            for i in range(n)]


def test_nullary_tuple(client):
    t = client.make_tuple([])
    assert isinstance(t, Tuple) and isinstance(t, Value)
    assert t.arity() == 0 and t.unpack() == [] and len(t) == 0
    assert t.ready_future().result() is None
    assert re.fullmatch(r".*Tuple\(\)", t.debug_string())
    assert t.client is client
    assert not t.is_deleted()
    assert t.delete().result() is None
    assert t.is_deleted()


def test_tuple_of_arrays(client):
    a1, a2, a3 = arrays(client)
    t = client.make_tuple([a1, a2, a3])
    assert t.arity() == 3
    u = t.unpack()
    assert u[0] is a1 and u[1] is a2 and u[2] is a3
    assert list(t) == u
    assert re.fullmatch(r"Tuple\(.*,.*,.*\)", t.debug_string())
    assert repr(t).startswith("<Tuple(")
    t.delete().result()
    assert t.is_deleted() and a1.is_deleted() and a2.is_deleted() and a3.is_deleted()


def test_delete_of_element_deletes_tuple(client):
    a1, a2, a3 = arrays(client)
    t = client.make_tuple([a1, a2, a3])
    assert not t.is_deleted()
    a1.delete()
    assert t.is_deleted()
    assert not a2.is_deleted() and not a3.is_deleted()


def test_nested_tuples(client):
    a1, a2, a3 = arrays(client)
    t1 = client.make_tuple([a1, a2])
    t2 = client.make_tuple([])
    t = client.make_tuple([t1, t2, a3])
    assert t.arity() == 3
    u = t.unpack()
    assert u[0] is t1 and u[1] is t2 and u[2] is a3
    del t, u
    assert t1.unpack() == [a1, a2]
    outer = client.make_tuple([t1, a3])
    a2.delete()
    assert t1.is_deleted() and outer.is_deleted()
    fresh = arrays(client, 2)
    nested = client.make_tuple([client.make_tuple(fresh)])
    nested.delete()
    assert all(a.is_deleted() for a in fresh)


def test_tuple_delete_is_idempotent(client):
    t = client.make_tuple(arrays(client))
    f1, f2 = t.delete(), t.delete()
    assert f1 is f2 and f1.result() is None


def test_tuple_ready_future_fails_with_element_error(client, x):
    bad = error_array(client, x, single(client))
    t = client.make_tuple([*arrays(client, 1), bad])
    with pytest.raises(InternalError, match="injected error"):
        t.ready_future().result()


def test_tuple_rejects_non_values(client):
    with pytest.raises(InvalidArgumentError, match="Values"):
        client.make_tuple([np.zeros(2)])


# -- LoadedExecutable defaults ----------------------------------------------------------------


def test_executable_defaults(client, x):
    def add_sub(a, b):
        return [a + b, a - b]

    exe = client.compile(add_sub, CompileOptions(devices=client.devices()[:1]))
    a = client.make_array_from_host_buffer(x, single(client))
    s, d = exe(a, a)
    np.testing.assert_array_equal(np.asarray(s), 2 * x)
    np.testing.assert_array_equal(np.asarray(d), 0 * x)
    res = exe.execute([a, a], ExecuteOptions(fill_status=True))
    assert res.status.result() is None and len(res.outputs) == 2
    assert exe.execute([a, a]).status is None
    assert exe.num_devices == 1 and exe.name == "add_sub"
    assert exe.fingerprint is None
    for method in ("serialize", "compiled_memory_stats", "cost_analysis", "program_text",
                   "donatable_input_indices"):
        with pytest.raises(UnimplementedError, match="ExampleExecutable"):
            getattr(exe, method)()
    assert repr(exe) == "<ExampleExecutable 'add_sub' on 1 device(s)>"
    assert not exe.is_deleted()
    exe.delete()
    assert exe.is_deleted()


def test_portable_executable_num_devices(client):
    exe = client.compile(lambda: [], CompileOptions(compile_portable_executable=True))
    assert exe.devices() is None and exe.num_devices == 1


# -- ExecuteOptions / CompileOptions / results ----------------------------------------------


def test_execute_options_defaults_and_normalisation():
    o = ExecuteOptions()
    assert (o.launch_id, o.non_donatable_input_indices, o.fill_status, o.execution_stream_id,
            o.custom_options) == (0, frozenset(), False, 0, {})
    o = ExecuteOptions(non_donatable_input_indices=[1, 3, 1], custom_options={"k": [1, 2]})
    assert o.non_donatable_input_indices == frozenset({1, 3})
    assert o == ExecuteOptions(non_donatable_input_indices={3, 1}, custom_options={"k": [1, 2]})
    assert hash(o) == hash(ExecuteOptions(non_donatable_input_indices=(1, 3),
                                          custom_options={"k": [1, 2]}))
    assert pickle.loads(pickle.dumps(o)) == o
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.launch_id = 3


def test_execute_options_copies_custom_options():
    custom = {"a": 1}
    o = ExecuteOptions(custom_options=custom)
    custom["a"] = 2
    assert o.custom_options == {"a": 1}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(launch_id=True), "launch_id must be an int"),
        (dict(launch_id=1.5), "launch_id must be an int"),
        (dict(launch_id=2**31), "launch_id must be in"),
        (dict(execution_stream_id="0"), "execution_stream_id must be an int"),
        (dict(fill_status=1), "fill_status must be a bool"),
        (dict(non_donatable_input_indices=3), "set of ints"),
        (dict(non_donatable_input_indices={-1}), "must be in"),
        (dict(non_donatable_input_indices={"0"}), "must be an int"),
        (dict(custom_options={1: "x"}), "keys must be str"),
        (dict(custom_options={"k": {"nested": 1}}), r"custom_options\['k'\]"),
        (dict(custom_options={"k": [1.5]}), "list of ints"),
        (dict(custom_options=[("k", 1)]), "must be a mapping"),
    ],
)
def test_execute_options_validation(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ExecuteOptions(**kwargs)


def test_compile_options_defaults_and_value_semantics(client):
    o = CompileOptions()
    assert (o.devices, o.num_replicas, o.num_partitions, o.use_spmd_partitioning,
            o.use_shardy_partitioner, o.compile_portable_executable, o.debug_options,
            o.env_option_overrides) == (None, 1, 1, None, None, False, {}, {})
    o = CompileOptions(devices=client.devices()[:2], num_partitions=2,
                       use_spmd_partitioning=True,
                       debug_options={"xla_cpu_enable_fast_math": False},
                       env_option_overrides={"xla_force_host_platform_device_count": 2})
    assert isinstance(o.devices, DeviceList) and list(o.devices) == client.devices()[:2]
    same = CompileOptions(devices=client.make_device_list(client.devices()[:2]), num_partitions=2,
                          use_spmd_partitioning=True,
                          debug_options={"xla_cpu_enable_fast_math": False},
                          env_option_overrides={"xla_force_host_platform_device_count": 2})
    assert o == same and hash(o) == hash(same)
    assert pickle.loads(pickle.dumps(o)) == o
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.num_replicas = 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_replicas=0), "num_replicas must be >= 1, got 0"),
        (dict(num_partitions=-3), "num_partitions must be >= 1, got -3"),
        (dict(num_replicas=True), "num_replicas must be an int, got True"),
        (dict(num_partitions=2.0), "num_partitions must be an int, got 2.0"),
        (dict(use_spmd_partitioning=1), "use_spmd_partitioning must be a bool or None"),
        (dict(use_shardy_partitioner="yes"), "use_shardy_partitioner must be a bool or None"),
        (dict(compile_portable_executable=None), "compile_portable_executable must be a bool"),
        (dict(compile_portable_executable=True, num_partitions=2), "portable executable"),
        (dict(debug_options={1: 2}), "debug_options keys must be str"),
        (dict(env_option_overrides={"f": [1]}), r"env_option_overrides\['f'\]"),
    ],
)
def test_compile_options_validation(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        CompileOptions(**kwargs)


def test_compile_options_device_count_must_match(client):
    with pytest.raises(InvalidArgumentError, match=r"devices has 3 devices.*2 \* 1 = 2"):
        CompileOptions(devices=client.devices()[:3], num_replicas=2)
    CompileOptions(devices=client.devices()[:4], num_replicas=2, num_partitions=2)


def test_result_types():
    r = ExecuteResult(status=None, outputs=[])
    assert r.status is None and r.outputs == []
    assert repr(r) == "ExecuteResult(status=None, outputs=[])"
    assert r == ExecuteResult(None, []) and r != ExecuteResult(None, [1]) and r != (None, [])
    assert pickle.loads(pickle.dumps(ExecuteResult(None, [1, 2]))) == ExecuteResult(None, [1, 2])
    match r:
        case ExecuteResult(status, outputs):
            assert status is None and outputs == []
    assert weakref.ref(r)() is r
    with pytest.raises(TypeError, match="unhashable"):
        hash(r)
    stats = CompiledMemoryStats(argument_size_in_bytes=24)
    assert stats.argument_size_in_bytes == 24 and stats.temp_size_in_bytes == 0
    assert stats.peak_memory_in_bytes == 0
    assert pickle.loads(pickle.dumps(stats)) == stats


def test_outputs_reused_from_their_free_list_drop_their_items():
    # Outputs keep a free list of their own (as list does); a freed one holds nothing.
    from ifrtpy.executable import Outputs

    class Item:
        pass

    class Sub(Outputs):
        pass

    for _ in range(3):
        kept = []
        for kind in (Outputs, Sub, Outputs):
            item = Item()
            kept.append(weakref.ref(item))
            outputs = kind([item, 1])
            del item
            assert outputs[1] == 1 and type(outputs) is kind
            del outputs
        assert all(ref() is None for ref in kept)
        big = Outputs(range(100))
        assert len(big) == 100 and big[-1] == 99
        del big
    made = ExecuteResult(None, [Item()]).outputs
    assert type(made) is Outputs and len(made) == 1
    with pytest.raises(TypeError, match="take the output first"):
        np.asarray(made)


@given(st.lists(st.integers(), max_size=5),
       st.one_of(st.integers(-8, 8), st.integers(), st.booleans(), st.floats(), st.text(max_size=1),
                 st.builds(slice, st.none() | st.integers(-6, 6), st.none() | st.integers(-6, 6),
                           st.none() | st.integers(-3, 3).filter(bool))))
def test_outputs_index_as_a_list_does(items, index):
    # outputs[i] reads an int in place; every index gives what the list's would, or its error.
    from ifrtpy.executable import Outputs

    def read(sequence):
        try:
            return "ok", sequence[index]
        except Exception as error:  # the same class and message as the list's
            return type(error), str(error)

    assert read(Outputs(items)) == read(list(items))


# -- backend registry -----------------------------------------------------------------------


@pytest.fixture
def registry():
    saved = dict(client_mod._BACKENDS)
    yield
    client_mod._BACKENDS.clear()
    client_mod._BACKENDS.update(saved)


def test_builtin_backends_are_registered_lazily():
    assert {"pjrt", "reference"} <= set(registered_backends())
    assert client_mod._BACKENDS["pjrt"] == "ifrtpy.backends.pjrt:create_client"
    assert client_mod._BACKENDS["reference"] == "ifrtpy.backends.reference:create_client"


def test_unknown_backend_lists_registered_names(registry):
    with pytest.raises(NotFoundError, match=r"(?s)no ifrtpy backend or PJRT plugin named 'nope'"
                                            r".*backends: .*pjrt, reference"):
        get_client("nope")


def test_register_callable_backend_passes_kwargs(registry):
    register_backend("mini", create_client)
    c = get_client("mini", device_count=2)
    assert isinstance(c, ExampleClient) and c.device_count() == 2
    assert "mini" in registered_backends()
    assert get_client("mini") is not c  # a new client per call


def test_register_by_import_path(registry):
    register_backend("mini-path", "ifrtpy.testing.example_backend:create_client")
    assert get_client("mini-path", device_count=3).device_count() == 3
    register_backend("missing-attr", f"{__name__}:no_such_factory")
    with pytest.raises(NotFoundError, match="no_such_factory"):
        get_client("missing-attr")
    register_backend("missing-module", "ifrtpy_no_such_module:create_client")
    with pytest.raises(ImportError):
        get_client("missing-module")


def test_register_duplicate_and_replace(registry):
    register_backend("mini", create_client)
    with pytest.raises(AlreadyExistsError, match="'mini'"):
        register_backend("mini", create_client)
    register_backend("mini", lambda **kw: create_client(device_count=1), replace=True)
    assert get_client("mini").device_count() == 1
    with pytest.raises(AlreadyExistsError):
        register_backend("pjrt", create_client)


@pytest.mark.parametrize(
    "name, factory, message",
    [
        ("", create_client, "non-empty str"),
        (3, create_client, "non-empty str"),
        ("x", "no_colon", "'module:function'"),
        ("x", ":f", "'module:function'"),
        ("x", 42, "callable"),
    ],
)
def test_register_backend_validation(registry, name, factory, message):
    with pytest.raises(InvalidArgumentError, match=message):
        register_backend(name, factory)


def test_factory_must_return_a_client(registry):
    register_backend("bogus", lambda: object())
    with pytest.raises(InvalidArgumentError, match="not a Client"):
        get_client("bogus")


def test_registry_is_thread_safe(registry):
    errors = []

    def reg(i):
        try:
            register_backend(f"t{i}", create_client)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=reg, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and {f"t{i}" for i in range(32)} <= set(registered_backends())


def test_interface_modules_do_not_import_backends():
    # ifrtpy.backends itself is the registry (names only) and the code backends share: no
    # backend is imported with it
    code = (
        "import sys, ifrtpy.client, ifrtpy.array, ifrtpy.executable, ifrtpy.future;"
        "bad = [m for m in sys.modules if m.startswith('ifrtpy._pjrt') or m.split('.')[:3] in"
        " (['ifrtpy', 'backends', b] for b in ('pjrt', 'jax', 'reference'))];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(_repo_root()))


def _repo_root():
    import pathlib

    return pathlib.Path(__file__).resolve().parents[2]


# -- property: host buffers with arbitrary byte strides --------------------------------------


@st.composite
def dims_and_strides(draw):
    dims = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
    itemsize = 4
    order = draw(st.permutations(range(len(dims))))  # minor-to-major dimension order
    strides = [0] * len(dims)
    step = itemsize
    for axis in order:
        step *= draw(st.integers(1, 2))  # optional padding
        strides[axis] = step * draw(st.sampled_from([1, -1]))
        step *= max(dims[axis], 1)
    return dims, tuple(strides)


@given(dims_and_strides())
def test_copy_to_host_buffer_any_byte_strides_matches_numpy(ds):
    dims, strides = ds
    client = create_client(device_count=1)
    x = np.arange(int(np.prod(dims)), dtype=np.int32).reshape(dims)
    a = client.make_array_from_host_buffer(x, single(client))
    out = a.copy_to_host_buffer(byte_strides=strides).result()
    if 0 not in dims:
        assert out.strides == strides
    np.testing.assert_array_equal(out, x)


def test_the_package_lists_its_public_names_only():
    """``dir(ifrtpy)`` and ``__all__`` are the public names (each resolves); the modules
    behind them (``array_plans``, ``execute_checks``, ...) stay out even once imported."""
    import ifrtpy
    import ifrtpy.array_plans  # noqa: F401  (an imported submodule is an attribute)

    assert "get_client" in ifrtpy.__all__ and "Array" in ifrtpy.__all__
    for name in ifrtpy.__all__:
        assert getattr(ifrtpy, name) is not None, name
    listed = dir(ifrtpy)
    for plumbing in ("array_plans", "array_text", "execute_checks", "executable_options",
                     "array", "backends", "annotations", "_log", "_Any"):
        assert plumbing not in listed, plumbing
    assert set(listed) - set(ifrtpy.__all__) == {"builder", "testing"}  # proxy needs grpcio
    assert ifrtpy.builder.Builder and ifrtpy.errors.IfrtError
    assert ifrtpy.plugins.builds.default_cpu_library  # any submodule, as before, unlisted
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        ifrtpy.nothing
