"""docs/pjrt-layer.md's table of the layer's modules is true: one row per compiled module
of ``ifrtpy._pjrt`` (each ``.pyx``), and every function or class a row names is defined
in that module."""

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "pjrt-layer.md"
LAYER = ROOT / "ifrtpy" / "_pjrt"

ROW = re.compile(r"^\| `(_\w+)` \| (.*) \|$", re.M)
#: A name a row gives: `name(...)` or `CamelCase`.
NAME = re.compile(r"`(\w+)\(|`([A-Z]\w+)`")


def _rows() -> dict[str, str]:
    text = DOC.read_text()
    table = text[text.index("| module | what it holds |"):]
    table = table[:table.index("\n\n")]
    return dict(ROW.findall(table))


def test_the_table_has_one_row_per_module():
    assert sorted(_rows()) == sorted(p.stem for p in LAYER.glob("*.pyx"))


def test_each_name_of_a_row_is_defined_in_its_module():
    missing = []
    for module, text in _rows().items():
        loaded = importlib.import_module(f"ifrtpy._pjrt.{module}")
        for function, cls in NAME.findall(text):
            if not hasattr(loaded, function or cls):
                missing.append(f"{module}.{function or cls}")
    assert not missing, missing
