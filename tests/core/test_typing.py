"""What mypy (and so an editor) knows of the public API: ``get_client``'s options are
typed per backend and plugin name, so a wrong option or type is an error before any run."""

from __future__ import annotations

import pathlib
import re

import pytest

api = pytest.importorskip("mypy.api")

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: Each line marked ``# error`` must be mypy's only errors in the snippet.
SNIPPET = """\
import ifrtpy as ifrt

ifrt.get_client()
ifrt.get_client("pjrt", device_count=8, plugin="/path/to/plugin.so", options={"x": 1})
ifrt.get_client("cpu", cpu_device_count=2)
ifrt.get_client("reference", device_count=8, addressable_device_count=4)
ifrt.get_client("jax", platform="cpu", device_count=2)
ifrt.get_client("tpu", max_inflight_computations=32, ml_framework_name="JAX")
ifrt.get_client("cuda", memory_fraction=0.5, preallocate=False, visible_devices=[0, 1])
ifrt.get_client("mybackend", anything=1)
ifrt.get_client("reference", device_count="8")  # error
ifrt.get_client("pjrt", plugin=3)  # error
ifrt.get_client("jax", device_count="2")  # error
ifrt.get_client("cuda", allocator="fast", device_count="1")  # error
ifrt.get_client("reference", plugin=None, device_count=1.5)  # error
"""


def test_get_client_options_are_typed_per_backend(tmp_path):
    snippet = tmp_path / "uses_get_client.py"
    snippet.write_text(SNIPPET)
    # The project's configuration and cache (CI runs mypy first: a warm cache).
    out, err, _ = api.run([str(snippet), "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(ROOT / ".mypy_cache"), "--no-error-summary"])
    errors = {int(n) for n in re.findall(rf"{snippet.name}:(\d+): error:", out)}
    expected = {i for i, line in enumerate(SNIPPET.splitlines(), 1) if line.endswith("# error")}
    assert errors == expected, out + err
