"""Laws every backend's arrays keep, checked against NumPy with hypothesis.

Host arrays of every dtype and shape (:mod:`ifrtpy.testing.strategies`) go through every
sharding kind, over random device subsets and orders, in every memory kind the devices
share; values are compared byte-wise (floats may hold NaNs) with the input, or, for a
dtype the client declares it holds inexactly (``Client.inexact_dtypes``), with the
declared values of the input (NaNs equal whatever their payloads); each declaration is
checked against the devices. A backend that declares it holds no arrays over several
devices (``MULTI_DEVICE_ARRAYS = False``,
:class:`~ifrtpy.testing.conformance.declarations.Declaration`) is held to the laws with
single-device shardings only; nothing is probed. A draw the backend raises
UnimplementedError for fails a core law; another law rejects it only for a reason the
backend declares for that law (``REJECTED_DRAWS``), and says how many it rejected
(:func:`~ifrtpy.testing.conformance.outcomes.reject_unimplemented`).

Run them with :func:`~ifrtpy.testing.conformance.case_classes` from a backend's test
module that provides a ``client`` fixture (see :mod:`ifrtpy.testing.conformance`). The
number of examples is hypothesis's profile (``ci``, ``dev``, ``debug``:
:func:`ifrtpy.testing.strategies.register_profiles`).
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.array import ArrayCopySemantics, ArraySpec, HostBufferSemantics
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import Shape
from ifrtpy.sharding import SingleDeviceSharding, SingleDeviceShardSemantics
from ifrtpy.testing import strategies as S
from ifrtpy.testing.asserts import assert_per_shard_data, assert_same_values
from ifrtpy.testing.conformance import outcomes
from ifrtpy.testing.conformance.outcomes import reject_unimplemented

ALWAYS_COPY = ArrayCopySemantics.ALWAYS_COPY
REUSE_INPUT = ArrayCopySemantics.REUSE_INPUT
DONATE_INPUT = ArrayCopySemantics.DONATE_INPUT
ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
TIMEOUT_S = 10.0

# The client fixture is module or session scoped: it is not reset between examples. No
# deadline: a law's verdict is about values, not about how busy the machine is (hypothesis's
# default profile, which a plugin run gets, failed the PjRt laws at 200 ms on a loaded one).
_FIXTURE = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                          HealthCheck.too_slow])

def holds_multi_device_arrays(client) -> bool:
    """Whether the laws draw arrays over several of ``client``'s devices: it has two
    addressable ones and its backend declares such arrays (the running case's
    declaration, :func:`~ifrtpy.testing.conformance.outcomes.declared`)."""
    return len(client.addressable_devices()) >= 2 and outcomes.declared().multi_device_arrays


def _single_device_only(client) -> str:
    """Why the laws draw single-device arrays only on ``client``."""
    count = len(client.addressable_devices())
    if count < 2:
        return f"cannot hold arrays over several devices: the client has {count}"
    return (f"cannot hold arrays over several devices: {type(client).__name__}'s backend "
            "declares none (MULTI_DEVICE_ARRAYS = False)")


def memory_kinds(client) -> list:
    """The memory kinds every addressable device has, in the first device's order."""
    devices = client.addressable_devices()
    kinds = [m.kind for m in devices[0].memories()]
    return [k for k in kinds if all(any(m.kind == k for m in d.memories()) for d in devices)]


def shardings_for(client, shape, min_devices: int = 1) -> st.SearchStrategy:
    """Shardings of an array of ``shape`` over the client's addressable devices, in any
    shared memory kind, of the kinds the backend declares (``SHARDING_KINDS``); single-device
    ones only for a backend that declares no multi-device arrays, or a client of one
    device."""
    devices = client.addressable_devices()
    kinds = memory_kinds(client)
    if not holds_multi_device_arrays(client):
        if min_devices > 1:
            pytest.skip(_single_device_only(client))
        return st.builds(SingleDeviceSharding, st.sampled_from(devices),
                         st.sampled_from([None, *kinds]))
    sharding_kinds = outcomes.declared().sharding_kinds or S.SHARDING_KINDS
    if min_devices > 1 and set(sharding_kinds) == {"single"}:
        pytest.skip("needs arrays over several devices: the backend declares single-device "
                    "shardings only (SHARDING_KINDS)")
    return S.shardings(devices, shape, kinds, sharding_kinds).filter(
        lambda s: len(s.devices) >= min_devices)


