"""The PJRT call plumbing is generated from one table (ifrtpy/_pjrt/api_functions.txt):
the committed output matches its generator, the table matches the header, no call site
reaches a slot of PJRT_Api but through a generated wrapper, and no source fills an
argument block by hand (a guard shown to fail on hand fills)."""

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


#: What fills an argument block by hand: a struct_size written, or a struct zeroed by
#: memset. Only the generated initializers (NAME_Args_new(), STRUCT_new()) do either.
HAND_FILL = re.compile(r"\bstruct_size\s*=(?!=)|\bmemset\(\s*&")


def hand_fills(text: str, where: str = "") -> list[str]:
    """The lines of source ``text`` that fill an argument block by hand."""
    return [f"{where}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), 1) if HAND_FILL.search(line)]


def test_no_source_fills_an_argument_block_by_hand():
    """Every struct with a size the layer hands a plugin or the XLA FFI (the args of each
    function of the table, its extensions' included, and each of its ``struct`` lines) is
    made by its generated initializer, zeroed, with its STRUCT_SIZE: no source writes a
    struct_size or zeroes a struct with memset."""
    found = [line for path in _sources()
             for line in hand_fills(path.read_text(), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "\n".join(found)


MADE = "args = PJRT_Client_Compile_Args_new()"


@pytest.mark.parametrize("fill", [
    "memset(&args, 0, sizeof(args))\n    args.struct_size = sizeof(PJRT_Client_Compile_Args)",
    "memset(&args, 0, sizeof(args))\n    args.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE",
    "args.struct_size = sizeof(args)",
    "memset( &args, 0, sizeof args)",
], ids=["memset-and-sizeof", "memset-and-macro", "sizeof-only", "memset-only"])
def test_the_guard_fails_on_a_hand_filled_block(fill):
    """The guard above flags ``_executable.pyx`` with one of its generated initializers
    replaced by a hand fill (whatever the size written: the header's macro, or sizeof,
    wrong for a struct with trailing padding), and passes it as it is."""
    text = (PJRT / "_executable.pyx").read_text()
    assert MADE in text and not hand_fills(text)
    mutated = text.replace(MADE, fill, 1)
    assert hand_fills(mutated)


def test_every_extension_function_is_generated_with_a_checked_caller():
    """Each extension of the table has its finder; each of its functions its args'
    initializer, ``has_NAME`` and the flavours the table names."""
    text = (PJRT / "api_functions.txt").read_text()
    generated = (PJRT / "_api.pxd").read_text()
    extensions = _generator().read_extensions(text)
    assert {e.name for e in extensions} >= {"Layouts", "Stream", "FFI"}
    for ext in extensions:
        assert f"{ext.name}_extension(const PJRT_Api* api)" in generated
        for f in ext.functions:
            assert f"cdef inline {f.name}_Args {f.name}_Args_new()" in generated
            assert f"cdef inline bint has_{f.name}(const PJRT_Api* api)" in generated
            assert f"_in_extension(&ext.base, &ext.{f.name})" in generated
            if "checked" in f.flavours:
                assert f"cdef inline int {f.name}(const PJRT_Api* api, {f.name}_Args* args)" in generated


@pytest.mark.parametrize("line, problem", [
    ("extension Layouts", "expected 'extension"),
    ("extension Layouts Other_Type PJRT_Layouts_Extension", "expected 'extension"),
    ("extension Layouts PJRT_Extension_Type_Layouts Other", "expected 'extension"),
])
def test_malformed_extension_lines_are_refused_with_their_line(line, problem):
    with pytest.raises(ValueError, match=problem) as info:
        _generator().read_extensions("# comment\n" + line + "\n")
    assert ":2:" in str(info.value)


def test_an_extension_function_cannot_be_loaded():
    with pytest.raises(ValueError, match="cannot be loaded"):
        _generator().read_table("extension X PJRT_Extension_Type_X PJRT_X\n"
                                "PJRT_X_Y 0 keep error loaded\n")


@pytest.mark.parametrize("line", ["struct", "struct PJRT_X size extra", "struct Other_X"])
def test_malformed_struct_lines_are_refused_with_their_line(line):
    with pytest.raises(ValueError, match="struct PJRT_Name") as info:
        _generator().read_structs("# comment\n" + line + "\n")
    assert ":2:" in str(info.value)
