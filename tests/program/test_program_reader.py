"""The reader process that converts untrusted program bytes (ifrtpy.program.inputs): one
long-lived child serves every input, and any input it fails on, refuses or crashes on gets
a fresh reader for the next one."""

from __future__ import annotations

import itertools
import os
import threading

import pytest

import ifrtpy as ifrt
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.program import inputs
from pjrt_helpers import run_python

_values = itertools.count(1)


def add_constant(value: float) -> str:
    return f"""
func.func public @main(%x: tensor<8xf32>) -> tensor<8xf32> {{
  %c = stablehlo.constant dense<{value}> : tensor<8xf32>
  %y = stablehlo.add %x, %c : tensor<8xf32>
  return %y : tensor<8xf32>
}}"""


def fresh_artifact() -> tuple[bytes, str]:
    """A portable artifact no test has converted yet, and the constant its text must hold."""
    value = 500.25 + next(_values)  # exact in f32, printed in full by %e
    art, _ = ifrt.HloProgram(add_constant(value)).serialize_for((1, 13, 3))
    return art, f"dense<{value:.6e}>"


def changed(art: bytes, position: int, value: int) -> bytes:
    b = bytearray(art)
    b[position] = value
    return bytes(b)


def assert_converts(art: bytes, constant: str) -> None:
    text = inputs.convert_isolated(art, "bytes")
    assert constant in text, text
    assert "stablehlo.add" in text


def test_distinct_inputs_are_read_by_one_reader():
    art, constant = fresh_artifact()
    assert_converts(art, constant)
    pid = inputs._reader_pid()
    assert pid is not None and pid != os.getpid()
    for _ in range(5):
        assert_converts(*fresh_artifact())
        assert inputs._reader_pid() == pid


def test_a_crashing_input_is_refused_and_the_next_input_gets_a_fresh_reader():
    art, constant = fresh_artifact()
    assert_converts(art, constant)
    pid = inputs._reader_pid()
    # this changed byte aborts jaxlib's bytecode reader (SIGABRT); see test_untrusted_bytes
    with pytest.raises(InvalidArgumentError, match="made jaxlib's reader fail in a child process"):
        inputs.convert_isolated(changed(art, 200, 215), "bytes")
    assert inputs._reader_pid() is None  # reaped
    assert_converts(*fresh_artifact())
    assert inputs._reader_pid() not in (None, pid)


@pytest.mark.parametrize("bad", [b"\x00\x01 not a program" * 4, "heap"])
def test_a_refused_input_gets_the_reader_replaced(bad):
    art, constant = fresh_artifact()
    assert_converts(art, constant)
    pid = inputs._reader_pid()
    # "heap": a changed byte that jaxlib refuses after corrupting its own heap
    data = changed(art, 52, 233) if bad == "heap" else bad
    with pytest.raises(InvalidArgumentError, match="not a valid program: program bytes"):
        inputs.convert_isolated(data, "bytes")
    assert inputs._reader_pid() is None
    assert_converts(*fresh_artifact())
    assert inputs._reader_pid() not in (None, pid)


def test_a_reader_over_the_time_bound_is_replaced(monkeypatch):
    assert_converts(*fresh_artifact())
    pid = inputs._reader_pid()
    monkeypatch.setattr(inputs, "_CHILD_TIMEOUT_S", 1e-6)
    with pytest.raises(InvalidArgumentError, match="took over"):
        inputs.convert_isolated(fresh_artifact()[0], "bytes")
    assert inputs._reader_pid() is None
    monkeypatch.undo()
    assert_converts(*fresh_artifact())
    assert inputs._reader_pid() not in (None, pid)


def test_threads_converting_at_once_each_get_their_own_text():
    cases = [fresh_artifact() for _ in range(12)]
    bad = b"\x00\x02 garbage " * 5
    texts: dict[int, str | Exception] = {}

    def convert(i: int) -> None:
        try:
            texts[i] = inputs.convert_isolated(cases[i][0] if i < len(cases) else bad, "bytes")
        except InvalidArgumentError as e:
            texts[i] = e

    threads = [threading.Thread(target=convert, args=(i,)) for i in range(len(cases) + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)  # a bound against a hang only
    assert sorted(texts) == list(range(len(cases) + 1))
    for i, (_, constant) in enumerate(cases):
        assert isinstance(texts[i], str) and constant in texts[i]
    assert isinstance(texts[len(cases)], InvalidArgumentError)


def test_many_programs_are_read_one_after_another_by_the_reader():
    cases = [fresh_artifact() for _ in range(4)]
    texts = inputs.stablehlo_texts([art for art, _ in cases] + [add_constant(0.5)])
    assert all(constant in text for (_, constant), text in zip(cases, texts))
    assert texts[-1] == add_constant(0.5)
    with pytest.raises(InvalidArgumentError, match="not a valid program"):
        inputs.stablehlo_texts([cases[0][0], b"ML\xefR" + b"\x00garbage" * 4])


def test_a_forked_child_starts_its_own_reader_and_the_reader_ends_with_its_process():
    done = run_python(f"""
        import os
        import ifrtpy as ifrt
        from ifrtpy.program import inputs

        def artifact(value):
            text = {add_constant("VALUE")!r}.replace("VALUE", str(value))
            return ifrt.HloProgram(text).serialize_for((1, 13, 3))[0]

        assert "dense<1.500000e+00>" in inputs.convert_isolated(artifact(1.5), "bytes")
        parent_reader = inputs._reader_pid()
        with inputs._reader_lock:  # as if another thread were converting at the fork
            child = os.fork()
            if child == 0:
                ok = "dense<2.500000e+00>" in inputs.convert_isolated(artifact(2.5), "bytes")
                ok = ok and inputs._reader_pid() not in (None, parent_reader)
                os._exit(0 if ok else 1)
        _, status = os.waitpid(child, 0)
        assert status == 0, status
        assert "dense<3.500000e+00>" in inputs.convert_isolated(artifact(3.5), "bytes")
        assert inputs._reader_pid() == parent_reader
        print("reader", parent_reader, flush=True)
        os._exit(0)  # no atexit: the reader must see its stdin end
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    reader = int(done.stdout.split("reader")[-1])
    assert not _running(reader)


def _running(pid: int) -> bool:
    """Whether ``pid`` is still a live process, waiting up to 60 s (a bound against a hang)
    for it to end."""
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.1)
    return True


def test_the_reader_serves_a_process_with_more_than_1024_open_files():
    """The reader's pipes may get descriptors above 1023 (a server with many connections):
    waiting on them must not be limited to select()'s FD_SETSIZE."""
    done = run_python(f"""
        import os, resource
        import ifrtpy as ifrt
        from ifrtpy.program import inputs

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < 1300:
            print("skip: RLIMIT_NOFILE hard limit", hard, flush=True)
            os._exit(0)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        assert max(held) > 1024
        text = {add_constant(4.5)!r}
        art = ifrt.HloProgram(text).serialize_for((1, 13, 3))[0]
        assert "dense<4.500000e+00>" in inputs.convert_isolated(art, "bytes")
        print("read", flush=True)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    if done.stdout.startswith("skip"):
        pytest.skip(done.stdout.strip())
    assert done.stdout.strip() == "read"
