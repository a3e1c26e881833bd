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
import re
import subprocess
import sys

__all__ = ["GlooLines", "start", "stop"]

_HEAD = re.compile(rb"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. "
                   rb"Expected number of connected peer ranks is : ")
_TAIL = re.compile(rb"\d+\n")
_PREFIX = b"[Gloo] Rank "


class GlooLines:
    """A stream filter dropping gloo's connection lines, also where writes of several
    threads cut them apart (a line's count and newline then come later, after another
    line: they are dropped where they stand at the start of a line). Everything else is
    passed on as soon as it cannot be the start of such a line."""

    def __init__(self) -> None:
        self._held = b""
        self._orphans = 0  # lines cut after "is : ": their "N\n" is still to come
        self._line_start = True

    def feed(self, data: bytes) -> bytes:
        """What to write now, of what came so far."""
        buffer, self._held = self._held + data, b""
        out = bytearray()
        i, n = 0, len(buffer)
        while i < n:
            head = _HEAD.match(buffer, i)
            if head is not None:
                i = head.end()
                tail = _TAIL.match(buffer, i)
                if tail is not None:
                    i = tail.end()
                elif i == n:  # the count may still come: wait
                    self._held = buffer[head.start():]
                    break
                else:
                    self._orphans += 1
                continue
            if self._orphans and self._line_start:
                tail = _TAIL.match(buffer, i)
                if tail is not None:
                    i = tail.end()
                    self._orphans -= 1
                    continue
                rest = buffer[i:]
                if rest.isdigit():  # an orphan count without its newline yet
                    self._held = rest
                    break
            if buffer[i] == _PREFIX[0]:
                rest = buffer[i:i + len(_PREFIX)]
                if _PREFIX.startswith(rest) and (len(rest) < len(_PREFIX) or
                                                 _could_be_head(buffer[i:])):
                    self._held = buffer[i:]  # maybe the start of a line to drop
                    break
            stop = _next_stop(buffer, i + 1)
            out += buffer[i:stop]
            self._line_start = buffer[stop - 1] == 0x0A
            i = stop
        return bytes(out)

    def flush(self) -> bytes:
        """What is held, at the end of the stream."""
        held, self._held = self._held, b""
        return b"" if _HEAD.match(held) else held


def _could_be_head(text: bytes) -> bool:
    """Whether ``text`` (starting with the prefix) may still become a connection line."""
    if b"\n" in text:
        return False
    pattern = _HEAD.pattern
    for end in range(len(pattern), 0, -1):  # the longest prefix of the pattern it matches
        try:
            if re.fullmatch(pattern[:end], text[:200]):
                return True
        except re.error:
            continue
    return False


def _next_stop(buffer: bytes, start: int) -> int:
    """The end of the run of bytes from ``start - 1`` that need no look: up to the next
    byte that may start a connection line or end a line (included)."""
    stops = [p for p in (buffer.find(b"[", start), buffer.find(b"\n", start) + 1)
             if p > 0]
    return min(stops) if stops else len(buffer)


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
