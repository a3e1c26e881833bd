"""jax reaches the IFRT Proxy server unchanged: the ``jax_plugins`` entry point
(``ifrtpy_jax_plugin``) registers the ``proxy`` backend only when JAX_PLATFORMS and
JAX_BACKEND_TARGET ask for it, importing nothing otherwise; ``connect_jax`` does the same
from code."""

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("grpc")
pytest.importorskip("jax")

import ifrtpy_jax_plugin  # noqa: E402

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError  # noqa: E402
from ifrtpy.proxy.jax_client import connect_jax, jax_target  # noqa: E402

#: Generous: a bound on a hang, not a timing assertion (a jax process starts in seconds).
HANG_S = 240

#: Top-level packages the plugin hook must not import when it has nothing to do.
HEAVY = ("jax", "jaxlib", "ifrtpy", "numpy", "grpc", "google")

#: Run in a jax process: a program through whatever backend jax chose, and what it saw.
JAX_PROGRAM = """
import json, os, sys
{setup}
import jax, jax.extend.backend, jax.numpy as jnp
y = jnp.arange(4) + 1
print(json.dumps({{"y": y.tolist(), "devices": jax.device_count(),
                  "runtime": jax.extend.backend.get_backend().runtime_type,
                  "insecure": os.environ.get("IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS")}}))
"""


@pytest.fixture(scope="module")
def server():
    with proxy.serve(ifrt.get_client("pjrt", device_count=3)) as running:
        yield running


def clean_env(**variables):
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_PLATFORMS", "JAX_BACKEND_TARGET",
                        "IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS",
                        ifrtpy_jax_plugin.TRANSFER_DIRECTORY,
                        ifrtpy_jax_plugin.TRANSFER_THRESHOLD)}
    env.update(variables)
    return env


def run_python(code, env):
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_entry_point_names_the_plugin_module():
    names = {e.name: e.value for e in importlib.metadata.entry_points(group="jax_plugins")}
    assert names.get("ifrtpy_proxy") == "ifrtpy_jax_plugin"


@pytest.mark.parametrize("variables", [
    {},
    {"JAX_PLATFORMS": "proxy"},                                  # no target
    {"JAX_BACKEND_TARGET": "grpc://127.0.0.1:1"},                # proxy not asked for
    {"JAX_PLATFORMS": "cpu", "JAX_BACKEND_TARGET": "grpc://127.0.0.1:1"},
])
def test_without_both_variables_the_hook_imports_and_sets_nothing(variables):
    code = (f"import json, os, sys, ifrtpy_jax_plugin; ifrtpy_jax_plugin.initialize(); "
            f"print(json.dumps([sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}), "
            f"os.environ.get('IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS')]))")
    assert run_python(code, clean_env(**variables)) == [[], None]


def test_the_variables_run_an_unchanged_jax_program_on_the_server(server):
    target = jax_target(server.address)
    seen = run_python(JAX_PROGRAM.format(setup=""),
                      clean_env(JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=target))
    assert seen["y"] == [1, 2, 3, 4]
    assert seen["devices"] == 3                                  # the server's, not jax's CPU
    assert seen["runtime"].startswith("proxy")
    assert seen["insecure"] == "true"                            # a loopback target


def test_large_puts_go_through_the_servers_shared_directory(server, monkeypatch):
    # the plugin makes this process a directory of its own in the local server's private
    # one and names it to the server: a put of 1 MiB or more is left there as a file, which
    # the server reads and removes
    from ifrtpy.proxy import local

    read = []
    original = local.read_put_file
    # (the server reads through its descriptor of the directory: where that is, is asked now)
    monkeypatch.setattr(local, "read_put_file", lambda path, size: read.append(
        (os.path.realpath(path), size)) or original(path, size))
    code = """
import json, os, jax, numpy as np
x = np.random.default_rng(1).random((1024, 1024), dtype=np.float32)
small = np.arange(10.0, dtype=np.float32)
print(json.dumps({"same": bool((np.asarray(jax.device_put(x) * 2) == x * 2).all()),
                  "small": np.asarray(jax.device_put(small)).tolist(),
                  "directory": os.environ["IFRT_PROXY_GRPC_LARGE_TRANSFER_OPTIMIZATION_DIRECTORY"]}))
"""
    seen = run_python(code, clean_env(JAX_PLATFORMS="proxy",
                                      JAX_BACKEND_TARGET=jax_target(server.address)))
    directory = seen.pop("directory")
    assert seen == {"same": True, "small": list(range(10))}
    assert [size for _, size in read] == [4 << 20]  # the small put went over gRPC
    assert os.path.dirname(read[0][0]) == directory
    assert os.path.dirname(directory) == ifrtpy_jax_plugin.shared_directory(server.address)
    assert not os.path.exists(directory)  # the client is gone: so is its directory


def test_connect_jax_does_the_same_from_code(server):
    setup = f"import ifrtpy.proxy; ifrtpy.proxy.connect_jax({server.address!r})"
    seen = run_python(JAX_PROGRAM.format(setup=setup), clean_env(JAX_PLATFORMS="cpu"))
    assert (seen["y"], seen["devices"], seen["insecure"]) == ([1, 2, 3, 4], 3, "true")
    assert seen["runtime"].startswith("proxy")


def test_connect_jax_after_jax_started_its_backends_is_refused():
    import jax

    jax.devices()
    with pytest.raises(FailedPreconditionError, match="already started its backends"):
        connect_jax("127.0.0.1:1")


@pytest.mark.parametrize("address, target", [
    ("127.0.0.1:5000", "grpc://127.0.0.1:5000"),
    ("grpc://127.0.0.1:5000", "grpc://127.0.0.1:5000"),
    ("unix:/tmp/s.sock", "grpc://unix:/tmp/s.sock"),
])
def test_jax_target(address, target):
    assert jax_target(address) == target


@pytest.mark.parametrize("address", ["", "grpc://", None, 5000])
def test_jax_target_refuses_what_is_no_address(address):
    with pytest.raises(InvalidArgumentError, match="an IFRT Proxy address is"):
        jax_target(address)


@pytest.mark.parametrize("target, local", [
    ("grpc://127.0.0.1:5000", True), ("127.0.0.2:1", True), ("grpc://localhost:1", True),
    ("grpc://[::1]:5000", True), ("grpc://unix:/tmp/s.sock", True), ("unix:relative.sock", True),
    ("grpc://0.0.0.0:5000", False), ("10.1.2.3:5000", False), ("grpc://example.com:1", False),
    ("[2001:db8::1]:5000", False),
])
def test_only_loopback_and_unix_targets_are_local(target, local):
    assert ifrtpy_jax_plugin.is_local(target) is local
