"""Quiet by default: nothing on the process's stderr unless asked for (docs/logging.md).

Each case runs a fresh interpreter (the plugin and jaxlib read their threshold once, when
loaded) that creates a client, compiles ``tanh(x @ w)`` and an SPMD program, runs both, and
imports jax; the test reads what the child wrote to file descriptor 2.
"""

import logging
import os
import re
import subprocess
import sys

import pytest

import ifrtpy
from ifrtpy.cli.demo import DEMO_PROGRAM
from ifrtpy._log import _native_level
from ifrtpy.errors import InvalidArgumentError

SCRIPT = f"""
import sys
import numpy as np
import ifrtpy as ifrt
from ifrtpy.builder import Builder
if len(sys.argv) > 1:
    ifrt.set_log_level(sys.argv[1])
client = ifrt.get_client("pjrt", device_count=8)
b = Builder("dot_tanh")
x, w = b.parameter((4, 8), np.float32), b.parameter((8, 16), np.float32)
exe = client.compile(b.build(b.tanh(b.dot(x, w))), ifrt.CompileOptions())
dev = client.devices()[0]
out, = exe(ifrt.device_put(np.ones((4, 8), np.float32), dev), ifrt.device_put(np.ones((8, 16), np.float32), dev))
np.testing.assert_allclose(np.asarray(out), np.tanh(np.full((4, 16), 8.0)), rtol=1e-6)
devs = client.devices()
spmd = client.compile(ifrt.HloProgram('''{DEMO_PROGRAM.format(rows=16, n=8)}'''),
                      ifrt.CompileOptions(devices=devs, num_partitions=8))
mesh = ifrt.Mesh(np.array(devs), ("x",))
a = client.make_array_from_host_buffer(np.ones((16, 4), np.float32),
                                       ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x")))
y, = spmd(a)
np.testing.assert_array_equal(np.asarray(y), np.full((16, 4), 3.0))
try:
    import jax
except ImportError:
    pass
else:
    jax.jit(lambda v: v + 1)(np.ones(3, np.float32)).block_until_ready()
print("done")
"""

NATIVE_LINE = re.compile(r"^([IWE])\d{4} ", re.M)


def run_child(*args, jax_first=False, **env):
    """The script's stderr, in a fresh interpreter (``jax_first``: importing jax first, as
    jax users do; jax then sets TF_CPP_MIN_LOG_LEVEL=1 before ifrtpy is imported)."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TF_CPP_MIN_LOG_LEVEL", "IFRTPY_LOG_LEVEL")}
    environ.update(env)
    script = ("import jax\n" if jax_first else "") + SCRIPT
    proc = subprocess.run([sys.executable, "-c", script, *args], env=environ,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    return proc.stderr


def test_nothing_on_stderr_by_default():
    assert run_child() == ""


@pytest.mark.parametrize("how", ["env", "call"])
def test_info_brings_the_plugin_lines_back(how):
    err = run_child(IFRTPY_LOG_LEVEL="info") if how == "env" else run_child("info")
    kinds = set(NATIVE_LINE.findall(err))
    assert "I" in kinds, err          # e.g. "cpu_device_count set via create_options: 8"
    assert kinds & {"W", "E"}, err    # the compiler's warnings and errors are back too


def test_warning_hides_info_lines_only():
    err = run_child(IFRTPY_LOG_LEVEL="warning")
    kinds = set(NATIVE_LINE.findall(err))
    assert "I" not in kinds and kinds & {"W", "E"}, err


def test_an_unreadable_switch_is_reported_once_and_ignored():
    err = run_child(IFRTPY_LOG_LEVEL="loud")
    assert err == ("IFRTPY_LOG_LEVEL must be one of debug, info, warning, error, critical (or a "
                   "logging level number), got 'loud'; ignored\n")


def test_nothing_on_stderr_with_jax_imported_first():
    pytest.importorskip("jax")
    assert run_child(jax_first=True) == ""


def test_the_users_own_threshold_is_kept():
    err = run_child(TF_CPP_MIN_LOG_LEVEL="0")
    assert "I" in set(NATIVE_LINE.findall(err)), err
    # jax's default is no reason to override a 1 the user set before starting Python
    pytest.importorskip("jax")
    err = run_child(jax_first=True, TF_CPP_MIN_LOG_LEVEL="1")
    # threshold 1 shows warnings and errors (which of them a program logs depends on the
    # plugin build: the official one logs an error, newer ones a GSPMD warning)
    assert set(NATIVE_LINE.findall(err)) & {"W", "E"}, err


def test_set_log_level_sets_logger_and_native_threshold(monkeypatch):
    logger = logging.getLogger("ifrtpy")
    monkeypatch.setattr(logger, "level", logger.level)  # restored after the test
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    for level, number, native in [("debug", 10, "0"), ("INFO", 20, "0"), (logging.WARNING, 30, "1"),
                                  ("error", 40, "2"), ("critical", 50, "3"), ("25", 25, "0"),
                                  (35, 35, "1")]:
        ifrtpy.set_log_level(level)
        assert (logger.level, os.environ["TF_CPP_MIN_LOG_LEVEL"]) == (number, native)
    assert [_native_level(n) for n in (5, 10, 20, 30, 40, 50, 60)] == [0, 0, 0, 1, 2, 3, 3]


@pytest.mark.parametrize("bad", ["loud", "", 1.5, None, True])
def test_set_log_level_refuses_unknown_levels(bad):
    with pytest.raises(InvalidArgumentError, match="level"):
        ifrtpy.set_log_level(bad)