@st.composite
def cases(draw, client, sub_byte=True, min_devices=1):
    """(host array, sharding) for the client (see :func:`shardings_for`)."""
    dtype = draw(S.dtypes(sub_byte=sub_byte))
    shape = draw(S.shapes())
    x = draw(S.host_arrays(dtype, shape))
    return x, draw(shardings_for(client, shape, min_devices))


def _strided(x: np.ndarray, layout: str) -> np.ndarray:
    """An array equal to ``x`` laid out as ``layout`` says (a view with those strides)."""
    if x.ndim == 0:
        return x
    if layout == "fortran":
        return np.asfortranarray(x)
    if layout == "reversed":  # negative strides
        index = (slice(None, None, -1),) * x.ndim
        return np.ascontiguousarray(x[index])[index]
    if layout == "padded":  # every dimension strided by 2 elements
        big = np.zeros([2 * n for n in x.shape], x.dtype)
        index = (slice(None, None, 2),) * x.ndim
        big[index] = x
        return big[index]
    return x


def _host(array) -> np.ndarray:
    return array.copy_to_host_buffer().result(timeout=TIMEOUT_S)


def expected_values(client, x: np.ndarray, *memory_kinds) -> tuple[np.ndarray, bool]:
    """What host array ``x`` reads as once put into the client's memory of the first of
    ``memory_kinds`` and copied through the others in turn (None: the default memory):
    the values the client declares for an inexact dtype (``Client.inexact_dtypes``), else
    ``x`` itself (a copy between memories declaring the same values keeps them as they
    are); and whether NaNs then compare equal whatever their payloads (declared values
    promise none)."""
    dtype = ifrt.DType.from_numpy(x.dtype)
    nan_equal, held = False, None
    for kind in memory_kinds:
        declared = client.inexact_dtypes(kind).get(dtype)
        if declared is not None and declared != held:
            x, nan_equal = declared.held_values(x), True
        held = declared
    return x, nan_equal


# -- host <-> array -------------------------------------------------------------------------

@_FIXTURE
@given(data=st.data(), layout=st.sampled_from(["c", "fortran", "reversed", "padded"]))
@reject_unimplemented
def test_host_array_host_is_identity(client, data, layout):
    x, sharding = data.draw(cases(client))
    array = client.make_array_from_host_buffer(_strided(x, layout), sharding)
    assert array.sharding is sharding
    assert array.dtype == ifrt.DType.from_numpy(x.dtype)
    assert array.shape == Shape(x.shape)
    want, nan_equal = expected_values(client, x, sharding.memory_kind)
    assert_same_values(np.asarray(array), want, nan_equal=nan_equal)
    out = _strided(np.zeros_like(x), data.draw(st.sampled_from(["fortran", "reversed", "padded"])))
    assert array.copy_to_host_buffer(out=out).result(timeout=TIMEOUT_S) is out
    assert_same_values(out, want, nan_equal=nan_equal)


@_FIXTURE
@given(data=st.data(), semantics=st.sampled_from(list(HostBufferSemantics)))
@reject_unimplemented
def test_on_done_runs_once_and_then_the_host_data_is_free(client, data, semantics):
    x, sharding = data.draw(cases(client))
    host = x.copy()
    calls = []
    done = threading.Event()

    def on_done():
        calls.append(threading.get_ident())
        done.set()

    array = client.make_array_from_host_buffer(host, sharding, semantics, on_done)
    if semantics == HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL:
        assert len(calls) == 1
    array.ready_future().result(timeout=TIMEOUT_S)
    if not done.is_set() and semantics >= HostBufferSemantics.IMMUTABLE_ZERO_COPY:
        del array  # a zero-copy array may use the data until it is freed
    deadline = time.monotonic() + TIMEOUT_S
    while not done.is_set() and time.monotonic() < deadline:
        gc.collect()
        done.wait(0.01)
    assert len(calls) == 1
    host.reshape(-1).view(np.uint8)[...] = 0xAB  # the runtime must not read it any more
    if "array" in locals():
        want, nan_equal = expected_values(client, x, sharding.memory_kind)
        assert_same_values(np.asarray(array), want, nan_equal=nan_equal)
    assert len(calls) == 1


