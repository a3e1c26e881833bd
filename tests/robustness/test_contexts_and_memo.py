"""Robustness of ordered effects, the PjRt compile memo and user context scopes.

* An ordered host callback (``io_callback(ordered=True)``) may wait for another thread's
  ordered execute on another device: ordering is per device and no lock is held while a
  callback runs. Executes on the same device still run their effects in call order,
  nested ones (a callback executing) included.
* The compile memo keeps nothing a program no longer uses alive (host callback callables,
  user contexts) and takes unhashable callables and contexts (identity, not equality).
* One UserContextScope may be used by several threads and tasks at once; scopes closed
  out of order leave the innermost open one active; leaving a scope where it is not open
  is a FailedPreconditionError.

Waits that would hang on a regression are bounded (generous timeouts, about hangs only).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import gc
import threading
import time
import weakref

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.errors import FailedPreconditionError
from ifrtpy.user_context import UserContext, UserContextScope, current_user_context

jax = pytest.importorskip("jax")
io_callback = pytest.importorskip("jax.experimental").io_callback

HANG = 60  # seconds: a bound on waits that only a hang would reach

X = np.arange(4, dtype=np.float32)


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)


@pytest.fixture(scope="module", params=["pjrt", "jax"])
def any_client(request):
    return ifrt.get_client("pjrt", device_count=8) if request.param == "pjrt" else ifrt.get_client("jax")


def _like(v):
    return jax.ShapeDtypeStruct(v.shape, v.dtype)


def _ordered(client, callback, devices):
    """An executable on ``devices`` (one: that device; more: SPMD, replicated) running
    ``callback(v)`` as an ordered io_callback, returning ``v + 1``."""
    def f(v):
        io_callback(callback, None, v, ordered=True)
        return v + 1
    options = ifrt.CompileOptions(devices=ifrt.DeviceList(list(devices)),
                                  num_partitions=len(devices))
    return client.compile(ifrt.HloProgram(jax.jit(f).lower(X)), options)


def _run_on(exe):
    """Execute ``exe`` on its devices (a replicated argument); the output as NumPy."""
    (out,) = exe(ifrt.device_put(X, exe.parameter_shardings()[0]))
    return np.asarray(out)


# -- ordered effects ------------------------------------------------------------------------

def test_an_ordered_callback_waits_for_another_threads_ordered_execute_on_another_device(any_client):
    client = any_client
    d0, d1 = client.devices()[:2]
    other = _ordered(client, lambda v: None, [d1])
    pool = cf.ThreadPoolExecutor(1)
    seen = []

    def wait_for_the_other_device(v):
        seen.append(pool.submit(_run_on, other).result(timeout=HANG))

    exe = _ordered(client, wait_for_the_other_device, [d0])
    np.testing.assert_array_equal(_run_on(exe), X + 1)
    np.testing.assert_array_equal(seen[0], X + 1)
    pool.shutdown()


def test_an_ordered_execute_does_not_wait_for_a_running_one_on_another_device(any_client):
    client = any_client
    d0, d1 = client.devices()[2:4]
    release, started = threading.Event(), threading.Event()

    def hold(v):
        started.set()
        release.wait(2 * HANG)  # longer than the wait below: set by the test only

    slow = _ordered(client, hold, [d0])
    fast = _ordered(client, lambda v: None, [d1])
    holder = threading.Thread(target=_run_on, args=(slow,), daemon=True)
    holder.start()
    try:
        assert started.wait(HANG)
        done = cf.ThreadPoolExecutor(1).submit(_run_on, fast)
        np.testing.assert_array_equal(done.result(timeout=HANG), X + 1)
        assert not release.is_set()  # the slow one was still in its callback
    finally:
        release.set()
        holder.join(HANG)


def test_ordered_executes_on_one_device_run_their_effects_in_call_order(any_client):
    client = any_client
    seen = []
    d0, d1 = client.devices()[4:6]
    exes = {name: _ordered(client, lambda v, name=name: seen.append(name), devices)
            for name, devices in (("a", [d0]), ("b", [d1]), ("ab", [d0, d1]))}
    calls = ["a", "ab", "b", "a", "ab", "ab", "b", "a"] * 3
    for name in calls:
        exes[name](ifrt.device_put(X, exes[name].parameter_shardings()[0]))  # not waited for
    _run_on(exes["ab"])
    calls.append("ab")
    # "ab" runs its callback once, on its first device (d0): the effects of each device keep
    # the call order; how d0's and d1's interleave is not ordered (per-device tokens).
    for device_calls in ({"a", "ab"}, {"b"}):
        assert [n for n in seen if n in device_calls] == [n for n in calls if n in device_calls]


def test_an_ordered_callback_may_execute_ordered_programs_on_its_own_device(any_client):
    client = any_client
    d0 = client.devices()[6]
    seen = []
    inner = _ordered(client, lambda v: seen.append("inner"), [d0])

    def outer_callback(v):
        seen.append("outer")
        _run_on(inner)
        _run_on(inner)

    outer = _ordered(client, outer_callback, [d0])
    done = cf.ThreadPoolExecutor(1).submit(lambda: [_run_on(outer), _run_on(inner)])
    for out in done.result(timeout=HANG):
        np.testing.assert_array_equal(out, X + 1)
    assert seen == ["outer", "inner", "inner", "inner"]


def test_threads_sharing_a_device_each_see_their_ordered_effects_in_order(any_client):
    client = any_client
    d0 = client.devices()[7]
    seen = []
    exe = _ordered(client, lambda v: seen.append((threading.get_ident(), int(v[0]))), [d0])

    def run(base):
        for i in range(10):
            exe(ifrt.device_put(X + base + i, d0))[0].delete()

    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(run, [0, 100, 200, 300], timeout=HANG))
    assert len(seen) == 40
    for thread in {t for t, _ in seen}:
        values = [v for t, v in seen if t == thread]
        assert values == sorted(values)


# -- the compile memo -------------------------------------------------------------------------

def _callback_program():
    return jax.jit(lambda v: jax.pure_callback(lambda t: t, _like(v), v)).lower(X)


def test_the_memo_keeps_no_callable_of_a_dead_executable(client):
    lowered, device = _callback_program(), client.devices()[0]
    refs = []
    for i in range(3):
        payload = np.full(1 << 16, i, np.float32)

        def callback(t, payload=payload):
            return (t + payload[0],)

        refs.append(weakref.ref(callback))
        exe = client.compile(ifrt.HloProgram(lowered, host_callbacks=[callback]))
        np.testing.assert_array_equal(np.asarray(exe(ifrt.device_put(X, device))[0]), X + i)
        del exe, callback, payload
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


class _TrackedContext(UserContext):
    """A context that can be weakly referenced (the base class has slots only)."""


def test_the_memo_keeps_no_user_context_of_a_dead_executable(client):
    context = _TrackedContext(41, "compile")
    ref = weakref.ref(context)
    with UserContextScope(context):
        exe = client.compile(ifrt.HloProgram(jax.jit(lambda v: v * 3).lower(X)))
    assert exe.user_context is context
    del exe, context
    gc.collect()
    assert ref() is None


def test_the_memo_returns_the_live_executable_for_the_same_callables(client):
    lowered = _callback_program()

    def callback(t):
        return (t * 2,)

    first = client.compile(ifrt.HloProgram(lowered, host_callbacks=[callback]))
    assert client.compile(ifrt.HloProgram(lowered, host_callbacks=[callback])) is first
    other = client.compile(ifrt.HloProgram(lowered, host_callbacks=[lambda t: (t * 5,)]))
    assert other is not first
    device = client.devices()[0]
    np.testing.assert_array_equal(np.asarray(first(ifrt.device_put(X, device))[0]), X * 2)
    np.testing.assert_array_equal(np.asarray(other(ifrt.device_put(X, device))[0]), X * 5)


@dataclasses.dataclass
class _Scale:
    """A callable dataclass: unhashable (eq without frozen)."""
    k: float

    def __call__(self, t):
        return (t * np.float32(self.k),)


def test_an_unhashable_callable_compiles_and_runs(client):
    lowered, device = _callback_program(), client.devices()[0]
    three, four = _Scale(3.0), _Scale(4.0)
    exe = client.compile(ifrt.HloProgram(lowered, host_callbacks=[three]))
    np.testing.assert_array_equal(np.asarray(exe(ifrt.device_put(X, device))[0]), X * 3)
    assert client.compile(ifrt.HloProgram(lowered, host_callbacks=[three])) is exe
    # An equal but distinct callable is another program's: its own executable.
    again = client.compile(ifrt.HloProgram(lowered, host_callbacks=[_Scale(3.0)]))
    assert again is not exe
    exe4 = client.compile(ifrt.HloProgram(lowered, host_callbacks=[four]))
    np.testing.assert_array_equal(np.asarray(exe4(ifrt.device_put(X, device))[0]), X * 4)


class _RequestContext(UserContext):
    """Contexts equal by fingerprint: unhashable (``__eq__`` without ``__hash__``)."""
    __slots__ = ()

    def __eq__(self, other):
        return isinstance(other, _RequestContext) and other.fingerprint() == self.fingerprint()


def test_an_unhashable_user_context_compiles_and_is_recorded(client):
    lowered = jax.jit(lambda v: v - 1).lower(X)
    first, second = _RequestContext(3, "request 3"), _RequestContext(3, "request 3 again")
    with UserContextScope(first):
        exe = client.compile(ifrt.HloProgram(lowered))
        assert client.compile(ifrt.HloProgram(lowered)) is exe
    with UserContextScope(second):
        other = client.compile(ifrt.HloProgram(lowered))
    assert exe.user_context is first and other.user_context is second
    out = exe(ifrt.device_put(X, client.devices()[0]))[0]
    np.testing.assert_array_equal(np.asarray(out), X - 1)


@pytest.mark.parametrize("value", [{"a"}, np.arange(3), bytearray(b"a")])
def test_an_unhashable_option_value_is_refused_by_name(client, value):
    options = ifrt.CompileOptions(debug_options={"xla_dump_to": value})
    with pytest.raises(ifrt.errors.InvalidArgumentError, match="xla_dump_to"):
        client.compile(ifrt.HloProgram(jax.jit(lambda v: v * 2).lower(X)), options)


# -- user context scopes ----------------------------------------------------------------------

def test_one_scope_used_by_several_threads_works_in_each():
    context = UserContext(99, "shared")
    scope = UserContextScope(context)
    barrier = threading.Barrier(6)
    failures = []

    def work():
        barrier.wait(HANG)
        try:
            for _ in range(300):
                with scope:
                    time.sleep(0)  # let the other threads enter and leave meanwhile
                    assert current_user_context() is context
                assert current_user_context() is None
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(repr(e))

    threads = [threading.Thread(target=work, daemon=True) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    assert failures == []


def test_one_scope_used_by_several_tasks_works_in_each():
    context = UserContext(98, "shared by tasks")
    scope = UserContextScope(context)

    async def task(n):
        inner = UserContext(n)
        for _ in range(5):
            with scope:
                await asyncio.sleep(0)
                with UserContextScope(inner):
                    await asyncio.sleep(0)
                    assert current_user_context() is inner
                assert current_user_context() is context
        return current_user_context()

    async def all_tasks():
        return await asyncio.gather(*(task(n) for n in range(1, 6)))

    assert asyncio.run(all_tasks()) == [None] * 5


def test_scopes_closed_out_of_order_leave_the_innermost_open_one_active():
    a, b, c = (UserContextScope(UserContext(n, name)) for n, name in ((1, "A"), (2, "B"), (3, "C")))
    a.__enter__()
    b.__enter__()
    c.__enter__()
    b.__exit__(None, None, None)
    assert current_user_context().fingerprint() == 3
    c.__exit__(None, None, None)
    assert current_user_context().fingerprint() == 1
    a.__exit__(None, None, None)
    assert current_user_context() is None

    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert current_user_context().fingerprint() == 2
    b.__exit__(None, None, None)
    assert current_user_context() is None


def test_leaving_a_scope_where_it_is_not_open_is_refused():
    scope = UserContextScope(UserContext(5, "request 5"))
    with pytest.raises(FailedPreconditionError, match="request 5.*not open"):
        scope.__exit__(None, None, None)
    scope.__enter__()
    caught = []

    def leave_elsewhere():
        try:
            scope.__exit__(None, None, None)
        except Exception as e:  # noqa: BLE001 - checked below
            caught.append(e)
        caught.append(current_user_context())

    thread = threading.Thread(target=leave_elsewhere, daemon=True)
    thread.start()
    thread.join(HANG)
    assert isinstance(caught[0], FailedPreconditionError) and caught[1] is None
    assert current_user_context().fingerprint() == 5  # still open here
    scope.__exit__(None, None, None)
    assert current_user_context() is None
