"""libtpu found by name as jax finds it, non-CPU plugins without a CPU build, libtpu's
typed options, and PJRT device attributes as attributes (CI has no TPU: a fake libtpu
package stands in for the real one)."""

import os
import sys

import pytest

import ifrtpy as ifrt
from ifrtpy import _pjrt, errors
from ifrtpy.backends.pjrt import PjrtDevice
from ifrtpy.device import Device
from ifrtpy.plugins import builds
from ifrtpy.plugins import discovery as plugins
from ifrtpy.plugins.options import check_options, known_options

from plugin_env import CPU_SO, clean_env, no_cpu_build  # noqa: F401  (fixtures)


def _fake_libtpu(root, library=None):
    """A libtpu package under ``root`` laid out as the real one (``__init__.py``,
    ``libtpu.so``, ``sdk.so``); importing it fails, and ``libtpu.so`` is empty unless it
    is a link to ``library``."""
    package = root / "libtpu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('discovery must not import libtpu')\n")
    (package / "sdk.so").write_bytes(b"")
    so = package / "libtpu.so"
    so.symlink_to(library) if library else so.write_bytes(b"")
    return str(so)


# -- libtpu by name ----------------------------------------------------------------------------

def test_libtpu_package_is_found_without_importing_or_loading_it(clean_env, tmp_path):
    so = _fake_libtpu(tmp_path)
    clean_env.syspath_prepend(str(tmp_path))
    info = plugins.find_plugin("tpu")
    assert (info.name, info.path, info.source, info.api_version) == (
        "tpu", so, "the libtpu package", None)
    assert "libtpu" not in sys.modules
    assert os.path.realpath(so) not in _pjrt.loaded_plugins()
    assert [i.path for i in ifrt.available_plugins() if i.name == "tpu"] == [so]


def test_tpu_library_path_comes_before_the_package_and_a_missing_one_is_passed_over(
        clean_env, tmp_path):
    package_so = _fake_libtpu(tmp_path / "site")
    clean_env.syspath_prepend(str(tmp_path / "site"))
    elsewhere = tmp_path / "opt" / "libtpu.so"
    clean_env.setenv(plugins.TPU_ENV_VAR, str(elsewhere))
    assert plugins.find_plugin("tpu").path == package_so       # missing: jax falls back too
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"")                                  # the same variable, now a file
    info = plugins.find_plugin("tpu")
    assert (info.path, info.source) == (str(elsewhere), f"env:{plugins.TPU_ENV_VAR}")
    assert [(i.path, i.source) for i in ifrt.available_plugins() if i.name == "tpu"] == [
        (str(elsewhere), f"env:{plugins.TPU_ENV_VAR}"), (package_so, "the libtpu package")]
    report = plugins.plugins_report().splitlines()
    at = report.index(f"  tpu: {elsewhere} (from env:{plugins.TPU_ENV_VAR}, not loaded)")
    assert report[at + 1] == f"    also at (not picked): {package_so} (from the libtpu package)"
    assert sum(line.startswith("  tpu: ") for line in report) == 1


def test_jax_variable_names_come_before_libtpu(clean_env, tmp_path):
    _fake_libtpu(tmp_path)
    clean_env.syspath_prepend(str(tmp_path))
    clean_env.setenv(plugins.ENV_VAR, "tpu:/opt/mine/libtpu.so")
    assert plugins.find_plugin("tpu").path == "/opt/mine/libtpu.so"
    order = plugins.SEARCH_ORDER
    libtpu = next(i for i, place in enumerate(order) if plugins.TPU_ENV_VAR in place)
    assert order.index("the jax_plugins entry-point group") < libtpu < order.index(
        "the XLA CPU builds ifrtpy knows")


def test_no_libtpu_is_not_found_naming_where_it_looked(clean_env):
    clean_env.setenv(plugins.TPU_ENV_VAR, "/nonexistent/libtpu.so")
    with pytest.raises(errors.NotFoundError, match="no PJRT plugin named 'tpu'") as e:
        plugins.find_plugin("tpu")
    assert plugins.TPU_ENV_VAR in str(e.value) and "is installed: pip install libtpu" in str(e.value)


# -- a non-CPU plugin on a machine without a CPU build --------------------------------------

def test_without_a_cpu_build_only_the_default_client_needs_one(no_cpu_build, tmp_path):
    """libtpu's layout, but its library is the CPU plugin (linked), so a client is made."""
    so = _fake_libtpu(tmp_path, library=CPU_SO)
    no_cpu_build.syspath_prepend(str(tmp_path))
    found = ifrt.available_plugins()
    assert [i.path for i in found if i.name == "tpu"] == [so]
    assert not {i.name for i in found} & {"cpu", *(b.name for b in builds.CPU_BUILDS)}
    assert plugins.find_plugin("tpu").path == so
    assert plugins.plugins_report().splitlines()[1].startswith(f"  tpu: {so} (from the libtpu package, ")
    client = ifrt.get_client("tpu", device_count=2)
    assert len(client.devices()) == 2 and client.plugin.path == CPU_SO
    assert ifrt.get_client("pjrt", plugin="tpu", device_count=1).device_count() == 1
    assert ifrt.get_client("tpu").device_count() == 8  # the default client by name (conftest's XLA_FLAGS)
    with pytest.raises(errors.NotFoundError,
                       match="PJRT plugin named 'cpu' is installed: pip install xla-cpu-pjrt"):
        ifrt.get_client("cpu", device_count=1)
    with pytest.raises(errors.NotFoundError, match="the default PJRT plugin needs one of the packages"):
        ifrt.get_client("pjrt", device_count=1)


