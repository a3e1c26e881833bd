"""Helpers of the tests that start jobs of several processes: a free loopback port, an
environment without the variables of the cluster the tests may run in, and the check
that a job left no process behind (``ps``, by a marker in the processes' environment,
which their children and the job's coordinator inherit)."""

import os
import socket
import subprocess
import time
import uuid
from typing import Any, Mapping

from ifrtpy.distributed import clusters

#: Prefixes of the variables cluster launchers set (removed from the tests' jobs).
LAUNCHER_PREFIXES = ("IFRTPY_", "SLURM_", "OMPI_", "PMIX_", "PRTE_", "JOB_COMPLETION_",
                     "KUBERNETES_")


def free_port(ports: range | None = None) -> int:
    """A TCP port free on 127.0.0.1 now: any, or the first free one of ``ports``."""
    for port in ports or [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise AssertionError(f"no free port in {ports}")


def job_environment(variables: Mapping[str, str] = {}, marker: str | None = None
                    ) -> tuple[dict[str, str], str]:
    """(this process's environment without any launcher's variables, with ``variables`` and
    the job's marker; the marker, new unless given), for a job whose processes are to be
    found by :func:`stray_processes`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCHER_PREFIXES) and k not in clusters.VARIABLES}
    marker = marker or uuid.uuid4().hex
    env.update(variables, IFRTPY_TEST_JOB=marker, TF_CPP_MIN_LOG_LEVEL="3")
    return env, marker


def use_environment(monkeypatch: Any, env: Mapping[str, str]) -> None:
    """Make ``env`` this process's environment for the test (``monkeypatch`` restores it)."""
    for name in list(os.environ):
        if name not in env:
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def stray_processes(marker: str) -> list[str]:
    """``ps`` lines (pid, state, command) of the live processes whose environment has the
    job's marker."""
    unmarked = {k: v for k, v in os.environ.items() if k != "IFRTPY_TEST_JOB"}
    out = subprocess.run(["ps", "axeww", "-o", "pid=,stat=,args="], capture_output=True,
                         text=True, timeout=30, check=True, env=unmarked).stdout
    return [line[:200] for line in out.splitlines()
            if f"IFRTPY_TEST_JOB={marker}" in line and line.split()[1][0] != "Z"]


def assert_no_stray_processes(marker: str, within_s: float = 10) -> None:
    """No process of the job is left running ``within_s`` seconds from now (a job's
    coordinator ends by itself once every process of the job is gone)."""
    deadline = time.monotonic() + within_s
    while (left := stray_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left running: {left}"


def lines_until(stream: Any, count: int, word: Any) -> list[Any]:
    """Lines read from ``stream`` until ``count`` of them hold ``word``; fails at its end."""
    lines = []
    while sum(word in line for line in lines) < count:
        line = stream.readline()
        assert line, f"the output ended before {count} lines with {word!r}: {lines}"
        lines.append(line)
    return lines