@_FIXTURE
@given(data=st.data())
@reject_unimplemented
def test_each_shard_is_the_numpy_slice_of_its_index_domain(client, data):
    x, sharding = data.draw(cases(client))
    array = client.make_array_from_host_buffer(x, sharding)
    want, nan_equal = expected_values(client, x, sharding.memory_kind)
    assert_per_shard_data(array, want, nan_equal=nan_equal)


#: Values of the TPU's float64 measurement (what a float32 pair keeps, rounds, overflows
#: and flushes), put with the drawn ones for a float or complex dtype declared inexact.
_EDGE_VALUES = (1 / 3, np.pi, 6.805647e38, 7.29e-304, 2.0 ** -149, -0.0, np.inf, -np.inf, np.nan)


@_FIXTURE
@given(data=st.data())
@reject_unimplemented
def test_declared_inexact_dtypes_are_what_the_devices_hold(client, data):
    """For a dtype the client declares inexact (``Client.inexact_dtypes``) in a memory
    kind, a put there and a copy back give the declared values; skipped where the client
    declares every dtype exact."""
    declared = {kind: client.inexact_dtypes(kind) for kind in [None, *memory_kinds(client)]}
    if not any(declared.values()):
        pytest.skip(f"{type(client).__name__} declares every dtype exact")
    kind = data.draw(st.sampled_from([k for k, d in declared.items() if d]))
    dtype = data.draw(st.sampled_from(sorted(declared[kind], key=str)))
    x = data.draw(S.host_arrays(dtype.to_numpy(), (data.draw(st.integers(0, 64)),)))
    if x.dtype.kind in "fc":
        with np.errstate(over="ignore"):
            x = np.concatenate([np.array(_EDGE_VALUES).astype(x.dtype), x])
    device = data.draw(st.sampled_from(client.addressable_devices()))
    array = client.make_array_from_host_buffer(x, SingleDeviceSharding(device, kind))
    assert_same_values(_host(array), declared[kind][dtype].held_values(x),
                       f"{dtype} in memory kind {kind}: {declared[kind][dtype].summary}",
                       nan_equal=True)


# -- assemble / disassemble -------------------------------------------------------------------

@_FIXTURE
@given(data=st.data(), split=st.sampled_from(list(ArrayCopySemantics)),
       join=st.sampled_from(list(ArrayCopySemantics)))
@reject_unimplemented
def test_assemble_of_disassemble_is_identity(client, data, split, join):
    x, sharding = data.draw(cases(client))
    array = client.make_array_from_host_buffer(x, sharding)
    shards = array.disassemble_into_single_device_arrays(split, ADDRESSABLE)
    assert array.is_deleted() == (split == DONATE_INPUT)
    again = client.assemble_array_from_single_device_arrays(
        Shape(x.shape), sharding, shards, join, ADDRESSABLE)
    assert again.sharding is sharding
    for i, shard in enumerate(shards):
        if shard is not again:  # a one-shard assemble may hand back its input
            assert shard.is_deleted() == (join == DONATE_INPUT), i
    want, nan_equal = expected_values(client, x, sharding.memory_kind)
    assert_same_values(np.asarray(again), want, nan_equal=nan_equal)


# -- reshard and copy -------------------------------------------------------------------------

def reordered(client, source) -> st.SearchStrategy:
    """``source`` over its own devices in any order, in any memory kind: drawn with half
    of a reshard's targets, so that a run always holds moves to the same devices in
    another order and memory kind at once (jax's device_put once refused those, and
    independent draws of source and target rarely make one)."""
    return st.builds(source.with_device_assignment, st.permutations(list(source.devices)),
                     st.sampled_from(memory_kinds(client)))


