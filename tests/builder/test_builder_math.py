"""The builder's elementwise math against NumPy (and jax.scipy.special where NumPy has
no such function): transcendental, hyperbolic and special functions, complex parts,
bit counts and shifts, classification, and ResultAccuracy on the transcendental ops.

The builder expands CHLO ops (the special and hyperbolic functions) into StableHLO when
it builds, so everything here runs on both backends; a program holding CHLO ops is still
refused by the reference backend at compile time, which is tested too.
"""

from __future__ import annotations

import math

import jax.scipy.special as jsp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.builder import Builder, ResultAccuracy
from ifrtpy.errors import InvalidArgumentError, UnimplementedError

from builder_helpers import (  # noqa: F401  (client is a fixture)
    FEW, SOME, array, client, optimized_hlo, pjrt_client, run, shapes,
)

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _logistic(x):
    return 1 / (1 + np.exp(-x))


#: StableHLO unary ops: (oracle, input range).
STABLEHLO_UNARY = {
    "exp": (np.exp, (-3, 3)), "expm1": (np.expm1, (-1, 1)), "log": (np.log, (0.1, 5)),
    "log1p": (np.log1p, (-0.5, 3)), "logistic": (_logistic, (-5, 5)),
    "sqrt": (np.sqrt, (0, 5)), "rsqrt": (lambda x: 1 / np.sqrt(x), (0.1, 5)),
    "cbrt": (np.cbrt, (-5, 5)), "sin": (np.sin, (-4, 4)), "cos": (np.cos, (-4, 4)),
    "tan": (np.tan, (-1.2, 1.2)), "tanh": (np.tanh, (-3, 3)),
    "real": (np.real, (-3, 3)), "imag": (np.imag, (-3, 3)),
}
#: CHLO unary ops: (oracle, input range).
CHLO_UNARY = {
    "square": (np.square, (-3, 3)), "sinh": (np.sinh, (-3, 3)), "cosh": (np.cosh, (-3, 3)),
    "asin": (np.arcsin, (-0.9, 0.9)), "acos": (np.arccos, (-0.9, 0.9)),
    "atan": (np.arctan, (-3, 3)), "asinh": (np.arcsinh, (-3, 3)),
    "acosh": (np.arccosh, (1.1, 5)), "atanh": (np.arctanh, (-0.9, 0.9)),
    "erf": (np.vectorize(math.erf), (-3, 3)), "erfc": (np.vectorize(math.erfc), (-3, 3)),
    "lgamma": (np.vectorize(math.lgamma), (0.1, 6)),
    "erf_inv": (lambda x: np.asarray(jsp.erfinv(x.astype(np.float32))), (-0.9, 0.9)),
    "digamma": (lambda x: np.asarray(jsp.digamma(x.astype(np.float32))), (0.5, 6)),
    "bessel_i1e": (lambda x: np.asarray(jsp.i1e(x.astype(np.float32))), (-4, 4)),
}
#: Ops checked against float32 oracles (jax.scipy.special): looser tolerance.
F32_ORACLES = frozenset({"erf_inv", "digamma", "bessel_i1e"})


def _tolerance(dtype, op=""):
    if dtype == F64 and op not in F32_ORACLES:
        return dict(rtol=1e-10, atol=1e-12)
    return dict(rtol=2e-5 if op not in F32_ORACLES else 2e-4, atol=2e-5)


def _unary_program(ops, shape, dtype):
    b = Builder("unary")
    params = [b.parameter(shape, dtype, name=op) for op in ops]
    return b.build(*[getattr(b, op)(p) for op, p in zip(ops, params)])


def _unary_inputs(ops, shape, dtype, data):
    return [array(data, shape, dtype, lo, hi) for _, (lo, hi) in ops.values()]


@SOME
@given(data=st.data(), shape=shapes(max_rank=2), dtype=st.sampled_from([F32, F64]))
def test_stablehlo_unary_math(client, data, shape, dtype):
    inputs = _unary_inputs(STABLEHLO_UNARY, shape, dtype, data)
    outs = run(client, _unary_program(STABLEHLO_UNARY, shape, dtype), *inputs)
    for (op, (oracle, _)), x, out in zip(STABLEHLO_UNARY.items(), inputs, outs):
        assert out.dtype == dtype, op
        np.testing.assert_allclose(out, oracle(x.astype(np.float64)), **_tolerance(dtype), err_msg=op)


#: CHLO ops expand into long StableHLO sequences that take seconds to compile: their
#: tests compile once per backend and dtype (fixed shape) and vary only the values.
_COMPILED: dict = {}
CHLO_SHAPE = (3, 5)


