"""Robustness of ``python -m ifrtpy launch`` under hostile use: a reader of its output that
leaves, processes that outlive it (setsid daemons, the launcher itself SIGKILLed), closed
or exhausted file descriptors, too many processes, and the status after escalating to
SIGKILL. Every launcher runs in a subprocess (a session of its own) with a timeout; the
timeouts are about hangs only, far above what the checks take."""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys

import pytest

from ifrtpy.cli.launch import Launcher
from ifrtpy.errors import ResourceExhaustedError
from job_helpers import assert_no_stray_processes, job_environment, lines_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the launcher's sweep is Linux's")

HANG_S = 60  # a launcher still running after this long hangs


def _launcher(count, command, *options, stdout=subprocess.PIPE):
    """``python -m ifrtpy launch -n count [options] -- command...`` in a session of its own:
    (the Popen, the job's marker)."""
    env, marker = job_environment()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ifrtpy", "launch", "-n", str(count), *options, "--", *command],
        env=env, stdout=stdout, stderr=subprocess.PIPE, start_new_session=True)
    return launcher, marker


def _ended(launcher):
    """Wait for the launcher (at most HANG_S); its status. A hang kills its session."""
    try:
        launcher.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        pytest.fail(f"the launcher still ran after {HANG_S} s")
    return launcher.returncode


