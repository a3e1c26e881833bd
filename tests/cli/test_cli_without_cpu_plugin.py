"""``python -m ifrtpy info|demo|bench`` on a machine without a CPU plugin, as on a TPU
machine: ``info`` describes every plugin found, ``demo`` and ``bench`` run on the first
one or say what to install. CI has no TPU: the CPU builds are hidden from discovery
(tests/helpers/cli_without_cpu_build.py) and the CPU plugin's library stands in for
libtpu (``TPU_LIBRARY_PATH``)."""

import os
import subprocess
import sys

import ifrtpy as ifrt
from ifrtpy.cli import bench as _bench
from ifrtpy.cli.info import NO_CPU_PLUGIN
from ifrtpy.plugins import discovery as plugins

from plugin_env import CPU_SO

HELPER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers",
                      "cli_without_cpu_build.py")
RUNS_ON_TPU = ("{}: no CPU plugin is installed; running on the plugin 'tpu' (--plugin NAME "
               "picks another; found: tpu)")


def _cli(*args, **env):
    """The command line run as on a machine without a CPU build, ``env`` naming plugins."""
    clean = {k: v for k, v in os.environ.items() if k not in (plugins.ENV_VAR, plugins.TPU_ENV_VAR)}
    clean["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    return subprocess.run([sys.executable, HELPER, *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_info_describes_the_plugin_found_and_says_no_cpu_plugin_is_installed():
    proc = _cli("info", TPU_LIBRARY_PATH=CPU_SO)
    assert (proc.returncode, proc.stderr) == (0, "")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"ifrtpy   {ifrt.__version__} (Python ")
    version = "%d.%d" % ifrt.get_client("pjrt", plugin=CPU_SO).plugin.api_version
    assert lines[1:6] == [NO_CPU_PLUGIN, "", "tpu:", f"plugin   {CPU_SO}",
                          f"         PJRT API {version}, attributes " + lines[5].split(
                              "attributes ", 1)[1]]
    assert lines[6].startswith("platform cpu (") and lines[7] == "devices  2 (2 addressable)"
    assert lines[8:10] == [f"  {i}: CpuDevice(id={i}) kind='cpu' memories: device (default), "
                           "pinned_host, unpinned_host" for i in range(2)]
    assert lines[10:] == ["", "plugins  (by name: ifrtpy.get_client(name))",
                          f"  tpu: {CPU_SO} (from env:{plugins.TPU_ENV_VAR}, PJRT API {version})"]


def test_info_says_which_plugin_cannot_be_opened_and_describes_the_others(tmp_path):
    broken = tmp_path / "broken.so"
    broken.write_bytes(b"not a library")
    proc = _cli("info", TPU_LIBRARY_PATH=CPU_SO, **{plugins.ENV_VAR: f"mychip:{broken}"})
    assert (proc.returncode, proc.stderr) == (0, "")
    out = proc.stdout
    assert "\nmychip:\n  cannot be opened: " in out and "\ntpu:\nplugin   " in out
    assert out.index("mychip:") < out.index("tpu:")            # in search order


def test_info_without_any_plugin_says_so():
    proc = _cli("info")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines()[1:4] == [NO_CPU_PLUGIN, "",
                                             "plugins  (by name: ifrtpy.get_client(name))"]
    assert proc.stdout.splitlines()[4].startswith("  none found; looked in ")


def test_demo_runs_on_the_plugin_found():
    proc = _cli("demo", TPU_LIBRARY_PATH=CPU_SO)
    assert (proc.returncode, proc.stderr) == (0, RUNS_ON_TPU.format("demo") + "\n")
    assert f"plugin   {CPU_SO}\n" in proc.stdout
    assert "y[:, 0] = [1.0, 9.0, 17.0, 25.0]  (equals NumPy)" in proc.stdout


def test_bench_runs_on_the_plugin_found():
    proc = _cli("bench", "--quick", TPU_LIBRARY_PATH=CPU_SO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == RUNS_ON_TPU.format("bench")
    first, rest = proc.stdout.split("\n", 1)
    assert first.startswith("bench: 2 cpu devices (")  # what the environment gives the plugin
    assert rest.startswith("median time per call, 2 devices (--quick")


def test_demo_and_bench_without_any_plugin_say_what_to_install():
    for command in ("demo", "bench"):
        proc = _cli(command)
        assert (proc.returncode, proc.stdout) == (1, "")
        assert proc.stderr == (
            "error: NotFoundError: no PJRT plugin is installed: pip install xla-cpu-pjrt for "
            "the CPU, or an accelerator's (jax-cuda13-pjrt for 'cuda', jax-rocm7-pjrt for "
            "'rocm', libtpu for 'tpu') (--debug shows the traceback)\n")


class _OnPlatform:
    """A client that reports another platform, for what bench does on an accelerator."""

    def __init__(self, client, platform_name):
        self._client, self.platform_name = client, platform_name

    def __getattr__(self, name):
        return getattr(self._client, name)


def test_bench_on_an_accelerator_times_no_jax_column(capsys):
    client = _OnPlatform(ifrt.get_client("pjrt", device_count=2), "tpu")
    _bench.bench(client, quick=True)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].split() == ["operation", "ifrtpy", "jax", "ifrtpy/jax"]
    rows, notes = lines[2:10], lines[10:-1]  # 8 rows; a busy machine's "~:" note
    assert all(row.split()[-2:] == ["-", "-"] or row.split()[-3:] == ["-", "-", "~"]
               for row in rows), out
    assert all(note.startswith("~: ") for note in notes) and len(notes) <= 1, out
    assert lines[-1] == ("no jax column on tpu: benchmarks/accelerator_check.py "
                                    "--parts speed times jax and ifrtpy there, each in its own "
                                    "process")
