"""A jax process on the proxy backend is as quiet as ifrtpy: jaxlib's proxy client writes
nothing to stderr by default (it logs two credential warnings and a stack trace at exit
otherwise), and ``IFRTPY_LOG_LEVEL`` brings its lines back."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("grpc")
pytest.importorskip("jax")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402
from ifrtpy.proxy.jax_client import jax_target  # noqa: E402

HANG_S = 240  # a bound on a hang, not a timing assertion

PROGRAM = "import jax, jax.numpy as jnp; print((jnp.arange(4) + 1).tolist())"


@pytest.fixture(scope="module")
def target():
    with proxy.serve(ifrt.get_client("pjrt", device_count=1)) as running:
        yield jax_target(running.address)


def run_jax(target, **variables):
    env = {k: v for k, v in os.environ.items()
           if k not in ("IFRTPY_LOG_LEVEL", "TF_CPP_MIN_LOG_LEVEL")}
    env.update(JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=target, **variables)
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                          text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[1, 2, 3, 4]", done.stdout
    return done.stderr


def test_a_jax_process_on_the_proxy_writes_nothing_to_stderr(target):
    assert run_jax(target) == ""


def test_ifrtpy_log_level_shows_the_clients_lines(target):
    assert "insecure client credentials" in run_jax(target, IFRTPY_LOG_LEVEL="warning")
