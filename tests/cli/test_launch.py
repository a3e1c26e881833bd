"""``python -m ifrtpy launch``: the job's variables, prefixed whole lines, a failing
process stopping the others with its status kept, signals passed on (Ctrl-C), no process
left behind (checked with ps) even when the launcher is killed; and jobs of 2 and 4
processes that join with initialize() alone, exchange key-value entries and run a psum
across the processes on the jax backend."""

import io
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from ifrtpy.cli.launch import Launcher, exit_status
from ifrtpy.errors import InvalidArgumentError
from job_helpers import assert_no_stray_processes, job_environment, lines_until

WORKER = pathlib.Path(__file__).resolve().parents[1] / "helpers" / "jax_multiprocess_worker.py"


def _launch(count, script, kill_after_s=5.0, shell=False, **options):
    """Run a job in this process's launcher: (exit status, stdout, stderr, seconds); no
    process of it may be left."""
    out, err = io.BytesIO(), io.BytesIO()
    environ, marker = job_environment()
    command = ["/bin/sh", "-c", script] if shell else [sys.executable, "-c", script]
    start = time.monotonic()
    status = Launcher(count, command, kill_after_s=kill_after_s, environ=environ, stdout=out,
                      stderr=err, **options).run()
    took = time.monotonic() - start
    assert_no_stray_processes(marker)
    return status, out.getvalue().decode(), err.getvalue().decode(), took


