"""Shared fixtures and helpers for the tests of the Cython layer ``ifrtpy._pjrt``.

Import the fixtures into a test module (``from pjrt_helpers import client8``) for pytest
to see them. Independent oracles live here too: the ``PJRT_Buffer_Type`` numbering read
from the plugin's own ``pjrt_c_api.h``, and the host value ranges of every dtype.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ifrtpy import _pjrt
from ifrtpy._pjrt._header import pjrt_include_dir
from ifrtpy.plugins.builds import default_cpu_library

REPO = Path(__file__).resolve().parents[2]
MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")

# Noise the plugin writes to stderr on every run; filtered out of subprocess output.
_NOISE = ("Unsupported fusion type", "absl::InitializeLog", "cpu_device_count set via")


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def plugin():
    return _pjrt.load_plugin(default_cpu_library())


@pytest.fixture(scope="module")
def client8(plugin):
    """A client with 8 CPU devices, shared by one test module."""
    return _pjrt.create_client(plugin, {"cpu_device_count": 8})


# --------------------------------------------------------------------------- buffers

def put(client, array, device=None, **kwargs):
    """``buffer_from_host_buffer`` onto ``device`` (default: device 0) unless memory=... ."""
    if device is None and "memory" not in kwargs:
        device = client.devices[0]
    return _pjrt.buffer_from_host_buffer(client, array, device, **kwargs)


def aligned_empty(shape, dtype, alignment=64, offset=0):
    """An uninitialised C-contiguous array whose data starts ``offset`` bytes past an
    ``alignment``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment + offset, np.uint8)
    start = (-raw.ctypes.data) % alignment + offset
    out = raw[start:start + nbytes].view(dtype).reshape(shape)
    assert (out.ctypes.data - offset) % alignment == 0
    return out


# Valid host values of the kinds where not every byte pattern is a value.
SUB_BYTE_RANGES = {
    np.dtype(ml_dtypes.int2): (-2, 1),
    np.dtype(ml_dtypes.uint2): (0, 3),
    np.dtype(ml_dtypes.int4): (-8, 7),
    np.dtype(ml_dtypes.uint4): (0, 15),
}


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Random data for ``dtype``: random bytes viewed as the dtype, except bool (0/1) and
    the sub-byte kinds (values in their range; float4_e2m1fn: bytes 0..15 viewed)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, size, dtype=np.uint8).astype(np.bool_).reshape(shape)
    if dtype in SUB_BYTE_RANGES:
        lo, hi = SUB_BYTE_RANGES[dtype]
        return rng.integers(lo, hi + 1, size).astype(dtype).reshape(shape)
    if dtype == np.dtype(ml_dtypes.float4_e2m1fn):
        return rng.integers(0, 16, size, dtype=np.uint8).view(dtype).reshape(shape)
    raw = rng.integers(0, 256, size * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


# --------------------------------------------------------------------------- the C header

# Names of PJRT_Buffer_Type_* for each host dtype (the oracle for element_type values).
PJRT_TYPE_NAME_OF_DTYPE = {
    np.dtype(np.bool_): "PRED",
    np.dtype(np.int8): "S8", np.dtype(np.int16): "S16",
    np.dtype(np.int32): "S32", np.dtype(np.int64): "S64",
    np.dtype(np.uint8): "U8", np.dtype(np.uint16): "U16",
    np.dtype(np.uint32): "U32", np.dtype(np.uint64): "U64",
    np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.complex64): "C64", np.dtype(np.complex128): "C128",
    np.dtype(ml_dtypes.float8_e5m2): "F8E5M2",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8E4M3FN",
    np.dtype(ml_dtypes.float8_e4m3b11fnuz): "F8E4M3B11FNUZ",
    np.dtype(ml_dtypes.float8_e5m2fnuz): "F8E5M2FNUZ",
    np.dtype(ml_dtypes.float8_e4m3fnuz): "F8E4M3FNUZ",
    np.dtype(ml_dtypes.int4): "S4", np.dtype(ml_dtypes.uint4): "U4",
    np.dtype(ml_dtypes.int2): "S2", np.dtype(ml_dtypes.uint2): "U2",
    np.dtype(ml_dtypes.float8_e4m3): "F8E4M3",
    np.dtype(ml_dtypes.float8_e3m4): "F8E3M4",
    np.dtype(ml_dtypes.float8_e8m0fnu): "F8E8M0FNU",
    np.dtype(ml_dtypes.float4_e2m1fn): "F4E2M1FN",
}

# Bits per element on the device (sub-byte kinds are packed there).
_SUB_BYTE_BITS = {np.dtype(ml_dtypes.int2): 2, np.dtype(ml_dtypes.uint2): 2,
                  np.dtype(ml_dtypes.int4): 4, np.dtype(ml_dtypes.uint4): 4,
                  np.dtype(ml_dtypes.float4_e2m1fn): 4}
BITS_OF_DTYPE = {dt: _SUB_BYTE_BITS.get(dt, 8 * dt.itemsize) for dt in PJRT_TYPE_NAME_OF_DTYPE}


