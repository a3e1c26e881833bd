"""The reference backend runs its programs in interpreter workers (worker processes):
a running program holds neither the GIL nor any lock, so other threads run and two
programs run at once; an input that kills the interpreter fails its execute with an
InternalError naming how, and the next execute gets a fresh worker; Ctrl-C while a
program runs is raised at once; workers end with their process, also when it is killed,
and a forked child runs programs on workers of its own; a worker's malformed answer is an
InternalError, never a crash or a wrong value."""

import ast
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.backends.reference import pool, worker
from ifrtpy.errors import InternalError
from slow_program import SLOW, slow_call

WAIT_S = 60  # a bound on a hang, not a timing assertion

ADD_ONE = """func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %c = stablehlo.constant dense<1.0> : tensor<4xf32>
  %0 = stablehlo.add %a, %c : tensor<4xf32>
  return %0 : tensor<4xf32> }"""

#: Programs that kill the interpreter's process: a call of a function with no body (an
#: abort), and a function that calls itself (its stack overflows).
KILLERS = {
    "abort": ("SIGABRT: LLVM ERROR: .*block arguments", """
func.func private @nowhere(tensor<4xf32>) -> tensor<4xf32>
func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = func.call @nowhere(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32> }"""),
    "stack overflow": ("SIGSEGV", """
func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = func.call @main(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32> }"""),
}

#: What a child process needs to run SLOW and ADD_ONE (client, executables, arguments).
CHILD_SETUP = f"""
import os, sys, threading, time
import numpy as np
import ifrtpy as ifrt
from ifrtpy.backends.reference import pool
client = ifrt.get_client("reference", device_count=1)
device = client.devices()[0]
slow = client.compile(ifrt.HloProgram({SLOW!r}))
add_one = client.compile(ifrt.HloProgram({ADD_ONE!r}))
a = ifrt.device_put(np.eye(32, dtype=np.float32), device)
x = ifrt.device_put(np.arange(4, dtype=np.float32), device)
forever = ifrt.device_put(np.int32(2**31 - 1), device)
def say(*words):
    print(*words, flush=True)
def when_busy(*words):  # says words once a worker runs a program
    def target():
        while len(pool._pool._all) == len(pool._pool._idle):
            time.sleep(0.001)
        say(*words)
    threading.Thread(target=target, daemon=True).start()
"""


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("reference", device_count=2)


@pytest.fixture(scope="module")
def small(client):
    return client.compile(ifrt.HloProgram(ADD_ONE))


def add_one(client, exe):
    x = np.arange(4, dtype=np.float32)
    out, = exe(ifrt.device_put(x, client.devices()[0]))
    np.testing.assert_array_equal(np.asarray(out), x + 1)


def busy_workers():
    """How many of this process's interpreter workers are running a program now."""
    with pool._pool._ready:
        return len(pool._pool._all) - len(pool._pool._idle)


def test_a_running_program_leaves_other_threads_and_programs_running(client, small):
    """While a slow program runs (its worker taken, its execute not returned), this thread
    runs Python and another program runs to its end. What is observed is the slow one
    still running, never how long anything took: on a machine so busy that the slow
    program ends first, it runs again four times longer."""
    run, steps = slow_call(client, 1.5)
    while True:
        assert busy_workers() == 0
        ended = threading.Event()
        slow = threading.Thread(target=lambda: (run(steps), ended.set()))
        slow.start()
        while not busy_workers() and not ended.is_set():  # until its execute has a worker
            time.sleep(0.001)
        ticks = 0
        while ticks < 50 and not ended.is_set():  # this thread runs meanwhile
            time.sleep(0.001)
            ticks += 1
        add_one(client, small)  # and so does another program, to its end
        overlapped = not ended.is_set()
        slow.join(WAIT_S)
        assert ended.is_set(), "the slow program did not end"
        if overlapped:
            return
        assert steps < 2**29, "the slow program always ended before the other one"
        steps *= 4


@pytest.mark.parametrize("kind", list(KILLERS))
def test_an_input_that_kills_the_interpreter_fails_its_execute_only(client, small, kind):
    """Before workers, these programs killed the whole process."""
    death, program = KILLERS[kind]
    exe = client.compile(ifrt.HloProgram(program))
    x = ifrt.device_put(np.zeros(4, np.float32), client.devices()[0])
    with pytest.raises(InternalError, match=r"the StableHLO interpreter failed: its worker "
                       rf"process \d+ died \(signal \d+, {death}"):
        np.asarray(exe.execute([x]).outputs[0])
    result = exe.execute([x], ifrt.ExecuteOptions(fill_status=True))
    with pytest.raises(InternalError, match=death.partition(":")[0]):
        result.status.result(timeout=WAIT_S)
    add_one(client, small)  # the next execute has a worker


def test_a_worker_killed_while_it_runs_fails_that_execute_and_is_replaced(client, small):
    run, steps = slow_call(client, 30)
    failed = []

    def target():
        try:
            run(steps)
        except InternalError as e:
            failed.append(str(e))

    thread = threading.Thread(target=target)
    before = set(pool.worker_pids())
    thread.start()
    deadline, killed = time.monotonic() + WAIT_S, set()
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.3)
        if not thread.is_alive():  # its execute failed: kill no worker the next one may take
            break
        for pid in pool.worker_pids():  # the busy one among them (idle ones are replaced quietly)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # reaped already
                continue
            killed.add(pid)
    assert not thread.is_alive()
    wait_until_gone(killed)
    assert len(failed) == 1 and "died (signal 9, SIGKILL" in failed[0], failed
    add_one(client, small)
    assert not set(pool.worker_pids()) & before


