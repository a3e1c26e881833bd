"""Repeated executes on the PjRt backend.

A call whose arguments are of the kinds of an earlier, checked call runs in C
(``ExecutableCore``) without the checks. These tests make the checked path unreachable
after the first call, so each assertion is about the C path, and hold it to the same
results as the first call and NumPy: values, output shardings, options, donation and
``exe(*arrays)``."""

from __future__ import annotations

import ctypes
import gc

import jax
import numpy as np
import pytest
from jax.sharding import Mesh as JaxMesh, NamedSharding as JaxNamedSharding, PartitionSpec as P

import ifrtpy as ifrt
from ifrtpy.array import ArraySpec
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError
from ifrtpy.plugins import builds
from ifrtpy.sharding import SingleDeviceSharding

from pjrt_helpers import assert_survives

TIMEOUT_S = 120.0  # a bound on a hang, not a timing assertion


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)


def _checked_only_once(monkeypatch, executable):
    """Let the next call through the checks, then fail any later one."""
    calls = []
    contract = executable._execute_contract
    check = contract.check

    def once(*args):
        calls.append(args)
        if len(calls) > 1:
            raise AssertionError("a repeated call took the checked path")
        return check(*args)

    monkeypatch.setattr(contract, "check", once)


def _host(array) -> np.ndarray:
    return array.copy_to_host_buffer().result(timeout=TIMEOUT_S)


def _compile(client, fn, num_args, devices, donate=()):
    """``fn`` on f32[8] arguments, split over ``devices`` (P("x")) when there are several."""
    jmesh = JaxMesh(np.array([jax.devices()[d.id] for d in devices]), ("x",))
    sharding = JaxNamedSharding(jmesh, P("x"))
    lowered = jax.jit(fn, in_shardings=(sharding,) * num_args, donate_argnums=donate).lower(
        *[jax.ShapeDtypeStruct((8,), np.float32)] * num_args)
    return client.compile(lowered, ifrt.CompileOptions(devices=devices, num_partitions=len(devices)))


def _sharding(client, devices):
    if len(devices) == 1:
        return SingleDeviceSharding(devices[0])
    return ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))


def _sums(*xs):
    return sum(xs), xs[0] * 2


@pytest.mark.parametrize("num_devices,num_args", [(1, 1), (1, 3), (8, 1), (8, 8)],
                         ids=["1dev-1arg", "1dev-3args", "8dev-1arg", "8dev-8args"])
def test_repeated_calls_match_numpy_and_the_first_call(client, monkeypatch, num_devices, num_args):
    """(8 devices, 8 arguments): more buffers than the C path keeps on the stack."""
    devices = client.addressable_devices()[:num_devices]
    executable = _compile(client, _sums, num_args, devices)
    sharding = _sharding(client, devices)
    _checked_only_once(monkeypatch, executable)
    rng = np.random.default_rng(num_args)
    # Over 8 devices the outputs are named after the arguments' mesh (as jax names them);
    # every call gives the same sharding objects.
    expected_shardings = [sharding if num_devices > 1 else s for s in executable.output_shardings()]
    first: list = []
    for _ in range(3):
        xs = [rng.standard_normal(8).astype(np.float32) for _ in range(num_args)]
        arrays = [client.make_array_from_host_buffer(x, sharding) for x in xs]
        result = executable.execute(arrays)
        assert result.status is None and len(result.outputs) == 2
        first = first or [out.sharding for out in result.outputs]
        for out, expected, out_sharding, seen in zip(result.outputs, _sums(*xs),
                                                      expected_shardings, first):
            assert out.block_until_ready() is out
            assert out.sharding is seen and out.sharding == out_sharding and out.shape == (8,)
            assert len(out.buffers) == num_devices
            np.testing.assert_allclose(_host(out), expected, rtol=1e-6)
        for array, x in zip(arrays, xs):
            np.testing.assert_array_equal(_host(array), x)  # read, not donated