def _shell(script, *, limits=""):
    """``bash -c 'limits; python -m ifrtpy launch ...'`` (the script says the rest), in a
    session of its own: (its status, stdout, stderr), text. A hang kills the session."""
    env, _ = job_environment()
    launch = f"{sys.executable} -m ifrtpy launch"
    shell = subprocess.Popen(["bash", "-c", f"{limits}{script.format(launch=launch)}"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        out, err = shell.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.communicate()
        pytest.fail(f"the launcher still ran after {HANG_S} s")
    return shell.returncode, out, err


def _one_line_error(stderr):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


# -- the reader of the output leaves ---------------------------------------------------------

def test_a_launcher_whose_reader_left_stops_the_job_as_a_pipeline_would():
    """``launch -n 1 -- yes | head -c 100``: once head has its 100 bytes and leaves, the
    launcher stops the job and exits 128 + SIGPIPE, as ``yes`` in ``yes | head`` does."""
    launcher, marker = _launcher(1, ["yes"])
    assert launcher.stdout.read(100) == b"[0] y\n" * 16 + b"[0] "
    launcher.stdout.close()
    assert _ended(launcher) == 128 + signal.SIGPIPE
    assert launcher.stderr.read() == b""  # as a pipeline's writer: quiet
    assert_no_stray_processes(marker)


def test_a_pipeline_in_a_shell_ends_with_the_readers_end():
    _, out, err = _shell("{launch} -n 2 -- yes | head -c 100 | wc -c; echo ${{PIPESTATUS[0]}}")
    assert out.split() == ["100", str(128 + signal.SIGPIPE)], err


# -- nothing is left running -----------------------------------------------------------------

DAEMON = "setsid sleep 60 </dev/null >/dev/null 2>&1 &"  # a grandchild in a session of its own


def test_a_grandchild_that_calls_setsid_is_swept_at_a_normal_end():
    launcher, marker = _launcher(2, ["sh", "-c", f"{DAEMON} exit 0"])
    assert _ended(launcher) == 0
    assert_no_stray_processes(marker)


def test_nothing_is_left_when_the_launcher_is_sigkilled():
    """Its processes' children in their sessions, and daemons in sessions of their own,
    die with the launcher too."""
    launcher, marker = _launcher(2, ["sh", "-c", f"{DAEMON} sleep 60 & echo ready; wait"])
    try:
        lines_until(launcher.stdout, 2, b"ready")
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()
        launcher.stderr.close()
    assert_no_stray_processes(marker)


def _children(pid):
    children = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(int(name))
        except OSError:
            pass
    return children


def test_nothing_is_left_when_the_launchers_runner_is_sigkilled():
    """The child of the launcher that runs the job, SIGKILLed: the job's processes die
    with it, and the launcher kills what was below them; it exits 137, the runner's."""
    launcher, marker = _launcher(2, ["sh", "-c", f"{DAEMON} sleep 60 & echo ready; wait"])
    try:
        lines_until(launcher.stdout, 2, b"ready")
        runner, = _children(launcher.pid)
        os.kill(runner, signal.SIGKILL)
        assert _ended(launcher) == 128 + signal.SIGKILL
    finally:
        launcher.kill()
        launcher.wait()
    assert_no_stray_processes(marker)


def test_a_write_error_other_than_epipe_stops_the_job_saying_why():
    status, _, err = _shell("{launch} -n 1 -- yes > /dev/full")
    assert status == 1 and "cannot write the job's output (No space left on device)" in err


# -- what cannot start is refused in one line ------------------------------------------------

def test_a_launcher_with_its_standard_output_or_error_closed_refuses():
    status, _, err = _shell("{launch} -n 1 -- true >&-")
    assert status == 1 and "standard output (fd 1) is closed" in _one_line_error(err)
    status, out, _ = _shell("{launch} -n 1 -- echo started 2>&-")  # nowhere to say why
    assert status == 1 and out == ""


def test_more_processes_than_the_bound_are_refused_in_one_line():
    status, _, err = _shell("{launch} -n 10000 -- true")
    assert status == 2 and "from 1 to 1024, got 10000" in _one_line_error(err)


def test_more_processes_than_the_open_files_allow_are_refused_before_any_starts():
    status, out, err = _shell("{launch} -n 200 -- sh -c 'echo started'", limits="ulimit -n 64; ")
    assert status == 1 and "started" not in out
    line = _one_line_error(err)
    assert "open files" in line and "64" in line and "200" in line


def test_a_process_that_cannot_start_stops_those_started_and_is_one_error(monkeypatch):
    """Starting process 2 of 4 fails (as fork does when out of processes): the two started
    are stopped, and run() raises ResourceExhaustedError naming the process."""
    started = []
    popen = subprocess.Popen

    def failing_popen(*args, **kwargs):
        if len(started) == 2:
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        started.append(popen(*args, **kwargs))
        return started[-1]

    environ, marker = job_environment()
    launcher = Launcher(4, ["sleep", "60"], environ=environ, stdout=io.BytesIO(),
                        stderr=io.BytesIO())
    monkeypatch.setattr(subprocess, "Popen", failing_popen)
    with pytest.raises(ResourceExhaustedError, match="cannot start process 2 of 4: Resource"):
        launcher.run()
    monkeypatch.undo()
    assert [process.returncode for process in started] == [-signal.SIGKILL] * 2
    assert_no_stray_processes(marker)


# -- the status after escalating to SIGKILL --------------------------------------------------

STUBBORN = ("import signal, time\n"
            "for s in (signal.SIGINT, signal.SIGTERM): signal.signal(s, signal.SIG_IGN)\n"
            "print('ready', flush=True); time.sleep(60)")


def test_a_job_killed_after_the_grace_period_keeps_the_status_of_the_signal_passed_on():
    """Ctrl-C passed on to processes that ignore it (and SIGTERM): SIGKILL after
    --kill-after; the launcher's status is 130 (128 + SIGINT, the signal passed on), not
    the 137 of the SIGKILL it sent itself."""
    launcher, marker = _launcher(2, [sys.executable, "-c", STUBBORN], "--kill-after", "0.5")
    lines_until(launcher.stdout, 2, b"ready")
    launcher.send_signal(signal.SIGINT)
    assert _ended(launcher) == 128 + signal.SIGINT
    assert_no_stray_processes(marker)


def test_a_second_ctrl_c_kills_the_job_and_keeps_the_status_of_the_first():
    launcher, marker = _launcher(2, [sys.executable, "-c", STUBBORN], "--kill-after", "30")
    lines_until(launcher.stdout, 2, b"ready")
    launcher.send_signal(signal.SIGINT)
    launcher.stderr.readline()  # "launch: got SIGINT: passing it on to the job"
    launcher.send_signal(signal.SIGINT)
    assert _ended(launcher) == 128 + signal.SIGINT
    assert_no_stray_processes(marker)


def test_a_failure_keeps_its_status_when_the_others_are_killed_by_a_second_signal():
    """Process 0 fails (status 3); the others ignore the SIGTERM that stops them, and two
    Ctrl-C (passed on, then a kill): the launcher exits 3."""
    script = ("import os, sys, time\n"
              "if os.environ['IFRTPY_PROCESS_ID'] == '0':\n"
              "    print('ready', flush=True); time.sleep(0.5); sys.exit(3)\n"
              + STUBBORN)
    launcher, marker = _launcher(2, [sys.executable, "-c", script], "--kill-after", "30")
    lines_until(launcher.stdout, 2, b"ready")
    assert b"process 0 failed (exit status 3)" in launcher.stderr.readline()
    launcher.send_signal(signal.SIGINT)
    launcher.stderr.readline()  # "launch: got SIGINT: passing it on to the job"
    launcher.send_signal(signal.SIGINT)
    assert _ended(launcher) == 3
    assert_no_stray_processes(marker)
