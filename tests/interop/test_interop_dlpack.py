"""Zero-copy exchange with NumPy and jax: DLPack both ways, NumPy views, lifetimes.

The oracle is NumPy (values byte for byte) and the addresses the plugin reports
(``unsafe_buffer_pointer``): equal addresses prove that nothing was copied.
"""

import gc
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from ifrtpy.testing import strategies as S
from pjrt_helpers import aligned_empty, assert_survives

WHOLE_BYTE = [d for d in S.DTYPES if d.itemsize * 8 == ifrt.DType.from_numpy(d).bit_size]


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)


def _bytes(x) -> bytes:
    return np.ascontiguousarray(x).view(np.uint8).tobytes()


def _put(client, x, device=0, kind=None):
    return client.make_array_from_host_buffer(
        x, ifrt.SingleDeviceSharding(client.devices()[device], kind))


class _Capsule:
    """Hands out one given capsule, as a producer would."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


# -- export ---------------------------------------------------------------------------------

@given(data=st.data(), dtype=st.sampled_from(WHOLE_BYTE), shape=S.shapes(),
       kind=st.sampled_from(["device", "pinned_host", "unpinned_host"]))
def test_numpy_views_and_dlpack_export_are_zero_copy(client, data, dtype, shape, kind):
    x = data.draw(S.host_arrays(dtype, shape))
    a = _put(client, x, data.draw(st.integers(0, 7)), kind)
    view = np.asarray(a)
    # NumPy's DLPack import knows the standard kinds only; ifrtpy's own, every dtype
    exported = np.from_dlpack(a) if x.dtype.num < 256 else view  # not ml_dtypes
    for out in (view, exported):
        assert out.dtype == x.dtype and out.shape == x.shape
        assert _bytes(out) == _bytes(x)
        assert not out.flags.writeable
        if x.size:
            assert out.ctypes.data == a.unsafe_buffer_pointer()
    b = ifrt.from_dlpack(a, client, copy=x.size == 0 or None)
    assert b.dtype == a.dtype and _bytes(np.asarray(b)) == _bytes(x)
    if x.size:
        assert b.unsafe_buffer_pointer() == a.unsafe_buffer_pointer()
    assert a.__dlpack_device__() == (1, 0)
    copied = np.array(a)  # copy=True: a new, writeable array
    assert copied.flags.writeable and not np.shares_memory(copied, view)
    assert _bytes(copied) == _bytes(x)


@given(data=st.data(), dtype=st.sampled_from(WHOLE_BYTE), shape=S.shapes())
def test_jax_round_trips_without_a_copy(client, data, dtype, shape):
    jnp = pytest.importorskip("jax.numpy")
    from ifrtpy.interop import jax as ij
    x = data.draw(S.host_arrays(dtype, shape))
    a = _put(client, x)
    j = ij.to_jax(a)  # every dtype, 64-bit ones too
    assert j.dtype == x.dtype and _bytes(np.asarray(j)) == _bytes(x)
    b = ij.from_jax(j, client)
    assert b.dtype == a.dtype and _bytes(np.asarray(b)) == _bytes(x)
    if x.dtype.num < 256 and x.itemsize <= 4:  # jnp.from_dlpack canonicalizes 64-bit
        k = jnp.from_dlpack(a)
        assert _bytes(np.asarray(k)) == _bytes(x)
        c = ifrt.from_dlpack(k, client.devices()[0])
        assert _bytes(np.asarray(c)) == _bytes(x)
        if x.size:
            assert k.unsafe_buffer_pointer() == a.unsafe_buffer_pointer() == c.unsafe_buffer_pointer()
    if x.size:
        assert j.unsafe_buffer_pointer() == a.unsafe_buffer_pointer() == b.unsafe_buffer_pointer()


def test_capsule_kinds_versions_and_flags(client):
    a = _put(client, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert "dltensor" in repr(a.__dlpack__()) and "versioned" not in repr(a.__dlpack__())
    assert "dltensor_versioned" in repr(a.__dlpack__(max_version=(1, 0)))
    assert "dltensor" in repr(a.__dlpack__(max_version=(0, 8)))
    with pytest.raises(BufferError, match="stream"):
        a.__dlpack__(stream=7)
    with pytest.raises(BufferError, match="copy"):
        a.__dlpack__(dl_device=(2, 0), copy=False)
    copied = np.from_dlpack(a, copy=True)
    assert copied.ctypes.data != a.unsafe_buffer_pointer()
    np.testing.assert_array_equal(copied, np.asarray(a))
    to_host = np.from_dlpack(a, device="cpu")
    np.testing.assert_array_equal(to_host, np.asarray(a))


def test_multi_device_and_deleted_arrays_refuse_clearly(client):
    mesh = ifrt.Mesh(np.array(client.devices()[:2]), ("x",))
    x = np.arange(8, dtype=np.int32)
    a = client.make_array_from_host_buffer(x, ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x")))
    for call in (a.__dlpack__, a.__dlpack_device__, a.unsafe_buffer_pointer):
        with pytest.raises(InvalidArgumentError, match="disassemble_into_single_device_arrays"):
            call()
    with pytest.raises(ValueError, match="copy"):
        np.array(a, copy=False)
    np.testing.assert_array_equal(np.asarray(a), x)  # gathered by copy
    b = _put(client, x)
    b.delete()
    for call in (b.__dlpack__, b.unsafe_buffer_pointer, lambda: np.asarray(b)):
        with pytest.raises(FailedPreconditionError):
            call()


def test_sub_byte_arrays_are_copied_not_exported(client):
    import ml_dtypes
    x = np.array([1, -2, 3], ml_dtypes.int4)
    a = _put(client, x)
    np.testing.assert_array_equal(np.asarray(a), x)
    with pytest.raises(ValueError):
        np.array(a, copy=False)
    with pytest.raises(UnimplementedError, match="int4"):
        a.__dlpack__()


def test_uneven_arrays_export_shard_by_shard(client):
    devices = client.devices()[:3]
    x = np.arange(16, dtype=np.float64).reshape(4, 4)
    sharding = ifrt.HloSharding(devices, "{devices=[3,1]0,1,2}")  # rows 2, 2 and 0
    a = client.make_array_from_host_buffer(x, sharding)
    shards = a.disassemble_into_single_device_arrays()
    pieces = [np.from_dlpack(s) for s in shards]
    np.testing.assert_array_equal(np.concatenate(pieces), x)
    assert pieces[2].shape == (0, 4)
    for shard, piece in zip(shards[:2], pieces[:2]):
        assert piece.ctypes.data == shard.unsafe_buffer_pointer()


# -- lifetimes ------------------------------------------------------------------------------

def test_views_outlive_the_array_the_client_and_gc():
    c = ifrt.get_client("pjrt", device_count=2)
    x = np.arange(1000, dtype=np.float32)
    a = _put(c, x, 1)
    view, capsule = np.asarray(a), a.__dlpack__(max_version=(1, 0))
    del a, c
    gc.collect()
    junk = [np.full(1000, 7.0, np.float32) for _ in range(100)]  # reuse freed memory, if any
    np.testing.assert_array_equal(view, x)
    np.testing.assert_array_equal(np.from_dlpack(_Capsule(capsule)), x)
    del junk


def test_delete_under_a_view_is_deferred_to_the_last_view(client):
    x = np.arange(4096, dtype=np.int64)
    a = _put(client, x)
    (buffer,) = a.buffers
    view, other = np.asarray(a), np.from_dlpack(a)
    assert buffer.exports == 2
    a.delete()
    assert a.is_deleted() and buffer.is_deleted()
    with pytest.raises(FailedPreconditionError):
        np.asarray(a)
    np.testing.assert_array_equal(view, x)
    del view
    np.testing.assert_array_equal(other, x)
    del other
    assert buffer.exports == 0 and buffer.is_deleted()


def test_donating_a_viewed_array_is_refused(client):
    jax = pytest.importorskip("jax")
    from pjrt_helpers import lower
    device = client.devices()[0]
    text = lower(lambda v: v + 1, np.ones(4, np.float32), donate_argnums=0)
    exe = client.compile(ifrt.HloProgram(text), ifrt.CompileOptions(devices=client.make_device_list([device])))
    for _ in range(2):  # the checked call, then the repeated (fast) one
        a = _put(client, np.ones(4, np.float32))
        view = np.asarray(a)
        with pytest.raises(FailedPreconditionError, match="donated"):
            exe.execute([a])
        assert not a.is_deleted()
        np.testing.assert_array_equal(view, 1.0)
        del view
        (out,) = exe.execute([a]).outputs
        np.testing.assert_array_equal(np.asarray(out), 2.0)
        assert a.is_deleted()
    del jax


def test_a_view_of_read_only_memory_is_never_donated(client):
    # Donating lets the plugin write outputs into the argument's memory: a view of a
    # tensor its producer marked read-only (DLPack 1.x) stays zero-copy but is not donated.
    pytest.importorskip("jax")
    from pjrt_helpers import lower
    device = client.devices()[0]
    text = lower(lambda v: v + 1, np.ones(16, np.float32), donate_argnums=0)
    exe = client.compile(ifrt.HloProgram(text), ifrt.CompileOptions(devices=client.make_device_list([device])))
    x = aligned_empty((16,), np.float32)
    x[:] = 1
    x.flags.writeable = False
    for _ in range(2):  # the checked call, then the repeated (fast) one
        b = ifrt.from_dlpack(x, device)
        assert b.unsafe_buffer_pointer() == x.ctypes.data  # zero-copy all the same
        with pytest.raises(InvalidArgumentError, match="read-only: it cannot be donated"):
            exe.execute([b])
        (out,) = exe.execute([b], ifrt.ExecuteOptions(non_donatable_input_indices=frozenset({0}))).outputs
        np.testing.assert_array_equal(np.asarray(out), 2.0)
        np.testing.assert_array_equal(x, 1.0)


def test_a_capsule_is_consumed_once(client):
    a = _put(client, np.arange(3, dtype=np.int16))
    for versioned in (None, (1, 0)):
        capsule = a.__dlpack__(max_version=versioned)
        first = np.from_dlpack(_Capsule(capsule))
        np.testing.assert_array_equal(first, np.arange(3, dtype=np.int16))
        del first
        # The consumer renames the capsule (the DLPack protocol), so a second one cannot
        # get its pointer: CPython's capsule name check.
        used = "used_dltensor_versioned" if versioned else "used_dltensor"
        assert f'capsule object "{used}"' in repr(capsule), repr(capsule)
        with pytest.raises(ValueError, match="PyCapsule_GetPointer called with incorrect name"):
            np.from_dlpack(_Capsule(capsule))
        with pytest.raises(InvalidArgumentError, match="consumed"):
            ifrt.from_dlpack(capsule, client)
    assert a.buffers[0].exports == 0
    gc.collect()


def test_releases_from_many_threads(client):
    x = np.arange(256, dtype=np.float32)
    a = _put(client, x)
    (buffer,) = a.buffers
    holders = [[np.asarray(a) if i % 2 else np.from_dlpack(a) for i in range(50)] for _ in range(8)]
    a.delete()  # deferred: 400 views
    start = threading.Barrier(8)

    def drop(views):
        start.wait()
        while views:
            assert views.pop()[-1] == x[-1]

    threads = [threading.Thread(target=drop, args=(h,)) for h in holders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert buffer.exports == 0 and buffer.is_deleted()


def test_views_racing_a_delete_are_whole_or_refused(client):
    x = np.arange(4096, dtype=np.int32)
    for _ in range(5):
        a = _put(client, x)
        (buffer,) = a.buffers
        views, start = [], threading.Barrier(5)

        def take():
            start.wait()
            for _ in range(200):
                try:
                    views.append(np.asarray(a))
                except FailedPreconditionError:
                    return

        threads = [threading.Thread(target=take) for _ in range(4)]
        for t in threads:
            t.start()
        start.wait()
        a.delete()
        for t in threads:
            t.join()
        assert all(v[-1] == x[-1] and v[0] == 0 for v in views)
        views.clear()
        assert buffer.exports == 0 and buffer.is_deleted()


def test_live_views_and_capsules_at_interpreter_exit():
    assert_survives("""
        import threading, ifrtpy as ifrt
        c = ifrt.get_client("pjrt", device_count=2)
        a = c.make_array_from_host_buffer(np.arange(1 << 16, dtype=np.float32),
                                          ifrt.SingleDeviceSharding(c.devices()[0]))
        keep = [np.asarray(a), a.__dlpack__(), a.__dlpack__(max_version=(1, 0)),
                ifrt.from_dlpack(np.ones(64, np.float64), c)]
        def late():
            import time; time.sleep(0.05); keep.clear()
        threading.Thread(target=late, daemon=True).start()
        print("alive")
    """)


# -- import ---------------------------------------------------------------------------------

@st.composite
def _strided(draw):
    """A host array with any strides (steps, negative steps, transposes), 0-d and empty."""
    dtype = draw(st.sampled_from(WHOLE_BYTE))
    shape = draw(S.shapes(max_rank=3))
    base = draw(S.host_arrays(dtype, tuple(2 * s for s in shape)))
    index = tuple(slice(None, None, draw(st.sampled_from([1, 2, -1, -2]))) for _ in shape)
    x = np.asarray(base[index][tuple(slice(0, s) for s in shape)])  # 0-d stays an array
    if x.ndim > 1 and draw(st.booleans()):
        x = x.T
    return x


@given(x=_strided())
def test_import_any_strides_copies_exactly_once(client, x):
    a = ifrt.from_dlpack(x, client.devices()[3])
    assert a.sharding.devices[0] is client.devices()[3]
    assert a.dtype == ifrt.DType.from_numpy(x.dtype) and tuple(a.shape.dims) == x.shape
    assert _bytes(np.asarray(a)) == _bytes(x)


@given(data=st.data(), dtype=st.sampled_from(WHOLE_BYTE), shape=S.shapes(min_rank=1))
def test_import_of_aligned_dense_memory_is_zero_copy(client, data, dtype, shape):
    values = data.draw(S.host_arrays(dtype, shape))
    x = aligned_empty(shape, dtype) if values.size else values.copy()
    x[...] = values
    a = ifrt.from_dlpack(x, client.devices()[0], copy=False)
    assert _bytes(np.asarray(a)) == _bytes(x)
    if x.size:
        assert a.unsafe_buffer_pointer() == x.ctypes.data
    c = client.from_dlpack(x, copy=True)
    if x.size:
        assert c.unsafe_buffer_pointer() != x.ctypes.data
    assert _bytes(np.asarray(c)) == _bytes(x)


def test_import_keeps_the_producer_alive_until_the_buffer_goes(client):
    x = aligned_empty((1024,), np.float64)
    x[...] = np.arange(1024)
    address = x.ctypes.data
    a = ifrt.from_dlpack(x, client)
    del x
    gc.collect()
    np.testing.assert_array_equal(np.asarray(a), np.arange(1024))
    assert a.unsafe_buffer_pointer() == address


def test_an_imported_tensor_goes_back_to_its_producer(client):
    import time
    a = _put(client, np.arange(64, dtype=np.float64))
    (buffer,) = a.buffers
    b = ifrt.from_dlpack(a, client)  # a view of a's buffer, holding a's capsule
    assert b.unsafe_buffer_pointer() == a.unsafe_buffer_pointer() and buffer.exports == 1
    a.delete()  # deferred: b reads it
    np.testing.assert_array_equal(np.asarray(b), np.arange(64))
    del b
    gc.collect()
    deadline = time.monotonic() + 10  # the plugin may call back from its own thread
    while buffer.exports and time.monotonic() < deadline:
        time.sleep(0.01)
    assert buffer.exports == 0 and buffer.is_deleted()


def test_import_refuses_a_needed_copy_when_told(client):
    x = aligned_empty((16,), np.float32, offset=4)  # off the plugin's 64-byte alignment
    with pytest.raises(ValueError, match="copy"):
        ifrt.from_dlpack(x, client, copy=False)
    with pytest.raises(ValueError, match="copy"):
        ifrt.from_dlpack(np.arange(10.0)[::2], client, copy=False)
    np.testing.assert_array_equal(np.asarray(ifrt.from_dlpack(x, client)), x)


# -- the array API's from_dlpack(x, /, *, device=None, copy=None) ----------------------------

@given(data=st.data(), dtype=st.sampled_from(WHOLE_BYTE), shape=S.shapes(),
       copy=st.sampled_from([None, True, False]))
def test_from_dlpack_without_a_device_lands_on_the_producers_device(data, dtype, shape, copy):
    """No device: the producer's device (host memory: kDLCPU) on the default client, as
    the array API standard says; the values are NumPy's, and copy= keeps its meaning
    (True: new memory; False: the producer's memory, or ValueError where a copy is
    needed; None: either)."""
    x = data.draw(S.host_arrays(dtype, shape))
    if data.draw(st.booleans()) and x.nbytes:
        y = aligned_empty(x.shape, x.dtype)
        y[...] = x
        x = y
    try:
        a = ifrt.from_dlpack(x, copy=copy)
    except ValueError:
        assert copy is False and x.size  # only a refused copy raises
        return
    default = ifrt.get_client()
    assert a.client is default and a.sharding.devices[0] is default.devices()[0]
    assert a.shape == x.shape and a.dtype == ifrt.DType.from_numpy(x.dtype)
    assert _bytes(np.asarray(a)) == _bytes(x)
    if x.nbytes and copy is not None:
        assert (a.unsafe_buffer_pointer() == x.ctypes.data) == (copy is False)


def test_from_dlpack_takes_the_standards_keywords_and_any_producer():
    default = ifrt.get_client()
    x = aligned_empty((4, 4), np.float32)
    x[...] = np.arange(16).reshape(4, 4)
    for a in (ifrt.from_dlpack(x), ifrt.from_dlpack(x, device=None, copy=None),
              ifrt.from_dlpack(_Capsule(x.__dlpack__())),     # a producer object
              ifrt.from_dlpack(x.__dlpack__())):             # a bare capsule: host memory
        assert a.client is default
        np.testing.assert_array_equal(np.asarray(a), x)
    jnp = pytest.importorskip("jax.numpy")
    jx = jnp.arange(6.0)
    b = ifrt.from_dlpack(jx)  # jax's CPU array: its DLPack device is kDLCPU
    assert b.client is default
    np.testing.assert_array_equal(np.asarray(b), np.arange(6.0))
    c = ifrt.from_dlpack(ifrt.from_dlpack(x))  # ifrtpy arrays are producers too
    np.testing.assert_array_equal(np.asarray(c), x)
    other = default.devices()[2]
    assert ifrt.from_dlpack(x, device=other).sharding.devices[0] is other


def test_import_refuses_bad_inputs(client):
    with pytest.raises(InvalidArgumentError, match="Device, Client or None"):
        ifrt.from_dlpack(np.ones(3), device="cpu")

    class Unknown:
        def __dlpack_device__(self):
            return (99, 0)

    with pytest.raises(InvalidArgumentError, match="DLPack device type 99"):
        ifrt.from_dlpack(Unknown())
    with pytest.raises(InvalidArgumentError, match="capsule"):
        ifrt.from_dlpack(object(), client)
    with pytest.raises(InvalidArgumentError, match="another|not a device"):
        client.from_dlpack(np.ones(3), ifrt.get_client("pjrt", device_count=1).devices()[0])

    class OnGpu:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            raise AssertionError("must not be asked for its capsule")

    with pytest.raises(InvalidArgumentError, match=r"\(2, 0\)"):
        ifrt.from_dlpack(OnGpu(), client)


# -- the reference backend ------------------------------------------------------------------

@given(data=st.data(), dtype=st.sampled_from(WHOLE_BYTE), shape=S.shapes())
def test_reference_arrays_are_numpy_views_and_dlpack_producers(data, dtype, shape):
    """A single-device reference array is its own read-only data to NumPy and DLPack
    (versioned, zero-copy); a legacy request gets a copy (it cannot say read-only); what
    DLPack has no code for is refused with UnimplementedError."""
    reference = ifrt.get_client("reference", device_count=2)
    x = data.draw(S.host_arrays(dtype, shape))
    a = reference.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(reference.devices()[1]))
    view = np.asarray(a)
    assert view is a.shards[0] and not view.flags.writeable and _bytes(view) == _bytes(x)
    copied = np.array(a)
    assert copied.flags.writeable and not np.shares_memory(copied, view)
    assert _bytes(copied) == _bytes(x) and a.__dlpack_device__() == (1, 0)
    # The contract, not one NumPy's abilities: exported where this NumPy exports the
    # dtype (the oracle: NumPy's own __dlpack__ of the data), else refused clearly.
    try:
        x.__dlpack__(max_version=(1, 0))
    except (BufferError, TypeError, ValueError):  # e.g. NumPy < 2.5 and bfloat16, < 2.1 and bool
        with pytest.raises(UnimplementedError, match="__dlpack__"):
            a.__dlpack__(max_version=(1, 0))
        return
    exported = np.from_dlpack(a)  # versioned: the same memory, read-only
    assert not exported.flags.writeable and _bytes(exported) == _bytes(x)
    if x.size:
        assert np.shares_memory(exported, view)
    legacy = np.from_dlpack(_Legacy(a))  # a copy, writeable
    assert _bytes(legacy) == _bytes(x) and not (x.size and np.shares_memory(legacy, view))
    with pytest.raises(UnimplementedError, match="readonly"):
        a.__dlpack__(copy=False)


class _Legacy:
    """A consumer's view of ``array`` that asks for a legacy capsule (as jax 0.10 does)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(stream=kwargs.get("stream"))

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_reference_arrays_that_dlpack_cannot_carry_are_refused():
    reference = ifrt.get_client("reference", device_count=2)
    devices = reference.devices()
    split = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))
    sharded = reference.make_array_from_host_buffer(np.arange(4, dtype=np.float32), split)
    with pytest.raises(InvalidArgumentError, match="single-device array"):
        sharded.__dlpack__()
    np.testing.assert_array_equal(np.asarray(sharded), np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match="without a copy"):
        np.array(sharded, copy=False)
    one = ifrt.SingleDeviceSharding(devices[0])
    strings = reference.make_array_from_host_buffer(np.array(["a", "b"], dtype=object), one)
    with pytest.raises(UnimplementedError, match="STRING"):
        strings.__dlpack__(max_version=(1, 0))
    assert np.asarray(strings).tolist() == ["a", "b"]
    gone = reference.make_array_from_host_buffer(np.ones(3, np.float32), one)
    gone.delete()
    with pytest.raises(FailedPreconditionError, match="deleted"):
        gone.__dlpack__(max_version=(1, 0))
    with pytest.raises(ValueError, match="needs a copy"):
        np.array(reference.make_array_from_host_buffer(np.ones(3, np.float32), one),
                 dtype=np.float64, copy=False)