def test_without_any_plugin_the_report_says_where_it_looked(no_cpu_build):
    no_cpu_build.setattr(plugins, "package_dirs", lambda package: [])
    no_cpu_build.setattr(plugins, "_entry_points", lambda group: [])
    assert ifrt.available_plugins() == []
    assert plugins.plugins_report().splitlines() == [
        "plugins  (by name: ifrtpy.get_client(name))",
        f"  none found; looked in {'; '.join(plugins.SEARCH_ORDER)}"]


# -- libtpu's create options ------------------------------------------------------------------

@pytest.mark.parametrize("options, match", [
    ({"bogus_option": 1}, "'tpu' plugin has no create option 'bogus_option'; known options: "
                          "max_inflight_computations, ml_framework_name, ml_framework_version$"),
    ({"max_inflight_computations": "32"}, "must be of type int, got str '32'"),
    ({"max_inflight_computations": True}, "must be of type int, got bool"),
    ({"max_inflight_computations": 0}, r"must be in \[1, 2147483647\], got 0"),
    ({"ml_framework_name": 1}, "'ml_framework_name' of the 'tpu' plugin must be of type str"),
    ({"ml_framework_version": 0.1}, "must be of type str, got float"),
    ({"cpu_device_count": 2}, "has no create option 'cpu_device_count'"),
])
def test_bad_tpu_options_are_refused(options, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        check_options("tpu", options)


def test_good_tpu_options_pass_and_are_checked_before_loading(clean_env, tmp_path):
    good = {"max_inflight_computations": 32, "ml_framework_name": "JAX",
            "ml_framework_version": "0.10.2"}
    assert check_options("tpu", good) == good
    assert set(known_options("tpu")) == set(good)
    _fake_libtpu(tmp_path)                # an empty file: loading it would fail otherwise
    clean_env.syspath_prepend(str(tmp_path))
    with pytest.raises(errors.InvalidArgumentError, match="no create option 'bogus_option'"):
        ifrt.get_client("tpu", bogus_option=1)
    with pytest.raises(errors.InvalidArgumentError, match="'tpu' plugin has no create option 'cpu_device_count'"):
        ifrt.get_client("tpu", device_count=8)


# -- device attributes as attributes ------------------------------------------------------------

class _TpuLikeDevice(Device):
    """What libtpu's devices report (measured on a v5e)."""

    __slots__ = ("reads",)

    def __init__(self):
        self.reads = 0

    client = None
    id = 0
    kind = "TPU v5 lite"
    is_addressable = True
    process_index = 0

    @property
    def attributes(self):
        self.reads += 1
        return {"coords": [0, 0, 0], "core_on_chip": 0, "num_cores": 1,
                "device_memory_bytes_limit": 16909336064, "id": 99}

    def memories(self):
        return ()

    def default_memory(self):
        raise errors.NotFoundError("none")

    def to_string(self):
        return "TpuDevice(id=0, process_index=0, coords=(0,0,0), core_on_chip=0)"


def test_device_attributes_read_as_attributes():
    d = _TpuLikeDevice()
    assert (d.coords, d.core_on_chip, d.num_cores) == ([0, 0, 0], 0, 1)
    assert d.device_memory_bytes_limit == 16909336064
    assert d.id == 0                                  # the class's own members come first
    assert not hasattr(d, "nope") and getattr(d, "nope", "default") == "default"
    with pytest.raises(AttributeError) as e:
        d.nope
    assert str(e.value) == (
        "device TpuDevice(id=0, process_index=0, coords=(0,0,0), core_on_chip=0) has no "
        "attribute 'nope'; its attributes: coords, core_on_chip, device_memory_bytes_limit, "
        "id, num_cores")
    assert (e.value.name, e.value.obj) == ("nope", d)
    reads = d.reads
    for name in ("_private", "__array_interface__", "__getnewargs_ex__"):
        assert not hasattr(d, name)                   # never looked up among the attributes
    assert d.reads == reads


def test_cpu_plugin_devices_have_no_attributes_to_read(clean_env):
    d = ifrt.get_client("cpu", device_count=1).devices()[0]
    assert dict(d.attributes) == {}
    assert not hasattr(d, "coords")
    with pytest.raises(AttributeError, match=r"^device CpuDevice\(id=0\) has no attribute "
                                             r"'coords'; its attributes: none$"):
        d.coords
    reference = ifrt.get_client("reference").devices()[0]
    assert reference.attributes == {"process_index": 0}
    with pytest.raises(AttributeError, match="its attributes: process_index$"):
        reference.coords


def test_a_half_built_device_raises_attribute_error_not_recursion():
    d = PjrtDevice.__new__(PjrtDevice)
    for name in ("kind", "coords", "_handle"):
        with pytest.raises(AttributeError, match="'PjrtDevice' object has no attribute"):
            getattr(d, name)
