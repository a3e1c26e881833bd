"""GPU check of plugins by name, dtypes, programs, speed next to jax, layouts and the KV path.

Run on a machine with an NVIDIA GPU, jax/jaxlib and jax-cuda13-pjrt (or -cuda12-):

    python benchmarks/gpu/check_plugins.py

Each check prints one ``PASS`` or ``FAIL`` line (with figures where it measures); a
failing check does not stop the others. Without a CUDA plugin it says so after the
discovery check and exits with status 2. Exit status 1 when any check failed. Takes well
under 3 minutes on one GPU (the 1 GiB transfers dominate).
"""

from __future__ import annotations

import gc
import os
import socket
import statistics
import sys
import time
import traceback

# jax shares the GPU with ifrtpy here: neither may take most of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

import ifrtpy as ifrt

RESULTS: list[bool] = []


def check(name: str):
    """Run the decorated function at once as one check: PASS with its return text, or FAIL."""
    def run(fn):
        start = time.perf_counter()
        try:
            detail = fn()
            RESULTS.append(True)
            print(f"PASS {name} ({time.perf_counter() - start:.1f} s){': ' + detail if detail else ''}",
                  flush=True)
        except Exception as e:  # noqa: BLE001 - every failure becomes one FAIL line
            RESULTS.append(False)
            last = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {name}: {type(e).__name__}: {e} (at {os.path.basename(last.filename)}:"
                  f"{last.lineno})", flush=True)
        return fn
    return run


def median_us(fn, number: int, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times) * 1e6


# -- 1. discovery ---------------------------------------------------------------------------

print("plugins found:", flush=True)
for info in ifrt.available_plugins():
    print(f"  {info.name}: {info.path} (from {info.source})", flush=True)

CUDA: ifrt.Client | None = None


@check("get_client('cuda') by name")
def _by_name():
    client = ifrt.get_client("cuda")
    text = f"{client}, platform {client.platform_name} {client.platform_version}"
    del client
    gc.collect()
    return text


if not RESULTS[-1]:
    print("no CUDA plugin found: the remaining checks need one", flush=True)
    sys.exit(2)

CUDA = ifrt.get_client("cuda", preallocate=False)
DEVICE = CUDA.addressable_devices()[0]
SHARDING = ifrt.SingleDeviceSharding(DEVICE)


@check("CPU and CUDA clients side by side")
def _side_by_side():
    if not any(p.name == "cpu" for p in ifrt.available_plugins()):
        return "skipped: no CPU plugin installed here (pip install xla-cpu-pjrt)"
    cpu = ifrt.get_client("cpu", cpu_device_count=2)
    x = np.arange(8, dtype=np.float32)
    a = ifrt.device_put(x, cpu.devices()[1])
    b = CUDA.make_array_from_host_buffer(x, SHARDING)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    return f"{cpu} next to {CUDA}"


# -- 2. dtypes ------------------------------------------------------------------------------

@check("every dtype round-trips")
def _dtypes():
    import ml_dtypes  # noqa: F401  (the numpy forms of the narrow types)

    rng = np.random.default_rng(0)
    done, failed = [], []
    for kind in ifrt.DType.Kind:
        dtype = ifrt.DType(kind)
        try:
            np_dtype = dtype.to_numpy()
        except Exception:  # noqa: BLE001 - kinds with no host form (token, opaque)
            continue
        if np_dtype == np.dtype(object):  # STRING: host-held, never on the device
            continue
        if np_dtype.kind == "b":
            x = rng.integers(0, 2, (3, 5)).astype(np_dtype)
        elif np_dtype.kind in "iu" or np_dtype.itemsize == 1 or "int" in np_dtype.name:
            info_max = 3 if np_dtype.itemsize == 1 else 100
            x = rng.integers(0, info_max + 1, (3, 5)).astype(np_dtype)
        elif np_dtype.kind == "c":
            x = (rng.standard_normal((3, 5)) + 1j * rng.standard_normal((3, 5))).astype(np_dtype)
        else:
            x = rng.standard_normal((3, 5)).astype(np_dtype)
        try:
            back = np.asarray(CUDA.make_array_from_host_buffer(x, SHARDING))
            assert back.dtype == x.dtype and back.tobytes() == x.tobytes(), "values differ"
            done.append(np_dtype.name)
        except Exception as e:  # noqa: BLE001
            failed.append(f"{np_dtype.name} ({type(e).__name__}: {e})"[:160])
    if failed:
        raise AssertionError(f"{len(failed)} failed: {'; '.join(failed)}; passed: {done}")
    return f"{len(done)} dtypes: {', '.join(done)}"


