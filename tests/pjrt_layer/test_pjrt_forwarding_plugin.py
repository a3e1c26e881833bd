"""A plugin as a plugin author may ship one: a forwarding plugin over the default CPU
build (tests/helpers/data/forwarding_plugin.c, built here with gcc against the PJRT
header) that leaves optional functions NULL, whose table is cut short of what its
reported version has, or that reports a version older than its table. Every everyday
operation, each in its own process
(tests/helpers/forwarding_worker.py), either works (the PjRt backend has another way) or
raises UnimplementedError naming the function; none crashes the interpreter."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ifrtpy import _pjrt, errors
from ifrtpy._pjrt._header import pjrt_include_dir
from ifrtpy.plugins.builds import default_cpu_library

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
SOURCE = HELPERS / "data" / "forwarding_plugin.c"
WORKER = HELPERS / "forwarding_worker.py"

#: The optional functions the NULL_OPTIONAL variant clears (those ifrtpy calls).
NULLED = ("PJRT_Executable_OutputMemoryKinds", "PJRT_Executable_GetCostAnalysis",
          "PJRT_Buffer_CopyToDevice", "PJRT_Device_MemoryStats", "PJRT_Executable_Fingerprint",
          "PJRT_Buffer_CopyToMemory", "PJRT_Executable_GetCompiledMemoryStats",
          "PJRT_Client_CreateViewOfDeviceBuffer", "PJRT_Executable_Serialize",
          "PJRT_Buffer_UnsafePointer", "PJRT_Executable_OptimizedProgram")

OK = ("ok", None)

#: Per variant and operation: the outcome and, for UnimplementedError, the function its
#: message names (None: the plugin's own message).
EXPECTED = {
    "null_optional": {
        "put_and_read": OK, "put_and_copy_out": OK, "compile_and_execute": OK,
        # the backend's own cost analysis reads the optimized program
        "cost_analysis": ("unimplemented", "PJRT_Executable_OptimizedProgram"),
        "compiled_memory_stats": ("unimplemented", "PJRT_Executable_GetCompiledMemoryStats"),
        "serialize": ("unimplemented", "PJRT_Executable_Serialize"),
        "fingerprint": OK,  # None where the plugin has none
        "output_memory_kinds": OK,  # from the output shardings
        "output_layouts": ("unimplemented", "PJRT_Executable_OptimizedProgram"),
        "optimized_program": ("unimplemented", "PJRT_Executable_OptimizedProgram"),
        "dlpack_export": OK,  # a copy in host memory, as copy=None allows
        "dlpack_import": OK,  # copied
        "unsafe_buffer_pointer": ("unimplemented", "PJRT_Buffer_UnsafePointer"),
        "copy_to_device": OK, "copy_to_memory": OK,  # through the host
        "memory_stats": ("unimplemented", "PJRT_Device_MemoryStats"),
    },
    "cut_short": {  # reports 0.60, its table ends before PJRT_Executable_OutputElementTypes
        "put_and_read": OK, "put_and_copy_out": OK, "compile_and_execute": OK,
        "cost_analysis": OK, "serialize": OK, "fingerprint": OK, "output_memory_kinds": OK,
        "output_layouts": OK, "optimized_program": OK, "dlpack_export": OK,
        "unsafe_buffer_pointer": OK, "copy_to_device": OK,
        "compiled_memory_stats": ("unimplemented", "PJRT_Executable_GetCompiledMemoryStats"),
        "dlpack_import": OK, "copy_to_memory": OK,
        "memory_stats": ("unimplemented", None),  # the CPU plugin has no allocator stats
    },
    "old_version": {  # the whole table, but reports 0.28: what came later is not called
        "put_and_read": OK, "compile_and_execute": OK,
        "copy_to_memory": OK,  # without PJRT_Buffer_CopyToMemory (0.32)
        "fingerprint": OK,  # None without PJRT_Executable_Fingerprint (0.35)
        "compiled_memory_stats": ("unimplemented", "PJRT_Executable_GetCompiledMemoryStats"),
    },
}
DEFINES = {"null_optional": "-DNULL_OPTIONAL", "cut_short": "-DCUT_SHORT",
           "old_version": "-DOLD_VERSION"}
REPORTED = {"cut_short": "0.60", "old_version": "0.28"}


def _build(folder: Path, define: str) -> Path:
    compiler = shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (gcc) to build the forwarding plugin")
    library = folder / f"forwarding_{define.lstrip('-D').lower()}.so"
    target = default_cpu_library()
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-I", pjrt_include_dir(),
                    f'-DFORWARD_TO="{target}"', define, str(SOURCE), "-o", str(library), "-ldl"],
                   check=True, timeout=120)
    return library


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    folder = tmp_path_factory.mktemp("forwarding")
    return {variant: _build(folder, define) for variant, define in DEFINES.items()}


def _worker(plugin: Path, operations) -> subprocess.Popen:
    """The worker running ``operations`` on ``plugin``, started."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(plugin), *operations],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OPENBLAS_NUM_THREADS="1"), cwd=HELPERS)


