"""Hiding gloo's connection lines on stdout in jobs of the jax backend.

gloo (jax's CPU collectives between processes) writes ``[Gloo] Rank 0 is connected to 3
peer ranks. Expected number of connected peer ranks is : 3`` to stdout, from C++ and with
no switch, each time a collective sets up its connections; the lines of several ranks
interleave. While a job runs, :func:`start` puts a pipe in place of file descriptor 1 and
a filter process (this file, run as a script: it imports nothing of ifrtpy) passes on
everything but those lines. A separate process rather than a thread, so that nothing
written is lost when this process ends abruptly: the filter drains the pipe to its end.
:func:`stop` (leaving the job, or at exit) puts the original stdout back.

This module imports only the standard library.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys

__all__ = ["GlooLines", "start", "stop"]

# One connection line is written as these pieces, each a write of its own (C++ ``<<``), with
# a number after the first, second and fourth and a newline last. Threads of one process
# write their lines at once, so the pieces of several lines interleave in any order that
# keeps each line's own order.
_PIECES = (b"[Gloo] Rank ", b" is connected to ", b" peer ranks. ",
           b"Expected number of connected peer ranks is : ")
_START = _PIECES[0]
_LONGEST_BURST = 1 << 16  # bytes held at most while interleaved lines are being told apart
_DIGITS = frozenset(b"0123456789")


class GlooLines:
    """A stream filter dropping gloo's connection lines, also where the writes of several
    threads interleave their pieces. A run of text from a line's start is held until it
    is known: every line begun in it is whole (dropped), or something in it cannot belong
    to such lines (passed on as it came). Everything else is passed on as soon as it cannot
    be the start of such a line."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """What to write now, of what came so far."""
        buffer, self._held = self._held + data, b""
        out = bytearray()
        i, n = 0, len(buffer)
        while i < n:
            if buffer[i] == _START[0]:
                if _START.startswith(buffer[i:i + len(_START)]) and n - i < len(_START):
                    self._held = buffer[i:]  # maybe the start of a line: wait
                    break
                if buffer.startswith(_START, i):
                    end = _burst_end(buffer, i)
                    if end is None and n - i <= _LONGEST_BURST:
                        self._held = buffer[i:]  # lines still being written: wait
                        break
                    if end is not None and end > 0:
                        i = end  # whole lines, dropped
                        continue
            stop = buffer.find(_START[:1], i + 1)
            stop = n if stop < 0 else stop
            out += buffer[i:stop]
            i = stop
        return bytes(out)

    def flush(self) -> bytes:
        """What is held, at the end of the stream (the pieces of lines left unfinished are
        dropped; anything else is passed on)."""
        held, self._held = self._held, b""
        return b"" if held.startswith(_START) else held


def _burst_end(buffer: bytes, start: int) -> int | None:
    """Where the interleaved connection lines from ``start`` (a line's first piece) all
    end; None while they may still end later in the stream; 0 where the text cannot be
    such lines."""
    begun = [0] * len(_PIECES)  # how many lines have written each piece
    ended = 0
    i, n = start, len(buffer)
    while i < n:
        byte = buffer[i]
        if byte in _DIGITS:
            i += 1
            continue
        if byte == 0x0A:
            if ended == begun[-1]:  # no line waits for its newline
                return 0
            ended += 1
            i += 1
            if ended == begun[0]:
                return i
            continue
        for k, piece in enumerate(_PIECES):
            if buffer.startswith(piece, i):
                if k and begun[k] == begun[k - 1]:  # no line waits for this piece
                    return 0
                begun[k] += 1
                i += len(piece)
                break
            if piece.startswith(buffer[i:i + len(piece)]) and n - i < len(piece):
                return None  # a piece cut by the end of what came: wait
        else:
            return 0
    return None


# -- the pipe in place of stdout --------------------------------------------------------------

_state: dict[str, object] = {}


def start() -> None:
    """Pass this process's stdout (file descriptor 1) through the filter, until
    :func:`stop`. Does nothing where it runs already, where stdout is closed, or where the
    native libraries' INFO lines are asked for (``TF_CPP_MIN_LOG_LEVEL=0``, which
    ``IFRTPY_LOG_LEVEL=info`` and ``ifrtpy.set_log_level("info")`` set: see
    docs/logging.md)."""
    if _state or os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0":
        return
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:
        return
    read, write = os.pipe()
    process = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)],
                               stdin=read, stdout=saved, close_fds=True)
    os.close(read)
    os.dup2(write, 1)
    os.close(write)
    _state.update(saved=saved, process=process)
    atexit.register(stop)


def stop() -> None:
    """Put the original stdout back; the filter passes on the rest and ends."""
    if not _state:
        return
    saved, process = _state.pop("saved"), _state.pop("process")
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    os.dup2(saved, 1)  # type: ignore[arg-type]
    os.close(saved)  # type: ignore[arg-type]
    try:
        process.wait(timeout=10)  # type: ignore[attr-defined]
    except subprocess.TimeoutExpired:  # another process still writes to the pipe
        pass


def _filter_stdin() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is for the job's process: drain on
    lines = GlooLines()
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            break
        out = lines.feed(data)
        if out:
            os.write(1, out)
    rest = lines.flush()
    if rest:
        os.write(1, rest)


if __name__ == "__main__":
    _filter_stdin()