def test_repeated_calls_honour_options(client, monkeypatch):
    devices = client.addressable_devices()[:1]
    executable = _compile(client, lambda x, y: x * 2 + y, 2, devices, donate=(0,))
    sharding = _sharding(client, devices)
    x, y = np.arange(8, dtype=np.float32), np.ones(8, np.float32)
    _checked_only_once(monkeypatch, executable)
    executable.execute([client.make_array_from_host_buffer(v, sharding) for v in (x, y)])

    a, b = (client.make_array_from_host_buffer(v, sharding) for v in (x, y))
    result = executable.execute([a, b], ifrt.ExecuteOptions(fill_status=True, launch_id=7))
    assert result.status.result(timeout=TIMEOUT_S) is None
    assert a.is_deleted() and not b.is_deleted()  # x is donated, y is not

    a = client.make_array_from_host_buffer(x, sharding)
    result = executable.execute([a, b], ifrt.ExecuteOptions(non_donatable_input_indices={0}))
    assert result.status is None and not a.is_deleted()
    np.testing.assert_array_equal(_host(result.outputs[0]), x * 2 + y)
    np.testing.assert_array_equal(_host(a), x)


def test_call_returns_the_outputs_on_both_paths(client, monkeypatch):
    devices = client.addressable_devices()[:8]
    executable = _compile(client, _sums, 2, devices)
    sharding = _sharding(client, devices)
    x, y = np.arange(8, dtype=np.float32), np.full(8, 3, np.float32)
    a, b = (client.make_array_from_host_buffer(v, sharding) for v in (x, y))
    _checked_only_once(monkeypatch, executable)
    for _ in range(2):
        total, double = executable(a, b)
        np.testing.assert_array_equal(_host(total), x + y)
        np.testing.assert_array_equal(_host(double), x * 2)


def test_the_first_call_is_always_checked(client):
    """Before any accepted call there is nothing to repeat: a fresh executable checks even
    a call with no arguments."""
    devices = client.addressable_devices()[:1]
    executable = _compile(client, lambda x: x + 1, 1, devices)
    with pytest.raises(InvalidArgumentError, match="takes 1 arguments, got 0"):
        executable.execute([])
    with pytest.raises(InvalidArgumentError, match="takes 1 arguments, got 0"):
        executable()


def test_the_array_type_must_be_an_array_core(client):
    """The C path makes its outputs of this type: anything else is refused when set."""
    devices = client.addressable_devices()[:1]
    executable = _compile(client, lambda x: x + 1, 1, devices)
    with pytest.raises(TypeError, match="subclass of ArrayCore"):
        executable._array_type = int


def test_a_program_without_arguments_repeats(client, monkeypatch):
    devices = client.addressable_devices()[:1]
    lowered = jax.jit(lambda: jax.numpy.arange(4, dtype=np.int32) * 3).lower()
    executable = client.compile(lowered, ifrt.CompileOptions(devices=devices))
    _checked_only_once(monkeypatch, executable)
    for _ in range(3):
        [out] = executable.execute([]).outputs
        np.testing.assert_array_equal(_host(out), np.arange(4, dtype=np.int32) * 3)


def test_arguments_dropped_by_another_thread_during_the_call():
    """The C path keeps its arguments alive while the plugin runs without the GIL: another
    thread emptying the caller's list mid-call must not free the buffers in use (it
    crashed the interpreter when the list itself was all that held them)."""
    assert_survives("""
        import os, threading
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import ifrtpy as ifrt
        client = ifrt.get_client("pjrt", device_count=8)
        devices = client.addressable_devices()
        jsharding = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), P("x"))
        lowered = jax.jit(lambda x, y: (x + y, x * 2), in_shardings=(jsharding,) * 2).lower(
            *[jax.ShapeDtypeStruct((8,), np.float32)] * 2)
        exe = client.compile(lowered, ifrt.CompileOptions(devices=devices, num_partitions=8))
        sharding = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))
        x, y = np.arange(8, dtype=np.float32), np.ones(8, np.float32)
        exe.execute([client.make_array_from_host_buffer(v, sharding) for v in (x, y)])
        go, dropped, state = threading.Event(), threading.Event(), {"args": None}

        def drop():  # wakes when the main thread releases the GIL inside execute
            while go.wait() and state["args"] is not None:
                go.clear()
                state["args"].clear()
                dropped.set()

        thread = threading.Thread(target=drop)
        thread.start()
        for _ in range(1000):
            args = [client.make_array_from_host_buffer(v, sharding) for v in (x, y)]
            for a in args:
                a.block_until_ready()
            state["args"] = args
            go.set()
            try:
                out = exe.execute(args).outputs[0]
            except ifrt.errors.InvalidArgumentError:  # emptied before the call: refused
                pass
            else:
                np.testing.assert_array_equal(np.asarray(out), x + y)
            dropped.wait()
            dropped.clear()
        state["args"] = None
        go.set()
        thread.join()
        print("alive")
    """)


