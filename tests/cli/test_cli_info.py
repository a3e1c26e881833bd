"""``python -m ifrtpy info``: each plugin named once, a plugin by name without a CPU build
(tests/cli/test_cli_without_cpu_plugin.py: ``info`` without ``--plugin`` there)."""

import ifrtpy as ifrt
from ifrtpy.__main__ import main
from ifrtpy.plugins import discovery as plugins

from plugin_env import CPU_SO, clean_env, no_cpu_build  # noqa: F401  (fixtures)


def _plugin_lines(out):
    lines = out.splitlines()
    return lines[lines.index("plugins  (by name: ifrtpy.get_client(name))") + 1:]


def test_info_names_each_plugin_once(clean_env, capsys):
    cpus = [i for i in ifrt.available_plugins() if i.name == "cpu"]
    assert len(cpus) == 2          # the default build, and xla-cpu-pjrt's xla_plugins package
    assert main(["info", "--devices", "1"]) == 0
    lines = _plugin_lines(capsys.readouterr().out)
    named = [line.split(":")[0].strip() for line in lines if not line.startswith("    ")]
    assert len(named) == len(set(named)) and "cpu" in named
    at = lines.index(next(line for line in lines if line.startswith("  cpu: ")))
    assert lines[at].startswith(f"  cpu: {cpus[0].path} (from {cpus[0].source}, PJRT API 0.")
    assert lines[at + 1] == f"    also at (not picked): {cpus[1].path} (from {cpus[1].source})"


def test_info_describes_a_plugin_by_name_without_a_cpu_build(no_cpu_build, capsys):
    no_cpu_build.setenv(plugins.ENV_VAR, f"tpu:{CPU_SO}")    # a library called tpu
    version = "%d.%d" % ifrt.get_client("pjrt", plugin=CPU_SO).plugin.api_version
    assert main(["info", "--plugin", "tpu", "--devices", "2"]) == 0
    out = capsys.readouterr().out
    assert f"plugin   {CPU_SO}\n" in out and "devices  2 (2 addressable)" in out
    lines = _plugin_lines(out)
    assert f"  tpu: {CPU_SO} (from env:{plugins.ENV_VAR}, PJRT API {version})" in lines
    assert not [line for line in lines if line.startswith(("  cpu: ", "  xla-cpu-pjrt: "))]