# -- 3. programs ----------------------------------------------------------------------------

@check("builder program runs")
def _builder():
    from ifrtpy.builder import Builder

    b = Builder("affine")
    x = b.parameter((4, 8), np.float32, name="x")
    w = b.parameter((8, 3), np.float32, name="w")
    program = b.build(b.tanh(b.dot(x, w, precision="HIGHEST")))
    exe = CUDA.compile(program, ifrt.CompileOptions(devices=[DEVICE]))
    rng = np.random.default_rng(1)
    xs, ws = rng.standard_normal((4, 8), np.float32), rng.standard_normal((8, 3), np.float32)
    (out,) = exe(*[CUDA.make_array_from_host_buffer(v, SHARDING) for v in (xs, ws)])
    np.testing.assert_allclose(np.asarray(out), np.tanh(xs @ ws), rtol=1e-5, atol=1e-5)


JAX_DEVICE = None


@check("jax-lowered program runs")
def _jax_lowered():
    global JAX_DEVICE
    import jax
    import jax.numpy as jnp

    JAX_DEVICE = jax.devices("gpu")[0]
    f = jax.jit(lambda x, y: jnp.sin(x) @ y + 1.0)
    xs = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    ys = np.ones((4, 2), np.float32)
    program = ifrt.HloProgram(f.lower(xs, ys))
    exe = CUDA.compile(program, ifrt.CompileOptions(devices=[DEVICE]))
    (out,) = exe(*[CUDA.make_array_from_host_buffer(v, SHARDING) for v in (xs, ys)])
    expected = np.asarray(f(jax.device_put(xs, JAX_DEVICE), jax.device_put(ys, JAX_DEVICE)))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)
    return f"jax {jax.__version__} on {JAX_DEVICE}"


# -- 4. speed next to jax on the same GPU ---------------------------------------------------

@check("execute dispatch of x+1, next to jax")
def _dispatch():
    import jax

    f = jax.jit(lambda x: x + 1)
    x = np.zeros(8, np.float32)
    exe = CUDA.compile(ifrt.HloProgram(f.lower(x)), ifrt.CompileOptions(devices=[DEVICE]))
    a = CUDA.make_array_from_host_buffer(x, SHARDING)
    ja = jax.device_put(x, JAX_DEVICE)

    def ifrtpy_step():
        return exe(a)[0].block_until_ready()

    ours = median_us(ifrtpy_step, number=200)
    theirs = median_us(lambda: f(ja).block_until_ready(), number=200)
    np.testing.assert_array_equal(np.asarray(ifrtpy_step()), x + 1)
    return f"ifrtpy {ours:.1f} us, jax {theirs:.1f} us per call+wait (ratio {ours / theirs:.2f})"


