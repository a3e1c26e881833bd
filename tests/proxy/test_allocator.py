"""glibc's allocator in a process that moves large arrays through the proxy: the plugin
hook sets ``ifrtpy_jax_plugin.MALLOPT`` when jax runs through the proxy (and a jax
program runs right with it), ``python -m ifrtpy serve`` sets it too, ``IFRTPY_MALLOPT=0`` leaves glibc alone, and nothing is set
elsewhere (another C library, jax not through the proxy).

Each case runs in a fresh process and reads glibc's own account of its heap
(``malloc_info``): with the setting, a 64 MiB block comes from the heap rather than its
own mapping, stays in the heap once freed, and a new thread allocates from the one arena;
without it, glibc maps such a block on its own, and a thread gets an arena of its own."""

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

import ifrtpy_jax_plugin

GLIBC = platform.libc_ver()[0] == "glibc"
glibc_only = pytest.mark.skipif(not GLIBC, reason="mallopt and malloc_info are glibc's")

#: Generous: a bound on a hang, not a timing assertion.
HANG_S = 240

#: In a fresh process: ``setup``, then what glibc's heap does with a thread's first
#: allocation and with a 64 MiB block, as JSON.
PROBE = r"""
import ctypes, json, os, re, sys, tempfile, threading
{setup}
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p


def malloc_info():
    path = os.path.join(tempfile.mkdtemp(), "info.xml")
    stream = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    with open(path) as f:
        text = f.read()
    return {{"arenas": len(re.findall(r"<heap nr=", text)),
            "mapped blocks": int(re.findall(r'<total type="mmap" count="(\d+)"', text)[-1]),
            "heap bytes": int(re.findall(r'<system type="current" size="(\d+)"', text)[-1])}}


kept = []
thread = threading.Thread(target=lambda: kept.append(libc.malloc(1024)))
thread.start()
thread.join()
before = malloc_info()
block = libc.malloc(ctypes.c_size_t(64 << 20))
during = malloc_info()
libc.free(ctypes.c_void_p(block))
after = malloc_info()
print(json.dumps({{"arenas": during["arenas"],
                  "mapped on its own": during["mapped blocks"] - before["mapped blocks"],
                  "heap grew by": during["heap bytes"] - before["heap bytes"],
                  "given back once freed": during["heap bytes"] - after["heap bytes"],
                  "tuned": {tuned}}}))
"""

SET = {"arenas": 1, "mapped on its own": 0, "given back once freed": 0}
UNSET = {"mapped on its own": 1}


def probe(setup, tuned="None", **env):
    """The heap's answers in a fresh process running ``setup`` first."""
    return run_probe([sys.executable, "-c", PROBE.format(setup=setup, tuned=tuned)], **env)


