"""The PJRT call plumbing is generated from one table (ifrtpy/_pjrt/api_functions.txt):
the committed output matches its generator, the table matches the header, and no call
site reaches a slot of PJRT_Api but through a generated wrapper."""

import importlib.util
import re
from pathlib import Path

import pytest

from pjrt_helpers import header_path

PJRT = Path(__file__).resolve().parents[2] / "ifrtpy" / "_pjrt"
PACKAGE = PJRT.parent
GENERATED = ("_api.pxd", "_api_table.pxi")


def _generator():
    spec = importlib.util.spec_from_file_location("_gen_api", PJRT / "_gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table():
    gen = _generator()
    return gen.read_table((PJRT / "api_functions.txt").read_text())


def _header_slots():
    text = header_path().read_text()
    body = text[text.index("typedef struct PJRT_Api {"):]
    body = body[:body.index("} PJRT_Api;")]
    return re.findall(r"_PJRT_API_STRUCT_FIELD\((PJRT_\w+)\)", body)


@pytest.mark.parametrize("name", GENERATED)
def test_generated_files_match_the_generator(name):
    written = _generator().outputs((PJRT / "api_functions.txt").read_text())
    assert (PJRT / name).read_text() == written[name], (
        f"{name} differs from what api_functions.txt gives: run python ifrtpy/_pjrt/_gen_api.py")


def test_table_names_slots_of_the_header_in_its_order():
    slots = _header_slots()
    names = [f.name for f in _table()]
    assert set(names) <= set(slots), set(names) - set(slots)
    assert names == sorted(names, key=slots.index)


def test_functions_newer_than_the_oldest_have_their_version():
    # Added after 0.28 (CHANGELOG of the C API): each is gated on the plugin's version.
    since = {f.name: f.since for f in _table()}
    assert since["PJRT_Executable_OutputElementTypes"] == 29
    assert since["PJRT_Buffer_CopyToMemory"] == 32
    assert since["PJRT_ExecuteContext_Create"] == 52
    assert since["PJRT_Client_Create"] == 0


@pytest.mark.parametrize("line, problem", [
    ("PJRT_X 0 keep error checked extra", "expected"),
    ("PJRT_X zero keep error checked", "expected"),
    ("PJRT_X 0 maybe error checked", "expected"),
    ("PJRT_X 0 keep error loud", "bad function"),
    ("PJRT_X 0 keep void checked", "bad function"),
    ("PJRT_X 0 keep error checked,loaded", "bad function"),
    ("Other_X 0 keep error checked", "bad function"),
])
def test_malformed_table_lines_are_refused_with_their_line(line, problem):
    with pytest.raises(ValueError, match=problem) as info:
        _generator().read_table("# comment\n" + line + "\n")
    assert ":2:" in str(info.value)


def test_a_function_listed_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        _generator().read_table("PJRT_X 0 keep error checked\nPJRT_X 0 keep error quiet\n")


def _sources():
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix in (".pyx", ".pxd", ".pxi") and path.name not in GENERATED:
            yield path


SLOT_CALL = re.compile(r"api\.PJRT_|api\[0\]\.PJRT_|\.PJRT_[A-Za-z_]*\(")


def test_no_call_site_reaches_a_slot_but_through_a_wrapper():
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
             for path in _sources()
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if SLOT_CALL.search(line)]
    assert not found, "\n".join(found)


STRUCT_SIZE = re.compile(r"\bstruct_size = (\w+)_STRUCT_SIZE")


def test_no_call_site_fills_an_args_block_by_hand():
    """Each args struct of the table (and each of its ``struct`` lines) is made by its
    generated ``NAME_new()``: zeroed, with its struct_size; no call site writes one."""
    text = (PJRT / "api_functions.txt").read_text()
    covered = {f"{f.name}_Args" for f in _table()} | set(_generator().read_structs(text))
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
             for path in _sources()
             for number, line in enumerate(path.read_text().splitlines(), 1)
             for match in STRUCT_SIZE.finditer(line) if match.group(1) in covered]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line", ["struct", "struct PJRT_X extra", "struct Other_X"])
def test_malformed_struct_lines_are_refused_with_their_line(line):
    with pytest.raises(ValueError, match="struct PJRT_Name") as info:
        _generator().read_structs("# comment\n" + line + "\n")
    assert ":2:" in str(info.value)