def test_arguments_removed_while_the_call_checks_them():
    """Comparing an argument's shape with the checked one may run Python code (a shape
    equal to it, not the same object), which may empty the caller's list: the C path reads
    the arguments the list held when the call was made, never past its end."""
    assert_survives("""
        import ifrtpy as ifrt
        from ifrtpy.shape import Shape
        client = ifrt.get_client("pjrt", device_count=1)
        prog = (
            "func.func public @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {"
            "  %z = stablehlo.add %x, %y : tensor<8xf32>"
            "  return %z : tensor<8xf32>"
            "}")
        exe = client.compile(ifrt.HloProgram(prog))
        a, b = (ifrt.device_put(np.arange(8, dtype=np.float32), client.devices()[0])
                for _ in range(2))
        exe.execute([a, b])
        args = [a, b]

        class Emptying(Shape):
            def __ne__(self, other):
                args.clear()
                return False

        a._shape = Emptying(a._shape)
        out, = exe.execute(args).outputs
        print("emptied", args == [], "ran", list(np.asarray(out)) == list(2 * np.arange(8)))
        print("alive")
    """, "emptied True ran True")


def test_a_repeated_call_checks_each_buffer(client, monkeypatch):
    """The C path skips the contract, not the checks of the buffers it hands the plugin: an
    argument whose buffers were replaced by something else is refused, not handed on."""
    devices = client.addressable_devices()[:1]
    executable = _compile(client, lambda x: x + 1, 1, devices)
    sharding = _sharding(client, devices)
    x = np.arange(8, dtype=np.float32)
    _checked_only_once(monkeypatch, executable)
    executable(client.make_array_from_host_buffer(x, sharding))
    a = client.make_array_from_host_buffer(x, sharding)
    buffers = a._buffers
    for broken, message in (((x,), "argument 0 on device 0 must be a BufferHandle"),
                            (buffers * 2, "argument 0 has 2 buffers for 1 devices"),
                            (None, "buffers of argument 0 must be a tuple")):
        a._buffers = broken
        assert a._buffers is broken  # read back as set, whatever it holds
        with pytest.raises(InvalidArgumentError, match=message):
            executable(a)
    a._buffers = buffers
    [out] = executable(a)
    np.testing.assert_array_equal(_host(out), x + 1)


@pytest.mark.parametrize("reads_completion", [True, False], ids=["completion", "ready-events"])
def test_block_until_ready(client, reads_completion):
    """Ready: the array itself. Deleted, or donated by an execute: FailedPreconditionError.
    An error array: its error. The same whether the execute read its completion events
    (the CPU platform's choice) or the outputs' ready events are waited for."""
    devices = client.addressable_devices()[:8]
    sharding = _sharding(client, devices)
    executable = _compile(client, lambda x: x * 2, 1, devices, donate=(0,))
    assert executable._handle.reads_completion  # the CPU runs small programs inline
    executable._handle.reads_completion = reads_completion
    x = np.arange(8, dtype=np.float32)
    for _ in range(2):  # checked, then repeated
        donated = client.make_array_from_host_buffer(x, sharding)
        [out] = executable(donated)
        assert out.block_until_ready() is out
        with pytest.raises(FailedPreconditionError, match="deleted"):
            donated.block_until_ready()
    out.delete()
    with pytest.raises(FailedPreconditionError, match="deleted"):
        out.block_until_ready()
    [out] = executable(client.make_array_from_host_buffer(x, sharding))
    assert out.block_until_ready() is out
    for buffer in out._buffers:  # deleted under the array: no longer known ready
        buffer.delete()
    with pytest.raises(FailedPreconditionError, match="deleted"):
        out.block_until_ready()
    spec = ArraySpec(ifrt.DType.from_numpy(np.float32), ifrt.Shape([8]), sharding)
    [bad] = client.make_error_arrays(RuntimeError("upstream failure"), [spec])
    with pytest.raises(RuntimeError, match="upstream failure"):
        bad.block_until_ready()


