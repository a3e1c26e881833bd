"""``python -m ifrtpy launch -n N [--devices-per-process K] [--kill-after S] -- CMD ...``: a
job of N processes of CMD on this machine (N at most :data:`MAX_PROCESSES`).

Process ``i`` gets the job's variables, so that ``ifrtpy.distributed.initialize()`` needs
no arguments: ``IFRTPY_COORDINATOR_ADDRESS`` (127.0.0.1 and a free port),
``IFRTPY_NUM_PROCESSES=N``, ``IFRTPY_PROCESS_ID=i``, ``IFRTPY_LOCAL_PROCESS_ID=i`` and, with
``--devices-per-process``, ``IFRTPY_LOCAL_DEVICE_COUNT=K`` (the CPU devices jax's runtime
gets in each process); also ``PYTHONUNBUFFERED=1`` unless set, and /dev/null as its input.

Each line a process writes goes to the launcher's standard output or error prefixed with
``[i] ``; lines are written whole, so those of different processes never mix. SIGINT,
SIGTERM and SIGHUP to the launcher go to every process (a second one kills them). When a
process fails (a non-zero status, or a signal), the others get SIGTERM, and SIGKILL
``--kill-after`` seconds later (default 10); so do they when the launcher cannot write
their output: a reader that left (EPIPE) stops the job as it stops a shell pipeline's
writer, quietly. A process ended by a signal the launcher sent of its own accord (that
SIGTERM, any SIGKILL) has not failed. The launcher exits with the first failure's status
(128 + n for signal n), else 128 + n when it passed on signal n, else 141 (128 + SIGPIPE)
when its output's reader left (1 for another write error), else 0. What cannot start is
refused with one line, before any process starts: a closed standard output or error, an
``-n`` above the bound or above what the launcher's open-file limit holds (two pipes per
process); exit status 2 for bad options, 1 otherwise.

Nothing is left running (Linux): ``launch`` runs the job in a child of its own, the
*runner*, in a session of its own; both are child subreapers (``PR_SET_CHILD_SUBREAPER``),
so every process the job starts stays below them, one that calls ``setsid`` or forks twice
too. When the job ends the runner kills (SIGKILL) every process still below it, the job's
coordinator included. Should the launcher be killed, even with SIGKILL, the runner sees it
(a pipe from the launcher reads end-of-file) and kills the job and everything below it at
once; should the runner be killed, the job's processes die with it (``PR_SET_PDEATHSIG``)
and the launcher kills what is left below it. Not covered: both killed at once (as
``pkill -9 -f ifrtpy`` does), and processes started outside this tree (through a daemon
such as systemd or sshd); a cgroup (``systemd-run --scope``, a container) covers those.
Elsewhere, and in :meth:`Launcher.run` called in a process of yours, the sweep is of the
processes' sessions only: each process runs in a session of its own, which is signalled
as a whole (its own children too) and swept with SIGKILL at the end. The death signal is
set by a small Python program that then becomes CMD, in the child, rather than by a
``preexec_fn``, which is unsafe in a process with threads.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import IO, Mapping, Sequence

from ifrtpy.errors import (FailedPreconditionError, IfrtError, InvalidArgumentError,
                           ResourceExhaustedError)

__all__ = ["Launcher", "MAX_PROCESSES", "configure", "run", "run_kept"]

#: The most processes of a job: each process of a job connects to every other one (gloo's
#: CPU collectives connect every pair), so one process of a bigger job would hold more
#: sockets than the usual limit of 1024 open files of a process.
MAX_PROCESSES = 1024

#: The signals the launcher passes on to the job's processes.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_MAX_PARTIAL = 64 * 1024  # a line longer than this is written in pieces
_DRAIN_S = 1.0  # after the last process ends, how long its own children may hold its pipes
_POLL_S = 0.05

#: Run in each child before CMD, in a fresh interpreter: die with the process that runs the
#: job (argv[1] is its pid), then become CMD (argv[2:]); 127 / 126 when CMD cannot be run,
#: as a shell.
_BECOME = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
    sys.stderr.write(f"cannot run {sys.argv[2]!r}: {e.strerror}\\n")
    os._exit(127 if isinstance(e, FileNotFoundError) else 126)
"""


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def exit_status(returncode: int) -> int:
    """A subprocess return code as a shell reports it: 128 + n for death by signal n."""
    return 128 - returncode if returncode < 0 else returncode


def _standard_stream(fd: int) -> IO[bytes]:
    """This process's standard output (``fd`` 1) or error (2), written unbuffered;
    FailedPreconditionError when it is closed."""
    try:
        return open(fd, "wb", buffering=0, closefd=False)
    except OSError:
        name = "output" if fd == 1 else "error"
        raise FailedPreconditionError(
            f"standard {name} (fd {fd}) is closed: the job's lines have nowhere to go") from None


