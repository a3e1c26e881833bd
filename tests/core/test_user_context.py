"""UserContext and UserContextScope (IFRT's ``user_context.h``): the context of the
innermost open scope of a thread or task, restored when a scope closes."""

import asyncio
import threading

import pytest

import ifrtpy as ifrt
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.user_context import UserContext, UserContextScope, current_user_context


def test_fingerprint_and_debug_string():
    context = UserContext(20, "request 20")
    assert context.fingerprint() == 20
    assert context.debug_string() == "request 20"
    assert UserContext(7).debug_string() == "UserContext(7)"
    assert "20" in repr(context)


@pytest.mark.parametrize("bad", [0, -1, 2**64, True, 1.0, "1"])
def test_fingerprint_is_a_non_zero_uint64(bad):
    with pytest.raises(InvalidArgumentError, match="non-zero uint64"):
        UserContext(bad)


def test_scopes_nest_and_restore():
    outer, inner = UserContext(1), UserContext(2)
    assert current_user_context() is None
    with UserContextScope(outer) as entered:
        assert entered is outer and current_user_context() is outer
        with UserContextScope(inner):
            assert UserContextScope.current() is inner
        assert current_user_context() is outer
    assert current_user_context() is None


def test_a_scope_restores_on_error_and_can_be_reused():
    context = UserContext(3)
    scope = UserContextScope(context)
    with pytest.raises(RuntimeError):
        with scope:
            raise RuntimeError("boom")
    assert current_user_context() is None
    with scope:
        with scope:
            assert current_user_context() is context
        assert current_user_context() is context
    assert current_user_context() is None


def test_each_thread_and_task_has_its_own():
    seen = {}

    def worker():
        seen["thread"] = current_user_context()

    with UserContextScope(UserContext(4)):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert seen["thread"] is None

    async def task(n):
        with UserContextScope(UserContext(n)):
            await asyncio.sleep(0)
            return current_user_context().fingerprint()

    async def both():
        return await asyncio.gather(task(5), task(6))

    assert asyncio.run(both()) == [5, 6]


def test_scope_needs_a_user_context():
    with pytest.raises(InvalidArgumentError, match="UserContextScope context"):
        UserContextScope(20)


def test_public_names():
    assert ifrt.UserContext is UserContext and ifrt.UserContextScope is UserContextScope
    assert ifrt.current_user_context is current_user_context


@pytest.mark.parametrize("backend", ["reference", "pjrt", "jax"])
def test_every_value_records_the_context_of_its_call(backend):
    """Puts, reshards and outputs of execute (first call and repeats) carry the context
    of their call; the executable that of its compile."""
    import numpy as np

    client = ifrt.get_client(backend, **({} if backend == "jax" else {"device_count": 2}))
    device = client.addressable_devices()[0]
    sharding = ifrt.SingleDeviceSharding(device)
    program = """func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {
      %y = stablehlo.add %x, %x : tensor<3xf32>
      return %y : tensor<3xf32>
    }"""
    with UserContextScope(UserContext(11)):
        exe = client.compile(ifrt.HloProgram(program), ifrt.CompileOptions(devices=[device]))
        a = client.make_array_from_host_buffer(np.arange(3, dtype=np.float32), sharding)
        b = client.make_array_from_host_buffer(np.arange(3, dtype=np.float32), sharding)
    assert exe.user_context.fingerprint() == 11
    assert a.user_context.fingerprint() == b.user_context.fingerprint() == 11
    for n in (12, 13, 14):
        with UserContextScope(UserContext(n)):
            out, = exe(a)
            moved, = client.reshard_arrays(
                [a], [ifrt.ArraySpec(a.dtype, a.shape, sharding)])
        assert out.user_context.fingerprint() == n and moved.user_context.fingerprint() == n
    out, = exe(a)
    assert out.user_context is None
    np.testing.assert_array_equal(np.asarray(out), 2 * np.arange(3))