def test_more_executes_than_workers_wait_their_turn(client, small, monkeypatch):
    monkeypatch.setattr(pool, "SIZE", 1)
    errors = []

    def target(i):
        try:
            add_one(client, small)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not errors and not any(t.is_alive() for t in threads), errors


def run_child(code):
    return subprocess.Popen([sys.executable, "-c", CHILD_SETUP + textwrap.dedent(code)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def gone(pid):
    """Whether process ``pid`` has ended: for a child of this process, every thread of it
    (its main thread shows as a zombie while the others still end, its pipes still open),
    left for the pool to reap; for another process, a zombie no one reaps counts."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already, or not a child of this process
        pass
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until_gone(pids):
    deadline = time.monotonic() + WAIT_S
    while not all(gone(pid) for pid in pids):
        assert time.monotonic() < deadline, [pid for pid in pids if not gone(pid)]
        time.sleep(0.05)


@pytest.mark.skipif(sys.platform != "linux", reason="a busy worker notices its parent's end "
                    "on Linux only (elsewhere when its program ends)")
def test_workers_end_when_their_process_is_killed():
    child = run_child("""
        busy = threading.Thread(target=lambda: slow.execute([a, forever]), daemon=True)
        busy.start()
        while len(pool._pool._all) == len(pool._pool._idle):  # until it runs
            time.sleep(0.001)
        np.asarray(add_one.execute([x]).outputs[0])  # on another worker, idle after
        say(*pool.worker_pids())
        time.sleep(WAIT)
    """.replace("WAIT", str(WAIT_S)))
    try:
        pids = [int(p) for p in child.stdout.readline().split()]
        assert len(pids) >= 2, (pids, child.stderr.read() if child.poll() is not None else "")
    finally:
        child.kill()
        child.wait(WAIT_S)
    wait_until_gone(pids)


def test_ctrl_c_while_a_program_runs_is_raised_at_once():
    child = run_child("""
        first = pool.worker_pids()
        when_busy("running")
        started = time.monotonic()
        try:
            slow.execute([a, forever])
        except KeyboardInterrupt:
            say("interrupted after", time.monotonic() - started)
        say(*first)
        say(np.asarray(add_one.execute([x]).outputs[0]).tolist(), *pool.worker_pids())
    """)
    try:
        assert child.stdout.readline() == "running\n", child.stderr.read()  # inside it
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=WAIT_S)  # the program itself runs for hours
    finally:
        child.kill()
        child.wait(WAIT_S)
    interrupted, first, after = out.splitlines()
    assert interrupted.startswith("interrupted after"), (out, err)
    assert after.startswith("[1.0, 2.0, 3.0, 4.0]"), (out, err)
    wait_until_gone([int(p) for p in first.split()])  # the interrupted worker was killed
    assert set(first.split()).isdisjoint(after.split()[4:])


def test_a_forked_child_runs_programs_on_workers_of_its_own():
    child = run_child("""
        np.asarray(add_one.execute([x]).outputs[0])
        mine = pool.worker_pids()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            out = np.asarray(add_one.execute([x]).outputs[0]).tolist()
            os.write(write, repr((out, pool.worker_pids())).encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        forked = os.read(read, 4096).decode()
        out = np.asarray(add_one.execute([x]).outputs[0]).tolist()
        say(repr((out, mine, pool.worker_pids(), forked)))
    """)
    out, err = child.communicate(timeout=WAIT_S)
    assert child.returncode == 0, err
    parent_out, mine, later, forked = ast.literal_eval(out)
    forked_out, forked_pids = ast.literal_eval(forked)
    assert parent_out == forked_out == [1.0, 2.0, 3.0, 4.0]
    assert later == mine and forked_pids and set(forked_pids).isdisjoint(mine)


@pytest.mark.parametrize("answer", [
    [], [b"what"], [b"error"], [b"ok"], [b"ok", b"not json", bytes(16)],
    [b"ok", b'["<f4"]'], [b"ok", b'["<f4"]', bytes(15)], [b"ok", b'["|O"]', bytes(16)],
    [b"ok", b'[["<f4"]]', bytes(16)], [b"ok", b'["<f4", "<f4"]', bytes(16), bytes(16)],
], ids=lambda answer: repr(answer)[:40])
def test_a_malformed_answer_from_a_worker_is_an_internal_error(client, small, monkeypatch,
                                                               answer):
    monkeypatch.setattr(pool, "run", lambda request, limit: [memoryview(p) for p in answer])
    with pytest.raises(InternalError, match="the StableHLO interpreter's worker answered malformed"):
        add_one(client, small)


@pytest.mark.parametrize("data, error", [
    (struct.pack("<QI", 1 << 40, 1), "over the limit"),
    (struct.pack("<QI", 8, 2) + bytes(8), "cannot hold 2 parts"),
    (struct.pack("<QI", 12, 1) + struct.pack("<Q", 5) + bytes(4), "holds parts of 5"),
], ids=["too long", "too many parts", "parts not its length"])
def test_a_malformed_message_is_refused(data, error):
    read, write = os.pipe()
    try:
        os.write(write, data)
        with pytest.raises(ValueError, match=error):
            worker.receive(read, 1 << 20)
        os.close(write)
        write = None
        with pytest.raises(EOFError):
            worker.receive(read, 1 << 20)
    finally:
        os.close(read)
        if write is not None:
            os.close(write)