@check("put/get of 1 GiB, next to jax")
def _transfer():
    import jax

    x = np.ones(1 << 28, np.float32)  # 1 GiB

    def timed(fn, setup=lambda: None, repeats=3):
        """Fastest of ``repeats`` runs of ``fn(setup())`` (setup untimed)."""
        times = []
        for _ in range(repeats):
            arg = setup()
            start = time.perf_counter()
            fn(arg)
            times.append(time.perf_counter() - start)
            del arg
        return min(times)

    def put_ours(_=None):
        return CUDA.make_array_from_host_buffer(x, SHARDING).block_until_ready()

    def put_jax(_=None):
        return jax.device_put(x, JAX_DEVICE).block_until_ready()

    t_put, t_put_jax = timed(put_ours), timed(put_jax)
    # Each get reads a new device array (jax keeps the host copy of an array it has read).
    t_get = timed(lambda a: a.copy_to_host_buffer().result(), put_ours)
    t_get_jax = timed(lambda ja: np.asarray(ja), put_jax)
    assert put_ours().copy_to_host_buffer().result()[-1] == 1.0
    gib = x.nbytes / (1 << 30)
    return (f"put {gib / t_put:.1f} GiB/s (jax {gib / t_put_jax:.1f}), "
            f"get {gib / t_get:.1f} GiB/s (jax {gib / t_get_jax:.1f})")


# -- 5. layouts -----------------------------------------------------------------------------

@check("column-major layout round-trips")
def _layout():
    x = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    column_major = ifrt.Layout.column_major(2)
    a = CUDA.make_array_from_host_buffer(x, SHARDING, layout=column_major)
    np.testing.assert_array_equal(np.asarray(a), x)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:  # a DLPack export carries the layout's strides
        t = torch.from_dlpack(a)
        assert t.stride() == (1, 6), t.stride()
        np.testing.assert_array_equal(t.cpu().numpy(), x)
    default = CUDA.make_array_from_host_buffer(x, SHARDING)
    return f"reported {a.layout} (default array {default.layout})"


@check("compile-time layouts: a column-major result, argument orders checked")
def _compile_layouts():
    add = ifrt.HloProgram("""
func.func @main(%a: tensor<6x4xf32>) -> tensor<6x4xf32> {
  %0 = stablehlo.add %a, %a : tensor<6x4xf32>
  return %0 : tensor<6x4xf32>
}""")
    x = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    column_major = ifrt.Layout.column_major(2)
    exe = CUDA.compile(add, ifrt.CompileOptions(result_layouts=[column_major]))
    assert exe.output_layouts() == [column_major], exe.output_layouts()
    row = CUDA.make_array_from_host_buffer(x, SHARDING)
    (y,) = exe(row)
    assert y.layout == column_major, y.layout
    np.testing.assert_array_equal(np.asarray(y), x + x)
    col = CUDA.make_array_from_host_buffer(x, SHARDING, layout=column_major)
    try:
        exe(col)  # compiled for a row-major argument
        raise AssertionError("a column-major argument was accepted for a row-major parameter")
    except ifrt.errors.InvalidArgumentError:
        pass
    exe_col = CUDA.compile(add, ifrt.CompileOptions(argument_layouts=[column_major]))
    (z,) = exe_col(col)
    np.testing.assert_array_equal(np.asarray(z), x + x)
    return f"parameter layouts {exe_col.parameter_layouts()}, output {exe.output_layouts()}"


# -- 6. one process through the KV path -----------------------------------------------------

@check("one process through the KV path (num_nodes=1)")
def _kv_path():
    from ifrtpy import distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    distributed.initialize(f"127.0.0.1:{port}", num_processes=1, process_id=0)
    try:
        client = ifrt.get_client("cuda", preallocate=False)
        x = np.arange(10, dtype=np.int32)
        a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(client.devices()[0]))
        np.testing.assert_array_equal(np.asarray(a), x)
        assert client._handle.kv_callbacks is not None
        text = (f"{client}, process_index {client.process_index()}, plugin calls of the "
                f"KV store: {distributed.key_value_store().counts}")
        del client, a
        gc.collect()
        return text
    finally:
        distributed.shutdown()


print(f"{sum(RESULTS)} of {len(RESULTS)} checks passed", flush=True)
sys.exit(0 if all(RESULTS) else 1)
