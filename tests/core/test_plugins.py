"""Plugins by name: discovery from each source, clients by name, typed create options."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy import _pjrt, errors
from ifrtpy.plugins import discovery as plugins
from ifrtpy.plugins.options import MAX_CPU_DEVICE_COUNT, check_options

CPU_SO = os.path.realpath(_pjrt.default_plugin_path())


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    return monkeypatch


def _dist(root, name, entry_points):
    """A minimal installed distribution under ``root`` declaring ``entry_points``."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.mark.parametrize("module, name", [
    ("xla_cuda12", "cuda"), ("xla_cuda13", "cuda"), ("xla_cpu_pjrt", "cpu"),
    ("jax_plugins.xla_rocm7", "rocm"), ("pjrt_tpu_plugin", "tpu"), ("mychip", "mychip"),
])
def test_plugin_name_of_a_package(module, name):
    assert plugins._plugin_name(module) == name


def test_xla_plugins_package_is_found_as_cpu(clean_env):
    info = plugins.find_plugin("cpu")
    assert os.path.realpath(info.path) == CPU_SO
    assert info.source == "xla_plugins:xla_cpu_pjrt"


def test_env_var_names_the_cpu_plugin_under_another_name(clean_env):
    clean_env.setenv(plugins.ENV_VAR, f"other:/nonexistent.so, mycpu:{CPU_SO}")
    found = {i.name: i for i in ifrt.available_plugins()}
    assert found["mycpu"].path == CPU_SO
    assert found["mycpu"].source == f"env:{plugins.ENV_VAR}"
    client = ifrt.get_client("mycpu", device_count=2)
    assert client.platform_name == "cpu" and len(client.devices()) == 2
    # A name in the variable comes before the same name found in a package.
    clean_env.setenv(plugins.ENV_VAR, "cpu:/nonexistent/elsewhere.so")
    assert plugins.find_plugin("cpu").path == "/nonexistent/elsewhere.so"
    with pytest.raises(errors.NotFoundError, match="elsewhere.so"):
        ifrt.get_client("cpu")


def test_jax_plugins_namespace_package_and_entry_point(clean_env, tmp_path):
    package = tmp_path / "jax_plugins" / "xla_fakechip7"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('discovery must not import me')\n")
    (package / "xla_fakechip_plugin.so").symlink_to(CPU_SO)
    _dist(tmp_path, "fakechip_pjrt", "[jax_plugins]\nxla_fakechip7 = jax_plugins.xla_fakechip7\n")
    clean_env.syspath_prepend(str(tmp_path))
    sources = [i.source for i in ifrt.available_plugins() if i.name == "fakechip"]
    assert sources == ["jax_plugins:xla_fakechip7", "entry point jax_plugins:xla_fakechip7"]
    client = ifrt.get_client("fakechip", device_count=1)
    assert client.platform_name == "cpu"


def test_ifrtpy_entry_point_group(clean_env, tmp_path):
    (tmp_path / "thirdparty_plugin.py").write_text(
        f"def library_path():\n    return {CPU_SO!r}\n")
    _dist(tmp_path, "thirdparty", f"[{plugins.ENTRY_POINT_GROUP}]\n"
          "thirdcpu = thirdparty_plugin:library_path\n")
    clean_env.syspath_prepend(str(tmp_path))
    info = plugins.find_plugin("thirdcpu")
    assert (info.path, info.source) == (CPU_SO, f"entry point {plugins.ENTRY_POINT_GROUP}:thirdcpu")
    assert len(ifrt.get_client("thirdcpu", device_count=3).devices()) == 3


def test_api_version_is_reported_once_loaded(clean_env):
    ifrt.get_client("cpu")
    (info,) = [i for i in ifrt.available_plugins() if i.name == "cpu"]
    assert info.api_version == _pjrt.load_plugin().api_version
    assert "PJRT API 0." in plugins.plugins_report()


def test_two_cpu_clients_side_by_side(clean_env):
    clean_env.setenv(plugins.ENV_VAR, f"mycpu:{CPU_SO}")
    a_client = ifrt.get_client("cpu", cpu_device_count=2)
    b_client = ifrt.get_client("mycpu", device_count=3)
    assert a_client.plugin is b_client.plugin
    x = np.arange(6, dtype=np.float32)
    a = ifrt.device_put(x, a_client.devices()[1])
    b = ifrt.device_put(x * 2, b_client.devices()[2])
    np.testing.assert_array_equal(np.asarray(a) + np.asarray(b), x * 3)
    assert a.sharding.devices[0].client is a_client and b.sharding.devices[0].client is b_client


