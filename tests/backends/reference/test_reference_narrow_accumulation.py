"""Dots, convolutions and reductions of floats narrower than f32 (bf16, f16) accumulate in
f32 on the reference backend and round once, as XLA computes them: the reference and PjRt
backends agree on dots within one rounding (the CPU plugin computes them the same way,
and gives the same bits), and jax's own bf16 matmul gives jax's CPU result. XLA's CPU
reductions of narrow floats round along the way (a bf16 sum of 16 values can be off by
several ulps of its result); the reference's are the exact sum rounded once, and the two
agree within the error bound of a pairwise sum."""

import importlib.util
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ifrtpy as ifrt

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
NAMES = {BF16: "bf16", F16: "f16"}
#: The unit roundoff of each narrow type (half an ulp at 1: one rounding's relative error).
UNIT = {BF16: 2.0 ** -8, F16: 2.0 ** -11}

_SETTINGS = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def clients():
    return {name: ifrt.get_client(name, device_count=1) for name in ("reference", "pjrt")}


def _run(client, text, *args):
    sharding = ifrt.SingleDeviceSharding(client.devices()[0])
    inputs = [client.make_array_from_host_buffer(a, sharding) for a in args]
    return [np.asarray(out) for out in client.compile(text).execute(inputs).outputs]


def _within_one_rounding(got, want, dtype, what):
    """``got`` holds ``want`` (computed in f32 or wider) rounded once to ``dtype``, or
    ``want`` itself: within one rounding's error."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    tiny = float(np.finfo(dtype).smallest_subnormal)
    bound = 2 * UNIT[dtype] * np.abs(want) + tiny  # one ulp: either side of a rounding
    worst = np.max(np.abs(got - want) - bound, initial=-1.0)
    assert worst <= 0, f"{what}: off by more than one rounding of {dtype}: {got} vs {want}"


@st.composite
def _dots(draw):
    dtype = draw(st.sampled_from([BF16, F16]))
    m, k, n = (draw(st.integers(1, 6)), draw(st.integers(1, 64)), draw(st.integers(1, 6)))
    widened = draw(st.booleans())  # the result converted to f32 (jax's astype)
    values = st.floats(-4, 4, width=16, allow_subnormal=False)
    a = np.array(draw(st.lists(values, min_size=m * k, max_size=m * k)), np.float32)
    b = np.array(draw(st.lists(values, min_size=k * n, max_size=k * n)), np.float32)
    return dtype, a.reshape(m, k).astype(dtype), b.reshape(k, n).astype(dtype), widened


def _dot_program(dtype, a, b, widened):
    (m, k), (_, n) = a.shape, b.shape
    t = NAMES[dtype]
    out = "f32" if widened else t
    convert = (f"%1 = stablehlo.convert %0 : (tensor<{m}x{n}x{t}>) -> tensor<{m}x{n}xf32>"
               if widened else "")
    return (f"module @dot {{ func.func @main(%a: tensor<{m}x{k}x{t}>, %b: tensor<{k}x{n}x{t}>)"
            f" -> tensor<{m}x{n}x{out}> {{\n"
            f"%0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : "
            f"(tensor<{m}x{k}x{t}>, tensor<{k}x{n}x{t}>) -> tensor<{m}x{n}x{t}>\n{convert}\n"
            f"return %{1 if widened else 0} : tensor<{m}x{n}x{out}> }} }}")


@_SETTINGS
@given(case=_dots())
def test_narrow_dots_agree_with_pjrt_within_one_rounding(clients, case):
    dtype, a, b, widened = case
    text = _dot_program(dtype, a, b, widened)
    (reference,) = _run(clients["reference"], text, a, b)
    (pjrt,) = _run(clients["pjrt"], text, a, b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    _within_one_rounding(pjrt, exact, dtype, "pjrt")  # what "as XLA does" means
    _within_one_rounding(reference, pjrt, dtype, "reference against pjrt")


@st.composite
def _sums(draw):
    dtype = draw(st.sampled_from([BF16, F16]))
    rows, n = draw(st.integers(1, 4)), draw(st.integers(1, 512))
    values = st.floats(-2, 2, width=16, allow_subnormal=False)
    x = np.array(draw(st.lists(values, min_size=rows * n, max_size=rows * n)), np.float32)
    return dtype, x.reshape(rows, n).astype(dtype)


@_SETTINGS
@given(case=_sums())
def test_narrow_sums_are_the_exact_sum_rounded_once(clients, case):
    dtype, x = case
    rows, n = x.shape
    t = NAMES[dtype]
    text = (f"module @sum {{ func.func @main(%x: tensor<{rows}x{n}x{t}>) -> tensor<{rows}x{t}> {{\n"
            f"%z = stablehlo.constant dense<0.0> : tensor<{t}>\n"
            f"%0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : "
            f"(tensor<{rows}x{n}x{t}>, tensor<{t}>) -> tensor<{rows}x{t}>\n"
            f"return %0 : tensor<{rows}x{t}> }} }}")
    (reference,) = _run(clients["reference"], text, x)
    (pjrt,) = _run(clients["pjrt"], text, x)
    exact = x.astype(np.float64).sum(axis=1)
    _within_one_rounding(reference, exact, dtype, "reference")
    # XLA's CPU sum rounds along the way: within a pairwise sum's bound of the exact one.
    bound = (math.ceil(math.log2(n)) + 1) * UNIT[dtype] * np.abs(x.astype(np.float64)).sum(1)
    assert np.all(np.abs(pjrt.astype(np.float64) - exact) <= bound + 2 * UNIT[dtype] * np.abs(exact))


def test_a_bf16_sum_of_many_values_does_not_stall():
    """The interpreter accumulating in bf16 stops at 256 once 256 + 0.5 rounds to 256."""
    client = ifrt.get_client("reference", device_count=1)
    x = np.full((1, 4096), 0.5, BF16)
    text = ("module @sum { func.func @main(%x: tensor<1x4096xbf16>) -> tensor<1xbf16> {\n"
            "%z = stablehlo.constant dense<0.0> : tensor<bf16>\n"
            "%0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : "
            "(tensor<1x4096xbf16>, tensor<bf16>) -> tensor<1xbf16>\n"
            "return %0 : tensor<1xbf16> } }")
    (out,) = _run(client, text, x)
    assert float(out[0]) == 2048.0


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax")
def test_jax_bf16_matmul_gives_jax_cpu_result():
    """jax's ``(a.astype(bf16) @ b.astype(bf16)).astype(f32)``, a f32[8,16] and b
    f32[16,8], lowered by jax and run on the reference backend, gives jax's CPU result
    within one bf16 rounding: XLA multiplies the bf16 values and accumulates in f32, as
    the reference does now (jaxlib 0.10's XLA folds the convert into the dot and returns
    the f32 sum, 0.12's rounds it to bf16 first). Accumulating in bf16 it was up to
    0.056 off."""
    import jax
    import jax.numpy as jnp

    def f(a, b):
        return (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)).astype(jnp.float32)

    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    want = np.asarray(jax.jit(f)(a, b))
    text = jax.jit(f).lower(a, b).as_text()
    (got,) = _run(ifrt.get_client("reference", device_count=1), text, a, b)
    _within_one_rounding(got, want, BF16, "reference against jax's CPU client")
