"""``python -m ifrtpy serve``: the exact ready line (a private unix socket by default, TCP
when asked), who can connect there, a clean stop on SIGTERM and SIGINT, and no non-loopback
address without ``--allow-remote``."""

import argparse
import ctypes
import os
import pathlib
import platform
import re
import signal
import socket
import stat
import subprocess
import sys

import pytest

pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy.__main__ import main  # noqa: E402

#: Generous: a bound on a hang, not a timing assertion (the server starts in seconds).
HANG_S = 120


def start(*options):
    """A ``serve`` process with ``options`` and its first line of output."""
    proc = subprocess.Popen([sys.executable, "-m", "ifrtpy", "serve", *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline()


def stop(proc, number=signal.SIGTERM):
    proc.send_signal(number)
    out, err = proc.communicate(timeout=HANG_S)
    return proc.returncode, out, err


def accepts_connections(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_ready_line_then_a_clean_stop(number):
    # by default a unix socket in a new directory only this user may enter
    proc, line = start("--backend", "pjrt", "--device-count", "2")
    try:
        expected = repr(ifrt.get_client("pjrt", device_count=2))
        match = re.fullmatch(rf"ifrtpy proxy: serving {re.escape(expected)} "
                             r"at grpc://unix:(/\S+/proxy\.sock)\n", line)
        assert match, line
        path = pathlib.Path(match.group(1))
        assert path.is_socket() and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert proc.stdout.readline().startswith(
            "who can connect: a unix socket in a directory only user ")
        hint = proc.stdout.readline()
        assert hint == (f"point jax at it: JAX_PLATFORMS=proxy "
                        f"JAX_BACKEND_TARGET=grpc://unix:{path} python train.py\n")
    finally:
        code, _, err = stop(proc, number)
    assert (code, err) == (0, "")                               # no traceback, exit 0
    assert not path.parent.exists()


def test_tcp_when_asked_and_who_can_connect_there():
    proc, line = start("--backend", "pjrt", "--device-count", "1", "--address", "127.0.0.1:0")
    try:
        match = re.fullmatch(r"ifrtpy proxy: serving <.*> at grpc://127\.0\.0\.1:(\d+)\n", line)
        assert match, line
        port = int(match.group(1))
        assert port > 0 and accepts_connections(port)
        assert proc.stdout.readline().startswith(
            "who can connect: a loopback TCP port: every user of this machine can connect")
    finally:
        code, _, err = stop(proc)
    assert (code, err) == (0, "")
    assert not accepts_connections(port)


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                    reason="sends the signal to one thread with the x86_64 tgkill syscall")
def test_a_signal_that_another_thread_receives_still_stops_it():
    # the kernel may hand a process's SIGTERM to any thread; the server once hung then
    proc, _ = start("--backend", "pjrt", "--device-count", "2")
    threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(234, proc.pid, threads[-1], int(signal.SIGTERM)) == 0  # tgkill
    out, err = proc.communicate(timeout=HANG_S)
    assert (proc.returncode, err) == (0, "")


def test_a_unix_socket(tmp_path):
    path = tmp_path / "proxy.sock"
    proc, line = start("--backend", "reference", "--device-count", "1", "--address", f"unix:{path}")
    try:
        assert line.endswith(f" at grpc://unix:{path}\n"), line
        assert line.startswith("ifrtpy proxy: serving <ReferenceClient 1 devices")
        assert path.exists()
    finally:
        code, _, err = stop(proc)
    assert (code, err) == (0, "")


@pytest.mark.parametrize("address", ["0.0.0.0:0", "[::]:0", "10.1.2.3:5000"])
def test_a_non_loopback_address_needs_allow_remote(address, capsys):
    assert main(["serve", "--address", address]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"serve: error: {address} is not a loopback address or a unix socket")
    assert "--allow-remote" in err


def test_allow_remote_serves_there_and_says_what_it_means():
    proc, line = start("--device-count", "1", "--address", "0.0.0.0:0", "--allow-remote")
    try:
        assert re.fullmatch(r"ifrtpy proxy: serving <.*> at grpc://0\.0\.0\.0:\d+\n", line), line
    finally:
        code, _, err = stop(proc)
    assert code == 0
    assert err.startswith("warning: 0.0.0.0:0 is not a loopback address: whoever can connect")
    assert "no TLS" in err and "SSH tunnel" in err


def test_an_unknown_backend_is_one_error_line(capsys):
    assert main(["serve", "--backend", "no-such-backend"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: NotFoundError: ") and "no-such-backend" in err
    assert len(err.splitlines()) == 1


def test_the_limits_are_options():
    import dataclasses

    import grpc
    from proxy_helpers import EXHAUSTED, RawSession, refused_session

    from ifrtpy.cli.serve import _LIMITS
    from ifrtpy.proxy import Limits

    # every limit has its option
    assert {f.name for f in dataclasses.fields(Limits)} == {*_LIMITS, "idle_timeout_s"}
    proc, line = start("--device-count", "1", "--address", "127.0.0.1:0", "--max-sessions", "1",
                       "--max-host-buffer-bytes", "64M", "--idle-timeout", "3600")
    try:
        address = re.fullmatch(r"ifrtpy proxy: serving <.*> at grpc://(\S+)\n", line).group(1)
        with grpc.insecure_channel(address) as channel:
            held = RawSession(channel)
            (code, _), details = refused_session(channel)
            assert code == EXHAUSTED and "limit of 1 sessions (max_sessions)" in details
            held.close()
    finally:
        code, _, err = stop(proc)
    assert (code, err) == (0, "")


@pytest.mark.parametrize("option, value, range_", [
    ("--max-sessions", "0", "from 1 to 4096"), ("--max-handles", "x", "from 1 to 2147483648"),
    ("--max-message-bytes", "1Q", "from 1 to 2147483647"),
    ("--max-sessions", str(10 ** 12), "from 1 to 4096"),
    ("--max-host-buffer-rpcs", str(10 ** 9), "from 1 to 65536"),
    ("--max-pending-requests", str(10 ** 15), "from 1 to 1048576"),
    ("--max-host-buffer-bytes", "2000000T", "from 1 to 1152921504606846976"),
    ("--idle-timeout", "-1", "from 1 to 1e+07, or none"), ("--idle-timeout", "nan", "or none"),
    ("--idle-timeout", "1e-9", "from 1 to 1e+07")])
def test_a_bad_limit_is_refused_by_name_and_range(option, value, range_, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve", option, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: {value!r} is not " in err and range_ in err, err


def test_no_idle_timeout_is_spelled_none():
    from ifrtpy.cli import serve

    parser = argparse.ArgumentParser()
    serve.configure(parser)
    assert serve.limits_of(parser.parse_args(["--idle-timeout", "none"])) == {}
    assert serve.limits_of(parser.parse_args(["--idle-timeout", "30"])) == {
        "idle_timeout_s": 30.0}
