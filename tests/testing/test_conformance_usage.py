"""The conformance suite as a user runs it: without a backend it stops with one message saying
how to pick one; the runs the docs give are green as written."""

import os
import pathlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("plugin_flag", [[], ["-p", "ifrtpy.testing.conformance.plugin"]])
def test_no_backend_gives_one_usage_error(plugin_flag, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_flag,
         "--pyargs", "ifrtpy.testing.conformance"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert out.count("needs a backend") == 1, out
    assert "--ifrtpy-backend=NAME" in out and "-p ifrtpy.testing.conformance.plugin" in out
    assert out.count("ERROR") == 1 and " passed" not in out


#: The runs the docs give (docs/implementing-a-backend.md, docs/troubleshooting.md,
#: ifrtpy.testing.example_backend), as written: each backend's shipped declaration
#: makes them green, from a directory outside the checkout (the package as installed).
DOCUMENTED_RUNS = {
    "reference": ["-p", "ifrtpy.testing.conformance.plugin", "--pyargs",
                  "ifrtpy.testing.conformance", "--ifrtpy-backend=reference"],
    "reference by path": ["ifrtpy/testing/conformance", "--ifrtpy-backend=reference"],
    "pjrt": ["-p", "ifrtpy.testing.conformance.plugin", "--pyargs",
             "ifrtpy.testing.conformance", "--ifrtpy-backend=pjrt"],
    "example": ["-p", "ifrtpy.testing.conformance.plugin", "--pyargs",
                "ifrtpy.testing.conformance",
                "--ifrtpy-backend=ifrtpy.testing.example_backend:create_client"],
    "example, core cases": ["-p", "ifrtpy.testing.conformance.plugin", "--pyargs",
                            "ifrtpy.testing.conformance", "--ifrtpy-core-only",
                            "--ifrtpy-backend=ifrtpy.testing.example_backend:create_client"],
}


@pytest.mark.parametrize("run", list(DOCUMENTED_RUNS))
def test_the_documented_runs_are_green(run, tmp_path):
    """Each documented command passes without a declaration on its command line (it
    failed for ifrtpy's own backends while their declarations lived in tests/). The run by
    path runs where the package is (the checkout's root, or site-packages)."""
    import ifrtpy

    args = DOCUMENTED_RUNS[run]
    cwd = pathlib.Path(ifrtpy.__file__).resolve().parents[1] if "by path" in run else tmp_path
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTEST_ADDOPTS")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd, capture_output=True, text=True, timeout=900, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.OK, out[-4000:]
    assert " passed" in out and " failed" not in out, out[-4000:]