@_FIXTURE
@given(data=st.data(), semantics=st.sampled_from([ALWAYS_COPY, DONATE_INPUT]))
@reject_unimplemented
def test_reshard_keeps_every_value(client, data, semantics):
    x, source = data.draw(cases(client))
    target = data.draw(st.one_of(shardings_for(client, x.shape), reordered(client, source)))
    array = client.make_array_from_host_buffer(x, source)
    dtype = ifrt.DType.from_numpy(x.dtype)
    (out,) = client.reshard_arrays([array], [ArraySpec(dtype, Shape(x.shape), target)], semantics)
    assert out.sharding is target
    assert array.is_deleted() == (semantics == DONATE_INPUT)
    want, nan_equal = expected_values(client, x, source.memory_kind, target.memory_kind)
    assert_same_values(np.asarray(out), want, nan_equal=nan_equal)
    assert_per_shard_data(out, want, nan_equal=nan_equal)
    if semantics == ALWAYS_COPY:
        want, nan_equal = expected_values(client, x, source.memory_kind)
        assert_same_values(np.asarray(array), want, nan_equal=nan_equal)


@_FIXTURE
@given(data=st.data(), semantics=st.sampled_from(list(ArrayCopySemantics)))
@reject_unimplemented
def test_copy_arrays_to_other_devices_keeps_every_value(client, data, semantics):
    x, sharding = data.draw(cases(client))
    devices = data.draw(st.permutations(client.addressable_devices()))[:len(sharding.devices)]
    kind = data.draw(st.sampled_from([None, *memory_kinds(client)]))
    array = client.make_array_from_host_buffer(x, sharding)
    (out,) = client.copy_arrays([array], devices, kind, semantics)
    assert out.sharding == sharding.with_device_assignment(devices, kind)
    assert list(out.sharding.devices) == devices
    assert array.is_deleted() == (semantics == DONATE_INPUT)
    want, nan_equal = expected_values(client, x, sharding.memory_kind, out.sharding.memory_kind)
    assert_same_values(np.asarray(out), want, nan_equal=nan_equal)
    if semantics != DONATE_INPUT:
        want, nan_equal = expected_values(client, x, sharding.memory_kind)
        assert_same_values(np.asarray(array), want, nan_equal=nan_equal)


# -- donation and validation ------------------------------------------------------------------

@pytest.mark.parametrize("semantics", list(ArrayCopySemantics), ids=lambda s: s.name)
def test_donation_deletes_exactly_the_donated_inputs(client, semantics):
    devices = client.addressable_devices()
    if len(devices) < 4:
        pytest.skip(f"needs 4 addressable devices, the client has {len(devices)}")
    devices = devices[:4]
    x = np.arange(8, dtype=np.int32).reshape(4, 2)
    sharding = ifrt.NamedSharding(ifrt.Mesh(devices, "x"), ifrt.PartitionSpec("x"))
    donated = semantics == DONATE_INPUT
    bystander = client.make_array_from_host_buffer(x, sharding)
    array = client.make_array_from_host_buffer(x, sharding)
    shards = array.disassemble_into_single_device_arrays(semantics)
    assert array.is_deleted() == donated
    assembled = client.assemble_array_from_single_device_arrays(
        Shape([4, 2]), sharding, shards, semantics)
    assert [s.is_deleted() for s in shards] == [donated] * 4
    (copied,) = client.copy_arrays([assembled], devices[::-1], None, semantics)
    assert assembled.is_deleted() == donated
    np.testing.assert_array_equal(np.asarray(copied), x)
    if donated:
        for value in (array, assembled, *shards):
            assert value.ready_future().exception(timeout=TIMEOUT_S) is not None
    assert not bystander.is_deleted() and not copied.is_deleted()
    np.testing.assert_array_equal(np.asarray(bystander), x)


def _read_error(array):
    """The error reading ``array`` fails with (at the call or through its future), or None."""
    try:
        return array.copy_to_host_buffer().exception(timeout=TIMEOUT_S)
    except Exception as e:  # a backend may refuse the read at the call
        return e


