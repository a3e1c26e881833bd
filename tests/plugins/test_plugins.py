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
from ifrtpy.plugins import builds
from ifrtpy.plugins import discovery as plugins
from ifrtpy.plugins.options import MAX_CPU_DEVICE_COUNT, check_cpu_device_count, check_options
from ifrtpy.plugins.builds import default_cpu_library

CPU_SO = os.path.realpath(default_cpu_library())


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


def test_cpu_is_the_default_build(clean_env):
    info = plugins.find_plugin("cpu")
    assert os.path.realpath(info.path) == CPU_SO
    installed = dict(builds.installed_builds())
    default = next(b for b in builds.DEFAULT_ORDER if b in installed)
    assert info.source == f"the default CPU build {default.name}"
    assert builds.build_at(info.path) is default


def test_each_installed_build_is_found_by_its_name(clean_env):
    installed = builds.installed_builds()
    assert builds.OFFICIAL in dict(installed)  # a dependency on every platform
    for build, path in installed:
        info = plugins.find_plugin(build.name)
        assert info.path == path and builds.build_at(path) is build
    client = ifrt.get_client("xla-cpu-pjrt", device_count=2)
    assert client.plugin.api_version == (0, 81) and client.device_count() == 2


def test_the_default_is_the_first_build_of_the_order_installed(clean_env, tmp_path):
    """A directory first on sys.path holding only the official build's layout: the
    default falls back to it when the preferred build is not there."""
    official = dict(builds.installed_builds())[builds.OFFICIAL]
    for build in builds.DEFAULT_ORDER:
        directory = tmp_path.joinpath(*build.package.split("."))
        directory.mkdir(parents=True)
        (directory / build.library).symlink_to(official)
    clean_env.setattr(sys, "path", [str(tmp_path)] + [
        p for p in sys.path if not any(
            os.path.isdir(os.path.join(p or ".", *b.package.split("."))) for b in builds.CPU_BUILDS)])
    first = builds.DEFAULT_ORDER[0]
    assert builds.default_cpu_library() == str(tmp_path.joinpath(*first.package.split("."), first.library))
    (tmp_path.joinpath(*first.package.split(".")) / first.library).unlink()
    second = builds.DEFAULT_ORDER[1]
    assert builds.default_cpu_library() == str(tmp_path.joinpath(*second.package.split("."), second.library))
    assert plugins.find_plugin("cpu").source == f"the default CPU build {second.name}"
    (tmp_path.joinpath(*second.package.split(".")) / second.library).unlink()
    with pytest.raises(errors.NotFoundError, match="pip install xla-cpu-pjrt"):
        builds.default_cpu_library()


def test_a_build_is_recognised_by_its_library_whatever_its_name(clean_env, tmp_path):
    assert builds.build_at(CPU_SO) is builds.build_at(plugins.find_plugin("cpu").path)
    assert builds.build_at("/elsewhere/libpjrt_cpu.so") is None
    link = tmp_path / "renamed.so"
    link.symlink_to(CPU_SO)
    assert builds.build_at(str(link)) is builds.build_at(CPU_SO)


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
    info = next(i for i in ifrt.available_plugins() if i.name == "cpu")  # the one picked
    assert info.api_version == _pjrt.load_plugin(default_cpu_library()).api_version
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
    ("cpu", {"bogus": 1}, "known options: cpu_device_count$"),
    ("cpu", {"asynchronous": False}, "has no create option 'asynchronous'"),
    ("xla-cpu-pjrt", {"max_inflight_computations": 2}, "has no create option"),
    ("lammps-jax-pjrt-cpu", {"bogus": 1}, "known options: asynchronous, cpu_device_count, process_id$"),
    ("lammps-jax-pjrt-cpu", {"process_id": -1}, "must be in"),
    ("cpu", {"cpu_device_count": "8"}, "must be of type int, got str '8'"),
    ("cpu", {"cpu_device_count": True}, "must be of type int, got bool"),
    ("cpu", {"cpu_device_count": 0}, r"must be in \[1, 4096\] \(a client needs a device\), got 0"),
    ("lammps-jax-pjrt-cpu", {"asynchronous": 1}, "must be of type bool"),
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
    default = builds.build_at(CPU_SO).name
    with pytest.raises(errors.InvalidArgumentError, match=f"'{default}' plugin has no create option"):
        ifrt.get_client("cpu", num_nodes=2)