class _Output:
    """One of the launcher's output streams, shared by the lines of every process: each
    write whole, none after one failed (``error`` says why)."""

    def __init__(self, stream: IO[bytes]):
        self._stream = stream
        self.error: OSError | None = None

    def write(self, data: bytes) -> None:
        if self.error is not None:
            return
        view = memoryview(data)
        try:
            while view:
                written = self._stream.write(view)
                if written is None:  # a non-blocking stream, full: wait until it takes more
                    select.select([], [self._stream], [])
                else:
                    view = view[written:]
            self._stream.flush()
        except OSError as e:  # a pipe whose reader left (EPIPE), a full disk, ...
            self.error = e
        except ValueError:  # the stream was closed
            self.error = OSError(errno.EBADF, os.strerror(errno.EBADF))


class _Lines:
    """One output stream of one process: whole lines, prefixed, written to ``out``."""

    def __init__(self, prefix: bytes, out: _Output):
        self._prefix = prefix
        self._out = out
        self._partial = b""

    def feed(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > _MAX_PARTIAL:
            lines.append(self._partial)
            self._partial = b""
        self._write(lines)

    def close(self) -> None:
        if self._partial:  # a last line without its newline
            self._write([self._partial])
            self._partial = b""

    def _write(self, lines: list[bytes]) -> None:
        if lines:
            self._out.write(b"".join(self._prefix + line + b"\n" for line in lines))


class Launcher:
    """A job of ``num_processes`` processes of ``command`` on this machine, as the module
    says; :meth:`run` runs it and returns the launcher's exit status. ``environ`` is the
    processes' environment before the job's variables (default: this process's);
    ``stdout`` and ``stderr`` take the prefixed lines (default: this process's, unbuffered;
    FailedPreconditionError when one is closed)."""

    def __init__(self, num_processes: int, command: Sequence[str], *,
                 devices_per_process: int | None = None, kill_after_s: float = 10.0,
                 environ: Mapping[str, str] | None = None, stdout: IO[bytes] | None = None,
                 stderr: IO[bytes] | None = None):
        if (isinstance(num_processes, bool) or not isinstance(num_processes, int)
                or not 1 <= num_processes <= MAX_PROCESSES):
            raise InvalidArgumentError(
                f"-n must be an integer from 1 to {MAX_PROCESSES}, got {num_processes!r} "
                "(each process of a job connects to every other one)")
        if devices_per_process is not None and devices_per_process < 1:
            raise InvalidArgumentError(
                f"--devices-per-process must be an integer >= 1, got {devices_per_process}")
        if not kill_after_s >= 0:
            raise InvalidArgumentError(f"--kill-after must be >= 0 seconds, got {kill_after_s}")
        if not command:
            raise InvalidArgumentError("no command to launch (give it after --)")
        self._count = num_processes
        self._command = list(command)
        self._devices = devices_per_process
        self._kill_after_s = kill_after_s
        self._environ = dict(os.environ if environ is None else environ)
        self._stdout = _Output(stdout if stdout is not None else _standard_stream(1))
        self._stderr = _Output(stderr if stderr is not None else _standard_stream(2))
        self._processes: list[subprocess.Popen[bytes]] = []
        self._failure: int | None = None  # the exit status of the first process that failed
        self._cause: int | None = None  # the status of the launcher's own first reason to stop
        self._forwarded = False  # whether a signal was passed on
        self._own: set[int] = set()  # the signals sent to the job of the launcher's own accord
        self._pending: list[int] = []  # signals received, not yet handled
        self._kill_at: float | None = None  # when the processes still running get SIGKILL

    def environment(self, process_id: int, address: str) -> dict[str, str]:
        """The environment of process ``process_id`` of the job at ``address``."""
        env = dict(self._environ)
        env.update(IFRTPY_COORDINATOR_ADDRESS=address, IFRTPY_NUM_PROCESSES=str(self._count),
                   IFRTPY_PROCESS_ID=str(process_id), IFRTPY_LOCAL_PROCESS_ID=str(process_id))
        if self._devices is not None:
            env["IFRTPY_LOCAL_DEVICE_COUNT"] = str(self._devices)
        env.setdefault("PYTHONUNBUFFERED", "1")  # else Python holds its output back in a pipe
        return env

    def run(self, lifeline: int | None = None) -> int:
        """Run the job; the launcher's exit status. ``lifeline``, the read end of a pipe:
        when it reads end-of-file (its writers are gone), the job is killed at once.
        ResourceExhaustedError, with nothing left running, when the processes cannot all
        start (the open files they need are checked before any starts)."""
        self._check_open_files()
        address = f"127.0.0.1:{free_loopback_port()}"
        width = len(str(self._count - 1))
        selector = selectors.DefaultSelector()
        if lifeline is not None:
            selector.register(lifeline, selectors.EVENT_READ, None)
        previous = {s: signal.signal(s, self._on_signal) for s in FORWARDED}
        mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        try:
            for i in range(self._count):
                process = self._start(i, address)
                self._processes.append(process)
                prefix = f"[{i:>{width}}] ".encode()
                assert process.stdout is not None and process.stderr is not None
                selector.register(process.stdout, selectors.EVENT_READ,
                                  _Lines(prefix, self._stdout))
                selector.register(process.stderr, selectors.EVENT_READ,
                                  _Lines(prefix, self._stderr))
            self._loop(selector)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._kill()  # what is left: their own children, or all
            for process in self._processes:
                process.wait()
            for key in list(selector.get_map().values()):
                if key.data is not None:
                    key.data.close()
                    key.fileobj.close()  # type: ignore[union-attr]
            selector.close()
        for status in (self._failure, self._cause):
            if status is not None:
                return status
        return 0

    def _check_open_files(self) -> None:
        import resource  # Unix only

        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        try:
            open_now = len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
        except OSError:
            open_now = 3
        # Two pipes kept per process; while the last starts, its four pipe ends and
        # subprocess's own pipe; the selector.
        need = 2 * self._count + 5
        if limit != resource.RLIM_INFINITY and open_now + need > limit:
            raise ResourceExhaustedError(
                f"-n {self._count} needs {need} more open files in the launcher (2 per "
                f"process) besides its {open_now}, but its limit is {limit} open files "
                "(ulimit -n): raise it or launch fewer processes")

    def _start(self, i: int, address: str) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _BECOME, str(os.getpid()), *self._command],
                env=self.environment(i, address), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise ResourceExhaustedError(
                f"cannot start process {i} of {self._count}: {e.strerror}") from None

    def _on_signal(self, signum: int, frame: object) -> None:
        self._pending.append(signum)

    def _signal_all(self, signum: int) -> None:
        """Send ``signum`` to every process's session (it and its own children; one whose
        process has ended too, while others of its session live)."""
        for process in self._processes:
            try:
                os.killpg(process.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _stop(self, signum: int, *, own: bool) -> None:
        """Stop the job: ``signum`` to every process, SIGKILL after the grace period. One
        of the launcher's ``own`` accord (not passed on) is sent once, and no process it
        ends has failed."""
        if own:
            if self._kill_at is not None:
                return
            self._own.add(signum)
        self._signal_all(signum)
        if self._kill_at is None:
            self._kill_at = time.monotonic() + self._kill_after_s

    def _kill(self) -> None:
        self._own.add(signal.SIGKILL)
        self._signal_all(signal.SIGKILL)

    def _say(self, message: str) -> None:
        _Lines(b"launch: ", self._stderr).feed(message.encode() + b"\n")

    def _failed(self, process: subprocess.Popen[bytes]) -> bool:
        """Whether ``process`` (ended) failed: a non-zero status not of the launcher's doing."""
        code = process.returncode
        return code != 0 and -code not in self._own

    def _loop(self, selector: selectors.BaseSelector) -> None:
        drain_until: float | None = None
        while True:
            for key, _ in selector.select(_POLL_S):
                if key.data is None:  # the lifeline: whoever held it is gone
                    selector.unregister(key.fileobj)
                    self._kill()
                    continue
                data = os.read(key.fd, 65536)
                if data:
                    key.data.feed(data)
                else:  # the process (and its children) closed it
                    key.data.close()
                    selector.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
            self._handle_signals()
            self._handle_lost_output()
            for i, process in enumerate(self._processes):
                ended = process.returncode is None and process.poll() is not None
                if ended and self._failure is None and self._failed(process):
                    self._failure = status = exit_status(process.returncode)
                    if self._kill_at is None:
                        self._say(f"process {i} failed (exit status {status}): stopping the "
                                  "others")
                        self._stop(signal.SIGTERM, own=True)
            now = time.monotonic()
            if self._kill_at is not None and now >= self._kill_at:
                self._kill()
                self._kill_at = float("inf")
            if all(process.returncode is not None for process in self._processes):
                if not [key for key in selector.get_map().values() if key.data is not None]:
                    return
                if drain_until is None:
                    drain_until = now + _DRAIN_S  # their own children may hold the pipes
                elif now >= drain_until:
                    return

    def _handle_signals(self) -> None:
        """The first signal received is passed on; a second one kills the job."""
        while self._pending:
            signum = self._pending.pop(0)
            if not self._forwarded:
                self._forwarded = True
                if self._cause is None:
                    self._cause = 128 + signum
                self._say(f"got {signal.Signals(signum).name}: passing it on to the job")
                self._stop(signum, own=False)
            else:
                self._kill()

    def _handle_lost_output(self) -> None:
        """Stop the job once the launcher cannot write its output: quietly when the reader
        left (EPIPE: 141, as SIGPIPE ends a pipeline's writer), else saying why (1)."""
        error = self._stdout.error or self._stderr.error
        if error is None or self._cause is not None:
            return
        if isinstance(error, BrokenPipeError):
            self._cause = 128 + signal.SIGPIPE
        else:
            self._cause = 1
            self._say(f"cannot write the job's output ({error.strerror}): stopping the job")
        self._stop(signal.SIGTERM, own=True)


def _set_child_subreaper() -> bool:
    """Make this process a child subreaper (Linux's ``PR_SET_CHILD_SUBREAPER``): the orphans
    among its descendants become its children. Whether it is one."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        done: int = ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
        return done == 0
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """The processes whose parent is this one (Linux's /proc)."""
    me, children = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == me:
                children.append(int(name))
    return children


def _kill_descendants() -> None:
    """SIGKILL every process below this one, a child subreaper (so that the orphans below
    it are its children): its children, reaped, until it has none. For a process whose
    children are all to go (no pid can be reused before it is reaped here)."""
    while children := _children():
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def run_kept(launcher: Launcher) -> int:
    """Run the launcher's job as the module says nothing is left running: in a child of
    this process (the runner, in a session of its own), both child subreapers, each
    sweeping what is below it; signals to this process are passed to the runner. For a
    process whose children are all the job's (the CLI's). Elsewhere than Linux:
    ``launcher.run()``. The launcher's exit status."""
    if not _set_child_subreaper():
        return _status(launcher)
    lifeline, held = os.pipe()  # the runner reads end-of-file once this process is gone
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until handled
    try:
        runner = os.fork()
    except OSError as e:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(lifeline)
        os.close(held)
        return _refuse(ResourceExhaustedError(f"cannot start the job's runner: {e.strerror}"))
    if runner == 0:
        os.close(held)
        os._exit(_run_job(launcher, lifeline))
    os.close(lifeline)
    previous = {s: signal.signal(s, lambda signum, frame: os.kill(runner, signum))
                for s in FORWARDED}
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        os.waitid(os.P_PID, runner, os.WEXITED | os.WNOWAIT)  # ended, its pid not yet free
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _, status = os.waitpid(runner, 0)
        _kill_descendants()  # what was below the runner, had it been killed
        os.close(held)
    return exit_status(os.waitstatus_to_exitcode(status))


def _run_job(launcher: Launcher, lifeline: int) -> int:
    """The runner: the job, then a sweep of whatever is still below it."""
    try:
        os.setsid()  # out of the launcher's process group: a kill of the group spares it
        _set_child_subreaper()
        return _status(launcher, lifeline)
    except BaseException:  # noqa: BLE001 - a child of a fork: report, never return
        traceback.print_exc()
        return 1
    finally:
        _kill_descendants()
        with contextlib.suppress(Exception):
            sys.stderr.flush()


def _status(launcher: Launcher, lifeline: int | None = None) -> int:
    """``launcher.run(lifeline)``, or one line saying why the job cannot run."""
    try:
        return launcher.run(lifeline)
    except IfrtError as e:
        return _refuse(e)


def _refuse(error: IfrtError) -> int:
    """Say why the job cannot run, in one line; the exit status (2 for bad options)."""
    if sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError):
            print(f"launch: error: {error}", file=sys.stderr, flush=True)
    return 2 if isinstance(error, InvalidArgumentError) else 1


def configure(parser: argparse.ArgumentParser) -> None:
    """The options of ``launch`` on its subcommand's ``parser``."""
    parser.add_argument("-n", "--num-processes", type=int, required=True, metavar="N",
                        help=f"the number of processes, at most {MAX_PROCESSES} (each process "
                             "of a job connects to every other one: a process of a bigger job "
                             "would need more sockets than the usual limit of 1024 open files)")
    parser.add_argument("--devices-per-process", type=int, metavar="K",
                        help="CPU devices of jax's runtime in each process "
                             "(IFRTPY_LOCAL_DEVICE_COUNT)")
    parser.add_argument("--kill-after", type=float, default=10.0, metavar="SECONDS",
                        help="how long a process may take to stop before SIGKILL (default 10)")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                        help="the command each process runs")


def run(args: argparse.Namespace) -> int:
    """Run the job ``args`` (of :func:`configure`'s parser) describes (:func:`run_kept`);
    its exit status."""
    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    try:
        launcher = Launcher(args.num_processes, command,
                            devices_per_process=args.devices_per_process,
                            kill_after_s=args.kill_after)
    except IfrtError as e:
        return _refuse(e)
    return run_kept(launcher)
