"""The C structs ifrtpy declares by hand match the real headers where those ship.

``xla_ffi.pxd`` declares the XLA FFI structs it uses in C (``ifrtpy_XLA_FFI_*``, the C
compiler lays them out) from their published layout; jaxlib ships the real header
(``jax.ffi.include_dir()``). A C program built here with gcc includes both and prints the
offset and size of every field the Cython declarations name, in ifrtpy's struct and in the
real one, and the values of the enum constants ifrtpy restates. (No DLPack header and no
PJRT layouts or FFI extension header ships with ifrtpy's dependencies: ``dlpack.pxd``,
``extensions.pxd`` and the ``PJRT_FFI_*`` structs are checked by the tests that use them on
the plugins.)
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ifrtpy._pjrt._header import pjrt_include_dir

PXD = Path(__file__).resolve().parents[2] / "ifrtpy" / "_pjrt" / "xla_ffi.pxd"

STRUCT = re.compile(r'^    ctypedef struct (\w+) "ifrtpy_(\w+)":\n((?:        .*\n)+)', re.M)
FIELD = re.compile(r"\(\*(\w+)\)|(\w+)\s*$")
ENUM = re.compile(r'^        (XLA_FFI_\w+) "ifrtpy_\1"$', re.M)
#: Names the header of XLA FFI 0.5 (jaxlib 0.12) gives to what ifrtpy names as 0.1-0.4
#: did: renamed, the layouts unchanged (``GetDetails`` adds a field after ``message``).
RENAMED = {"XLA_FFI_Extension_Base": "XLA_FFI_InternalExtension",
           "XLA_FFI_Error_GetMessage": "XLA_FFI_Error_GetDetails",
           "XLA_FFI_ExecutionContext_Get": "XLA_FFI_InvokeContext_Get"}


def _verbatim(text: str) -> str:
    """The C code of the pxd's ``cdef extern from *`` block."""
    return text[text.index('"""') + 3:text.index('"""', text.index('"""') + 3)]


def _fields(body: str) -> list[str]:
    names = []
    for line in body.splitlines():
        line = line.split("#")[0].strip()
        match = FIELD.search(line.split(")(")[0] + ")" if "(*" in line else line)
        names.append(match.group(1) or match.group(2))
    return names


def checks(text: str, header: str) -> tuple[list[str], list[str]]:
    """C expressions (ours, the header's) for every field and enum constant of the
    XLA FFI declarations in pxd ``text``, the header's in the names of ``header`` (its
    text)."""
    renamed = RENAMED if "XLA_FFI_InternalExtension" in header else {}
    rename = re.compile(r"\b(" + "|".join(renamed) + r")(?=\b|_Args)") if renamed else None

    def header_name(expression: str) -> str:
        return rename.sub(lambda m: renamed[m.group(1)], expression) if rename else expression

    ours, theirs = [], []
    for name, c_name, body in STRUCT.findall(text):
        if not c_name.startswith("XLA_FFI_"):
            continue  # the PJRT FFI extension's structs: no header ships
        for field in _fields(body):
            ours.append(f"offsetof(ifrtpy_{c_name}, {field})")
            theirs.append(header_name(f"offsetof({c_name}, {field})"))
            ours.append(f"sizeof(((ifrtpy_{c_name}*)0)->{field})")
            theirs.append(header_name(f"sizeof((({c_name}*)0)->{field})"))
    for constant in ENUM.findall(text):
        if not constant.endswith(("_STRUCT_SIZE", "_USED_SIZE")):  # sizes of ifrtpy's choosing
            ours.append(f"ifrtpy_{constant}")
            theirs.append(constant)
    return ours, theirs


def measure(text: str, folder: Path) -> list[tuple[str, int, int]]:
    """``(expression, ours, theirs)`` for every check of pxd ``text``, from gcc."""
    jax = pytest.importorskip("jax")
    compiler = shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (gcc)")
    include = jax.ffi.include_dir()
    ours, theirs = checks(text, (Path(include) / "xla" / "ffi" / "api" / "c_api.h").read_text())
    lines = [f'  printf("%zu %zu\\n", (size_t)({a}), (size_t)({b}));' for a, b in zip(ours, theirs)]
    source = folder / "layouts.c"
    source.write_text("\n".join([
        "#include <stddef.h>", "#include <stdint.h>", "#include <stdio.h>",
        '#include "pjrt_c_api.h"', '#include "xla/ffi/api/c_api.h"',
        _verbatim(text), "int main(void) {", *lines, "  return 0;", "}", ""]))
    program = folder / "layouts"
    subprocess.run([compiler, "-I", pjrt_include_dir(), "-I", include,
                    str(source), "-o", str(program)], check=True, timeout=120)
    out = subprocess.run([str(program)], check=True, capture_output=True, text=True,
                         timeout=60).stdout.split("\n")
    return [(expr, *map(int, line.split())) for expr, line in zip(theirs, out)]


def test_xla_ffi_structs_and_constants_match_jaxlibs_header(tmp_path):
    measured = measure(PXD.read_text(), tmp_path)
    assert len(measured) > 80  # every field of the 17 XLA FFI structs, and the enums
    wrong = [f"{expr}: ifrtpy {a}, header {b}" for expr, a, b in measured if a != b]
    assert not wrong, "\n".join(wrong)


def test_a_misdeclared_field_is_found(tmp_path):
    # XLA_FFI_Buffer's data and rank swapped in ifrtpy's C declaration.
    text = PXD.read_text().replace("int dtype; void* data; int64_t rank;",
                                   "int dtype; int64_t rank; void* data;")
    assert text != PXD.read_text()
    wrong = {expr for expr, a, b in measure(text, tmp_path) if a != b}
    assert wrong == {"offsetof(XLA_FFI_Buffer, data)", "offsetof(XLA_FFI_Buffer, rank)"}