def cpu_device_name(client, i: int) -> str:
    """The debug string of CPU device ``i`` (what the plugin's messages name it by):
    ``TFRT_CPU_i`` on the official build (PJRT 0.81), ``cpu:i`` on newer XLA."""
    return f"TFRT_CPU_{i}" if client.plugin.api_version <= (0, 81) else f"cpu:{i}"


def header_path() -> Path:
    """The PJRT C API header ifrtpy is compiled against (xla-cpu-pjrt's, API 0.81)."""
    return Path(pjrt_include_dir()) / "pjrt_c_api.h"


def pjrt_buffer_types() -> dict[str, int]:
    """``PJRT_Buffer_Type`` enum of the plugin's header: name (without prefix) -> value."""
    text = header_path().read_text()
    text = re.sub(r"//[^\n]*", "", text)
    body = re.search(r"typedef enum \{([^}]*)\}\s*PJRT_Buffer_Type;", text).group(1)
    out, value = {}, -1
    for item in filter(None, (s.strip() for s in body.split(","))):
        name, _, explicit = item.partition("=")
        value = int(explicit, 0) if explicit.strip() else value + 1
        out[name.strip().removeprefix("PJRT_Buffer_Type_")] = value
    return out


# --------------------------------------------------------------------------- programs

def lower(fun, *args, **jit_kwargs) -> bytes:
    """StableHLO text of ``jax.jit(fun, **jit_kwargs).lower(*args)``."""
    import jax
    return jax.jit(fun, **jit_kwargs).lower(*args).as_text().encode()


@contextlib.contextmanager
def shardy_lowering(enabled: bool):
    """jax lowers with the Shardy partitioner (True) or GSPMD (False) inside the block.
    GSPMD skips the test from jax 0.12.1: its changelog made Shardy the only lowering
    (``jax_use_shardy_partitioner`` "has no effect"); older jax keeps GSPMD tested."""
    import jax
    if not enabled and tuple(int(p) for p in jax.__version_info__[:3]) >= (0, 12, 1):
        import pytest
        pytest.skip(f"jax {jax.__version__} lowers for Shardy only (GSPMD lowering removed)")
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", enabled)
    try:
        yield
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


def compile_options(device_assignment=None, **build) -> bytes:
    """Serialized CompileOptionsProto; ``build`` sets executable_build_options fields."""
    from jaxlib import xla_client as xc
    options = xc.CompileOptions()
    eb = options.executable_build_options
    for name, value in build.items():
        setattr(eb, name, value)
    if device_assignment is not None:
        eb.device_assignment = xc.DeviceAssignment.create(np.asarray(device_assignment))
    return options.SerializeAsString()


def run1(executable, *arrays, device=None):
    """Execute a single-device executable on host ``arrays``; the outputs as NumPy."""
    client = executable.client
    device = device or executable.addressable_devices[0]
    buffers = [put(client, a, device)[0] for a in arrays]
    outputs, events = executable.execute([buffers])
    for event in events:
        event.await_()
    return [b.to_numpy() for b in outputs[0]]


# --------------------------------------------------------------------------- subprocesses

#: x + 1 on f32[4], one device
ADD_ONE_F32_4 = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = stablehlo.constant dense<1.0> : tensor<4xf32>
  %y = stablehlo.add %x, %c : tensor<4xf32>
  return %y : tensor<4xf32>
}"""

PRELUDE = """
import gc, sys, numpy as np
from ifrtpy import _pjrt, errors
from ifrtpy.plugins.builds import default_cpu_library
"""


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``PRELUDE + code`` in a fresh interpreter that imports this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    env.setdefault("JAX_PLATFORMS", "cpu")
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def describe(proc: subprocess.CompletedProcess) -> str:
    err = "\n".join(line for line in proc.stderr.splitlines() if not any(n in line for n in _NOISE))
    return f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{err[-3000:]}"


def assert_survives(code: str, *expected_lines: str, timeout: float = 120) -> list[str]:
    """Run ``code`` in a subprocess; it must exit 0 after printing "alive" last, and
    print each of ``expected_lines``. Returns the printed lines."""
    proc = run_python(code, timeout=timeout)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines and lines[-1] == "alive", describe(proc)
    for line in expected_lines:
        assert line in lines, describe(proc)
    return lines


def too_new_for_the_plugin(program_text: str, client) -> bool:
    """Whether jax wrote StableHLO the ``client``'s plugin cannot read: jax >= 0.11 lowers a
    Shardy collective with replica groups named by mesh axes
    (``#stablehlo.replica_group_mesh_axes``, after StableHLO 1.13), which a plugin reading
    StableHLO up to 1.13 (the official 0.81 build) cannot parse. ifrtpy must then refuse the
    program naming the producer and consumer versions (``REFUSED_AS_TOO_NEW``)."""
    reads = tuple(client.plugin.attributes.get("stablehlo_current_version") or (0,))
    return "replica_group_mesh_axes" in program_text and reads < (1, 14)


REFUSED_AS_TOO_NEW = r"jaxlib writes StableHLO .*, this plugin reads StableHLO up to"


def assert_ends(pid: int, within_s: float) -> None:
    """The process ``pid`` ends (or is left a zombie for its new parent) in time."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} still runs {within_s} s later")
