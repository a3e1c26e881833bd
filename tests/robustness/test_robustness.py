"""Robustness: no crash, hang, deadlock or silent wrong result under hostile use.

Every check runs ``robustness_worker.py`` in a child process, so that a crash (a signal)
or a hang (a timeout) fails the test instead of ending pytest:

* the reliability reproducers (each a clear ifrtpy error or the right answer);
* bad-input fuzzing of the public API and of ``ifrtpy._pjrt``: hypothesis draws batches of
  calls with hostile arguments; each call must raise an ifrtpy error or give NumPy's answer;
* random lifetime orders of clients, arrays, shards and executables, exiting with work in
  flight;
* threads racing puts, reads, executes (single device, SPMD, donating), copies, reshards
  and deletes on one shared pool of arrays, and the SPMD execute-vs-delete race.

The default sizes keep the whole module to tens of seconds. ``IFRTPY_ROBUSTNESS_LONG=1``
runs the same code at the sizes of the long profile (10,000 fuzz calls, 1,000 lifetime
orders, 20 runs of 8 threads x 60 s); ``IFRTPY_ROBUSTNESS_FUZZ_CALLS``,
``_ORDERS``, ``_THREAD_RUNS`` and ``_THREAD_SECONDS`` set one figure each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")
WORKER = os.path.join(HELPERS, "robustness_worker.py")
LONG = os.environ.get("IFRTPY_ROBUSTNESS_LONG") == "1"


def _figure(name: str, short: int, long: int) -> int:
    return int(os.environ.get(f"IFRTPY_ROBUSTNESS_{name}", long if LONG else short))


FUZZ_CALLS = _figure("FUZZ_CALLS", 1000, 10_000)
ORDERS = _figure("ORDERS", 8, 1_000)
THREAD_RUNS = _figure("THREAD_RUNS", 1, 20)
THREAD_SECONDS = _figure("THREAD_SECONDS", 3, 60)
BATCH = 20  # fuzz calls per hypothesis example
ORDERS_PER_PROCESS = 10


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def _run(args: list[str], timeout: float, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The worker (or ``python -c``) in a child; pytest.fail on a signal, a hang or a
    non-zero exit, with the end of its stderr."""
    try:
        done = subprocess.run([sys.executable, *args], input=stdin, capture_output=True,
                              text=True, timeout=timeout, env=_env(), cwd=HELPERS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[:2]} hung (no exit within {timeout} s)")
    if done.returncode != 0:
        pytest.fail(f"{args[:2]} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def _counts(done: subprocess.CompletedProcess) -> dict:
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    print(counts)  # shown with pytest -s: the figures of a long run
    assert counts["wrong"] == 0 and counts["unclear"] == 0 and counts["never_ready"] == 0, counts
    return counts


# -- the reproducers ----------------------------------------------------------------------

REPRODUCERS = {
    "compile_duplicate_devices": ("""
        d = c.devices()
        prog = ifrt.HloProgram(ADD1)
        expect_error(lambda: c.compile(prog, ifrt.CompileOptions(devices=[d[0]] * 9, num_replicas=9)),
                     "must not repeat a device")
        expect_error(lambda: c.compile(prog, ifrt.CompileOptions(devices=[d[0], d[0]], num_replicas=2)),
                     "must not repeat a device")
    """),
    "concrete_sharding_uninitialised": ("""
        d = c.devices()
        x = np.array([10, 11, 12, 13], np.float32)
        # Built as given (as IFRT does); refused where an array would follow them.
        for domains, message in [((((0,), (3,)), ((1,), (1,))), "overlap"),
                                 ((((0,), (2,)), ((3,), (1,))), "cover 3 of the 4"),
                                 ((((0,), (2,)), ((3,), (2,))), "outside")]:
            sh = ifrt.ConcreteSharding(d[:2], (4,), [s for _, s in domains],
                                       [IndexDomain(Shape(o), Shape(s)) for o, s in domains])
            expect_error(lambda: c.make_array_from_host_buffer(x, sh), message)
        good = ifrt.ConcreteSharding(d[:2], (4,), [(3,), (1,)],
                     [IndexDomain(Shape((0,)), Shape((3,))), IndexDomain(Shape((3,)), Shape((1,)))])
        a = c.make_array_from_host_buffer(x, good)
        np.testing.assert_array_equal(a.copy_to_host_buffer(np.full(4, -1, np.float32)).result(), x)
    """),
    "byte_strides_overlap": ("""
        a = c.make_array_from_host_buffer(np.arange(4, dtype=np.float32),
                                          ifrt.SingleDeviceSharding(c.devices()[0]))
        expect_error(lambda: a.copy_to_host_buffer(byte_strides=[0]), "share memory")
        b = c.make_array_from_host_buffer(np.arange(6, dtype=np.float32).reshape(2, 3),
                                          ifrt.SingleDeviceSharding(c.devices()[0]))
        expect_error(lambda: b.copy_to_host_buffer(byte_strides=[4, 4]), "share memory")
        got = b.copy_to_host_buffer(byte_strides=[4, 8]).result()   # column-major: fine
        np.testing.assert_array_equal(got, np.arange(6).reshape(2, 3))
        assert got.strides == (4, 8)
    """),
    "oversize_shapes": ("""
        expect_error(lambda: Shape((2**62, 2**62)), "at most 2\\\\*\\\\*63 - 1 elements")
        expect_error(lambda: ifrt.ShardingParam([1], [0], [2**40]), "the limit is")
        assert Shape((2**62, 0)).num_elements() == 0
        n = 2**61  # f32: 2**63 bytes, one more than an int64 holds (the plugin aborts)
        huge = ifrt.HloProgram(ADD1.replace("8xf32", f"{n}xf32"))
        expect_error(lambda: c.compile(huge), "takes 9223372036854775808 bytes")
    """),
    "pjrt_none_arguments": ("""
        from ifrtpy import _pjrt
        x = np.arange(4, dtype=np.float32)
        b, _ = _pjrt.buffer_from_host_buffer(c._handle, x, c._handle.devices[0])
        for call, name in [
                (lambda: _pjrt.create_client(None, {}), "plugin"),   # crashed the process
                (lambda: _pjrt.buffer_from_host_buffer(None, x, c._handle.devices[0]), "client"),
                (lambda: _pjrt.buffer_from_host_buffer(c._handle, None, c._handle.devices[0]), "data"),
                (lambda: _pjrt.compile(None, b"", b""), "client"),
                (lambda: _pjrt.deserialize_and_load(None, b""), "client"),
                (lambda: _pjrt.deserialize_and_load(c._handle, None), "serialized"),
                (lambda: b.copy_to_device(None), "device"),
                (lambda: b.copy_to_memory(None), "memory")]:
            try:
                call()
            except TypeError as e:
                assert str(e).startswith(f"Argument '{name}' has incorrect type"), str(e)
            else:
                raise AssertionError(f"None accepted for {name}")
        # the public path checks serialized bytes (the envelope, then the PjRt backend's
        # seal) before anything reaches the plugin
        expect_error(lambda: c.deserialize_executable(None),
                     "a serialized executable is bytes, got NoneType")
    """),
    "host_callback_hostile": ("""
        import jax
        like = lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype)
        x0 = np.ones(3, np.float32)
        x = c.make_array_from_host_buffer(x0, ifrt.SingleDeviceSharding(c.devices()[0]))
        lowered = jax.jit(lambda v: jax.pure_callback(np.sin, like(v), v)).lower(x0)
        bad_returns = [
            (lambda t: (t, t), "returned 2 values for 1 results"),
            (lambda t: (t[:2],), r"result 0 is float32\\[2\\]"),
            (lambda t: (t.astype(np.int32),), r"result 0 is int32\\[3\\]"),
            (lambda t: ("abc",), r"result 0 is <U3"),
            (lambda t: (object(),), r"result 0 is object"),
            (lambda t: 5, r"TypeError: 'int' object is not iterable"),
            (lambda t: None, r"TypeError: 'NoneType' object is not iterable"),
            # (KeyboardInterrupt reaches the caller as itself: test_callback_robustness.py)
            (lambda t: sys.exit(3), r"raised SystemExit: 3"),
            (lambda t: (t, t, t)[5], r"raised IndexError"),
        ]
        import sys
        for fn, pattern in bad_returns:
            exe = c.compile(ifrt.HloProgram(lowered, host_callbacks=[fn]))
            expect_error(lambda: np.asarray(exe(x)[0]), pattern)
            expect_error(lambda: exe.execute([x], ifrt.ExecuteOptions(fill_status=True)).status.result(),
                         pattern)
        expect_error(lambda: ifrt.HloProgram(lowered, host_callbacks=[3]), "not callable")
        text = lowered.as_text()
        expect_error(lambda: c.compile(ifrt.HloProgram(text)), "carries no Python callables")
        two = text.replace("index = 0 : ui64", "index = 1 : ui64")
        expect_error(lambda: c.compile(ifrt.HloProgram(two, host_callbacks=[np.sin])),
                     "calls host callback 1, but carries 1")
        # the C layer: a callback program's handle never runs without its context
        exe = c.compile(ifrt.HloProgram(lowered))
        exe._handle.execute_context = None
        expect_error(lambda: exe._handle.execute([[x._buffers[0]]]), "execute_context")
    """),
    "host_callback_reentrant": ("""
        import jax, threading
        like = lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype)
        d = c.devices()
        x0 = np.arange(4, dtype=np.float32)
        inner = c.compile(ifrt.HloProgram(jax.jit(
            lambda v: jax.pure_callback(lambda t: t + 1, like(v), v)).lower(x0)))
        holder = {}
        def outer_host(t):
            # puts, an execute of another callback program, reads, and the executable's
            # own deletion, from inside a callback
            a = c.make_array_from_host_buffer(t, ifrt.SingleDeviceSharding(d[0]))
            (b,) = inner(a)
            holder["exe"].delete()
            return np.asarray(b) * 2
        outer = c.compile(ifrt.HloProgram(jax.jit(
            lambda v: jax.pure_callback(outer_host, like(v), v)).lower(x0)))
        holder["exe"] = outer
        (out,) = outer(c.make_array_from_host_buffer(x0, ifrt.SingleDeviceSharding(d[0])))
        np.testing.assert_array_equal(np.asarray(out), (x0 + 1) * 2)
        expect_error(lambda: outer(c.make_array_from_host_buffer(x0, ifrt.SingleDeviceSharding(d[0]))),
                     "has been deleted")
    """),
    "dynamic_shape_repr": ("""
        spec = ifrt.ArraySpec(ifrt.DType.from_numpy(np.float32),
                              ifrt.DynamicShape((4, 2), [True, False]),
                              ifrt.SingleDeviceSharding(c.devices()[0]))
        a, = c.make_error_arrays(ValueError("no data"), [spec])
        assert "[<=4,2]" in repr(a), repr(a)
    """),
}

PRELUDE = """
import re, numpy as np, ifrtpy as ifrt
from ifrtpy import IndexDomain, Shape, errors
from robustness_worker import ADD1
c = ifrt.get_client("pjrt", device_count=8)

def expect_error(call, pattern):
    try:
        call()
    except errors.IfrtError as e:
        assert re.search(pattern, str(e)), (pattern, str(e))
    else:
        raise AssertionError(f"accepted; expected an error matching {pattern!r}")
"""


@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_reproducer_gives_a_clear_error_or_the_right_answer(name):
    _run(["-c", PRELUDE + textwrap.dedent(REPRODUCERS[name])], timeout=120)


def test_errors_name_the_parameter_and_what_it_got():
    code = PRELUDE + textwrap.dedent("""
        d = c.devices()
        exe = c.compile(ifrt.HloProgram(ADD1))
        a = c.make_array_from_host_buffer(np.arange(8, dtype=np.float32), ifrt.SingleDeviceSharding(d[0]))
        cases = [
            (lambda: ifrt.Mesh(np.array([0, 1]), ("x",)), r"Mesh devices.*must be a Device, got 0 \\(int\\)"),
            (lambda: ifrt.SingleDeviceSharding(3), r"device must be a Device, got 3 \\(int\\)"),
            (lambda: c.copy_arrays([a], devices=[0]), r"devices\\[0\\] must be a Device, got 0"),
            (lambda: exe.execute([a], devices="x"), r"devices must be an iterable of Devices, got 'x' \\(str\\)"),
            (lambda: c.copy_arrays([np.arange(3)]), r"copy_arrays arrays\\[0\\] must be an Array.*ndarray"),
            (lambda: ifrt.ArraySpec(a.dtype, a.shape, d[0]), r"ArraySpec.sharding must be a Sharding"),
            (lambda: c.make_array_from_host_buffer(np.zeros((2, 2), np.float32),
                 ifrt.ShardingParamSharding(ifrt.ShardingParam([2, 1, 1], [0], [2]), d[:2])),
             r"Numbers of dimensions don't match|does not fit"),
            (lambda: c.compile(ifrt.HloProgram(ADD1), ifrt.CompileOptions(
                 debug_options={"xla_backend_optimization_level": "high"})),
             r"debug_options\\['xla_backend_optimization_level'\\] must be a int, got 'high'"),
            (lambda: c._handle.lookup_device("x"), r"device_id must be an int, got 'x' \\(str\\)"),
            (lambda: c._handle.lookup_device(2**70), r"device_id must be in \\[.*\\], got"),
            (lambda: exe._handle.execute([[a._buffers[0]]], launch_id=2**40), r"launch_id must be in"),
            (lambda: exe.execute([a], options="fast"), r"options must be an ExecuteOptions or None"),
            (lambda: exe.execute(5), r"args must be a sequence of Arrays, got 5 \\(int\\)"),
            (lambda: a.copy_to_host_buffer(byte_strides="ab"), r"byte_strides must be a sequence of ints"),
        ]
        for call, pattern in cases:
            expect_error(call, pattern)
    """)
    _run(["-c", code], timeout=120)


# -- deadlock and exit ----------------------------------------------------------------------

def test_spmd_execute_racing_a_delete_never_strands_its_outputs():
    counts = _counts(_run([WORKER, "race", str(2 if not LONG else 30)], timeout=300))
    assert counts["ok"] > 0


def test_exit_with_host_callbacks_running_in_many_threads():
    code = PRELUDE + textwrap.dedent("""
        import threading, time, jax
        f = jax.jit(lambda v: jax.pure_callback(lambda t: (time.sleep(0.01), t * 2)[1],
                                                jax.ShapeDtypeStruct(v.shape, v.dtype), v))
        exe = c.compile(ifrt.HloProgram(f.lower(np.ones(4, np.float32))))
        def loop(k):
            x = c.make_array_from_host_buffer(np.full(4, k, np.float32),
                                              ifrt.SingleDeviceSharding(c.devices()[0]))
            while True:
                try:
                    exe(x)
                except errors.IfrtError:
                    pass  # refused once the interpreter exits
        for k in range(6):
            threading.Thread(target=loop, args=(k,), daemon=True).start()
        time.sleep(0.3)
    """)
    for _ in range(3):
        _run(["-c", code], timeout=120)


def test_exit_with_work_in_flight_and_callbacks_pending():
    code = PRELUDE + textwrap.dedent("""
        import threading
        from robustness_worker import HEAVY
        heavy = c.compile(ifrt.HloProgram(HEAVY))
        h = c.make_array_from_host_buffer(np.ones((128, 128), np.float32), heavy.parameter_shardings()[0])
        def loop():
            o = h
            while True:
                o, = heavy(o)
                o.copy_to_host_buffer()        # a transfer whose callback is pending
        for _ in range(3):
            threading.Thread(target=loop, daemon=True).start()
        outs = [heavy(h) for _ in range(20)]   # and work nobody waits for
    """)
    for _ in range(3):
        _run(["-c", code], timeout=120)


# -- fuzzing ------------------------------------------------------------------------------

def _tok(kind, *rest):
    return [kind, *rest]


INTS = st.sampled_from([-1, 0, 1, 2, 3, 4, 7, 8, 9, 16, 2**31, 2**62, 2**63, -2**63, 2**64])
GARBAGE = st.one_of(INTS.map(lambda n: _tok("int", n)), st.just(_tok("none")),
                    st.just(_tok("float", 1.5)), st.just(_tok("str", "x")),
                    st.just(_tok("bool", True)))
SMALL = st.sampled_from([-1, 0, 1, 2, 3, 4, 8, 2**63])
INT_LISTS = st.lists(SMALL, max_size=3).map(lambda v: _tok("ints", v))
SHAPES = st.one_of(st.sampled_from([(8,), (2, 4), (), (0,), (8, 8), (1, 2, 3), (4,)]).map(
    lambda s: _tok("ints", list(s))), INT_LISTS, GARBAGE)
DEVS = st.lists(st.integers(0, 9), max_size=9).map(lambda v: _tok("devs", v))
DEVICES = st.one_of(DEVS, st.integers(0, 9).map(lambda i: _tok("dev", i)), GARBAGE,
                    st.just(_tok("list", [_tok("int", 0), _tok("int", 1)])))
NUMPY = st.builds(
    lambda dtype, shape, layout: _tok("np", dtype, list(shape), layout),
    st.sampled_from(["float32", "int32", "float64", "bool", "int8", "uint64", "complex64",
                     ">f4", "object", "float16"]),
    st.sampled_from([(8,), (2, 4), (), (0,), (8, 8), (4, 2), (1, 2, 3)]),
    st.sampled_from(["c", "f", "neg", "strided"]))
DATA = st.one_of(NUMPY, GARBAGE, st.just(_tok("list", [_tok("int", 1), _tok("str", "a")])))
DOMAIN = st.tuples(SHAPES, SHAPES).map(list)
SHARDINGS = st.one_of(
    st.builds(lambda d: _tok("sharding", "single", d), DEVICES),
    st.builds(lambda d, s, ss, dom: _tok("sharding", "concrete", d, s, ss, dom),
              DEVS, SHAPES, st.lists(SHAPES, max_size=3), st.one_of(st.none(), st.lists(DOMAIN, max_size=3))),
    st.builds(lambda d, s, ss, r: _tok("sharding", "even", d, s, ss, r), DEVS, SHAPES, SHAPES, st.booleans()),
    st.builds(lambda a, b, c, d: _tok("sharding", "param", a, b, c, d), INT_LISTS, INT_LISTS, INT_LISTS, DEVS),
    st.builds(lambda d, m, n, s: _tok("sharding", "named", d, m, n, s), DEVS, SHAPES,
              st.sampled_from([_tok("ints", []), _tok("list", [_tok("str", "x")]),
                               _tok("list", [_tok("str", "x"), _tok("str", "y")]),
                               _tok("list", [_tok("str", "x"), _tok("str", "x")])]),
              st.sampled_from([_tok("ints", []), _tok("list", [_tok("str", "x")]),
                               _tok("list", [_tok("none"), _tok("str", "y")]),
                               _tok("list", [_tok("str", "z")])])),
    GARBAGE)
ARRAYS = st.sampled_from(["x8", "x88", "deleted", "numpy", "dynamic"]).map(lambda w: _tok("array", w))
ARRAY_OBJECTS = st.sampled_from(["x8", "x88", "deleted", "dynamic"]).map(lambda w: _tok("array", w))
ARG_LISTS = st.one_of(st.lists(ARRAYS, max_size=2).map(lambda v: _tok("list", v)), GARBAGE)
SEMANTICS = st.one_of(st.integers(-1, 5).map(lambda n: _tok("int", n)), GARBAGE)
MEMKINDS = st.sampled_from([_tok("none"), _tok("str", "device"), _tok("str", "pinned_host"),
                            _tok("str", "nope"), _tok("int", 3)])
STRIDES = st.one_of(st.lists(st.sampled_from([0, 4, -4, 8, 32, 3, 2**63]), max_size=2).map(
    lambda v: _tok("ints", v)), GARBAGE)
DEBUG = st.tuples(st.sampled_from(["xla_cpu_enable_fast_math", "xla_backend_optimization_level",
                                   "no_such_option"]).map(lambda s: _tok("str", s)),
                  st.one_of(GARBAGE, st.just(_tok("list", []))))

CALLS = st.one_of(
    st.tuples(st.just("shape"), st.tuples(SHAPES)),
    st.tuples(st.just("device_list"), st.tuples(DEVICES)),
    st.tuples(st.just("sharding"), st.tuples(SHARDINGS)),
    st.tuples(st.just("put"), st.tuples(DATA, SHARDINGS, SEMANTICS)),
    st.tuples(st.just("get_strided"), st.tuples(STRIDES)),
    st.tuples(st.just("get_into"), st.tuples(st.one_of(NUMPY, GARBAGE))),
    st.tuples(st.just("execute"), st.tuples(ARG_LISTS, st.just(_tok("none")),
                                            st.one_of(st.just(_tok("none")), DEVICES))),
    st.tuples(st.just("execute_spmd"), st.tuples(ARG_LISTS)),
    st.tuples(st.just("copy_arrays"), st.tuples(ARG_LISTS, st.one_of(st.just(_tok("none")), DEVICES),
                                                MEMKINDS)),
    st.tuples(st.just("reshard"), st.tuples(SHAPES, SHARDINGS)),
    st.tuples(st.just("compile"), st.tuples(st.one_of(st.just(_tok("none")), DEVS, GARBAGE),
                                            SEMANTICS, SEMANTICS)),
    st.tuples(st.just("compile_debug"), DEBUG),
    st.tuples(st.just("execute_options"), st.tuples(GARBAGE, GARBAGE)),
    st.tuples(st.just("lookup_device"), st.tuples(GARBAGE)),
    st.tuples(st.just("assemble"), st.tuples(SHAPES, SHARDINGS)),
    st.tuples(st.just("array_spec"), st.tuples(
        st.one_of(st.sampled_from([_tok("str", "float32"), _tok("str", "nope")]), GARBAGE),
        SHAPES, SHARDINGS)),
    st.tuples(st.just("pjrt_put"), st.tuples(NUMPY, st.integers(-1, 9).map(lambda i: _tok("int", i)),
                                             SEMANTICS)),
    st.tuples(st.just("pjrt_execute"), st.tuples(st.one_of(st.just("ok"), ARG_LISTS),
                                                 st.one_of(INTS.map(lambda n: _tok("int", n)), GARBAGE),
                                                 st.one_of(INT_LISTS, GARBAGE))),
    st.tuples(st.just("pjrt_lookup"), st.tuples(GARBAGE)),
    st.tuples(st.just("disassemble"), st.tuples(ARRAY_OBJECTS, st.one_of(st.integers(0, 3).map(
        lambda n: _tok("int", n)), GARBAGE))),
    st.tuples(st.just("replicated_shard"), st.tuples(ARRAY_OBJECTS, st.one_of(st.integers(0, 3).map(
        lambda n: _tok("int", n)), GARBAGE))),
    st.tuples(st.just("error_arrays"), st.tuples(GARBAGE)),
    st.tuples(st.just("deleted_use"), st.sampled_from(
        ["get", "copy", "execute", "reshard", "disassemble", "delete"]).map(lambda u: (u,))),
    st.tuples(st.just("pjrt_get_into"), st.tuples(st.one_of(NUMPY, GARBAGE))),
    st.tuples(st.just("pjrt_copy"), st.tuples(st.one_of(DEVICES, GARBAGE))),
    # Small device counts only: the count's upper limit is the client options' business.
    st.tuples(st.just("pjrt_client"), st.tuples(
        st.sampled_from(["cpu_device_count", "no_such_option", ""]),
        st.one_of(GARBAGE.filter(lambda t: t[0] != "int" or not 16 < t[1] < 2**31),
                  st.just(_tok("list", [_tok("int", 1)]))))),
    st.tuples(st.just("repr"), st.tuples(st.one_of(ARRAYS, SHARDINGS))),
).map(lambda call: [call[0], list(call[1])])


class _FuzzWorker:
    """One worker process for a whole fuzz test: batches in, counts out."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, WORKER, "fuzz"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=_env(), cwd=HELPERS)
        assert json.loads(self.proc.stdout.readline()).get("ready"), self.proc.stderr.read()[-3000:]
        self.calls = 0

    def run(self, batch: list) -> dict:
        self.proc.stdin.write(json.dumps(batch) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()  # a hang here is caught by the outer timeout
        if not line:
            rc = self.proc.wait(timeout=30)
            pytest.fail(f"the fuzz worker died (exit {rc}) on the batch {json.dumps(batch)}:\n"
                        f"{self.proc.stderr.read()[-3000:]}")
        self.calls += len(batch)
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0, self.proc.stderr.read()[-3000:]


def test_fuzz_public_api_and_pjrt_layer():
    worker = _FuzzWorker()
    totals: dict = {}

    @settings(max_examples=max(1, FUZZ_CALLS // BATCH), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(CALLS, min_size=BATCH, max_size=BATCH))
    def check(batch):
        counts = worker.run(batch)
        for key in ("ok", "refused"):
            totals[key] = totals.get(key, 0) + counts[key]
        assert counts["wrong"] == 0 and counts["unclear"] == 0 and counts["never_ready"] == 0, (
            counts["samples"], counts, batch)

    try:
        check()
    finally:
        worker.close()
    print(f"fuzz: {worker.calls} calls, {totals}")
    assert totals.get("ok", 0) > 0 and totals.get("refused", 0) > 0


# -- lifetimes and threads -----------------------------------------------------------------

def test_random_lifetime_orders_then_exit_with_work_in_flight():
    done_orders = 0
    seed = 0
    while done_orders < ORDERS:
        n = min(ORDERS_PER_PROCESS, ORDERS - done_orders)
        _counts(_run([WORKER, "lifetimes", str(seed), str(n)], timeout=60 + 10 * n))
        done_orders += n
        seed += 1


@pytest.mark.parametrize("run", range(THREAD_RUNS))
def test_threads_race_on_a_shared_pool(run):
    counts = _counts(_run([WORKER, "threads", str(run), str(THREAD_SECONDS)],
                          timeout=THREAD_SECONDS + 120))
    assert counts["ok"] > 0