def _run_cached(client, key, build, *inputs):
    key = (client, *key)
    if key not in _COMPILED:
        _COMPILED[key] = client.compile(build(), ifrt.CompileOptions())
    device = client.devices()[0]
    outs = _COMPILED[key](*[ifrt.device_put(np.asarray(x), device) for x in inputs])
    return [np.asarray(o) for o in outs]


@FEW
@given(data=st.data(), dtype=st.sampled_from([F32, F64]))
def test_chlo_unary_math(client, data, dtype):
    inputs = _unary_inputs(CHLO_UNARY, CHLO_SHAPE, dtype, data)
    outs = _run_cached(client, ("chlo_unary", dtype), lambda: _unary_program(CHLO_UNARY, CHLO_SHAPE, dtype),
                       *inputs)
    for (op, (oracle, _)), x, out in zip(CHLO_UNARY.items(), inputs, outs):
        assert out.dtype == dtype, op
        np.testing.assert_allclose(out, oracle(x.astype(np.float64)), **_tolerance(dtype, op), err_msg=op)


def test_chlo_is_expanded_and_a_chlo_program_is_refused_by_the_reference_backend():
    b = Builder()
    x = b.parameter((3,), np.float32)
    program = b.build(b.erf(x), b.top_k(x, 2)[0])
    assert "chlo." not in program.text
    assert program.serialize_for((1, 13, 3))[1].startswith("bytecode")
    text = """func.func @main(%a: tensor<3xf32>) -> tensor<3xf32> {
      %0 = chlo.erf %a : tensor<3xf32> -> tensor<3xf32>
      return %0 : tensor<3xf32> }"""
    with pytest.raises(UnimplementedError, match="chlo.erf"):
        ifrt.get_client("reference").compile(ifrt.HloProgram(text), ifrt.CompileOptions())


@SOME
@given(data=st.data(), shape=shapes(max_rank=2), dtype=st.sampled_from([np.dtype(np.complex64), np.dtype(np.complex128)]))
def test_complex_math(client, data, shape, dtype):
    part = np.float32 if dtype == np.complex64 else np.float64
    b = Builder("complex")
    re_, im_ = b.parameter(shape, part), b.parameter(shape, part)
    z = b.complex(re_, im_)
    program = b.build(z, b.real(z), b.imag(z), b.abs(z), b.exp(z), b.sqrt(z), b.sin(z), b.log(z),
                      b.tanh(z), b.sign(z), z * z)
    xr, xi = array(data, shape, part, 0.1, 2), array(data, shape, part, -2, 2)
    outs = run(client, program, xr, xi)
    zz = xr.astype(np.float64) + 1j * xi.astype(np.float64)
    expected = [zz, zz.real, zz.imag, np.abs(zz), np.exp(zz), np.sqrt(zz), np.sin(zz), np.log(zz),
                np.tanh(zz), zz / np.abs(zz), zz * zz]
    tol = _tolerance(np.dtype(part))
    for i, (out, exp) in enumerate(zip(outs, expected)):
        assert out.dtype == (dtype if i in (0, 4, 5, 6, 7, 8, 9, 10) else part), i
        np.testing.assert_allclose(out, exp, **tol, err_msg=str(i))


@FEW
@given(data=st.data(), shape=shapes(max_rank=2),
       dtype=st.sampled_from([np.dtype(t) for t in (np.int8, np.int32, np.int64, np.uint8, np.uint32)]))
def test_bit_ops(client, data, shape, dtype):
    bits = dtype.itemsize * 8
    info = np.iinfo(dtype)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    x = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    lo = -2 if info.min < 0 else 0
    s = rng.integers(lo, bits + 3, size=shape).astype(dtype)
    b = Builder("bits")
    px, ps = b.parameter(shape, dtype), b.parameter(shape, dtype)
    ops = [b.popcnt(px), b.clz(px), b.shift_left(px, ps), b.shift_right_logical(px, ps)]
    if info.min < 0:
        ops.append(b.shift_right_arithmetic(px, ps))
    outs = run(client, b.build(*ops), x, s)
    unsigned = np.dtype(f"uint{bits}")
    ux = x.view(unsigned).astype(object)
    valid = (s >= 0) & (s < bits)
    shift = np.where(valid, s, 0).astype(object)
    mask = (1 << bits) - 1
    expected = [
        np.bitwise_count(x.view(unsigned)).astype(dtype),
        np.array([bits - int(v).bit_length() for v in ux.reshape(-1)], dtype).reshape(shape),
        np.where(valid, np.asarray((ux << shift) & mask).astype(unsigned).view(dtype), 0),
        np.where(valid, np.asarray(ux >> shift).astype(unsigned).view(dtype), 0),
    ]
    if info.min < 0:
        expected.append(np.where(valid, x >> np.where(valid, s, 0), np.where(x < 0, -1, 0)))
    for i, (out, exp) in enumerate(zip(outs, expected)):
        np.testing.assert_array_equal(out, np.asarray(exp, dtype), err_msg=str(i))


