"""The demo and info commands stay true (the README's blocks run in tests/docs/test_docs.py)."""

import pytest

from ifrtpy.__main__ import main
from ifrtpy.backends.pjrt.client import host_device_count


@pytest.mark.parametrize("devices", [None, 1, 8])
def test_demo_checks_every_result_against_numpy(devices, capsys):
    argv = ["demo"] + ([] if devices is None else ["--devices", str(devices)])
    assert main(argv) == 0
    out = capsys.readouterr().out
    # Without --devices: the CPU device count jax is given (tests/conftest.py: 8 through
    # XLA_FLAGS), else the CPU plugin's default of 4.
    expected = (host_device_count() or 4) if devices is None else devices
    assert f"devices  {expected} ({expected} addressable)" in out
    assert out.count("│") == 2 * expected               # visualize_sharding: a row per device
    assert "(equals NumPy)" in out


def test_info_lists_devices_and_memories(capsys):
    assert main(["info", "--devices", "2"]) == 0
    out = capsys.readouterr().out
    assert "PJRT API 0." in out
    assert out.count("memories: device (default), pinned_host, unpinned_host") == 2
