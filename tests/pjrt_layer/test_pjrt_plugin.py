"""ifrtpy._pjrt plugin loading: the default CPU plugin and what each XLA CPU build reports,
idempotence, refused files."""

import ctypes
import ctypes.util
import os
from pathlib import Path

import pytest

from ifrtpy import _pjrt, errors
from ifrtpy.plugins import builds
from ifrtpy.plugins.builds import default_cpu_library
from pjrt_helpers import header_path, plugin  # noqa: F401  (fixture)


def _header_api_version():
    text = header_path().read_text()
    major = int(next(line.split()[2] for line in text.splitlines()
                     if line.startswith("#define PJRT_API_MAJOR")))
    minor = int(next(line.split()[2] for line in text.splitlines()
                     if line.startswith("#define PJRT_API_MINOR")))
    return major, minor


#: What each XLA CPU build reports: API version, function table size, the StableHLO
#: version of its attributes, extension chain (types in order).
FACTS = {
    builds.OFFICIAL: ((0, 81), 984, [1, 13, 3], [9, 5, 6, 4]),  # PhaseCompile, FFI, MemoryDescriptions, Layouts
    builds.ZML: ((0, 106), 1128, [1, 16, 1], [19, 9, 5, 6, 4]),
    builds.LAMMPS: ((0, 115), 1144, [1, 20, 0], [24, 19, 9, 5, 6, 4]),
}
INSTALLED = dict(builds.installed_builds())


def test_default_plugin_path_is_the_first_default_build_installed():
    path = Path(default_cpu_library())
    assert path.is_file()
    assert builds.build_at(str(path)) is next(b for b in builds.DEFAULT_ORDER if b in INSTALLED)


def test_ifrtpy_is_compiled_against_the_official_builds_api_version():
    assert FACTS[builds.OFFICIAL][0] == _header_api_version()


@pytest.mark.parametrize("build", list(FACTS), ids=lambda b: b.name)
def test_each_build_reports_its_version_table_attributes_and_extensions(build):
    if build not in INSTALLED:
        pytest.skip(f"{build.name} not installed")
    plugin = _pjrt.load_plugin(INSTALLED[build])
    version, size, stablehlo, extensions = FACTS[build]
    assert plugin.api_version == version
    assert plugin.api_struct_size == size
    assert plugin.attributes == {"xla_version": 2, "stablehlo_current_version": stablehlo,
                                 "stablehlo_minimum_version": [0, 9, 0]}
    assert plugin.extensions == extensions


def test_plugin_path_and_repr(plugin):
    assert plugin.path == os.path.realpath(default_cpu_library())
    assert plugin.path in repr(plugin) and "%d.%d" % plugin.api_version in repr(plugin)


def test_loading_is_idempotent_per_real_path(plugin, tmp_path):
    link = tmp_path / "link_to_plugin.so"
    link.symlink_to(plugin.path)
    assert _pjrt.load_plugin(default_cpu_library()) is plugin
    assert _pjrt.load_plugin(plugin.path) is plugin
    assert _pjrt.load_plugin(Path(plugin.path)) is plugin
    assert _pjrt.load_plugin(link) is plugin


def test_plugin_handle_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        _pjrt.PluginHandle()


def test_missing_file_raises_not_found(tmp_path):
    missing = tmp_path / "no_such_plugin.so"
    with pytest.raises(errors.NotFoundError) as info:
        _pjrt.load_plugin(missing)
    assert str(missing) in str(info.value)
    assert isinstance(info.value, LookupError)


def test_directory_raises_not_found(tmp_path):
    with pytest.raises(errors.NotFoundError):
        _pjrt.load_plugin(tmp_path)


def test_text_file_raises_invalid_argument_naming_the_file(tmp_path):
    text = tmp_path / "not_a_library.so"
    text.write_text("this is not a shared library\n")
    with pytest.raises(errors.InvalidArgumentError) as info:
        _pjrt.load_plugin(text)
    message = str(info.value)
    assert str(text) in message
    assert "shared library" in message
    # dlopen's reason is passed on.
    assert "invalid ELF header" in message or "file too short" in message


def _libm_path():
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    ctypes.CDLL(name)
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libm.so") and os.path.isfile(path):
                return path
    return None


def _numpy_extension_path():
    try:
        from numpy._core import _multiarray_umath as module
    except ImportError:  # NumPy 1.x
        from numpy.core import _multiarray_umath as module
    return module.__file__


@pytest.mark.parametrize("which", ["libm", "numpy_extension"])
def test_shared_library_without_GetPjrtApi_raises_invalid_argument(which):
    path = _libm_path() if which == "libm" else _numpy_extension_path()
    if path is None:
        pytest.skip("libm not found as a file")
    with pytest.raises(errors.InvalidArgumentError) as info:
        _pjrt.load_plugin(path)
    assert "GetPjrtApi" in str(info.value)


def test_refused_file_is_not_cached(tmp_path):
    text = tmp_path / "later.so"
    text.write_text("x")
    for _ in range(2):
        with pytest.raises(errors.InvalidArgumentError):
            _pjrt.load_plugin(text)


def test_errors_are_ifrt_errors_and_python_builtins(tmp_path):
    with pytest.raises(ValueError):
        _pjrt.load_plugin(_numpy_extension_path())
    with pytest.raises(errors.IfrtError):
        _pjrt.load_plugin(tmp_path / "missing.so")


def test_api_version_and_size_match_the_raw_GetPjrtApi_table(plugin):
    # Read the same PJRT_Api with ctypes: {size_t struct_size; void* extension_start;
    # PJRT_Api_Version {size_t struct_size; void* extension_start; int major, minor}}.
    lib = ctypes.CDLL(plugin.path, mode=os.RTLD_LOCAL)
    lib.GetPjrtApi.restype = ctypes.c_void_p
    api = lib.GetPjrtApi()
    struct_size = ctypes.c_size_t.from_address(api).value
    version = (ctypes.c_int * 2).from_address(api + 32)
    assert struct_size == plugin.api_struct_size
    assert (version[0], version[1]) == plugin.api_version