def _binary_program(dtype):
    b = Builder("binary")
    x, y, n, q = (b.parameter(CHLO_SHAPE, dtype) for _ in range(4))
    return b.build(b.atan2(x, y), b.next_after(x, y), b.polygamma(n, q), b.zeta(q + 1.5, q))


@FEW
@given(data=st.data(), dtype=st.sampled_from([F32, F64]))
def test_binary_math(client, data, dtype):
    """atan2, next_after, polygamma and zeta."""
    xs, ys = array(data, CHLO_SHAPE, dtype, -3, 3), array(data, CHLO_SHAPE, dtype, -3, 3)
    ns = array(data, CHLO_SHAPE, np.int32, 0, 2).astype(dtype)
    qs = array(data, CHLO_SHAPE, dtype, 0.5, 4)
    outs = _run_cached(client, ("binary", dtype), lambda: _binary_program(dtype), xs, ys, ns, qs)
    np.testing.assert_allclose(outs[0], np.arctan2(xs.astype(np.float64), ys), **_tolerance(dtype))
    np.testing.assert_array_equal(outs[1], np.nextafter(xs, ys))
    q32 = qs.astype(np.float32)
    np.testing.assert_allclose(outs[2], np.asarray(jsp.polygamma(ns.astype(np.int32), q32)), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(outs[3], np.asarray(jsp.zeta(q32 + 1.5, q32)), rtol=1e-3, atol=1e-4)


def test_atan2_and_classification(client):
    special = np.array([0.0, -0.0, 1.5, -2.0, np.inf, -np.inf, np.nan], np.float32)
    b = Builder()
    x = b.parameter(special.shape, np.float32)
    y = b.parameter(special.shape, np.float32)
    outs = run(client, b.build(b.atan2(x, y), b.is_finite(x)), special, special[::-1].copy())
    np.testing.assert_allclose(outs[0], np.arctan2(special, special[::-1]), rtol=1e-6)
    np.testing.assert_array_equal(outs[1], np.isfinite(special))
    b = Builder()
    x = b.parameter(special.shape, np.float32)
    outs = run(client, b.build(b.is_inf(x), b.is_pos_inf(x), b.is_neg_inf(x)), special)
    np.testing.assert_array_equal(outs[0], np.isinf(special))
    np.testing.assert_array_equal(outs[1], np.isposinf(special))
    np.testing.assert_array_equal(outs[2], np.isneginf(special))


def test_reciprocal_and_round_nearest_even(client):
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 4.0], np.float32)
    b = Builder()
    p = b.parameter(x.shape, np.float32)
    outs = run(client, b.build(b.reciprocal(p), b.round_nearest_even(p)), x)
    np.testing.assert_allclose(outs[0], 1 / x)
    np.testing.assert_array_equal(outs[1], np.round(x))


@pytest.mark.parametrize("op,dtype,message", [
    ("sin", np.int32, "needs floating-point or complex operands"),
    ("erf", np.complex64, "needs floating-point operands"),
    ("popcnt", np.float32, "needs integer operands"),
    ("is_finite", np.int32, "needs floating-point operands"),
])
def test_unary_dtype_errors(op, dtype, message):
    b = Builder()
    with pytest.raises(InvalidArgumentError, match=f"{op}: {message}"):
        getattr(b, op)(b.parameter((2,), dtype))


def test_binary_dtype_errors():
    b = Builder()
    f16 = b.parameter((2,), np.float16)
    with pytest.raises(InvalidArgumentError, match="complex: needs f32 or f64 operands"):
        b.complex(f16, f16)
    with pytest.raises(InvalidArgumentError, match="shift_left: needs integer operands"):
        b.shift_left(f16, f16)


# -- result accuracy -----------------------------------------------------------------------------

@pytest.mark.parametrize("accuracy,text,hlo", [
    ("HIGHEST", "mode = #stablehlo.result_accuracy_mode<HIGHEST>", "result_accuracy={mode=highest}"),
    (ResultAccuracy(atol=1e-5, rtol=1e-6, ulps=2),
     "atol = 1.000000e-05, rtol = 9.9999999999999995E-7, ulps = 2",
     "result_accuracy={tolerance={atol=1e-05,rtol=1e-06,ulps=2}}"),
])
def test_result_accuracy_reaches_the_compiled_module(accuracy, text, hlo):
    b = Builder()
    x = b.parameter((4,), np.float32)
    program = b.build(b.exp(x, result_accuracy=accuracy), b.sin(x))
    assert text in program.text
    client = pjrt_client()
    exe = client.compile(program, ifrt.CompileOptions())
    optimized = optimized_hlo(exe)
    exp_line = next(line for line in optimized.splitlines() if " exponential(" in line)
    assert hlo in exp_line
    sin_line = next(line for line in optimized.splitlines() if " sine(" in line)
    assert "result_accuracy" not in sin_line
    value = np.linspace(-2, 2, 4, dtype=np.float32)
    out = exe(ifrt.device_put(value, client.devices()[0]))
    np.testing.assert_allclose(np.asarray(out[0]), np.exp(value), rtol=1e-5)


