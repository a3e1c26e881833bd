"""The tests' own XLA FFI handlers (tests/helpers/data/ffi_handlers.cc), built with g++
against the headers jaxlib ships (``jax.ffi.include_dir()``) and registered with
``ifrtpy.ffi`` under :data:`TARGETS` (the legacy one with api_version 0)."""

from __future__ import annotations

import atexit
import ctypes
import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent / "data" / "ffi_handlers.cc"
#: symbol -> custom call target name.
TARGETS = {"ScaleTyped": "ifrtpy_test_scale_typed", "ScaleAbi": "ifrtpy_test_scale_abi",
           "DoubleLegacy": "ifrtpy_test_double_legacy"}


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL:
    """The library (built once per process), its handlers registered; skips the calling
    test where there is no C++ compiler or no jax."""
    jax = pytest.importorskip("jax")
    import ifrtpy as ifrt

    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++) to build the test's FFI handlers")
    folder = tempfile.mkdtemp(prefix="ifrtpy-ffi-")
    atexit.register(shutil.rmtree, folder, True)  # the loaded library outlives its file
    library = Path(folder) / "libifrtpy_test_ffi.so"
    subprocess.run([compiler, "-std=c++17", "-O1", "-w", "-shared", "-fPIC",
                    "-I", jax.ffi.include_dir(), str(SOURCE), "-o", str(library)],
                   check=True, timeout=300)
    lib = ctypes.cdll.LoadLibrary(str(library))
    for symbol, target in TARGETS.items():
        legacy = symbol.endswith("Legacy")
        try:
            ifrt.ffi.register_ffi_target(target, ifrt.ffi.pycapsule(getattr(lib, symbol)),
                                         platform="cpu", api_version=0 if legacy else 1)
        except (ifrt.errors.UnimplementedError, ifrt.errors.FailedPreconditionError):
            # a plugin already in use refuses it (a legacy target, or one built for a newer
            # XLA FFI than the plugin's): it stays registered for the others
            assert target in ifrt.ffi.registered_targets("cpu")
    return lib


def header_version() -> tuple[int, ...]:
    """The XLA FFI version of jaxlib's headers (what a handler built with them claims)."""
    import jax

    text = (Path(jax.ffi.include_dir()) / "xla/ffi/api/c_api.h").read_text()
    return tuple(int(re.search(rf"#define XLA_FFI_API_{part} (\d+)", text).group(1))
                 for part in ("MAJOR", "MINOR"))