def test_a_known_build_gets_its_own_table_by_path(clean_env):
    """By path, with no name: the build's table still applies (the official build would
    ignore the option silently)."""
    official = dict(builds.installed_builds())[builds.OFFICIAL]
    with pytest.raises(errors.InvalidArgumentError, match="'xla-cpu-pjrt' plugin has no create option 'asynchronous'"):
        ifrt.get_client("pjrt", plugin=official, asynchronous=False)


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
    default = builds.build_at(CPU_SO).name
    assert f"'cpu_device_count' of the '{default}' plugin must be in [1, {MAX_CPU_DEVICE_COUNT}]" \
        in out.stdout
    assert "quadratic" in out.stdout and "got 1000000" in out.stdout


def test_string_device_count_is_refused_and_the_process_lives():
    # The plugin aborts (std::bad_variant_access) when it gets this option as a string.
    script = textwrap.dedent("""
        import ifrtpy as ifrt
        for plugin in (None, ifrt.plugins.builds.default_cpu_library()):
            try:
                ifrt.get_client("pjrt", plugin=plugin, cpu_device_count="8")
            except ifrt.errors.InvalidArgumentError as e:
                print("refused:", e)
        print(len(ifrt.get_client("pjrt", device_count=2).devices()), "alive")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("refused:") == 2 and "2 alive" in out.stdout, out.stdout


def test_device_count_limit_guards_plugins_without_a_table():
    # The PjRt backend applies it to every plugin it creates a client of, known or not.
    check_cpu_device_count({"cpu_device_count": MAX_CPU_DEVICE_COUNT})
    check_cpu_device_count({"cpu_device_count": 1})
    check_cpu_device_count({"other": "x"})
    with pytest.raises(errors.InvalidArgumentError, match=f"quadratic.*got {MAX_CPU_DEVICE_COUNT + 1}"):
        check_cpu_device_count({"cpu_device_count": MAX_CPU_DEVICE_COUNT + 1})


@pytest.mark.parametrize("value", ["8", 8.0, True, False, None, [8]], ids=repr)
def test_device_count_of_another_type_is_refused(value):
    # An XLA CPU plugin aborts the process (std::bad_variant_access) on any but an int64.
    with pytest.raises(errors.InvalidArgumentError,
                       match=f"'cpu_device_count' must be an int .*, got {type(value).__name__}"):
        check_cpu_device_count({"cpu_device_count": value})


@pytest.mark.parametrize("value", [0, -1, -2**63, -2**70], ids=repr)
def test_device_count_below_one_is_refused(value):
    # The plugin would make a client without devices.
    with pytest.raises(errors.InvalidArgumentError, match=rf"must be in \[1, {MAX_CPU_DEVICE_COUNT}\] "
                       rf"\(a client needs a device\), got {value}"):
        check_cpu_device_count({"cpu_device_count": value})


def test_a_package_installed_later_is_found(clean_env, tmp_path):
    clean_env.syspath_prepend(str(tmp_path))
    with pytest.raises(errors.NotFoundError):
        plugins.find_plugin("latechip")          # searched (and cached) without it
    time.sleep(0.05)                              # a later modification time on any file system
    package = tmp_path / "xla_plugins" / "xla_latechip_pjrt"
    package.mkdir(parents=True)
    (package / "xla_latechip_pjrt.so").symlink_to(CPU_SO)
    assert plugins.find_plugin("latechip").source == "xla_plugins:xla_latechip_pjrt"