@pytest.mark.parametrize("accuracy", ["DEFAULT", ResultAccuracy(atol=1e-3)])
def test_result_accuracy_on_the_reference_backend(accuracy):
    b = Builder()
    x = b.parameter((3,), np.float32)
    program = b.build(b.log(x, result_accuracy=accuracy))
    value = np.array([0.5, 1.0, 3.0], np.float32)
    out = run(ifrt.get_client("reference"), program, value)
    np.testing.assert_allclose(out[0], np.log(value), rtol=1e-6)


@pytest.mark.parametrize("accuracy,message", [
    ("FASTEST", "mode must be one of DEFAULT, HIGHEST, TOLERANCE, got 'FASTEST'"),
    (ResultAccuracy(atol=-1.0), "tolerances must be finite and non-negative"),
    (ResultAccuracy(ulps=1, mode="HIGHEST"), "mode HIGHEST takes no tolerances"),
    (3, "must be a mode name or a ResultAccuracy, got 3"),
])
def test_result_accuracy_errors(accuracy, message):
    b = Builder()
    x = b.parameter((3,), np.float32)
    with pytest.raises(InvalidArgumentError, match=f"^tanh: result_accuracy {message}".replace("(", r"\(")
                       .replace(")", r"\)")):
        b.tanh(x, result_accuracy=accuracy)


def test_conj(client):
    z = np.array([1 + 2j, -3 - 0.5j, 0j], np.complex64)
    b = Builder()
    out = run(client, b.build(b.conj(b.parameter(z.shape, np.complex64))), z)
    np.testing.assert_array_equal(out[0], np.conj(z))


NARROW_FLOATS = ["float8_e3m4", "float8_e4m3", "float8_e4m3fn", "float8_e4m3fnuz",
                 "float8_e4m3b11fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
                 "float4_e2m1fn"]


@pytest.mark.parametrize("name", NARROW_FLOATS)
def test_next_after_every_pair_of_narrow_floats(client, name):
    """next_after over every (from, to) pair of each 8- and 4-bit float (256² or 16²
    pairs): the bits ml_dtypes' nextafter gives, any NaN for NaN. The types without
    negative zero (the FNUZ ones) step from the least negative value to 0, not to their
    NaN; float8_e8m0fnu has no sign bit and no zero."""
    dtype = np.dtype(getattr(ml_dtypes, name))
    codes = np.arange(2 ** ml_dtypes.finfo(dtype).bits, dtype=np.uint8).view(dtype)
    x, y = np.repeat(codes, codes.size), np.tile(codes, codes.size)
    b = Builder("next_after")
    program = b.build(b.next_after(b.parameter(x.shape, dtype), b.parameter(y.shape, dtype)))
    got, = run(client, program, x, y)
    want = np.nextafter(x, y)
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    wrong = ~nan & (got.view(np.uint8) != want.view(np.uint8))
    assert not wrong.any(), [(x[i], y[i], got[i], want[i]) for i in np.flatnonzero(wrong)[:5]]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_next_after_wide_floats_on_the_bits(client, dtype):
    """next_after of the wider floats against np.nextafter: random bit patterns (NaNs,
    infinities and subnormals among them) paired with each other and with their
    neighbours, signed zeros and infinities."""
    dtype = np.dtype(dtype)
    unsigned = np.dtype(f"u{dtype.itemsize}")
    rng = np.random.default_rng(7)
    codes = rng.integers(0, np.iinfo(unsigned).max, 4096, dtype=unsigned, endpoint=True)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -1.0]).astype(dtype)
    x = np.concatenate([codes.view(dtype), np.repeat(special, special.size), codes.view(dtype)])
    y = np.concatenate([np.roll(codes, 1).view(dtype), np.tile(special, special.size),
                        (codes + unsigned.type(1)).view(dtype)])
    b = Builder("next_after")
    program = b.build(b.next_after(b.parameter(x.shape, dtype), b.parameter(y.shape, dtype)))
    got, = run(client, program, x, y)
    with np.errstate(invalid="ignore"):
        want = np.where(x == y, y, np.nextafter(x, y))  # C's y (NumPy's float16 gives x)
    nan = np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
    np.testing.assert_array_equal(got.view(unsigned)[~nan], want.view(unsigned)[~nan])
