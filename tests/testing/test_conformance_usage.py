"""The conformance suite run without a backend stops with one message saying how to pick one."""

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