@pytest.mark.parametrize("build", [b.name for b, _ in builds.installed_builds()])
def test_a_loop_of_donated_steps_runs_ahead_of_the_computation(build):
    """As jax's async dispatch: each step returns while its computation runs, the next one
    taking the previous step's outputs (donated) as they are, so a loop of steps is all
    dispatched before the first one finished. Except on the official build (PJRT 0.81),
    whose destroy of a donated buffer waits for the execute it was given to: there each
    step waits for the one before (the last one may still run, or not)."""
    client = ifrt.get_client(build, device_count=1)

    def step(x):
        for _ in range(16):
            x = jax.numpy.tanh(x @ x)
        return x

    x = np.full((384, 384), 1 / 384, np.float32)
    exe = client.compile(jax.jit(step, donate_argnums=0).lower(x))
    state = exe(ifrt.device_put(x, client.devices()[0]))
    state[0].block_until_ready()
    futures = []
    for _ in range(6):
        state = exe(*state)
        futures.append(state[0].ready_future())
    done = [f.done() for f in futures]
    if client.plugin.api_version <= (0, 81):
        assert done[:5] == [True] * 5
    else:
        assert done == [False] * 6
    expected = x
    for _ in range(7):
        expected = np.asarray(step(expected))
    np.testing.assert_allclose(np.asarray(state[0]), expected, rtol=1e-4)
    assert all(f.result(timeout=TIMEOUT_S) is None for f in futures)


def test_execute_and_call_are_bound_by_name_not_by_the_order_of_the_bases():
    # LoadedExecutable.execute (the contract, then _launch) runs as ExecutableCore's C
    # version, which a reader of PjrtLoadedExecutable sees there, not by the method order.
    from ifrtpy.backends.pjrt._execute_launch import ExecutableCore
    from ifrtpy.backends.pjrt.executable import PjrtLoadedExecutable

    assert vars(PjrtLoadedExecutable)["execute"] is vars(ExecutableCore)["execute"]
    assert vars(PjrtLoadedExecutable)["__call__"] is vars(ExecutableCore)["__call__"]


def test_every_way_of_calling_gives_the_same_outputs(client, monkeypatch):
    """``exe(a)`` is a vectorcall (its arguments read where the caller keeps them); a call
    through a tuple (``exe(*args)``, ``functools.partial``, ``type(exe).__call__``) and one
    with keywords (refused) take the same path or tp_call's, and agree."""
    import functools

    devices = client.addressable_devices()[:1]
    executable = _compile(client, lambda x, y: x - y, 2, devices)
    x, y = np.arange(8, dtype=np.float32), np.full(8, 2, np.float32)
    a, b = (client.make_array_from_host_buffer(v, SingleDeviceSharding(devices[0])) for v in (x, y))
    assert type(executable).__flags__ & (1 << 11)  # Py_TPFLAGS_HAVE_VECTORCALL
    _checked_only_once(monkeypatch, executable)
    for call in (lambda: executable(a, b), lambda: executable(*[a, b]),
                 functools.partial(executable, a, b), lambda: type(executable).__call__(executable, a, b)):
        [out] = call()
        np.testing.assert_array_equal(_host(out), x - y)
    with pytest.raises(TypeError, match=r"not by keyword \(got y=\)"):
        executable(a, y=b)
    monkeypatch.undo()  # a call of other kinds is checked
    with pytest.raises(InvalidArgumentError, match="takes 2 arguments, got 1"):
        executable(a)


