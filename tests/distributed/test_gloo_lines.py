"""gloo's connection lines are dropped from stdout, also where threads cut them apart;
everything else passes, promptly and whole (ifrtpy.distributed._gloo_lines)."""

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ifrtpy.distributed._gloo_lines import GlooLines


def line(rank, n=7):
    return (f"[Gloo] Rank {rank} is connected to {n} peer ranks. Expected number of "
            f"connected peer ranks is : {n}\n").encode()


def run(chunks):
    f = GlooLines()
    return b"".join(f.feed(c) for c in chunks) + f.flush()


def test_whole_and_cut_lines_are_dropped():
    # what two processes of a 2 x 4-device job printed, cut where threads interleaved
    cut = line(1)[:-2] + line(2) + b"7\n"
    text = b"start\n" + line(5) + line(4) + cut + line(3) + b"OK\n"
    assert run([text]) == b"start\nOK\n"


def pieces(rank, n=7):
    """One connection line as gloo writes it: a write per piece."""
    return [b"[Gloo] Rank ", str(rank).encode(), b" is connected to ", str(n).encode(),
            b" peer ranks. ", b"Expected number of connected peer ranks is : ",
            str(n).encode(), b"\n"]


def test_lines_whose_pieces_interleave_are_dropped():
    # a line's first piece, then another thread's whole line, then the first line's rest
    # (seen in a 2 x 4-device job)
    first = pieces(4)
    text = b"start\n" + first[0] + line(5) + b"".join(first[1:]) + b"OK\n"
    assert run([text]) == b"start\nOK\n"


@given(st.lists(st.integers(0, 63), min_size=1, max_size=8), st.data())
def test_any_interleaving_of_the_threads_lines_is_dropped_however_it_is_cut(ranks, data):
    """Each thread writes its line piece by piece; the pieces of all lines interleave in
    any order that keeps each line's own; the filter reads it in chunks cut anywhere."""
    queues = [pieces(rank) for rank in ranks]
    written = []
    while any(queues):
        queue = data.draw(st.sampled_from([q for q in queues if q]))
        written.append(queue.pop(0))
    text = b"before\n" + b"".join(written) + b"after\n"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert run(chunks) == b"before\nafter\n"


@given(st.lists(st.sampled_from([b"hello\n", b"[not gloo]\n", b"42\n", b"x", b"[Gloo", b"\n",
                                 b"[Gloo] Rank 3 is fine\n"]), max_size=12),
       st.lists(st.integers(0, 7), max_size=4), st.data())
def test_other_output_passes_byte_for_byte_however_it_is_cut(others, ranks, data):
    """Whatever else is written, cut into chunks anywhere, passes unchanged; whole
    connection lines between writes vanish."""
    pieces = list(others)
    for rank in ranks:
        at = data.draw(st.integers(0, len(pieces)))
        if at == 0 or pieces[at - 1].endswith(b"\n"):  # gloo writes whole lines
            pieces.insert(at, line(rank))
    text = b"".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert run(chunks) == b"".join(p for p in pieces if not p.startswith(b"[Gloo] Rank ") or
                                   b"connected" not in p)


def test_output_that_cannot_be_a_connection_line_is_not_held():
    f = GlooLines()
    assert f.feed(b"prompt> ") == b"prompt> "
    assert f.feed(b"[Gl") == b""            # may be one: waits
    assert f.feed(b"ad]\n") == b"[Glad]\n"  # was not
    assert f.feed(line(0)[:30]) == b""
    assert f.feed(line(0)[30:]) == b""


@pytest.mark.parametrize("native_level", ["3", "0"])
def test_the_filter_process_passes_stdout_on_and_ends_with_it(tmp_path, native_level):
    """start() in a process: its prints and its native writes to fd 1 come through, the
    connection lines do not, and the filter ends with the process (nothing is lost). With
    the native INFO lines asked for, stdout is left alone."""
    script = tmp_path / "child.py"
    script.write_text(
        "import os\n"
        "from ifrtpy.distributed import _gloo_lines\n"
        "_gloo_lines.start()\n"
        "print('before', flush=True)\n"
        f"os.write(1, {line(0)!r} + b'native\\n' + {line(1)!r})\n"
        "print('after', flush=True)\n"
        "os._exit(0)  # abruptly: the filter still drains the pipe\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                               "TF_CPP_MIN_LOG_LEVEL": native_level})
    assert done.returncode == 0, done.stderr
    if native_level == "0":
        assert done.stdout == b"before\n" + line(0) + b"native\n" + line(1) + b"after\n"
    else:
        assert done.stdout == b"before\nnative\nafter\n"
