"""The interpreter workers of this process: the processes (:mod:`.worker`) that run the
reference backend's programs, so that a running program holds neither this process's GIL
nor any of its locks, and no program can take this process down.

Each worker runs one program at a time; an execute takes an idle worker, so executes from
several threads run at once. Workers are started before they are needed and kept: the
first when the first program is prepared (compiled), and one more each time an execute
takes the last idle one, so the next execute finds one started (a start takes about 0.3 s);
at most :data:`SIZE` in all (twice the CPUs this process may use, at least 4, at most 16).
Past that, an execute waits for a worker to be free.

A worker that dies (a signal, an abort) fails the execute it was running with an
InternalError naming how it ended (and its last line on stderr), and is replaced; so is a
worker whose execute is interrupted (Ctrl-C while waiting for its answer, raised at once):
it is killed, still running the program. So is a worker whose program is cancelled
(:mod:`ifrtpy.cancellation`: the proxy server cancels a session's work when its client has
gone), and the execute raises CancelledError. Workers end with this process (killed at exit;
after an abrupt end they notice their closed pipe, see :mod:`.worker`); a forked child
starts its own.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import threading

from ifrtpy import _jaxlib
from ifrtpy.backends.reference import worker as _worker
from ifrtpy.cancellation import current_cancellation
from ifrtpy.errors import CancelledError, InternalError

__all__ = ["SIZE", "run", "warm", "worker_pids"]


def _cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


#: The most workers a process runs at once.
SIZE = min(16, max(4, 2 * _cpus()))
#: The most bytes a worker's stderr file keeps between programs.
_STDERR_KEPT = 1 << 16


class _Worker:
    """One worker process, this process's ends of its pipes, and the file its stderr
    goes to (appended to; emptied when it passes :data:`_STDERR_KEPT` bytes)."""

    def __init__(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        fcntl.fcntl(self._stderr, fcntl.F_SETFL, fcntl.fcntl(self._stderr, fcntl.F_GETFL) | os.O_APPEND)
        requests_in, self._requests = os.pipe()
        self._answers, answers_out = os.pipe()
        # Linux: a pipe never written to, whose closing ends the worker (see worker.py)
        lifeline_in, self._lifeline = os.pipe() if sys.platform == "linux" else (-1, -1)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _worker.BOOT, _worker.__file__,
                 _jaxlib.register_jax_dialects_location(),
                 str(lifeline_in) if lifeline_in >= 0 else "-"],
                stdin=requests_in, stdout=answers_out, stderr=self._stderr, close_fds=True,
                pass_fds=[lifeline_in] if lifeline_in >= 0 else [])
        except BaseException as e:
            self.abandon()
            if isinstance(e, OSError):  # out of processes or file descriptors
                raise InternalError(f"the StableHLO interpreter's worker did not start: {e}") from None
            raise
        finally:
            for fd in (requests_in, answers_out, lifeline_in):
                if fd >= 0:
                    os.close(fd)
        self.owner = os.getpid()

    def alive(self) -> bool:
        return self.process.poll() is None

    def exchange(self, request: list[bytes], limit: int) -> list[memoryview]:
        """The answer to ``request``; InternalError naming why when the worker ends first
        or answers with a malformed or too long message (over ``limit`` bytes)."""
        try:
            _worker.send(self._requests, request)
            answer = _worker.receive(self._answers, limit)
        except (OSError, EOFError):
            why = self._ended()
        except ValueError as e:
            why = f"its worker process {self.process.pid} answered with {e}"
        else:
            if os.fstat(self._stderr.fileno()).st_size > _STDERR_KEPT:
                os.ftruncate(self._stderr.fileno(), 0)
            return answer
        raise InternalError(f"the StableHLO interpreter failed: {why}")

    def _ended(self) -> str:
        """How the worker ended (it has closed its pipes), with its last line on stderr."""
        try:
            code = self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return f"its worker process {self.process.pid} closed its pipes"
        how = f"exit status {code}"
        if code < 0:
            try:
                how = f"signal {-code}, {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        self._stderr.seek(max(0, self._stderr.seek(0, os.SEEK_END) - 4096))
        last = self._stderr.read().decode(errors="replace").strip().splitlines()[-1:]
        return (f"its worker process {self.process.pid} died ({how}"
                + (": " + last[0][:300] if last else "")
                + ") running the program; the next execute starts another")

    def stop(self) -> None:
        """Kills the worker from another thread, while it runs a program that nobody
        waits for any more (its exchange then fails; the pool drops it)."""
        if self.owner == os.getpid() and self.process.returncode is None:
            self.process.kill()

    def close(self) -> None:
        """Kills the worker (it holds nothing worth a clean end) and reaps it."""
        self.abandon()
        if self.owner == os.getpid():
            self.process.kill()
            self.process.wait()

    def abandon(self) -> None:
        """Closes this process's ends of the pipes and the stderr file (all a forked
        child may do)."""
        for fd in (self._requests, self._answers, self._lifeline):
            try:
                if fd >= 0:
                    os.close(fd)
            except OSError:
                pass
        self._stderr.close()


class _Pool:
    """The workers of this process: each idle or running one program."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()

    def warm(self, idle: int = 1) -> None:
        """Starts workers until ``idle`` are idle or the pool is full (they go last in the
        idle list: those started before, ready sooner, are taken first)."""
        with self._ready:
            while len(self._idle) < idle and len(self._all) < SIZE:
                worker = _Worker()
                self._all.add(worker)
                self._idle.insert(0, worker)

    def run(self, request: list[bytes], limit: int) -> list[memoryview]:
        cancellation = current_cancellation()
        if cancellation is not None:
            cancellation.check()
        worker = self._take()
        try:
            if cancellation is None:
                answer = worker.exchange(request, limit)
            else:
                with cancellation.stopping(worker.stop):
                    answer = worker.exchange(request, limit)
        except BaseException:  # it died, or an interrupt left it running the program
            self._drop(worker)
            if cancellation is not None and cancellation.cancelled:
                raise CancelledError(
                    f"{cancellation.what} was cancelled: its program was stopped (its "
                    f"interpreter worker process {worker.process.pid} was killed)") from None
            raise
        if cancellation is not None and cancellation.cancelled:
            # cancelled as the program ended: its stop may still come (Cancellation.cancel
            # calls it outside its lock), so the worker serves no other execute
            self._drop(worker)
            return answer
        with self._ready:
            self._idle.append(worker)
            self._ready.notify()
        return answer

    def _take(self) -> _Worker:
        """The idle worker used last (waited for while the pool is full), leaving another
        idle for the next execute where there is room."""
        with self._ready:
            while True:
                self.warm(2)
                if not self._idle:
                    self._ready.wait()
                    continue
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                self._drop(worker)  # it ended while idle: nothing of it is lost

    def _drop(self, worker: _Worker) -> None:
        worker.close()
        with self._ready:
            self._all.discard(worker)
            self._ready.notify()

    def pids(self) -> list[int]:
        with self._ready:
            return sorted(w.process.pid for w in self._all)

    def close(self) -> None:
        with self._ready:
            workers, self._all, self._idle = list(self._all), set(), []
        for worker in workers:
            worker.close()

    def abandon(self) -> None:
        for worker in list(self._all):
            worker.abandon()


_pool = _Pool()


def warm() -> None:
    """Starts a worker, ready for a program, unless one is idle (or the pool is full)."""
    _pool.warm()


def run(request: list[bytes], limit: int) -> list[memoryview]:
    """The answer of a free worker to ``request`` (:mod:`.worker`'s format), at most
    ``limit`` bytes; InternalError when the worker dies first or answers malformed."""
    return _pool.run(request, limit)


def worker_pids() -> list[int]:
    """The process ids of this process's workers, idle and busy."""
    return _pool.pids()


def _forget_after_fork() -> None:
    global _pool
    _pool.abandon()  # the workers are the parent's: their pipes are closed here, no more
    _pool = _Pool()


atexit.register(lambda: _pool.close())
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