def test_a_subclass_whose_call_changes_later_is_called_through_it(client):
    """A subclass of the executable type whose ``__call__`` is replaced after its first
    instance is made calls the new one, not the C path."""
    from ifrtpy.backends.pjrt.executable import PjrtLoadedExecutable

    class Counting(PjrtLoadedExecutable):
        pass

    devices = client.addressable_devices()[:1]
    original = _compile(client, lambda x: x + 1, 1, devices)
    executable = Counting(client, original._handle, original._program, original._devices)
    a = client.make_array_from_host_buffer(np.arange(8, dtype=np.float32),
                                           SingleDeviceSharding(devices[0]))
    [out] = executable(a)
    np.testing.assert_array_equal(_host(out), np.arange(8, dtype=np.float32) + 1)
    calls = []
    Counting.__call__ = lambda self, *args: calls.append(args) or "replaced"
    assert executable(a) == "replaced" and calls == [(a,)]


def test_outputs_are_freed_directly_and_wholly(client):
    """PjrtArray is freed without subtype_dealloc (``_array_storage.free_directly``): each freed
    output releases its type and its weak references, one made from the free list is
    whole and fresh, a subclass of it (with a __dict__) is freed through subtype_dealloc
    as before, and no other class is taken."""
    import gc
    import sys
    import weakref

    from ifrtpy.backends.pjrt._array_storage import ArrayCore, free_directly
    from ifrtpy.backends.pjrt.array import PjrtArray

    devices = client.addressable_devices()[:1]
    executable = _compile(client, lambda x: x + 1, 1, devices)
    a = client.make_array_from_host_buffer(np.arange(8, dtype=np.float32),
                                           SingleDeviceSharding(devices[0]))
    executable(a)
    gc.collect()
    before = sys.getrefcount(PjrtArray)
    for _ in range(1000):
        executable(a)[0].block_until_ready()
    assert sys.getrefcount(PjrtArray) == before
    freed = []
    [out] = executable(a)
    ref = weakref.ref(out, freed.append)
    out.delete()
    del out
    assert ref() is None and freed == [ref]
    for _ in range(20):  # more than the free list keeps: some made afresh, some reused
        outs = [executable(a)[0] for _ in range(20)]
        assert all(not o.is_deleted() and o._error is None and gc.is_tracked(o) for o in outs)
        np.testing.assert_array_equal(_host(outs[-1]), np.arange(8, dtype=np.float32) + 1)
        for o in outs[::2]:
            o.delete()
        del outs, o
    assert sys.getrefcount(PjrtArray) == before

    class Annotated(PjrtArray):  # a __dict__, and subtype_dealloc
        pass

    [out] = executable(a)
    copy = Annotated(client, out.dtype, out.shape, out.sharding, out._buffers)
    copy.note = "kept"
    ref = weakref.ref(copy)
    before = sys.getrefcount(Annotated)
    del copy
    assert ref() is None and sys.getrefcount(Annotated) == before - 1
    free_directly(PjrtArray)  # again: nothing changes
    for cls in (Annotated, ArrayCore, int, "PjrtArray"):
        with pytest.raises(TypeError, match="cannot be freed directly"):
            free_directly(cls)



