"""ifrtpy._pjrt against a newer CPU plugin: ``lammps-jax-pjrt-cpu`` from PyPI (PJRT 0.115).

Skipped where that package is not installed.
"""

import importlib.metadata
import sysconfig
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ifrtpy import _pjrt
from ifrtpy.plugins.builds import default_cpu_library
from pjrt_helpers import compile_options, lower, random_array, run1

pytestmark = pytest.mark.plugin_compat

DISTRIBUTION = "lammps-jax-pjrt-cpu"
LIBRARY = "pjrt_c_api_cpu_plugin.so"


def _plugin_path():
    try:
        files = importlib.metadata.distribution(DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == LIBRARY:
            path = Path(file.locate()).resolve()
            if path.is_file():
                return path
    site = Path(sysconfig.get_paths()["purelib"])
    found = sorted(site.glob(f"lammps_jax_pjrt_cpu*/{LIBRARY}"))
    return found[0] if found else None


@pytest.fixture(scope="module")
def compat_plugin():
    path = _plugin_path()
    if path is None:
        pytest.skip("lammps-jax-pjrt-cpu not installed")
    return _pjrt.load_plugin(path)


@pytest.fixture(scope="module")
def compat_client(compat_plugin):
    return _pjrt.create_client(compat_plugin, {"cpu_device_count": 2})


def test_newer_plugin_loads_with_its_api_version(compat_plugin):
    assert compat_plugin.api_version == (0, 115)
    assert compat_plugin.api_struct_size > _pjrt.load_plugin(default_cpu_library()).api_struct_size
    assert compat_plugin is not _pjrt.load_plugin(default_cpu_library())
    assert compat_plugin.attributes["stablehlo_current_version"] >= [1, 13, 3]


def test_newer_plugin_client(compat_client):
    assert compat_client.platform_name == "cpu"
    assert [d.id for d in compat_client.devices] == [0, 1]
    assert [m.kind for m in compat_client.devices[1].memories][0] == "device"


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_, np.complex128,
                                   ml_dtypes.bfloat16, ml_dtypes.int4,
                                   ml_dtypes.float8_e4m3fn], ids=lambda d: np.dtype(d).name)
def test_newer_plugin_round_trips_bytes(compat_client, dtype):
    x = random_array(np.random.default_rng(7), (3, 5), dtype)
    for view in (x, x[::-1, ::2], x.T):
        buffer, _ = _pjrt.buffer_from_host_buffer(compat_client, view, compat_client.devices[1])
        assert buffer.to_numpy().tobytes() == np.ascontiguousarray(view).tobytes()


def test_newer_plugin_runs_add_one(compat_client):
    exe = _pjrt.compile(compat_client, lower(lambda x: x + 1, np.zeros(8, np.float32)),
                        compile_options())
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(run1(exe, x)[0], x + 1)
    assert exe.num_outputs == 1 and exe.fingerprint()
