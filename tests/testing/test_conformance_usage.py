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


PLUGIN_RUN = ["-p", "no:cacheprovider", "-p", "ifrtpy.testing.conformance.plugin", "--pyargs",
              "ifrtpy.testing.conformance"]


@pytest.mark.parametrize("backend, message", [
    ("no_such_package.backend:create_client",
     "the client factory cannot be imported: ModuleNotFoundError: No module named "
     "'no_such_package'"),
    ("ifrtpy.testing.example_backend:no_such_function",
     "the client factory cannot be imported: AttributeError"),
    ("ifrtpy.testing.example_backend:EXPECTED_SKIPS", "EXPECTED_SKIPS is a dict, not a client factory"),
    ("no_such_backend", "get_client knows no backend of that name (it knows jax, pjrt, reference)"),
], ids=["module", "function", "not callable", "name"])
def test_a_backend_that_cannot_be_made_is_one_usage_error(backend, message, tmp_path):
    """Before any case runs, one line (not an error and a traceback for each case)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", *PLUGIN_RUN,
                           f"--ifrtpy-backend={backend}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    assert f"--ifrtpy-backend={backend}: {message}" in out, out[-3000:]
    assert len(out.strip().splitlines()) <= 3, out[-3000:]


#: Runs pytest as though hypothesis were not installed (its import finds no module).
WITHOUT_HYPOTHESIS = """
import sys
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hypothesis":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NotInstalled())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_a_missing_test_tool_names_itself_and_the_extra(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WITHOUT_HYPOTHESIS, "-q", *PLUGIN_RUN,
                           "--ifrtpy-backend=reference"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert ("the ifrtpy conformance suite needs hypothesis, which is not installed: pip "
            'install pytest hypothesis (from a checkout: pip install -e ".[conformance]")') in out, out
    assert len(out.strip().splitlines()) <= 6, out
