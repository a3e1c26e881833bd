"""``python -m ifrtpy launch -n N [--devices-per-process K] [--kill-after S] -- CMD ...``: a
job of N processes of CMD on this machine.

Process ``i`` gets the job's variables, so that ``ifrtpy.distributed.initialize()`` needs
no arguments: ``IFRTPY_COORDINATOR_ADDRESS`` (127.0.0.1 and a free port),
``IFRTPY_NUM_PROCESSES=N``, ``IFRTPY_PROCESS_ID=i``, ``IFRTPY_LOCAL_PROCESS_ID=i`` and, with
``--devices-per-process``, ``IFRTPY_LOCAL_DEVICE_COUNT=K`` (the CPU devices jax's runtime
gets in each process); also ``PYTHONUNBUFFERED=1`` unless set, and /dev/null as its input.

Each line a process writes goes to the launcher's standard output or error prefixed with
``[i] ``; lines are written whole, so those of different processes never mix. SIGINT,
SIGTERM and SIGHUP to the launcher go to every process (a second one kills them). When a
process fails (a non-zero status, or a signal), the others get SIGTERM, and SIGKILL
``--kill-after`` seconds later (default 10). The launcher exits with the first failure's
status (128 + n for signal n), else with 128 + n when it passed on signal n, else 0.

Nothing is left running: each process runs in a session of its own, which is signalled
as a whole (its own children too) and swept with SIGKILL at the end; on Linux each
process also dies with the launcher (``PR_SET_PDEATHSIG``), should the launcher be
killed. The death signal is set by a small Python program that then becomes CMD, in the
child, rather than by a ``preexec_fn``, which is unsafe in a process with threads.
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import IO, Mapping, Sequence

from ifrtpy.errors import InvalidArgumentError

__all__ = ["Launcher", "configure", "run"]

#: The signals the launcher passes on to the job's processes.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_MAX_PARTIAL = 64 * 1024  # a line longer than this is written in pieces
_DRAIN_S = 1.0  # after the last process ends, how long its own children may hold its pipes
_POLL_S = 0.05

#: Run in each child before CMD, in a fresh interpreter: die with the launcher (argv[1] is
#: its pid), then become CMD (argv[2:]); 127 / 126 when CMD cannot be run, as a shell.
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


class _Lines:
    """One output stream of one process: whole lines, prefixed, written to ``out``."""

    def __init__(self, prefix: bytes, out: IO[bytes] | None):
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
        if lines and self._out is not None:
            try:
                self._out.write(b"".join(self._prefix + line + b"\n" for line in lines))
                self._out.flush()
            except (OSError, ValueError):  # closed (a pipe whose reader left): drop the rest
                self._out = None


class Launcher:
    """A job of ``num_processes`` processes of ``command`` on this machine, as the module
    says; :meth:`run` runs it and returns the launcher's exit status. ``environ`` is the
    processes' environment before the job's variables (default: this process's);
    ``stdout`` and ``stderr`` take the prefixed lines (default: this process's)."""

    def __init__(self, num_processes: int, command: Sequence[str], *,
                 devices_per_process: int | None = None, kill_after_s: float = 10.0,
                 environ: Mapping[str, str] | None = None, stdout: IO[bytes] | None = None,
                 stderr: IO[bytes] | None = None):
        if (isinstance(num_processes, bool) or not isinstance(num_processes, int)
                or num_processes < 1):
            raise InvalidArgumentError(f"-n must be an integer >= 1, got {num_processes!r}")
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
        self._stdout = stdout if stdout is not None else sys.stdout.buffer
        self._stderr = stderr if stderr is not None else sys.stderr.buffer
        self._processes: list[subprocess.Popen[bytes]] = []
        self._failure: int | None = None  # the exit status of the first process that failed
        self._forwarded: int | None = None  # the first signal passed on
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

    def run(self) -> int:
        address = f"127.0.0.1:{free_loopback_port()}"
        width = len(str(self._count - 1))
        selector = selectors.DefaultSelector()
        previous = {s: signal.signal(s, self._on_signal) for s in FORWARDED}
        try:
            for i in range(self._count):
                process = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _BECOME, str(os.getpid()), *self._command],
                    env=self.environment(i, address), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
                self._processes.append(process)
                prefix = f"[{i:>{width}}] ".encode()
                assert process.stdout is not None and process.stderr is not None
                selector.register(process.stdout, selectors.EVENT_READ,
                                  _Lines(prefix, self._stdout))
                selector.register(process.stderr, selectors.EVENT_READ,
                                  _Lines(prefix, self._stderr))
            self._loop(selector)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._signal_all(signal.SIGKILL)  # what is left: their own children, or all
            for process in self._processes:
                process.wait()
            for key in list(selector.get_map().values()):
                key.data.close()
                key.fileobj.close()  # type: ignore[union-attr]
            selector.close()
        if self._failure is not None:
            return self._failure
        return 0 if self._forwarded is None else 128 + self._forwarded

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

    def _stop(self, signum: int) -> None:
        """Stop the job: ``signum`` to every process, SIGKILL after the grace period."""
        self._signal_all(signum)
        if self._kill_at is None:
            self._kill_at = time.monotonic() + self._kill_after_s

    def _say(self, message: str) -> None:
        _Lines(b"launch: ", self._stderr).feed(message.encode() + b"\n")

    def _loop(self, selector: selectors.BaseSelector) -> None:
        drain_until: float | None = None
        while True:
            for key, _ in selector.select(_POLL_S):
                data = os.read(key.fd, 65536)
                if data:
                    key.data.feed(data)
                else:  # the process (and its children) closed it
                    key.data.close()
                    selector.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
            while self._pending:
                signum = self._pending.pop(0)
                if self._forwarded is None:
                    self._forwarded = signum
                    self._say(f"got {signal.Signals(signum).name}: passing it on to the job")
                    self._stop(signum)
                else:
                    self._signal_all(signal.SIGKILL)
            for i, process in enumerate(self._processes):
                ended = process.returncode is None and process.poll() is not None
                status = exit_status(process.returncode or 0)
                if ended and status != 0 and self._failure is None:
                    self._failure = status
                    if self._kill_at is None:
                        self._say(f"process {i} failed (exit status {status}): stopping the "
                                  "others")
                        self._stop(signal.SIGTERM)
            now = time.monotonic()
            if self._kill_at is not None and now >= self._kill_at:
                self._signal_all(signal.SIGKILL)
                self._kill_at = float("inf")
            if all(process.returncode is not None for process in self._processes):
                if not selector.get_map():
                    return
                if drain_until is None:
                    drain_until = now + _DRAIN_S  # their own children may hold the pipes
                elif now >= drain_until:
                    return


def configure(parser: argparse.ArgumentParser) -> None:
    """The options of ``launch`` on its subcommand's ``parser``."""
    parser.add_argument("-n", "--num-processes", type=int, required=True, metavar="N",
                        help="the number of processes")
    parser.add_argument("--devices-per-process", type=int, metavar="K",
                        help="CPU devices of jax's runtime in each process "
                             "(IFRTPY_LOCAL_DEVICE_COUNT)")
    parser.add_argument("--kill-after", type=float, default=10.0, metavar="SECONDS",
                        help="how long a process may take to stop before SIGKILL (default 10)")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                        help="the command each process runs")


def run(args: argparse.Namespace) -> int:
    """Run the job ``args`` (of :func:`configure`'s parser) describes; its exit status."""
    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    try:
        launcher = Launcher(args.num_processes, command,
                            devices_per_process=args.devices_per_process,
                            kill_after_s=args.kill_after)
    except InvalidArgumentError as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return 2
    return launcher.run()