def run_probe(argv, **env):
    """The JSON line the process ``argv`` prints last, its environment this one's without
    the allocator's variables, plus ``env``."""
    variables = {k: v for k, v in os.environ.items()
                 if k not in ("JAX_PLATFORMS", "JAX_BACKEND_TARGET", ifrtpy_jax_plugin.MALLOPT_VARIABLE)
                 and not k.startswith("MALLOC_")}
    variables.update(env)
    done = subprocess.run(argv, env=variables, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def assert_set(found):
    """One arena; the block came from the heap and stayed there once freed."""
    assert {k: found[k] for k in SET} == SET, found
    assert found["heap grew by"] > 0, found


def assert_unset(found):
    """glibc's defaults: the block mapped on its own, the thread's arena its own."""
    assert {k: found[k] for k in UNSET} == UNSET, found
    assert found["arenas"] >= 2, found


@glibc_only
def test_tune_allocator_sets_glibcs_parameters():
    found = probe("import ifrtpy_jax_plugin\nset_ = ifrtpy_jax_plugin.tune_allocator()",
                  tuned="set_")
    assert found["tuned"] == {name: value for name, _, value in ifrtpy_jax_plugin.MALLOPT}
    assert_set(found)


@glibc_only
def test_glibcs_own_behaviour_without_the_setting():
    assert_unset(probe(""))


@glibc_only
def test_the_plugin_sets_it_when_jax_runs_through_the_proxy():
    pytest.importorskip("jax")
    found = probe("import ifrtpy_jax_plugin\nifrtpy_jax_plugin.initialize()",
                  tuned="ifrtpy_jax_plugin.tune_allocator()", JAX_PLATFORMS="proxy",
                  JAX_BACKEND_TARGET="grpc://unix:/nonexistent/proxy.sock")
    assert found["tuned"]
    assert_set(found)


#: A jax program through the proxy: 16 MiB put and got back, then jit'd, with what the
#: plugin set in its process.
JAX_PROGRAM = """
import json, numpy as np, jax, ifrtpy_jax_plugin
x = np.arange(4 << 20, dtype=np.float32)
y = jax.device_put(x)
back = np.asarray(y)
z = np.asarray(jax.jit(lambda v: v * 2 + 1)(y))
print(json.dumps({"equal": bool((back == x).all() and (z == x * 2 + 1).all()),
                  "tuned": ifrtpy_jax_plugin.tune_allocator()}))
"""


@glibc_only
def test_jax_runs_through_the_proxy_with_the_setting():
    pytest.importorskip("jax")
    pytest.importorskip("grpc")
    import ifrtpy as ifrt
    from ifrtpy import proxy
    from ifrtpy.proxy.jax_client import jax_target

    env = {k: v for k, v in os.environ.items()
           if k != ifrtpy_jax_plugin.MALLOPT_VARIABLE and not k.startswith("MALLOC_")}
    with proxy.serve(ifrt.get_client("pjrt", device_count=1)) as server:
        env.update(JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=jax_target(server.address))
        done = subprocess.run([sys.executable, "-c", JAX_PROGRAM], env=env,
                              capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"equal": True,
                    "tuned": {name: value for name, _, value in ifrtpy_jax_plugin.MALLOPT}}


@glibc_only
def test_the_variable_turns_it_off():
    pytest.importorskip("jax")
    found = probe("import ifrtpy_jax_plugin\nifrtpy_jax_plugin.initialize()",
                  tuned="ifrtpy_jax_plugin.tune_allocator()", JAX_PLATFORMS="proxy",
                  JAX_BACKEND_TARGET="grpc://unix:/nonexistent/proxy.sock",
                  IFRTPY_MALLOPT="0")
    assert found["tuned"] == {}
    assert_unset(found)


@glibc_only
@pytest.mark.parametrize("platforms", ["", "cpu"])
def test_nothing_is_set_when_jax_does_not_run_through_the_proxy(platforms):
    found = probe("import ifrtpy_jax_plugin\nifrtpy_jax_plugin.initialize()",
                  JAX_PLATFORMS=platforms, JAX_BACKEND_TARGET="grpc://unix:/x/proxy.sock")
    assert_unset(found)


@glibc_only
@pytest.mark.parametrize("setting", ["", "0"])
def test_python_m_ifrtpy_serve_sets_it_as_it_starts(tmp_path, setting):
    """The server's process, probed where its backend is made (a factory that reports
    the heap and ends the process), with the setting and with ``IFRTPY_MALLOPT=0``."""
    pytest.importorskip("grpc")
    body = PROBE.format(setup="", tuned="None") + "sys.stdout.flush()\nos._exit(0)\n"
    (tmp_path / "heap_probe_backend.py").write_text(
        "def make(**options):\n" + textwrap.indent(body, "    "))
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    found = run_probe([sys.executable, "-m", "ifrtpy", "serve", "--backend",
                       "heap_probe_backend:make"], PYTHONPATH=path,
                      **({ifrtpy_jax_plugin.MALLOPT_VARIABLE: setting} if setting else {}))
    (assert_unset if setting == "0" else assert_set)(found)


def test_nothing_is_set_on_another_c_library(monkeypatch):
    def not_glibc(name):
        raise ValueError(f"unrecognized configuration name {name!r}")

    monkeypatch.setattr(os, "confstr", not_glibc)
    assert ifrtpy_jax_plugin._glibc() is None
    monkeypatch.setattr(ifrtpy_jax_plugin, "_tuned", None)
    assert ifrtpy_jax_plugin.tune_allocator() == {}
