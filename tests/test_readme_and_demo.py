"""The README's tour and the demo command stay true."""

import pathlib
import re

import pytest

from ifrtpy.__main__ import main

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_tour_runs():
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## A short tour\n\n```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})


@pytest.mark.parametrize("devices", [None, 1, 8])
def test_demo_checks_every_result_against_numpy(devices, capsys):
    argv = ["demo"] + ([] if devices is None else ["--devices", str(devices)])
    assert main(argv) == 0
    out = capsys.readouterr().out
    expected = 4 if devices is None else devices  # the CPU plugin's default is 4 devices
    assert f"devices  {expected} ({expected} addressable)" in out
    assert out.count("rows [") == expected
    assert "(equals NumPy)" in out


def test_info_lists_devices_and_memories(capsys):
    assert main(["info", "--devices", "2"]) == 0
    out = capsys.readouterr().out
    assert "PJRT API 0." in out
    assert out.count("memories: device (default), pinned_host, unpinned_host") == 2