def _launcher(count, script, *options):
    """``python -m ifrtpy launch`` in a subprocess (a session of its own, as a terminal's
    job): (the Popen, the job's marker)."""
    env, marker = job_environment()
    return subprocess.Popen(
        [sys.executable, "-m", "ifrtpy", "launch", "-n", str(count), *options, "--",
         sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True), marker


def test_each_process_gets_the_jobs_variables_and_its_lines_are_prefixed():
    status, out, err, _ = _launch(3, 'echo "$IFRTPY_PROCESS_ID/$IFRTPY_NUM_PROCESSES '
                                     '$IFRTPY_COORDINATOR_ADDRESS $IFRTPY_LOCAL_PROCESS_ID '
                                     '$IFRTPY_LOCAL_DEVICE_COUNT $PYTHONUNBUFFERED"; echo oops >&2',
                                  shell=True, devices_per_process=2)
    assert status == 0
    lines = sorted(out.splitlines())
    address = lines[0].split()[2]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", address)
    assert lines == [f"[{i}] {i}/3 {address} {i} 2 1" for i in range(3)]
    assert sorted(err.splitlines()) == ["[0] oops", "[1] oops", "[2] oops"]


def test_lines_are_written_whole():
    script = ("import os, sys, time\n"
              "i = os.environ['IFRTPY_PROCESS_ID']\n"
              "for k in range(40):\n"
              "    sys.stdout.write(f'p{i} '); sys.stdout.flush(); time.sleep(0.001)\n"
              "    sys.stdout.write(f'line {k}\\n'); sys.stdout.flush()\n"
              "sys.stdout.write('no newline at the end')")
    status, out, _, _ = _launch(2, script)
    assert status == 0 and len(out.splitlines()) == 82
    for line in out.splitlines():
        match = re.fullmatch(r"\[(\d)\] (?:p(\d) line \d+|no newline at the end)", line)
        assert match and match.group(2) in (None, match.group(1)), line


def test_a_failing_process_stops_the_others_and_its_status_is_kept():
    script = ("import os, sys, time\n"
              "if os.environ['IFRTPY_PROCESS_ID'] == '1':\n"
              "    time.sleep(0.3); sys.exit(3)\n"
              "time.sleep(600); print('woke', flush=True)")
    status, out, err, _ = _launch(3, script)
    assert status == 3 and "woke" not in out  # the others were stopped, not waited for
    assert "launch: process 1 failed (exit status 3): stopping the others" in err


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    ready = tmp_path / "ready"  # process 0 fails once process 1 ignores SIGTERM
    script = ("import os, signal, sys, time\n"
              "if os.environ['IFRTPY_PROCESS_ID'] == '0':\n"
              f"    while not os.path.exists({str(ready)!r}): time.sleep(0.01)\n"
              "    sys.exit(7)\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)\n"
              f"open({str(ready)!r}, 'w').close()\n"
              "time.sleep(600); print('woke', flush=True)")
    status, out, _, took = _launch(2, script, kill_after_s=1.0)
    # the 1 s grace period was given (never less), and the other was killed, not waited for
    assert status == 7 and "[1] ready" in out and "woke" not in out and took >= 1.0


def test_death_by_a_signal_is_128_plus_its_number_and_children_are_stopped_too():
    assert exit_status(-9) == 137 and exit_status(2) == 2
    status, out, _, _ = _launch(
        2, 'if [ "$IFRTPY_PROCESS_ID" = 1 ]; then sleep 60 & echo "child $!"; sleep 0.3; '
           'kill -SEGV $$; fi; sleep 60', shell=True, kill_after_s=1.0)
    assert status == 128 + signal.SIGSEGV
    assert re.search(r"\[1\] child \d+", out)  # gone too: no process was left (checked)


def test_a_command_that_cannot_run_exits_127_and_bad_options_are_refused():
    out, err = io.BytesIO(), io.BytesIO()
    status = Launcher(1, ["/nonexistent/program"], stdout=out, stderr=err).run()
    assert status == 127 and "cannot run '/nonexistent/program'" in err.getvalue().decode()
    for count, command, options in ((0, ["true"], {}), (1, [], {}),
                                    (1, ["true"], {"devices_per_process": 0})):
        with pytest.raises(InvalidArgumentError):
            Launcher(count, command, **options)
    usage = subprocess.run([sys.executable, "-m", "ifrtpy", "launch", "-n", "2"],
                           capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "no command to launch" in usage.stderr


def test_ctrl_c_is_passed_on_once_and_the_launcher_exits_130():
    script = ("import signal, sys, time\n"
              "def stop(signum, frame):\n"
              "    print('got', signum, flush=True); sys.exit(0)\n"
              "signal.signal(signal.SIGINT, stop); print('ready', flush=True); time.sleep(60)")
    launcher, marker = _launcher(2, script)
    try:
        lines_until(launcher.stdout, 2, "ready")
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=300)  # a bound on a hang
    finally:
        launcher.kill()
        launcher.wait()
    assert sorted(out.splitlines()) == ["[0] got 2", "[1] got 2"]
    assert "launch: got SIGINT: passing it on to the job" in err
    assert launcher.returncode == 130
    assert_no_stray_processes(marker)


def test_no_process_is_left_when_the_launcher_is_killed():
    launcher, marker = _launcher(3, "import time; print('up', flush=True); time.sleep(60)")
    try:
        lines_until(launcher.stdout, 3, "up")
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()
        launcher.stderr.close()
    assert_no_stray_processes(marker, within_s=10)


# -- jobs of ifrtpy: the processes join with initialize() alone ------------------------------

@pytest.mark.parametrize("count, devices", [(2, 4), (4, 2)])
def test_a_launched_job_exchanges_key_values_and_runs_a_psum_across_processes(count, devices):
    """Every process: initialize() alone (the launcher's variables), a key-value exchange,
    get_client("jax") listing the devices of all the processes, and a psum over them
    equal to NumPy's (gloo between the processes)."""
    pytest.importorskip("jax")
    env, marker = job_environment({"JAX_PLATFORMS": "cpu"})
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "ifrtpy", "launch", "-n", str(count), "--devices-per-process",
         str(devices), "--kill-after", "5", "--", sys.executable, str(WORKER), "launched"],
        env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(line for line in proc.stdout.splitlines() if " OK " in line) == [
        f"[{i}] OK {i} of {count}: psum over {count * devices} devices" for i in range(count)]
    assert_no_stray_processes(marker)


def test_a_launched_job_whose_process_fails_after_joining_is_stopped():
    """Process 1 exits 3 once in the job; the others are stopped, the launcher exits 3, and
    nothing of the job is left (the job's coordinator ends once they are all gone)."""
    script = ("import os, sys, time\n"
              "from ifrtpy import distributed\n"
              "distributed.initialize(initialization_timeout=300)\n"
              "print('joined', flush=True)\n"
              "if distributed.process_id() == 1:\n"
              "    sys.exit(3)\n"
              "time.sleep(600); print('woke', flush=True)")
    env, marker = job_environment()
    proc = subprocess.run([sys.executable, "-m", "ifrtpy", "launch", "-n", "3", "--kill-after",
                           "5", "--", sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, timeout=1200)  # a bound on a hang
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "[1] joined" in proc.stdout and "process 1 failed (exit status 3)" in proc.stderr
    assert "woke" not in proc.stdout  # the others were stopped, not waited for
    assert_no_stray_processes(marker)