def _heap_in_use():
    """Bytes glibc's malloc has handed out and not had back (the plugin's buffers among
    them); None without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def test_an_outputs_buffer_gets_its_handle_when_first_asked_for(client):
    """An output on one device holds its buffer as the execute made it until its handle
    is asked for: the handle is then made once, and the buffer works as any other (read,
    chained, donated, deleted); an output nobody asked frees its buffer and its reference
    to the client, also when the GC breaks a cycle through it."""
    import gc
    import sys

    devices = client.addressable_devices()[:1]
    sharding = _sharding(client, devices)
    add_one = _compile(client, lambda x: x + 1, 1, devices)
    double = _compile(client, lambda x: x * 2, 1, devices, donate=(0,))
    x = np.arange(8, dtype=np.float32)
    a = client.make_array_from_host_buffer(x, sharding)
    double(add_one(a)[0])  # both checked once
    handle = client._handle
    gc.collect()
    holders = sys.getrefcount(handle)

    [out] = add_one(a)
    assert out._buffers[0] is out._buffers[0]  # made once
    np.testing.assert_array_equal(_host(out), x + 1)
    [chained] = add_one(add_one(a)[0])  # an output never asked for, as an argument
    np.testing.assert_array_equal(_host(chained), x + 2)
    [donor] = add_one(a)
    [doubled] = double(donor)  # donated before anyone asked for its buffer
    assert donor.is_deleted()
    with pytest.raises(FailedPreconditionError, match="deleted"):
        donor.block_until_ready()
    np.testing.assert_array_equal(_host(doubled), (x + 1) * 2)
    [deleted] = add_one(a)
    deleted.delete()
    assert deleted.is_deleted()
    [cyclic] = add_one(a)
    cyclic._user_context = [cyclic]  # collected by the GC, its fields cleared first
    del out, chained, donor, doubled, deleted, cyclic
    for _ in range(1000):
        add_one(a)[0].block_until_ready()
    gc.collect()
    assert sys.getrefcount(handle) <= holders  # others may let go meanwhile, none holds more


def test_outputs_nobody_asked_for_free_their_buffers(client):
    """40 outputs of 16 MiB dropped as the executes return, before their handles were
    asked for: once the executes are done, the memory in use is back near where it was,
    not 640 MiB above (the buffers destroyed with their arrays)."""
    if _heap_in_use() is None:
        pytest.skip("reads glibc's malloc statistics")
    devices = client.addressable_devices()[:1]
    x = np.ones(4 << 20, np.float32)
    executable = client.compile(jax.jit(lambda v: v + 1).lower(x))
    a = client.make_array_from_host_buffer(x, SingleDeviceSharding(devices[0]))
    executable(a)[0].block_until_ready()
    before = _heap_in_use()
    for _ in range(40):
        executable(a)
    np.testing.assert_array_equal(_host(executable(a)[0]), x + 1)  # after all the others
    assert _heap_in_use() - before < 160 << 20


def test_an_unread_output_shows_the_collector_its_client(client):
    """An output holding its buffer as the execute made it refers to its ClientHandle: the
    collector sees that reference (else a cycle through the client and the output would
    never be collected); once the handle is made, the handle holds the client."""
    devices = client.addressable_devices()[:1]
    executable = _compile(client, lambda x: x + 1, 1, devices)
    a = client.make_array_from_host_buffer(np.ones(8, np.float32), _sharding(client, devices))
    [out] = executable(a)
    handle = executable._handle.client
    assert any(r is handle for r in gc.get_referents(out))
    out._buffers  # the handle made: the array no longer refers to the client itself
    assert not any(r is handle for r in gc.get_referents(out))


@pytest.mark.parametrize("num_devices", [1, 8])
def test_a_failure_making_the_outputs_keeps_the_donated_inputs(client, num_devices):
    """Making the output arrays fails (a MemoryError): the call raises it, and the donated
    argument is neither given to the plugin nor read as deleted."""
    devices = client.addressable_devices()[:num_devices]
    executable = _compile(client, lambda x: x * 2, 1, devices, donate=(0,))
    sharding = _sharding(client, devices)
    x = np.arange(8, dtype=np.float32)
    array_type = executable._array_type

    class NoRoom(array_type):
        __slots__ = ()

        def __new__(cls, *args, **kwargs):
            raise MemoryError("no room for the outputs")

    a = client.make_array_from_host_buffer(x, sharding)
    executable._array_type = NoRoom
    try:
        with pytest.raises(MemoryError, match="no room for the outputs"):
            executable.execute([a])
    finally:
        executable._array_type = array_type
    assert not a.is_deleted()
    np.testing.assert_array_equal(_host(a), x)
    [out] = executable(a)  # and it can still be donated
    assert a.is_deleted()
    np.testing.assert_array_equal(_host(out), x * 2)