def test_an_array_reads_deleted_exactly_when_it_cannot_be_read(client):
    """Deleting one of the shards a REUSE_INPUT disassembly gave (each in turn, over two
    devices where the backend holds such arrays): the array reads deleted exactly when
    reading it fails, then with FailedPreconditionError; a backend whose shards share the
    array's memory reads deleted whichever shard went."""
    devices = client.addressable_devices()[:2 if holds_multi_device_arrays(client) else 1]
    x = np.arange(2 * len(devices), dtype=np.int32).reshape(len(devices), 2)
    sharding = ifrt.NamedSharding(ifrt.Mesh(devices, "x"), ifrt.PartitionSpec("x"))
    for i in range(len(devices)):
        array = client.make_array_from_host_buffer(x, sharding)
        shards = array.disassemble_into_single_device_arrays(REUSE_INPUT, ADDRESSABLE)
        shards[i].delete().result(timeout=TIMEOUT_S)
        assert shards[i].is_deleted()
        error = _read_error(array)
        assert array.is_deleted() == (error is not None), (i, error)
        if error is not None:
            assert isinstance(error, ifrt.errors.FailedPreconditionError), (i, error)
        else:
            np.testing.assert_array_equal(np.asarray(array), x)


@_FIXTURE
@given(data=st.data(), fault=st.sampled_from(["count", "device", "dtype", "shape"]),
       semantics=st.sampled_from(list(ArrayCopySemantics)))
@reject_unimplemented
def test_bad_assemble_raises_and_leaves_inputs_intact(client, data, fault, semantics):
    x, sharding = data.draw(cases(client, sub_byte=False, min_devices=2))
    shape = Shape(x.shape)
    shards = client.make_array_from_host_buffer(x, sharding).disassemble_into_single_device_arrays(
        ALWAYS_COPY)
    i = data.draw(st.integers(0, len(shards) - 1))
    expected_device = sharding.devices[i]
    shard_shape = shards[i].shape
    if fault == "count":
        shards = shards[:i] + shards[i + 1:]
    elif fault == "device":
        other = next(d for d in client.addressable_devices() if d is not expected_device)
        (shards[i],) = client.copy_arrays([shards[i]], [other], None, ALWAYS_COPY)
    elif fault == "dtype":
        wrong = np.dtype(np.float32 if x.dtype != np.float32 else np.int32)
        shards[i] = client.make_array_from_host_buffer(
            np.zeros(shard_shape.dims, wrong),
            SingleDeviceSharding(expected_device, sharding.memory_kind))
    else:
        shards[i] = client.make_array_from_host_buffer(
            np.zeros((*shard_shape.dims, 1), x.dtype),
            SingleDeviceSharding(expected_device, sharding.memory_kind))
    with pytest.raises(InvalidArgumentError):
        client.assemble_array_from_single_device_arrays(shape, sharding, shards, semantics)
    for shard in shards:
        assert not shard.is_deleted()
        shard.ready_future().result(timeout=TIMEOUT_S)


@pytest.mark.parametrize("semantics", list(ArrayCopySemantics), ids=lambda s: s.name)
def test_bad_reshard_raises_and_leaves_inputs_intact(client, semantics):
    devices = client.addressable_devices()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = client.make_array_from_host_buffer(x, SingleDeviceSharding(devices[0]))
    target = SingleDeviceSharding(devices[-1])
    for spec in (ArraySpec(np.float32, Shape([3, 2]), target),
                 ArraySpec(np.int32, Shape([2, 3]), target)):
        with pytest.raises(InvalidArgumentError):
            client.reshard_arrays([a], [spec], semantics)
    if semantics == REUSE_INPUT:
        with pytest.raises(InvalidArgumentError):
            client.reshard_arrays([a], [ArraySpec(np.float32, Shape([2, 3]), target)], semantics)
    assert not a.is_deleted()
    np.testing.assert_array_equal(np.asarray(a), x)