def _report(worker: subprocess.Popen) -> dict:
    """Operation -> [outcome, detail], once ``worker`` is done."""
    # no deadline: each operation is bounded by its CPU time (the worker's limit), which a
    # busy machine does not use up
    stdout, stderr = worker.communicate()
    assert worker.returncode == 0, stderr[-3000:]
    return json.loads(stdout)


@pytest.fixture(scope="module")
def outcomes(plugins):
    """Operation -> [outcome, detail] per variant: the variants' workers at once."""
    workers = {variant: _worker(plugins[variant], [*EXPECTED[variant], "missing_functions"])
               for variant in EXPECTED}
    return {variant: _report(worker) for variant, worker in workers.items()}


CASES = [(variant, op) for variant, ops in EXPECTED.items() for op in ops]


@pytest.mark.parametrize("variant, operation", CASES, ids=[f"{v}-{o}" for v, o in CASES])
def test_each_operation_works_or_names_the_missing_function(outcomes, variant, operation):
    outcome, detail = outcomes[variant][operation]
    expected, function = EXPECTED[variant][operation]
    assert outcome == expected, detail
    if function is not None:
        assert detail.startswith(f"{function} is not provided by this PJRT plugin"), detail
        version = REPORTED.get(variant, "%d.%d" % _default_plugin().api_version)
        assert f"(API version {version}," in detail


def _default_plugin():
    return _pjrt.load_plugin(default_cpu_library())


def _table() -> list[tuple[str, int]]:
    """The PJRT_Api functions of the table (those before its first extension)."""
    spec = Path(_pjrt.__file__).resolve().parent / "api_functions.txt"
    text = spec.read_text()
    text = text[:text.index("\nextension ")]
    return [(line.split()[0], int(line.split()[1])) for line in text.splitlines()
            if line.strip() and not line.startswith(("#", "struct "))]


def _table_from(first: str) -> list[str]:
    names = [name for name, _ in _table()]
    return names[names.index(first):]


def test_the_plugin_reports_what_its_table_lacks(outcomes):
    own = set(_default_plugin().missing_functions)  # what the CPU build itself leaves NULL
    assert outcomes["null_optional"]["missing_functions"] == ["ok", " ".join(
        n for n in _table_from("PJRT_Error_Destroy") if n in own or n in NULLED)]
    cut = _table_from("PJRT_Executable_OutputElementTypes")
    assert outcomes["cut_short"]["missing_functions"] == ["ok", " ".join(
        n for n in _table_from("PJRT_Error_Destroy") if n in own or n in cut)]
    assert outcomes["old_version"]["missing_functions"] == ["ok", " ".join(
        n for n, since in _table() if n in own or since > 28)]


def test_a_plugin_without_the_error_functions_is_refused(tmp_path):
    library = _build(tmp_path, "-DNO_ERROR_CODES")
    with pytest.raises(errors.FailedPreconditionError, match="has no PJRT_Error_GetCode"):
        _pjrt.load_plugin(library)


def test_a_failing_layout_destroy_leaves_the_first_error(tmp_path):
    """Serializing a layout fails, and so does destroying it after that (the
    FAILING_LAYOUTS plugin): reading a default layout or a buffer's raises the serialize's
    error, not the destroy's (which is dropped; the layout is destroyed all the same)."""
    plugin = _build(tmp_path, "-DFAILING_LAYOUTS")
    report = _report(_worker(plugin, ["put_and_read", "default_layout_text",
                                      "buffer_layout_text"]))
    assert report["put_and_read"][0] == "ok", report["put_and_read"]
    for operation in ("default_layout_text", "buffer_layout_text"):
        outcome, detail = report[operation]
        assert outcome == "error", detail
        assert detail.startswith("InternalError: serialize failed here"), detail
