"""ifrtpy._pjrt compilation and execution of jax-lowered programs, checked with NumPy."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ifrtpy import _pjrt, errors
from ifrtpy.plugins.builds import default_cpu_library
from pjrt_helpers import (
    assert_survives, client8, compile_options, cpu_device_name, lower, pjrt_buffer_types, plugin,
    put, run1,
)  # noqa: F401

F32 = np.float32
X8 = np.arange(8, dtype=F32)


def add_one(x):
    return x + 1


def two_inputs(x, y):
    return x * 2 + y.astype(F32), y * 3


@pytest.fixture(scope="module")
def options():
    return compile_options()


@pytest.fixture(scope="module")
def add_one_text():
    return lower(add_one, np.zeros(8, F32))


@pytest.fixture(scope="module")
def add_one_exe(client8, add_one_text, options):
    return _pjrt.compile(client8, add_one_text, options)


@pytest.fixture(scope="module")
def two_inputs_exe(client8, options):
    return _pjrt.compile(client8, lower(two_inputs, np.zeros(4, F32), np.zeros(4, np.int32)), options)


@pytest.fixture(scope="module")
def donating_text():
    return lower(add_one, np.zeros(8, F32), donate_argnums=0)


# ------------------------------------------------------------------ running

def test_add_one_runs(add_one_exe):
    [out] = run1(add_one_exe, X8)
    np.testing.assert_array_equal(out, X8 + 1)


def test_two_input_program_runs(two_inputs_exe):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4).astype(F32)
    y = rng.integers(-100, 100, 4).astype(np.int32)
    first, second = run1(two_inputs_exe, x, y)
    np.testing.assert_array_equal(first, x * 2 + y.astype(F32))
    np.testing.assert_array_equal(second, y * 3)
    assert first.dtype == F32 and second.dtype == np.int32


def test_execute_returns_outputs_per_device_and_events(add_one_exe, client8):
    buffer, _ = put(client8, X8)
    outputs, events = add_one_exe.execute([[buffer]])
    assert len(outputs) == 1 and len(outputs[0]) == 1 and len(events) == 1
    events[0].await_()
    assert events[0].is_ready() and events[0].error() is None
    out = outputs[0][0]
    assert out.device is client8.devices[0]
    assert out.dims == (8,) and out.dtype == F32
    np.testing.assert_array_equal(buffer.to_numpy(), X8)  # the input is untouched


def test_outputs_are_inputs_for_the_next_run(add_one_exe, client8):
    buffer, _ = put(client8, X8)
    for _ in range(5):
        (([buffer],), _) = add_one_exe.execute([[buffer]])
    np.testing.assert_array_equal(buffer.to_numpy(), X8 + 5)


def test_execute_device_runs_on_the_given_device(add_one_exe, client8):
    buffer, _ = put(client8, X8)
    outputs, events = add_one_exe.execute([[buffer]], execute_device=client8.devices[0])
    np.testing.assert_array_equal(outputs[0][0].to_numpy(), X8 + 1)


@pytest.fixture(scope="module")
def on_device3_exe(client8, add_one_text):
    return _pjrt.compile(client8, add_one_text, compile_options(device_assignment=[[3]]))


def test_program_assigned_to_device_3(on_device3_exe, client8):
    device3 = client8.devices[3]
    assert on_device3_exe.addressable_devices == (device3,)
    assert on_device3_exe.addressable_devices[0] is device3
    buffer, _ = put(client8, X8, device3)
    outputs, events = on_device3_exe.execute([[buffer]])
    events[0].await_()
    assert outputs[0][0].device is device3
    np.testing.assert_array_equal(outputs[0][0].to_numpy(), X8 + 1)


def test_program_on_device_3_refuses_a_buffer_on_device_0(on_device3_exe, client8):
    buffer, _ = put(client8, X8, client8.devices[0])
    with pytest.raises(errors.InvalidArgumentError) as info:
        on_device3_exe.execute([[buffer]])
    assert cpu_device_name(client8, 0) in str(info.value)
    assert cpu_device_name(client8, 3) in str(info.value)


# ------------------------------------------------------------------ properties

def test_executable_properties(add_one_exe, client8):
    enum = pjrt_buffer_types()
    assert add_one_exe.name == "jit_add_one"
    assert add_one_exe.client is client8
    assert add_one_exe.num_outputs == 1
    assert add_one_exe.num_replicas == 1
    assert add_one_exe.num_partitions == 1
    assert add_one_exe.addressable_devices == (client8.devices[0],)
    assert add_one_exe.output_element_types() == [enum["F32"]]
    assert add_one_exe.output_dimensions() == [(8,)]
    # The CPU plugin counts no generated code (reference pjrt_cpu.md section 6 measured 0),
    # and its compiled memory stats report the same size.
    stats = add_one_exe.compiled_memory_stats()
    assert add_one_exe.size_of_generated_code_in_bytes == stats["generated_code_size_in_bytes"] == 0
    assert repr(add_one_exe) == "<ExecutableHandle 'jit_add_one' on 1 devices>"


def test_two_output_properties(two_inputs_exe):
    enum = pjrt_buffer_types()
    assert two_inputs_exe.num_outputs == 2
    assert two_inputs_exe.output_element_types() == [enum["F32"], enum["S32"]]
    assert two_inputs_exe.output_dimensions() == [(4,), (4,)]


def test_fingerprint_is_a_stable_string(add_one_exe, client8, add_one_text, options,
                                        two_inputs_exe):
    fingerprint = add_one_exe.fingerprint()
    assert isinstance(fingerprint, str) and fingerprint
    assert add_one_exe.fingerprint() == fingerprint
    again = _pjrt.compile(client8, add_one_text, options)
    assert again.fingerprint() == fingerprint
    assert two_inputs_exe.fingerprint() != fingerprint


def test_serialize_then_deserialize_and_load_runs_the_same(add_one_exe, client8):
    serialized = add_one_exe.serialize()
    assert isinstance(serialized, bytes) and serialized
    loaded = _pjrt.deserialize_and_load(client8, serialized)
    assert loaded.name == add_one_exe.name
    assert loaded.fingerprint() == add_one_exe.fingerprint()
    assert loaded.addressable_devices == add_one_exe.addressable_devices
    [out] = run1(loaded, X8)
    np.testing.assert_array_equal(out, X8 + 1)


@pytest.mark.parametrize("data", [b"garbage", b""], ids=["garbage", "empty"])
def test_deserialize_of_bad_bytes_raises(client8, data):
    # The layer hands the bytes to the plugin unchecked (the PjRt backend seals them:
    # tests/robustness/test_untrusted_bytes.py); the default plugin refuses these two.
    with pytest.raises(errors.IfrtError):
        _pjrt.deserialize_and_load(client8, data)


def test_serialize_returns_the_plugins_own_bytes(add_one_exe, client8):
    # No seal of ifrtpy's in this layer: the bytes are the plugin's, loaded as they are.
    serialized = add_one_exe.serialize()
    assert not serialized.startswith(b"IFRTPY")
    assert _pjrt.deserialize_and_load(client8, serialized).name == add_one_exe.name
    with pytest.raises(TypeError):
        _pjrt.deserialize_and_load(client8, bytearray(serialized))


def test_compiled_memory_stats(add_one_exe):
    stats = add_one_exe.compiled_memory_stats()
    assert stats["argument_size_in_bytes"] == X8.nbytes
    assert stats["output_size_in_bytes"] == X8.nbytes
    assert all(isinstance(v, int) for v in stats.values())


def test_cost_analysis_counts_one_flop_per_element(add_one_exe, client8):
    if client8.plugin.api_version > (0, 81):  # newer XLA CPU builds dropped the call
        with pytest.raises(errors.UnimplementedError, match="GetCostAnalysis"):
            add_one_exe.cost_analysis()
        return
    cost = add_one_exe.cost_analysis()
    assert cost["flops"] == X8.size
    assert all(isinstance(k, str) for k in cost)


def test_output_memory_kinds_is_unimplemented(add_one_exe):
    with pytest.raises(errors.UnimplementedError):
        add_one_exe.output_memory_kinds()


def test_delete_is_accepted(client8, add_one_text, options):
    exe = _pjrt.compile(client8, add_one_text, options)
    assert exe.is_deleted() is False
    exe.delete()
    # The CPU plugin's PjRtLoadedExecutable::Delete is a no-op (IsDeleted is always
    # false): the program stays loaded and still runs.
    assert exe.is_deleted() is False
    np.testing.assert_array_equal(run1(exe, X8)[0], X8 + 1)


def test_executable_handle_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        _pjrt.ExecutableHandle()


# ------------------------------------------------------------------ donation

@pytest.fixture(scope="module")
def donating_exe(client8, donating_text, options):
    return _pjrt.compile(client8, donating_text, options)


def test_donated_input_is_deleted(donating_exe, client8):
    buffer, _ = put(client8, X8)
    outputs, events = donating_exe.execute([[buffer]])
    events[0].await_()
    assert buffer.is_deleted()
    np.testing.assert_array_equal(outputs[0][0].to_numpy(), X8 + 1)
    with pytest.raises(errors.InvalidArgumentError):
        donating_exe.execute([[buffer]])


def test_non_donatable_input_is_kept(donating_exe, client8):
    buffer, _ = put(client8, X8)
    outputs, events = donating_exe.execute([[buffer]], non_donatable_input_indices=[0])
    events[0].await_()
    assert not buffer.is_deleted()
    np.testing.assert_array_equal(buffer.to_numpy(), X8)
    np.testing.assert_array_equal(outputs[0][0].to_numpy(), X8 + 1)


def test_program_without_donation_keeps_inputs(add_one_exe, client8):
    buffer, _ = put(client8, X8)
    add_one_exe.execute([[buffer]])[1][0].await_()
    assert not buffer.is_deleted()


# ------------------------------------------------------------------ execute errors

@pytest.mark.parametrize("count", [0, 2])
def test_wrong_argument_count_raises(add_one_exe, client8, count):
    buffer, _ = put(client8, X8)
    with pytest.raises(errors.InvalidArgumentError) as info:
        add_one_exe.execute([[buffer] * count])
    assert f"supplied {count} buffers" in str(info.value)


@pytest.mark.parametrize("lists", [0, 2, 8])
def test_wrong_number_of_device_lists_raises(add_one_exe, client8, lists):
    buffer, _ = put(client8, X8)
    with pytest.raises(errors.InvalidArgumentError):
        add_one_exe.execute([[buffer]] * lists)


def test_buffer_on_the_wrong_device_raises(add_one_exe, client8):
    buffer, _ = put(client8, X8, client8.devices[1])
    with pytest.raises(errors.InvalidArgumentError) as info:
        add_one_exe.execute([[buffer]])
    assert cpu_device_name(client8, 1) in str(info.value)


def test_buffer_of_wrong_size_raises(add_one_exe, client8):
    buffer, _ = put(client8, np.zeros(16, F32))
    with pytest.raises(errors.InvalidArgumentError):
        add_one_exe.execute([[buffer]])


def test_deleted_argument_raises(add_one_exe, client8):
    buffer, _ = put(client8, X8)
    buffer.delete()
    with pytest.raises(errors.InvalidArgumentError):
        add_one_exe.execute([[buffer]])


def test_buffer_of_another_client_raises(add_one_exe, plugin):
    other = _pjrt.create_client(plugin, {"cpu_device_count": 1})
    buffer, _ = put(other, X8)
    with pytest.raises(errors.InvalidArgumentError):
        add_one_exe.execute([[buffer]])


def test_non_buffer_argument_is_refused_by_name(add_one_exe):
    with pytest.raises(errors.InvalidArgumentError, match="argument 0 on device 0 must be a BufferHandle"):
        add_one_exe.execute([[X8]])


# ------------------------------------------------------------------ compile errors

def test_invalid_mlir_raises_with_the_parse_error(client8, options):
    with pytest.raises(errors.IfrtError) as info:
        _pjrt.compile(client8, b"module { func.func @main( -> }", options)
    assert "Failed to parse" in str(info.value)


def test_garbage_program_raises(client8, options):
    with pytest.raises(errors.IfrtError, match="garbage"):
        _pjrt.compile(client8, b"garbage", options)


def test_compile_takes_stablehlo_only(client8, add_one_text, options):
    # The program format was never anything but "mlir": no parameter for it.
    with pytest.raises(TypeError, match="3 positional arguments"):
        _pjrt.compile(client8, add_one_text, options, "mlir")
    with pytest.raises(TypeError):
        _pjrt.compile(client8, add_one_text, options, format="mlir")


def test_empty_compile_options_are_refused_and_the_process_lives(add_one_text):
    # The plugin aborts on empty options: the layer refuses them, the one check of the
    # options it makes (it does not parse them; replicas and partitions below 1, on which
    # the plugin aborts too, are refused by ifrtpy.CompileOptions: tests/backends/pjrt).
    assert_survives(f"""
        client = _pjrt.create_client(_pjrt.load_plugin(default_cpu_library()), {{"cpu_device_count": 1}})
        try:
            _pjrt.compile(client, {add_one_text!r}, b"")
        except errors.InvalidArgumentError as e:
            print("refused empty")
            assert "compile options are empty" in str(e), e
        print("alive")
    """, "refused empty")


# ------------------------------------------------------------------ SPMD over 8 devices

def _spmd(x, w):
    return jax.numpy.tanh(x @ w) * 2


@pytest.fixture(scope="module")
def spmd_exe(client8):
    devices = jax.devices()
    if len(devices) < 8:
        pytest.skip("jax needs 8 CPU devices (XLA_FLAGS from conftest)")
    mesh = Mesh(np.array(devices[:8]), ("x",))
    text = lower(_spmd, jax.ShapeDtypeStruct((16, 4), F32), jax.ShapeDtypeStruct((4, 3), F32),
                 in_shardings=(NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P())),
                 out_shardings=NamedSharding(mesh, P("x", None)))
    opts = compile_options(num_partitions=8, use_spmd_partitioning=True,
                           use_shardy_partitioner=True,
                           device_assignment=np.arange(8).reshape(1, 8))
    return _pjrt.compile(client8, text, opts)


def test_spmd_program_over_8_devices(spmd_exe, client8):
    assert spmd_exe.num_partitions == 8 and spmd_exe.num_replicas == 1
    assert spmd_exe.addressable_devices == client8.devices
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 4)).astype(F32)
    w = rng.standard_normal((4, 3)).astype(F32)
    args = [[put(client8, x[2 * i:2 * i + 2], d)[0], put(client8, w, d)[0]]
            for i, d in enumerate(client8.devices)]
    outputs, events = spmd_exe.execute(args)
    assert len(outputs) == 8 and len(events) == 8
    for event in events:
        event.await_()
    for device, [out] in zip(client8.devices, outputs):
        assert out.device is device and out.dims == (2, 3)
    result = np.concatenate([out.to_numpy() for [out] in outputs])
    np.testing.assert_allclose(result, np.tanh(x @ w) * 2, rtol=1e-5, atol=1e-5)


def test_execute_by_argument_groups_the_buffers_by_argument(spmd_exe, client8):
    """The same call as ``execute``'s, its buffers and outputs grouped the other way: each
    group a list or a tuple (a subclass of list too)."""

    class Buffers(list):
        pass

    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 4)).astype(F32)
    w = rng.standard_normal((4, 3)).astype(F32)
    xs = Buffers(put(client8, x[2 * i:2 * i + 2], d)[0] for i, d in enumerate(client8.devices))
    ws = tuple(put(client8, w, d)[0] for d in client8.devices)
    outputs, events = spmd_exe.execute_by_argument([xs, ws])
    assert len(outputs) == 1 and len(outputs[0]) == 8 and len(events) == 8
    for event in events:
        event.await_()
    assert [out.device for out in outputs[0]] == list(client8.devices)
    np.testing.assert_allclose(np.concatenate([out.to_numpy() for out in outputs[0]]),
                               np.tanh(x @ w) * 2, rtol=1e-5, atol=1e-5)
    by_device, _ = spmd_exe.execute([[a, b] for a, b in zip(xs, ws)])
    for [out], theirs in zip(by_device, outputs[0]):
        np.testing.assert_array_equal(out.to_numpy(), theirs.to_numpy())
    with pytest.raises(errors.InvalidArgumentError, match="argument 1 has 7 buffers for 8 devices"):
        spmd_exe.execute_by_argument([xs, ws[:7]])


def test_device_lists_of_different_lengths_are_refused(spmd_exe, client8):
    lists = [[put(client8, np.zeros((2, 4), F32), d)[0], put(client8, np.zeros((4, 3), F32), d)[0]]
             for d in client8.devices]
    lists[3].pop()
    with pytest.raises(errors.InvalidArgumentError, match="argument list 3 has 1 buffers, list 0 has 2"):
        spmd_exe.execute(lists)


def test_spmd_program_refuses_a_single_device_list(spmd_exe, client8):
    with pytest.raises(errors.InvalidArgumentError):
        spmd_exe.execute([[put(client8, np.zeros((2, 4), F32))[0],
                           put(client8, np.zeros((4, 3), F32))[0]]])


def test_mutable_zero_copy_never_writes_into_a_read_only_array(donating_exe, client8):
    # kMutableZeroCopy lets the runtime write into the host array (a donated input is
    # updated in place). A read-only array - here backed by an immutable bytes object -
    # must be refused or copied, never aliased mutably.
    blob = bytes(3 * 64)
    whole = np.frombuffer(blob, F32)
    start = (-whole.ctypes.data) % 64 // 4
    x = whole[start:start + 8]
    assert not x.flags.writeable and x.ctypes.data % 64 == 0
    try:
        buffer, _ = put(client8, x, semantics=3)
    except errors.InvalidArgumentError:
        return
    outputs, events = donating_exe.execute([[buffer]])
    events[0].await_()
    np.testing.assert_array_equal(outputs[0][0].to_numpy(), np.ones(8, F32))
    assert blob == bytes(3 * 64), "the plugin wrote into an immutable bytes object"


def test_buffers_dropped_during_execute_stay_alive_until_it_returns():
    """Execute holds every buffer it passes while the plugin runs without the GIL: another
    thread emptying the caller's list, or a sequence whose length changes while it is
    read, must not free a buffer in use or overrun the arrays the layer fills."""
    text = lower(lambda x, y: x + y, np.zeros(1 << 20, F32), np.zeros(1 << 20, F32))
    assert_survives(f"""
        import threading
        client = _pjrt.create_client(_pjrt.load_plugin(default_cpu_library()), {{"cpu_device_count": 1}})
        exe = _pjrt.compile(client, {text!r}, {compile_options()!r})
        x = np.arange(1 << 20, dtype=np.float32)
        go, dropped, state = threading.Event(), threading.Event(), {{"args": None}}

        def drop():  # wakes when the main thread releases the GIL inside execute
            while go.wait() and state["args"] is not None:
                go.clear()
                state["args"].clear()
                dropped.set()

        thread = threading.Thread(target=drop, daemon=True)
        thread.start()
        for _ in range(100):
            state["args"] = args = [
                _pjrt.buffer_from_host_buffer(client, x, client.devices[0])[0] for _ in range(2)]
            go.set()
            try:
                ((out,),), (event,) = exe.execute([args])
            except errors.InvalidArgumentError:  # emptied before the call: refused
                pass
            else:
                event.await_()
                assert np.array_equal(out.to_numpy(), x + x)
            dropped.wait()
            dropped.clear()
        state["args"] = None
        go.set()
        thread.join()

        class Growing(list):
            def __len__(self):
                self.calls = getattr(self, "calls", 0) + 1
                return 2 if self.calls <= 2 else 1000  # grows once checked

        # Each list is copied to a tuple first: the execute reads what the list holds (1000
        # buffers, which the plugin refuses), whatever its length says.
        buffer, _ = _pjrt.buffer_from_host_buffer(client, x, client.devices[0])
        try:
            exe.execute([Growing([buffer] * 1000)])
        except errors.InvalidArgumentError as e:
            print("refused", "supplied 1000 buffers" in str(e))
        print("alive")
    """, "refused True")