def _taken_as_given(devices) -> dict:
    """Shardings of an f32[4] array over two devices whose shard shapes or index domains,
    taken as given when built (as IFRT does), cannot hold it."""
    d = devices[:2]
    return {
        "overlapping domains": ifrt.ConcreteSharding(
            d, [4], [[3], [1]], [ifrt.IndexDomain([0], [3]), ifrt.IndexDomain([1], [1])]),
        "a hole": ifrt.ConcreteSharding(
            d, [4], [[2], [1]], [ifrt.IndexDomain([0], [2]), ifrt.IndexDomain([3], [1])]),
        "a domain outside": ifrt.ConcreteSharding(
            d, [4], [[2], [2]], [ifrt.IndexDomain([0], [2]), ifrt.IndexDomain([3], [2])]),
        "a shard larger than the array": ifrt.ConcreteSharding(d, [4], [[5], [1]]),
        "a replicated shard smaller than the array": ifrt.ConcreteEvenSharding(d, [4], [2], True),
        "too few elements in the shards": ifrt.ConcreteEvenSharding(d, [4], [1], False),
        "a shard of another rank": ifrt.ConcreteEvenSharding(d, [4], [2, 2], False),
    }


@pytest.mark.parametrize("op", ["put", "assemble", "reshard"])
def test_shardings_taken_as_given_are_checked_where_an_array_is_made(client, op):
    """Concrete shardings are built whatever their shapes say (IFRT's cases); making an
    array with one that cannot hold it raises InvalidArgumentError, leaving the inputs
    intact, instead of an array with missing or misplaced elements."""
    if not holds_multi_device_arrays(client):
        pytest.skip(_single_device_only(client))
    devices = client.addressable_devices()
    x = np.arange(4, dtype=np.float32)
    for name, sharding in _taken_as_given(devices).items():
        if op == "put":
            with pytest.raises(InvalidArgumentError):
                client.make_array_from_host_buffer(x, sharding)
            continue
        if op == "assemble":
            shard_shapes = (sharding.shard_shapes if isinstance(sharding, ifrt.ConcreteSharding)
                            else [sharding.shard_shape([4])] * 2)
            inputs = [client.make_array_from_host_buffer(np.zeros(s, np.float32),
                                                         SingleDeviceSharding(d))
                      for s, d in zip(shard_shapes, devices)]
            with pytest.raises(InvalidArgumentError):
                client.assemble_array_from_single_device_arrays([4], sharding, inputs,
                                                                DONATE_INPUT)
        else:
            inputs = [client.make_array_from_host_buffer(x, SingleDeviceSharding(devices[0]))]
            with pytest.raises(InvalidArgumentError):
                client.reshard_arrays(inputs, [ArraySpec(np.float32, Shape([4]), sharding)],
                                      DONATE_INPUT)
        assert not any(a.is_deleted() for a in inputs), name


# -- error arrays ----------------------------------------------------------------------------

def _assert_injected(future):
    exc = future.exception(timeout=TIMEOUT_S)
    assert exc is not None and "injected error" in str(exc), exc


@pytest.mark.parametrize("op", ["copy", "reshard", "disassemble", "assemble"])
def test_an_error_array_poisons_what_is_made_from_it(client, op):
    """Errors of an array travel through the futures of the arrays made from it; they
    are not raised at the call."""
    devices = client.addressable_devices()
    error = InvalidArgumentError("injected error")
    if op == "assemble":
        (shard,) = client.make_error_arrays(
            error, [ArraySpec(np.float32, Shape([2, 3]), SingleDeviceSharding(devices[0]))])
        sharding = ifrt.ConcreteEvenSharding(devices[:1], [2, 3], [2, 3])
        outs = [client.assemble_array_from_single_device_arrays([2, 3], sharding, [shard])]
    else:
        sharding = SingleDeviceSharding(devices[0])
        (array,) = client.make_error_arrays(error, [ArraySpec(np.float32, Shape([2, 3]),
                                                              sharding)])
        if op == "copy":
            outs = client.copy_arrays([array], devices[-1:], None, ALWAYS_COPY)
        elif op == "reshard":
            spec = ArraySpec(np.float32, Shape([2, 3]), SingleDeviceSharding(devices[-1]))
            outs = client.reshard_arrays([array], [spec], ALWAYS_COPY)
        else:
            try:
                outs = array.disassemble_into_single_device_arrays(REUSE_INPUT)
            except InvalidArgumentError:
                return  # raised at the call is allowed for disassemble
    for out in outs:
        _assert_injected(out.ready_future())
        _assert_injected(out.copy_to_host_buffer())


__all__ = sorted(name for name in dir() if name.startswith("test_"))
