"""``stablehlo.fma`` sent to a plugin whose StableHLO predates it (the bundled CPU plugins
read up to 1.16.1; fma arrived in 1.24.0): rewritten into older ops (``ifrtpy/program/fma.py``)
that round once, checked on the plugin against exact rational arithmetic
(``tests/helpers/exact_float.py``) in f16, bf16, f32 and f64. Needs a jaxlib whose
StableHLO has the op (0.12.1 and later; jax lowers ``lax.erf_inv`` and
``jax.random.normal`` to it there)."""

from __future__ import annotations

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.program import fma as fma_rewrite
from ifrtpy.program import mlir
import exact_float

ELEMENT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}
N = 512


def _fma_program(dtype) -> str:
    t = f"tensor<{N}x{ELEMENT[np.dtype(dtype).name]}>"
    return f"""func.func public @main(%a: {t}, %b: {t}, %c: {t}) -> {t} {{
  %0 = stablehlo.fma %a, %b, %c : {t}
  return %0 : {t}
}}"""


@pytest.fixture(scope="module", autouse=True)
def _needs_fma():
    if mlir.stablehlo_version() < fma_rewrite.FMA_VERSION:
        pytest.skip(f"jaxlib's StableHLO {mlir.stablehlo_version()} has no stablehlo.fma")


@pytest.fixture(scope="module")
def client():
    client = ifrt.get_client("pjrt")
    target = client.plugin.attributes.get("stablehlo_current_version")
    if target is None or tuple(target) >= fma_rewrite.FMA_VERSION:
        pytest.skip(f"the plugin reads StableHLO {target}, which has fma: nothing to rewrite")
    return client


def _run(client, dtype, a, b, c):
    exe = client.compile(ifrt.HloProgram(_fma_program(dtype)))
    device = client.devices()[0]
    out, = exe(*[ifrt.device_put(v, device) for v in (a, b, c)])
    return np.asarray(out)


def _safe_for_the_split(a, b, c):
    """f64 operands where the rewrite is exact (fma.py's docstring): elsewhere it
    rounds the product first."""
    a, b, c = (np.asarray(v, np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        p = np.abs(a * b)
    finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
    inside = ((p > 2.0 ** -900) & (p < 2.0 ** 1020) & (np.abs(c) < 2.0 ** 1020)
              & (np.abs(a) < 2.0 ** 995) & (np.abs(b) < 2.0 ** 995))
    return inside | ~finite


@pytest.mark.parametrize("dtype", sorted(exact_float.FORMATS, key=str), ids=str)
def test_the_plugin_rounds_fma_once(client, dtype):
    a, b, c = exact_float.hard_cases(dtype, N, seed=11)
    if np.dtype(dtype) == np.float64:
        keep = _safe_for_the_split(a, b, c)
        a, b, c = (np.resize(v[keep], N) for v in (a, b, c))
    out = _run(client, dtype, a, b, c)
    assert out.dtype == np.dtype(dtype)
    rows = [(x, y, z, o, exact_float.fma(x, y, z, dtype)) for x, y, z, o in zip(a, b, c, out)]
    normal = [r for r in rows if not any(_subnormal(v, dtype) for v in r[:3] + r[4:])]
    assert len(normal) > N * 0.9
    wrong = [r[:4] for r in normal if not exact_float.same(r[3], r[4])]
    assert not wrong, f"{len(wrong)} of {len(normal)} wrong, e.g. (a, b, c, plugin's) {wrong[:3]}"


def _subnormal(value, dtype) -> bool:
    """XLA's CPU code flushes f32 and f64 subnormals to zero (operands and results), as
    in every op: the oracle's IEEE subnormals are left out for those types."""
    if np.dtype(dtype) not in (np.float32, np.float64):
        return False
    return 0 < abs(float(value)) < float(np.finfo(dtype).tiny)


def test_f64_outside_the_split_rounds_the_product_first(client):
    """Products near the ends of f64's range: the documented two roundings (and IEEE's
    infinities: an overflowing product plus -inf is -inf, not NaN)."""
    big, tiny = 2.0 ** 1000, 2.0 ** -600
    a = np.resize(np.array([big, big, tiny, -tiny, 2.0 ** 1023]), N)
    b = np.resize(np.array([3.0, 2.0 ** 30, tiny * 1.5, tiny, 4.0]), N)
    c = np.resize(np.array([-big, -np.inf, 2.0 ** -1000, 0.0, 1.0]), N)
    out = _run(client, np.float64, a, b, c)
    with np.errstate(all="ignore"):
        want = np.where(np.isinf(c), c, a * b + c)
    np.testing.assert_array_equal(out, want)


def test_the_rewrite_happens_only_for_plugins_without_fma():
    program = ifrt.HloProgram(_fma_program(np.float32))
    old, how_old = program.serialize_for((1, 16, 1))
    new, how_new = program.serialize_for(mlir.stablehlo_version())
    assert how_old == "bytecode 1.16.1" and how_new.startswith("bytecode")
    assert "stablehlo.fma" not in str(ifrt.HloProgram(old))
    assert "stablehlo.fma" in str(ifrt.HloProgram(new))
