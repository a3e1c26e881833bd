"""Robustness of host callbacks and custom calls: a callback's failure always fails its
execute (however badly the exception behaves), executes nested through callbacks are
refused at the plugin's limit instead of waiting forever, Ctrl-C in a callback reaches
the caller as KeyboardInterrupt, handlers that cannot report failure are refused, and
repeated executes of callback and custom-call programs keep memory bounded.

Checks that could hang or crash run in a child process with a timeout (the timeouts are
about a hang, not about speed).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.errors import InternalError, InvalidArgumentError

HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")


def _run_child(code: str, timeout: float = 120) -> str:
    """``code`` in a fresh interpreter (cwd tests/helpers); its stdout. pytest.fail on a
    signal, a hang or a non-zero exit, with the end of its stderr."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONFAULTHANDLER="1")
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=HELPERS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung (no exit within {timeout} s)")
    if done.returncode != 0:
        pytest.fail(f"the child exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=1)


def _callback_program(client, callback, shape=(4,)):
    b = ifrt.builder.Builder("callback")
    v = b.parameter(shape, np.float32)
    return client.compile(b.build(b.host_callback(callback, [v], (shape, np.float32))))


# -- a callback's failure is the execute's failure ---------------------------------------------

class _StrRaises(Exception):
    def __str__(self):
        raise RuntimeError("__str__ fails")


class _StrNotStr(Exception):
    def __str__(self):
        return 42  # type: ignore[return-value]


@pytest.mark.parametrize("kind", [_StrRaises, _StrNotStr])
def test_an_exception_that_cannot_be_printed_still_fails_the_execute(client, kind):
    def callback(t):
        raise kind()

    exe = _callback_program(client, callback)
    x = ifrt.device_put(np.arange(4, dtype=np.float32), client.devices()[0])
    with pytest.raises(InternalError, match=f"host callback 0 raised {kind.__name__}"):
        out, = exe(x)
        np.asarray(out)  # the error may come with the output


def test_jax_callback_whose_exception_cannot_be_printed_fails_the_execute(client):
    jax = pytest.importorskip("jax")

    def callback(t):
        raise _StrRaises()

    x = np.arange(4, dtype=np.float32)
    f = jax.jit(lambda v: jax.pure_callback(callback, jax.ShapeDtypeStruct(v.shape, v.dtype), v) + 1)
    exe = client.compile(ifrt.HloProgram(f.lower(x)))
    with pytest.raises(InternalError, match="host callback 0 raised"):
        np.asarray(exe(ifrt.device_put(x, client.devices()[0]))[0])


# -- Ctrl-C in a callback ---------------------------------------------------------------------

def test_ctrl_c_in_an_inline_callback_reaches_the_caller_as_keyboard_interrupt(client):
    def callback(t):
        raise KeyboardInterrupt  # what Ctrl-C raises in the Python code running then

    exe = _callback_program(client, callback)
    x = ifrt.device_put(np.ones(4, np.float32), client.devices()[0])
    with pytest.raises(KeyboardInterrupt):
        out, = exe(x)
        np.asarray(out)
    # the next execute is not affected
    good = _callback_program(client, lambda t: t * 2)
    np.testing.assert_array_equal(np.asarray(good(x)[0]), np.full(4, 2, np.float32))


def test_ctrl_c_from_the_signal_during_a_nested_callback():
    out = _run_child("""
        import signal, threading, numpy as np, ifrtpy as ifrt
        c = ifrt.get_client("pjrt", device_count=1)
        d = c.devices()[0]
        def inner_host(t):
            # Ctrl-C during this callback: SIGINT to the main thread, which takes a
            # terminal's whenever it can. Not os.kill: a signal sent to the process may be
            # taken by any thread that does not block it (a plugin thread that unblocks
            # signals meanwhile), and Python then raises it only when the main thread
            # next takes the GIL or checks, which may be after the call (at exit, where
            # it is ignored). Nor signal.raise_signal: it signals this thread, a plugin
            # thread when the plugin runs the program on one.
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            return t
        def program(f):
            b = ifrt.builder.Builder("p"); v = b.parameter((4,), np.float32)
            return c.compile(b.build(b.host_callback(f, [v], ((4,), np.float32))))
        inner = program(inner_host)
        outer = program(lambda t: np.asarray(inner(ifrt.device_put(t, d))[0]))
        try:
            np.asarray(outer(ifrt.device_put(np.ones(4, np.float32), d))[0])
            print("no KeyboardInterrupt")
        except KeyboardInterrupt:
            print("KeyboardInterrupt")
        except Exception as e:
            print(type(e).__name__, e)
    """, timeout=60)
    assert out.strip().splitlines()[-1] == "KeyboardInterrupt", out


# -- executes nested through callbacks --------------------------------------------------------

NESTED_PRELUDE = """
    import re, threading, numpy as np, ifrtpy as ifrt
    c = ifrt.get_client("pjrt", device_count=1)
    d = c.devices()[0]
    def program(f):
        b = ifrt.builder.Builder("p"); v = b.parameter((4,), np.float32)
        return c.compile(b.build(b.host_callback(f, [v], ((4,), np.float32))))
    LIMIT = "32 executions .* in flight on device 0"
    def expect_limit(call):
        try:
            call()
        except ifrt.errors.IfrtError as e:
            assert re.search(LIMIT, str(e)), str(e)
        else:
            raise AssertionError("accepted")
"""


def test_executes_nested_through_callbacks_stop_at_the_plugins_limit():
    out = _run_child(NESTED_PRELUDE + """
    def run(depth):
        def host(t):
            return np.asarray(exe(ifrt.device_put(t + 1, d))[0]) if t[0] < depth else t
        global exe
        exe = program(host)
        return np.asarray(exe(ifrt.device_put(np.zeros(4, np.float32), d))[0])
    np.testing.assert_array_equal(run(31), np.full(4, 31, np.float32))  # 32 in flight: runs
    expect_limit(lambda: run(32))
    expect_limit(lambda: run(100))
    np.testing.assert_array_equal(run(5), np.full(4, 5, np.float32))  # the counts came back
    print("ok")
    """, timeout=60)
    assert out.strip().endswith("ok"), out


def test_32_threads_whose_callbacks_execute_on_the_same_device():
    out = _run_child(NESTED_PRELUDE + """
    plain = program(lambda t: t + 1)
    barrier = threading.Barrier(32, timeout=30)  # all 32 callbacks in flight at once
    def host(t):
        barrier.wait()
        return np.asarray(plain(ifrt.device_put(t, d))[0])
    outer = program(host)
    refused, errors = [], []
    def thread():
        try:
            out = np.asarray(outer(ifrt.device_put(np.zeros(4, np.float32), d))[0])
            np.testing.assert_array_equal(out, np.ones(4, np.float32))
        except ifrt.errors.IfrtError as e:
            refused.append(e)
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=thread) for _ in range(32)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors, errors[:3]
    # the first nested execute found 32 in flight; once it failed, the others had room
    assert refused, "no execute was refused"
    assert all(re.search(LIMIT, str(e)) for e in refused), refused[:3]
    # once they are done, the same program runs again
    barrier = threading.Barrier(1)
    np.testing.assert_array_equal(np.asarray(outer(ifrt.device_put(np.zeros(4, np.float32), d))[0]),
                                  np.ones(4, np.float32))
    print("ok")
    """, timeout=60)
    assert out.strip().endswith("ok"), out


# -- custom call handlers and target names ----------------------------------------------------

def test_a_ctypes_callback_of_python_code_is_refused_as_a_handler():
    handler_type = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
    handler = handler_type(lambda frame: 0)
    for funcptr in (handler, ctypes.cast(handler, ctypes.c_void_p)):
        with pytest.raises(InvalidArgumentError, match="Python function"):
            ifrt.ffi.pycapsule(funcptr)


def test_the_probe_target_name_is_refused_at_registration():
    from ifrtpy._pjrt import _ffi

    with pytest.raises(InvalidArgumentError, match="reserved"):
        ifrt.ffi.register_ffi_target(_ffi.PROBE_TARGET, _ffi.noop_handler())
    assert _ffi.PROBE_TARGET not in ifrt.ffi.registered_targets("cpu")


# -- memory stays bounded over many executes ---------------------------------------------------

RSS_PRELUDE = """
    import numpy as np, ifrtpy as ifrt
    def rss_mib():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    def growth(run, n):
        for _ in range(200):  # warm up: caches, pools and allocators settle
            run()
        before = rss_mib()
        for _ in range(n):
            run()
        return rss_mib() - before
    c = ifrt.get_client("pjrt", device_count=1)
    d = c.devices()[0]
    x = np.arange(16384, dtype=np.float32)  # 64 KiB: a leak of one per execute is 125 MiB
"""
# A generous bound: what a leak of one argument, result or callback table per execute
# exceeds many times, not a measure of the allocator.
RSS_BOUND_MIB = 48


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_rss_stays_bounded_over_2000_executes_of_callback_programs():
    out = _run_child(RSS_PRELUDE + """
    import jax
    b = ifrt.builder.Builder("p"); v = b.parameter(x.shape, np.float32)
    builder_exe = c.compile(b.build(b.host_callback(lambda t: t * 2, [v], (x.shape, np.float32))))
    f = jax.jit(lambda v: jax.pure_callback(lambda t: t + 1, jax.ShapeDtypeStruct(v.shape, v.dtype), v))
    jax_exe = c.compile(ifrt.HloProgram(f.lower(x)))
    failing = c.compile(b.build(b.host_callback(lambda t: 1 / 0, [v], (x.shape, np.float32))))
    def run_builder():
        np.asarray(builder_exe(ifrt.device_put(x, d))[0])
    def run_jax():
        np.asarray(jax_exe(ifrt.device_put(x, d))[0])
    def run_failing():
        try:
            np.asarray(failing(ifrt.device_put(x, d))[0])
        except ifrt.errors.InternalError:
            pass
    print(growth(run_builder, 2000), growth(run_jax, 1000), growth(run_failing, 1000))
    """, timeout=300)
    grown = [float(v) for v in out.split()]
    assert all(g < RSS_BOUND_MIB for g in grown), grown


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_each_execute_of_a_callback_program_frees_its_completion_events():
    # An execute with an execute context holds the context until its completion events
    # fire, then destroys them: one event left per execute (about 500 bytes with what it
    # holds) grows 30000 executes of an 8-element program by 14 MiB; freed, by none.
    out = _run_child(RSS_PRELUDE + """
    x8 = x[:8]
    b = ifrt.builder.Builder("p"); v = b.parameter(x8.shape, np.float32)
    exe = c.compile(b.build(b.host_callback(lambda t: t * 2, [v], (x8.shape, np.float32))))
    a = ifrt.device_put(x8, d)
    print(growth(lambda: exe(a)[0].block_until_ready(), 30000))
    """, timeout=300)
    assert float(out) < 4, out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_rss_stays_bounded_over_2000_custom_call_executes():
    import ffi_library

    library = ffi_library.load()._name  # built once per test session, loaded by the child
    out = _run_child(RSS_PRELUDE + f"""
    import ctypes
    lib = ctypes.cdll.LoadLibrary({library!r})
    ifrt.ffi.register_ffi_target("ifrtpy_test_scale_abi", ifrt.ffi.pycapsule(lib.ScaleAbi))
    b = ifrt.builder.Builder("p"); v = b.parameter(x.shape, np.float32)
    def program(scale):
        return c.compile(b.build(b.ffi_call("ifrtpy_test_scale_abi", (x.shape, np.float32), v,
                                            scale=np.float32(scale))))
    good, bad = program(2), program(-1)
    np.testing.assert_array_equal(np.asarray(good(ifrt.device_put(x, d))[0]), x * 2)
    def run_good():
        np.asarray(good(ifrt.device_put(x, d))[0])
    def run_bad():  # the handler's error, every time
        try:
            np.asarray(bad(ifrt.device_put(x, d))[0])
        except ifrt.errors.IfrtError:
            pass
    print(growth(run_good, 2000), growth(run_bad, 1000))
    """, timeout=300)
    grown = [float(v) for v in out.split()]
    assert all(g < RSS_BOUND_MIB for g in grown), grown