def test_unknown_name_lists_found_plugins_and_places_looked(clean_env):
    with pytest.raises(errors.NotFoundError) as e:
        ifrt.get_client("nosuchchip")
    message = str(e.value)
    for text in ("'nosuchchip'", "pjrt, reference", "'cpu'", CPU_SO.rsplit("/", 1)[1],
                 plugins.ENV_VAR, "jax_plugins", "xla_plugins", plugins.ENTRY_POINT_GROUP):
        assert text in message


def test_explicit_path_comes_first(clean_env):
    clean_env.setenv(plugins.ENV_VAR, "cpu:/nonexistent.so")
    client = ifrt.get_client("cpu", plugin=CPU_SO, device_count=1)
    assert len(client.devices()) == 1
    client = ifrt.get_client("pjrt", plugin=CPU_SO)
    assert client.platform_name == "cpu"


def test_pjrt_backend_takes_a_plugin_name(clean_env):
    assert ifrt.get_client("pjrt", plugin="cpu", device_count=2).device_count() == 2


# -- typed options ---------------------------------------------------------------------------

@pytest.mark.parametrize("plugin, options, match", [
    ("cpu", {"bogus": 1}, "known options: asynchronous, cpu_device_count"),
    ("cpu", {"cpu_device_count": "8"}, "must be of type int, got str '8'"),
    ("cpu", {"cpu_device_count": True}, "must be of type int, got bool"),
    ("cpu", {"cpu_device_count": 0}, r"must be in \[1, 4096\] \(creating a CPU .* quadratic.*got 0"),
    ("cpu", {"asynchronous": 1}, "must be of type bool"),
    ("cuda", {"memory_fraction": 1.5}, r"must be in \[0.0, 1.0\]"),
    ("cuda", {"memory_fraction": "0.5"}, "must be of type float"),
    ("cuda", {"visible_devices": 0}, "must be of type int_list"),
    ("cuda", {"visible_devices": [0, 0]}, "must not repeat"),
    ("cuda", {"allocator": "magic"}, "must be one of 'default', 'platform', 'bfc'"),
    ("cuda", {"preallocate": "no"}, "must be of type bool"),
    ("cuda", {"num_nodes": 0}, "must be in"),
    ("rocm", {"cpu_device_count": 2}, "has no create option 'cpu_device_count'"),
])
def test_bad_options_are_refused_naming_the_option(plugin, options, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        check_options(plugin, options)


def test_good_options_are_normalised():
    assert check_options("cuda", {"memory_fraction": 1, "visible_devices": (0, 1),
                                  "preallocate": False, "allocator": "bfc"}) == {
        "memory_fraction": 1.0, "visible_devices": [0, 1], "preallocate": False,
        "allocator": "bfc"}
    assert check_options("unknownchip", {"anything": object}) == {"anything": object}


def test_cpu_options_reach_the_plugin(clean_env):
    client = ifrt.get_client("cpu", cpu_device_count=5)
    assert client.device_count() == 5
    with pytest.raises(errors.InvalidArgumentError, match="'cpu' plugin has no create option"):
        ifrt.get_client("cpu", num_nodes=2)


def test_device_count_over_the_limit_is_refused_quickly():
    # The reliability reproducer: 10**6 devices used to run for minutes eating memory.
    script = textwrap.dedent("""
        import ifrtpy as ifrt
        try:
            ifrt.get_client("pjrt", device_count=10**6)
        except ifrt.errors.InvalidArgumentError as e:
            print("refused:", e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"'cpu_device_count' of the 'cpu' plugin must be in [1, {MAX_CPU_DEVICE_COUNT}]" \
        in out.stdout
    assert "quadratic" in out.stdout and "got 1000000" in out.stdout


def test_device_count_limit_also_guards_the_cython_layer():
    with pytest.raises(errors.InvalidArgumentError, match=f"quadratic.*got {MAX_CPU_DEVICE_COUNT + 1}"):
        _pjrt.create_client(_pjrt.load_plugin(), {"cpu_device_count": MAX_CPU_DEVICE_COUNT + 1})


def test_a_package_installed_later_is_found(clean_env, tmp_path):
    clean_env.syspath_prepend(str(tmp_path))
    with pytest.raises(errors.NotFoundError):
        plugins.find_plugin("latechip")          # searched (and cached) without it
    time.sleep(0.05)                              # a later modification time on any file system
    package = tmp_path / "xla_plugins" / "xla_latechip_pjrt"
    package.mkdir(parents=True)
    (package / "xla_latechip_pjrt.so").symlink_to(CPU_SO)
    assert plugins.find_plugin("latechip").source == "xla_plugins:xla_latechip_pjrt"
