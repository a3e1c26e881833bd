"""Every builder op, built over random shapes and dtypes, compiled and run, equals NumPy.

Each hypothesis test builds one program (several ops side by side where they are cheap),
runs it on the backend of the ``client`` fixture (PjRt; and the reference backend where it
exists: ops it does not implement are skipped there) and compares with the NumPy
expression the ops stand for: exactly, or with a tolerance for floating-point math.
"""

from __future__ import annotations

import math
import pathlib
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.builder import Builder

from builder_helpers import (  # noqa: F401  (client is a fixture)
    BF16, FEW, FLOATS, INTS, NUMERIC, PRED, SIGNED, array, assert_close, client, isfloat, run,
    shapes,
)

# -- elementwise -------------------------------------------------------------------------------

@FEW
@given(data=st.data(), shape=shapes(), dtype=st.sampled_from(NUMERIC))
def test_binary_arithmetic(client, data, shape, dtype):
    x = array(data, shape, dtype, -20, 20)
    y = array(data, shape, dtype, -20, 20)
    if dtype.kind in "iu":
        y = np.where(y == 0, 1, y).astype(dtype)
    else:
        y = np.where(np.abs(y) < 0.5, 1.5, y).astype(dtype)
    b = Builder()
    px, py = b.parameter(shape, dtype), b.parameter(shape, dtype)
    prog = b.build(px + py, px - py, px * py, b.max(px, py), b.min(px, py), px / py, px % py)
    outs = run(client, prog, x, y)
    wide = np.float64 if isfloat(dtype) else np.int64
    xw, yw = x.astype(wide), y.astype(wide)
    if dtype.kind in "iu":
        quotient = np.trunc(xw / yw)
    else:
        quotient = xw / yw
    expected = [xw + yw, xw - yw, xw * yw, np.maximum(xw, yw), np.minimum(xw, yw), quotient,
                np.fmod(xw, yw)]
    for got, want in zip(outs, expected):
        if dtype.kind in "iu":
            want = want.astype(np.int64).astype(dtype)  # wrap around as the device does
        assert_close(got, want, dtype)


@FEW
@given(data=st.data(), shape=shapes(), dtype=st.sampled_from(FLOATS + SIGNED))
def test_pow(client, data, shape, dtype):
    if isfloat(dtype):
        x, y = array(data, shape, dtype, 0.5, 2.0), array(data, shape, dtype, -2, 2)
    else:
        x, y = array(data, shape, dtype, -3, 3), array(data, shape, dtype, 0, 3)
    b = Builder()
    px, py = b.parameter(shape, dtype), b.parameter(shape, dtype)
    out, = run(client, b.build(px ** py), x, y)
    if isfloat(dtype):
        assert_close(out, np.power(x.astype(np.float64), y.astype(np.float64)), dtype)
    else:
        assert_close(out, np.power(x.astype(np.int64), y.astype(np.int64)), dtype)


def _round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


@FEW
@given(data=st.data(), shape=shapes(), dtype=st.sampled_from(FLOATS))
def test_unary_float_math(client, data, shape, dtype):
    x = array(data, shape, dtype, -3, 3)
    x[...] = np.where(np.abs(x.astype(np.float64) % 1 - 0.5) < 1e-3, 0.25, x)  # no ties in round
    pos = array(data, shape, dtype, 0.1, 4)
    b = Builder()
    px, pp = b.parameter(shape, dtype), b.parameter(shape, dtype)
    prog = b.build(b.exp(px), b.log(pp), b.tanh(px), b.logistic(px), b.sqrt(pp), b.rsqrt(pp),
                   b.floor(px), b.ceil(px), b.round(px), b.round_nearest_even(px), -px, abs(px),
                   b.sign(px))
    xs, ps = x.astype(np.float64), pos.astype(np.float64)
    expected = [np.exp(xs), np.log(ps), np.tanh(xs), 1 / (1 + np.exp(-xs)), np.sqrt(ps),
                1 / np.sqrt(ps), np.floor(xs), np.ceil(xs), _round_half_away(xs), np.round(xs),
                -xs, np.abs(xs), np.sign(xs)]
    for got, want in zip(run(client, prog, x, pos), expected):
        assert_close(got, want.astype(dtype), dtype)


@FEW
@given(data=st.data(), shape=shapes(), dtype=st.sampled_from(SIGNED))
def test_unary_integer(client, data, shape, dtype):
    x = array(data, shape, dtype, -100, 100)
    b = Builder()
    px = b.parameter(shape, dtype)
    outs = run(client, b.build(-px, abs(px), b.sign(px), ~px), x)
    for got, want in zip(outs, [-x, np.abs(x), np.sign(x), ~x]):
        assert_close(got, want, dtype)


@FEW
@given(data=st.data(), shape=shapes(), dtype=st.sampled_from(NUMERIC))
def test_compare_all_directions(client, data, shape, dtype):
    x, y = array(data, shape, dtype, 0, 3), array(data, shape, dtype, 0, 3)
    x = np.round(x) if isfloat(dtype) else x  # equal values are likely
    y = np.round(y) if isfloat(dtype) else y
    b = Builder()
    px, py = b.parameter(shape, dtype), b.parameter(shape, dtype)
    prog = b.build([b.compare(px, py, d) for d in ("EQ", "NE", "LT", "LE", "GT", "GE")],
                   px == py, px != py, px < py, px <= py, px > py, px >= py)
    outs = run(client, prog, x, y)
    expected = [x == y, x != y, x < y, x <= y, x > y, x >= y] * 2
    for got, want in zip(outs, expected):
        assert_close(got, want, PRED)


@FEW
@given(data=st.data(), shape=shapes(), dtype=st.sampled_from(NUMERIC + [PRED]),
       scalar_pred=st.booleans())
def test_select(client, data, shape, dtype, scalar_pred):
    pred = array(data, () if scalar_pred else shape, PRED)
    x, y = array(data, shape, dtype), array(data, shape, dtype)
    b = Builder()
    pp, px, py = b.parameter(pred.shape, PRED), b.parameter(shape, dtype), b.parameter(shape, dtype)
    out, = run(client, b.build(b.select(pp, px, py)), pred, x, y)
    assert_close(out, np.where(pred, x, y), dtype)


@FEW
@given(data=st.data(), shape=shapes(), dtype=st.sampled_from(INTS + [PRED]))
def test_logical(client, data, shape, dtype):
    x, y = array(data, shape, dtype, -100, 100), array(data, shape, dtype, -100, 100)
    b = Builder()
    px, py = b.parameter(shape, dtype), b.parameter(shape, dtype)
    outs = run(client, b.build(px & py, px | py, px ^ py, ~px, b.and_(px, py), b.or_(px, py)), x, y)
    for got, want in zip(outs, [x & y, x | y, x ^ y, ~x, x & y, x | y]):
        assert_close(got, want, dtype)


@FEW
@given(data=st.data(), shape=shapes(), src=st.sampled_from(NUMERIC + [PRED]),
       dst=st.sampled_from(NUMERIC + [PRED]))
def test_convert(client, data, shape, src, dst):
    # values every destination holds (floats to integers truncate toward zero)
    lo = 0 if dst.kind == "u" else -100
    x = array(data, shape, src, lo, 100)
    b = Builder()
    px = b.parameter(shape, src)
    out, = run(client, b.build(b.convert(px, dst)), x)
    want = x.astype(np.float64).astype(dst) if src == BF16 or dst == BF16 else x.astype(dst)
    if isfloat(dst):
        assert_close(out, want, dst)
    else:
        np.testing.assert_array_equal(out, want)
        assert out.dtype == dst


BITCAST_PAIRS = [(np.float32, np.int32), (np.int32, np.float32), (np.float32, np.uint32),
                 (np.float16, np.int16), (BF16, np.uint16), (np.float64, np.int64),
                 (np.float32, np.uint8), (np.int64, np.int16), (np.uint8, np.float32),
                 (np.int16, np.int64)]


@FEW
@given(data=st.data(), shape=shapes(max_rank=2), pair=st.sampled_from(BITCAST_PAIRS))
def test_bitcast_convert(client, data, shape, pair):
    src, dst = np.dtype(pair[0]), np.dtype(pair[1])
    if src.itemsize < dst.itemsize:
        shape = shape + (dst.itemsize // src.itemsize,)
    x = array(data, shape, src, -100, 100)
    b = Builder()
    px = b.parameter(shape, src)
    out, = run(client, b.build(b.bitcast_convert(px, dst)), x)
    if src.itemsize == dst.itemsize:
        want = x.view(dst)
    elif src.itemsize > dst.itemsize:
        want = x.reshape(shape + (1,)).view(dst)
    else:
        want = x.view(dst).reshape(shape[:-1])
    assert out.shape == want.shape and out.dtype == dst
    assert out.tobytes() == want.tobytes()


@FEW
@given(data=st.data(), shape=shapes(min_rank=1), dtype=st.sampled_from(NUMERIC))
def test_iota(client, data, shape, dtype):
    dim = data.draw(st.integers(0, len(shape) - 1))
    b = Builder()
    out, = run(client, b.build(b.iota(shape, dtype, dim)))
    want = np.broadcast_to(np.arange(shape[dim]).reshape([-1 if i == dim else 1 for i in range(len(shape))]),
                           shape).astype(dtype)
    assert_close(out, want, dtype)


@FEW
@given(data=st.data(), shape=shapes(max_rank=2), dtype=st.sampled_from(NUMERIC + [PRED]))
def test_broadcast_in_dim_and_broadcast_to(client, data, shape, dtype):
    rank = len(shape)
    extra = data.draw(shapes(min_rank=0, max_rank=2), label="extra dims")
    out_rank = rank + len(extra)
    dims = sorted(data.draw(st.permutations(range(out_rank)))[:rank])
    out_shape = [0] * out_rank
    new = iter(extra)
    for i in range(out_rank):
        out_shape[i] = shape[dims.index(i)] if i in dims else next(new)
    ones = tuple(1 if data.draw(st.booleans(), label="size 1") else d for d in shape)
    x, y = array(data, shape, dtype), array(data, ones, dtype)
    b = Builder()
    px, py = b.parameter(shape, dtype), b.parameter(ones, dtype)
    prog = b.build(b.broadcast_in_dim(px, out_shape, dims), b.broadcast_to(py, tuple(extra) + shape))
    got, got2 = run(client, prog, x, y)
    want = x.reshape([shape[dims.index(i)] if i in dims else 1 for i in range(out_rank)])
    assert_close(got, np.broadcast_to(want, out_shape), dtype)
    assert_close(got2, np.broadcast_to(y, tuple(extra) + shape), dtype)


@FEW
@given(data=st.data(), shape=shapes(max_rank=4), dtype=st.sampled_from(NUMERIC + [PRED]))
def test_reshape_transpose_reverse(client, data, shape, dtype):
    x = array(data, shape, dtype)
    perm = data.draw(st.permutations(range(len(shape))))
    rev = data.draw(st.lists(st.integers(0, max(len(shape) - 1, 0)), unique=True,
                             max_size=len(shape)))
    flat = [math.prod(shape)]
    b = Builder()
    px = b.parameter(shape, dtype)
    prog = b.build(b.reshape(px, flat), px.reshape(shape[::-1]), b.transpose(px, perm), px.T,
                   b.reverse(px, rev))
    outs = run(client, prog, x)
    wants = [x.reshape(flat), x.reshape(shape[::-1]), x.transpose(perm), x.T, np.flip(x, rev)]
    for got, want in zip(outs, wants):
        assert_close(got, want, dtype)


@FEW
@given(data=st.data(), shape=shapes(min_rank=1, max_side=6), dtype=st.sampled_from(NUMERIC))
def test_slice(client, data, shape, dtype):
    start, limit, strides = [], [], []
    for d in shape:
        s = data.draw(st.integers(0, d))
        start.append(s)
        limit.append(data.draw(st.integers(s, d)))
        strides.append(data.draw(st.integers(1, 3)))
    x = array(data, shape, dtype)
    b = Builder()
    px = b.parameter(shape, dtype)
    out, = run(client, b.build(b.slice(px, start, limit, strides)), x)
    assert_close(out, x[tuple(slice(s, l, st_) for s, l, st_ in zip(start, limit, strides))], dtype)


@FEW
@given(data=st.data(), shape=shapes(min_rank=1, max_side=5), dtype=st.sampled_from(NUMERIC),
       index_dtype=st.sampled_from([np.int32, np.int64, np.uint32]))
def test_dynamic_slice_and_update(client, data, shape, dtype, index_dtype):
    sizes = [data.draw(st.integers(0, d)) for d in shape]
    starts = [data.draw(st.integers(0, d + 2)) for d in shape]  # may clamp
    x, upd = array(data, shape, dtype), array(data, sizes, dtype)
    b = Builder()
    px, pu = b.parameter(shape, dtype), b.parameter(sizes, dtype)
    pidx = [b.parameter((), index_dtype) for _ in shape]
    prog = b.build(b.dynamic_slice(px, pidx, sizes), b.dynamic_update_slice(px, pu, pidx),
                   b.dynamic_slice(px, [0] * len(shape), sizes))
    got, updated, at0 = run(client, prog, x, upd, *[np.asarray(s, index_dtype) for s in starts])
    clamped = [min(s, d - z) for s, d, z in zip(starts, shape, sizes)]
    window = tuple(slice(c, c + z) for c, z in zip(clamped, sizes))
    assert_close(got, x[window], dtype)
    want = x.copy()
    want[window] = upd
    assert_close(updated, want, dtype)
    assert_close(at0, x[tuple(slice(0, z) for z in sizes)], dtype)


@FEW
@given(data=st.data(), shape=shapes(min_rank=1), dtype=st.sampled_from(NUMERIC + [PRED]),
       n=st.integers(1, 3))
def test_concatenate(client, data, shape, dtype, n):
    dim = data.draw(st.integers(0, len(shape) - 1))
    parts = []
    for _ in range(n):
        s = list(shape)
        s[dim] = data.draw(st.integers(0, 3))
        parts.append(array(data, tuple(s), dtype))
    b = Builder()
    params = [b.parameter(p.shape, dtype) for p in parts]
    out, = run(client, b.build(b.concatenate(params, dim)), *parts)
    assert_close(out, np.concatenate(parts, dim), dtype)


def _np_pad(x, value, low, high, interior):
    for axis, (lo, hi, inner) in enumerate(zip(low, high, interior)):
        n = x.shape[axis]
        if inner and n > 1:
            shape = list(x.shape)
            shape[axis] = n + (n - 1) * inner
            spread = np.full(shape, value, x.dtype)
            idx = [slice(None)] * x.ndim
            idx[axis] = slice(None, None, inner + 1)
            spread[tuple(idx)] = x
            x = spread
        widths = [(0, 0)] * x.ndim
        widths[axis] = (max(lo, 0), max(hi, 0))
        x = np.pad(x, widths, constant_values=value)
        idx = [slice(None)] * x.ndim
        idx[axis] = slice(max(-lo, 0), x.shape[axis] - max(-hi, 0))
        x = x[tuple(idx)]
    return x


@FEW
@given(data=st.data(), shape=shapes(max_rank=3), dtype=st.sampled_from(NUMERIC))
def test_pad(client, data, shape, dtype):
    low, high, interior = [], [], []
    for d in shape:
        inner = data.draw(st.integers(0, 2))
        size = d + max(d - 1, 0) * inner
        lo = data.draw(st.integers(-min(size, 2), 3))
        hi = data.draw(st.integers(-min(size + lo, 2) if size + lo > 0 else 0, 3))
        low.append(lo), high.append(hi), interior.append(inner)
    x = array(data, shape, dtype)
    b = Builder()
    px = b.parameter(shape, dtype)
    out, = run(client, b.build(b.pad(px, 7, low, high, interior)), x)
    assert_close(out, _np_pad(x, np.asarray(7, dtype), low, high, interior), dtype)


# -- dot and convolution -------------------------------------------------------------------------

DOT_DTYPES = [np.dtype(np.float32), np.dtype(np.float64), BF16, np.dtype(np.int32)]


@FEW
@given(data=st.data(), dtype=st.sampled_from(DOT_DTYPES), ranks=st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]),
       precision=st.sampled_from([None, "DEFAULT", "HIGH", "HIGHEST", ("HIGHEST", "DEFAULT")]))
def test_dot(client, data, dtype, ranks, precision):
    m, k, n = (data.draw(st.integers(1, 5)) for _ in range(3))
    lshape = (k,) if ranks[0] == 1 else (m, k)
    rshape = (k,) if ranks[1] == 1 else (k, n)
    x, y = array(data, lshape, dtype), array(data, rshape, dtype)
    b = Builder()
    px, py = b.parameter(lshape, dtype), b.parameter(rshape, dtype)
    prog = b.build(b.dot(px, py, precision=precision), px @ py)
    want = np.dot(x.astype(np.float64), y.astype(np.float64))
    for got in run(client, prog, x, y):
        assert_close(got, want.astype(dtype), dtype)


@FEW
@given(data=st.data(), dtype=st.sampled_from(DOT_DTYPES + [np.dtype(np.int8)]),
       nbatch=st.integers(0, 2), ncontract=st.integers(0, 2), preferred=st.booleans())
def test_dot_general(client, data, dtype, nbatch, ncontract, preferred):
    batch = [data.draw(st.integers(1, 3)) for _ in range(nbatch)]
    contract = [data.draw(st.integers(1, 3)) for _ in range(ncontract)]
    lfree = [data.draw(st.integers(1, 3)) for _ in range(data.draw(st.integers(0, 2)))]
    rfree = [data.draw(st.integers(1, 3)) for _ in range(data.draw(st.integers(0, 2)))]
    # lay the dims out in a random order on each side
    lroles = [("b", i) for i in range(nbatch)] + [("c", i) for i in range(ncontract)] + [("f", i) for i in range(len(lfree))]
    rroles = [("b", i) for i in range(nbatch)] + [("c", i) for i in range(ncontract)] + [("f", i) for i in range(len(rfree))]
    lroles = data.draw(st.permutations(lroles))
    rroles = data.draw(st.permutations(rroles))
    size = {"b": batch, "c": contract}
    lshape = [(size.get(r, lfree))[i] for r, i in lroles]
    rshape = [(size.get(r, rfree))[i] for r, i in rroles]
    lb = [lroles.index(("b", i)) for i in range(nbatch)]
    rb = [rroles.index(("b", i)) for i in range(nbatch)]
    lc = [lroles.index(("c", i)) for i in range(ncontract)]
    rc = [rroles.index(("c", i)) for i in range(ncontract)]
    pref = {np.dtype(np.int8): np.int32, BF16: np.float32}.get(dtype, dtype) if preferred else None
    out_dtype = np.dtype(pref or dtype)
    x, y = array(data, lshape, dtype), array(data, rshape, dtype)
    b = Builder()
    px, py = b.parameter(lshape, dtype), b.parameter(rshape, dtype)
    prog = b.build(b.dot_general(px, py, (lc, rc), (lb, rb), precision="HIGHEST",
                                 preferred_element_type=pref))
    out, = run(client, prog, x, y)
    letters = "abcdefghij"
    lsub = "".join(letters[i] if r == "b" else letters[4 + i] if r == "c" else "klmn"[i] for r, i in lroles)
    rsub = "".join(letters[i] if r == "b" else letters[4 + i] if r == "c" else "opqr"[i] for r, i in rroles)
    # free dims follow in operand order
    osub = (letters[:nbatch] + "".join("klmn"[i] for r, i in lroles if r == "f")
            + "".join("opqr"[i] for r, i in rroles if r == "f"))
    want = np.einsum(f"{lsub},{rsub}->{osub}", x.astype(np.float64), y.astype(np.float64))
    assert_close(out, want.astype(out_dtype), out_dtype)


def _np_conv(lhs, rhs, strides, pads, lhs_dil, rhs_dil, fgc, bgc):
    """Reference convolution on NC... / OI... / NC... layouts."""
    n, c = lhs.shape[:2]
    o, i = rhs.shape[:2]
    nsp = lhs.ndim - 2
    # dilate and pad the input
    dil_shape = [n, c] + [(s - 1) * d + 1 if s else 0 for s, d in zip(lhs.shape[2:], lhs_dil)]
    x = np.zeros(dil_shape, np.float64)
    x[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in lhs_dil)] = lhs
    x = _np_pad(x, 0.0, [0, 0] + [p[0] for p in pads], [0, 0] + [p[1] for p in pads], [0] * lhs.ndim)
    ksp = rhs.shape[2:]
    out_sp = []
    for k in range(nsp):
        extent = (ksp[k] - 1) * rhs_dil[k] + 1
        out_sp.append(max((x.shape[2 + k] - extent) // strides[k] + 1, 0) if x.shape[2 + k] >= extent else 0)
    nb = n // bgc
    out = np.zeros([nb, o] + out_sp, np.float64)
    per_fg, per_bg = o // fgc, o // bgc
    for oc in range(o):
        g = oc // per_fg
        bg = oc // per_bg
        xs = x[bg * nb:(bg + 1) * nb, g * i:(g + 1) * i]
        for pos in np.ndindex(*out_sp):
            for kpos in np.ndindex(*ksp):
                idx = tuple(p * s + kp * d for p, s, kp, d in zip(pos, strides, kpos, rhs_dil))
                out[(slice(None), oc) + pos] += xs[(slice(None), slice(None)) + idx] @ rhs[(oc, slice(None)) + kpos]
    return out


@FEW
@given(data=st.data(), nsp=st.integers(1, 2), dtype=st.sampled_from([np.dtype(np.float32), np.dtype(np.float64)]),
       layout=st.booleans(), groups=st.sampled_from(["none", "feature", "batch"]))
def test_conv_general_dilated(client, data, nsp, dtype, layout, groups):
    g = 1 if groups == "none" else data.draw(st.integers(1, 2))
    fgc, bgc = (g, 1) if groups == "feature" else (1, g)
    n = data.draw(st.integers(1, 2)) * bgc
    i = data.draw(st.integers(1, 2))
    c = i * fgc
    o = data.draw(st.integers(1, 2)) * g
    sp = [data.draw(st.integers(1, 5)) for _ in range(nsp)]
    ksp = [data.draw(st.integers(1, 3)) for _ in range(nsp)]
    strides = [data.draw(st.integers(1, 2)) for _ in range(nsp)]
    lhs_dil = [data.draw(st.integers(1, 2)) for _ in range(nsp)]
    rhs_dil = [data.draw(st.integers(1, 2)) for _ in range(nsp)]
    padding = data.draw(st.sampled_from(["VALID", "SAME", "explicit"]))
    if padding == "explicit":
        padding = [(data.draw(st.integers(0, 2)), data.draw(st.integers(-2, 2))) for _ in range(nsp)]
    lhs = array(data, (n, c, *sp), dtype)
    rhs = array(data, (o, i, *ksp), dtype)
    reversal = data.draw(st.none() | st.lists(st.booleans(), min_size=nsp, max_size=nsp))
    from ifrtpy.builder._ops import _window_padding
    pads = _window_padding(padding, sp, ksp, strides, lhs_dil, rhs_dil, "test")
    dilated = [(s - 1) * d + 1 + lo + hi for s, d, (lo, hi) in zip(sp, lhs_dil, pads)]
    if any(v < 0 for v in dilated):  # no input left to convolve: refused, as StableHLO does
        b = Builder()
        with pytest.raises(ifrt.errors.InvalidArgumentError, match="leaves a negative size"):
            b.conv_general_dilated(b.parameter(lhs.shape, dtype), b.parameter(rhs.shape, dtype),
                                   strides, padding, lhs_dil, rhs_dil, None, fgc, bgc)
        return
    flipped = [2 + k for k, r in enumerate(reversal or []) if r]  # XLA's window reversal
    want = _np_conv(lhs.astype(np.float64), np.flip(rhs, flipped).astype(np.float64), strides,
                    pads, lhs_dil, rhs_dil, fgc, bgc)
    b = Builder()
    if layout:  # channels last: NHWC, HWIO, NHWC
        spatial = "HW"[:nsp]
        dn = ("N" + spatial + "C", spatial + "IO", "N" + spatial + "C")
        lhs_in = np.moveaxis(lhs, 1, -1)
        rhs_in = np.moveaxis(rhs, (0, 1), (-1, -2))
    else:
        dn, lhs_in, rhs_in = None, lhs, rhs
    pl, pr = b.parameter(lhs_in.shape, dtype), b.parameter(rhs_in.shape, dtype)
    prog = b.build(b.conv_general_dilated(pl, pr, strides, padding, lhs_dil, rhs_dil, dn, fgc, bgc,
                                          precision="HIGHEST", window_reversal=reversal))
    out, = run(client, prog, np.ascontiguousarray(lhs_in), np.ascontiguousarray(rhs_in))
    if layout:
        out = np.moveaxis(out, -1, 1)
    assert_close(out, want.astype(dtype), dtype)


@pytest.mark.parametrize("padding, lhs_dilation", [([(0, -3)], [1]), ([(-1, -3)], [2]),
                                                   ([(1, -5)], [2])])
def test_conv_padding_that_leaves_a_negative_size_is_refused(padding, lhs_dilation):
    """A spatial size of 2 (dilated: 2 or 3) padded below zero leaves nothing to convolve."""
    b = Builder()
    lhs, rhs = b.parameter((1, 1, 2), np.float32), b.parameter((1, 1, 1), np.float32)
    with pytest.raises(ifrt.errors.InvalidArgumentError, match="leaves a negative size"):
        b.conv_general_dilated(lhs, rhs, [1], padding, lhs_dilation, [1])


# -- reductions ----------------------------------------------------------------------------------

_NP_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "and": np.all, "or": np.any}


@FEW
@given(data=st.data(), shape=shapes(max_rank=3), dtype=st.sampled_from(NUMERIC + [PRED]))
def test_reduce(client, data, shape, dtype):
    dims = data.draw(st.lists(st.integers(0, max(len(shape) - 1, 0)), unique=True,
                              max_size=len(shape)))
    names = ["and", "or"] if dtype == PRED else ["sum", "prod", "max", "min"]
    if dtype.kind in "iu":
        names += ["and", "or"]
    x = array(data, shape, dtype, -2, 2) if dtype.kind in "iu" else array(data, shape, dtype, 0.5, 1.5)
    b = Builder()
    px = b.parameter(shape, dtype)
    prog = b.build([b.reduce(px, None, dims, name) for name in names])
    for name, got in zip(names, run(client, prog, x)):
        if name == "and" and dtype.kind in "iu":
            want = np.bitwise_and.reduce(x, axis=tuple(dims))
        elif name == "or" and dtype.kind in "iu":
            want = np.bitwise_or.reduce(x, axis=tuple(dims))
        elif isfloat(dtype):
            want = _NP_REDUCE[name](x.astype(np.float64), axis=tuple(dims))
        else:
            want = _NP_REDUCE[name](x, axis=tuple(dims))
        assert_close(got, np.asarray(want).astype(dtype), dtype)


@FEW
@given(data=st.data(), shape=shapes(min_rank=1, max_rank=2), dtype=st.sampled_from([np.dtype(np.float32), np.dtype(np.int32)]))
def test_reduce_variadic_argmax(client, data, shape, dtype):
    x = array(data, shape, dtype, -50, 50)
    dim = len(shape) - 1
    b = Builder()
    px = b.parameter(shape, dtype)
    idx = b.iota(shape, np.int32, dim)

    def argmax(best, best_i, value, value_i):
        take = (value > best) | ((value == best) & (value_i < best_i))
        return b.select(take, value, best), b.select(take, value_i, best_i)

    init = -np.inf if isfloat(dtype) else np.iinfo(dtype).min
    best, where = b.reduce([px, idx], [init, 0], [dim], argmax)
    got_best, got_where = run(client, b.build(best, where), x)
    assert_close(got_best, x.max(axis=dim), dtype)
    assert_close(got_where, x.argmax(axis=dim).astype(np.int32), np.int32)


def _np_reduce_window(x, fn, init, window, strides, pads, base_dil, win_dil):
    dil = np.full([(s - 1) * d + 1 if s else 0 for s, d in zip(x.shape, base_dil)], init, x.dtype)
    dil[tuple(slice(None, None, d) for d in base_dil)] = x
    padded = _np_pad(dil, init, [p[0] for p in pads], [p[1] for p in pads], [0] * x.ndim)
    out_shape = []
    for size, w, s, d in zip(padded.shape, window, strides, win_dil):
        extent = (w - 1) * d + 1
        out_shape.append((size - extent) // s + 1 if size >= extent else 0)
    out = np.empty(out_shape, x.dtype)
    for pos in np.ndindex(*out_shape):
        sl = tuple(slice(p * s, p * s + (w - 1) * d + 1, d) for p, s, w, d in zip(pos, strides, window, win_dil))
        out[pos] = fn(np.concatenate([padded[sl].ravel(), [init]]).astype(x.dtype))
    return out


@FEW
@given(data=st.data(), shape=shapes(min_rank=1, max_rank=2, max_side=5),
       dtype=st.sampled_from([np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.float64)]),
       name=st.sampled_from(["sum", "max", "min"]))
def test_reduce_window(client, data, shape, dtype, name):
    window = [data.draw(st.integers(1, 3)) for _ in shape]
    strides = [data.draw(st.integers(1, 2)) for _ in shape]
    base_dil = [data.draw(st.integers(1, 2)) for _ in shape]
    win_dil = [data.draw(st.integers(1, 2)) for _ in shape]
    pads = [(data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape]
    x = array(data, shape, dtype, -10, 10)
    from ifrtpy.builder._regions import identity
    init = identity(name, ifrt.DType.from_numpy(dtype))
    b = Builder()
    px = b.parameter(shape, dtype)
    out, = run(client, b.build(b.reduce_window(px, None, name, window, strides, pads, base_dil, win_dil)), x)
    fn = {"sum": np.sum, "max": np.max, "min": np.min}[name]
    want = _np_reduce_window(x.astype(np.float64) if isfloat(dtype) else x, fn,
                             init.astype(np.float64) if isfloat(dtype) else init,
                             window, strides, pads, base_dil, win_dil)
    assert_close(out, want.astype(dtype), dtype)


# -- gather, scatter, sort ------------------------------------------------------------------------

@FEW
@given(data=st.data(), shape=shapes(min_rank=1, max_rank=3), dtype=st.sampled_from(NUMERIC),
       index_shape=shapes(max_rank=2), index_dtype=st.sampled_from([np.int32, np.int64]))
def test_gather(client, data, shape, dtype, index_shape, index_dtype):
    axis = data.draw(st.integers(0, len(shape) - 1))
    x = array(data, shape, dtype)
    idx = array(data, index_shape, index_dtype, 0, shape[axis] - 1)
    # a general gather: windows of size w at (row, col)-style starts on the first dim
    w = data.draw(st.integers(1, shape[0]))
    starts = array(data, (3, 1), index_dtype, 0, shape[0] - w)
    b = Builder()
    px, pi, ps = b.parameter(shape, dtype), b.parameter(index_shape, index_dtype), b.parameter((3, 1), index_dtype)
    general = b.gather(px, ps, offset_dims=list(range(1, len(shape) + 1)), collapsed_slice_dims=[],
                       start_index_map=[0], slice_sizes=(w,) + shape[1:])
    taken, windows = run(client, b.build(b.take(px, pi, axis), general), x, idx, starts)
    assert_close(taken, np.take(x, idx, axis), dtype)
    assert_close(windows, np.stack([x[s:s + w] for s in starts[:, 0]]), dtype)


@FEW
@given(data=st.data(), shape=shapes(min_rank=1, max_rank=3), dtype=st.sampled_from(NUMERIC),
       nidx=st.integers(0, 5))
def test_scatter(client, data, shape, dtype, nidx):
    axis = data.draw(st.integers(0, len(shape) - 1))
    x = array(data, shape, dtype, 0, 10)
    idx = array(data, (nidx,), np.int32, 0, shape[axis] - 1)
    unique = np.unique(idx)
    upd_shape = shape[:axis] + (nidx,) + shape[axis + 1:]
    uniq_shape = shape[:axis] + (len(unique),) + shape[axis + 1:]
    upd, upd_u = array(data, upd_shape, dtype, 0, 10), array(data, uniq_shape, dtype, 0, 10)
    outs = []
    for computation, (i, u) in (("add", (idx, upd)), ("set", (unique.astype(np.int32), upd_u)),
                                ("max", (idx, upd))):
        # one program each: see test_scatters_sharing_an_operand
        b = Builder()
        px, pi, pu = b.parameter(shape, dtype), b.parameter(i.shape, np.int32), b.parameter(u.shape, dtype)
        outs += run(client, b.build(b.scatter_along(px, pi, pu, axis, computation)), x, i, u)
    added, setted, maxed = outs
    where = (slice(None),) * axis
    want = x.copy()
    np.add.at(want, where + (idx,), upd)
    assert_close(added, want, dtype)
    want = x.copy()
    want[where + (unique,)] = upd_u
    assert_close(setted, want, dtype)
    want = x.copy()
    np.maximum.at(want, where + (idx,), upd)
    assert_close(maxed, want, dtype)


def test_scatters_sharing_an_operand(client, request):
    if "reference" in request.node.name:
        pytest.xfail("jaxlib's StableHLO interpreter (stablehlo.eval_module) updates a "
                     "scatter's operand in place, so a second scatter of it sees the first's "
                     "result")
    b = Builder()
    x = b.parameter((2,), np.float32)
    i = b.constant(np.array([0], np.int32))
    u = b.constant(np.array([2.0], np.float32))
    prog = b.build(b.scatter_along(x, i, u, 0, "add"), b.scatter_along(x, i, u * 10, 0, "set"), x)
    added, setted, same = run(client, prog, np.array([5.0, 1.0], np.float32))
    np.testing.assert_array_equal(added, [7.0, 1.0])
    np.testing.assert_array_equal(setted, [20.0, 1.0])
    np.testing.assert_array_equal(same, [5.0, 1.0])


@FEW
@given(data=st.data(), shape=shapes(min_rank=1, max_rank=2, max_side=6), dtype=st.sampled_from(NUMERIC))
def test_sort(client, data, shape, dtype):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = array(data, shape, dtype, -5, 5)
    b = Builder()
    px = b.parameter(shape, dtype)
    idx = b.iota(shape, np.int32, dim % len(shape))
    keys, perm = b.sort([px, idx], dimension=dim)
    desc = b.sort(px, dimension=dim, descending=True)
    custom = b.sort(px, dimension=dim, comparator=lambda a, c: a > c)
    outs = run(client, b.build(keys, perm, desc, custom), x)
    assert_close(outs[0], np.sort(x, axis=dim), dtype)
    assert_close(outs[1], np.argsort(x, axis=dim, kind="stable").astype(np.int32), np.int32)
    assert_close(outs[2], np.flip(np.sort(x, axis=dim), dim), dtype)
    assert_close(outs[3], np.flip(np.sort(x, axis=dim), dim), dtype)


# -- control flow, tuples, constants --------------------------------------------------------------

@FEW
@given(data=st.data(), shape=shapes(max_rank=2), dtype=st.sampled_from([np.dtype(np.float32), np.dtype(np.int32)]),
       n=st.integers(0, 5))
def test_while_loop(client, data, shape, dtype, n):
    x = array(data, shape, dtype, -3, 3)
    b = Builder()
    px = b.parameter(shape, dtype)
    pn = b.parameter((), np.int32)
    step = b.constant(np.ones(shape, dtype))  # captured from outside the loop

    def cond(i, acc):
        return i < pn

    def body(i, acc):
        return i + 1, acc * 2 + step

    count, acc = b.while_loop(cond, body, (b.constant(np.int32(0)), px))
    doubled = b.while_loop(lambda v: b.reduce(v, None, list(range(len(shape))), "sum") < 0,
                           lambda v: v + 1, b.constant(np.zeros(shape, dtype)))
    got_n, got, got_d = run(client, b.build(count, acc, doubled), x, np.int32(n))
    want = x.copy()
    for _ in range(n):
        want = want * 2 + 1
    assert int(got_n) == n
    assert_close(got, want, dtype)
    assert_close(got_d, np.zeros(shape, dtype), dtype)


@FEW
@given(data=st.data(), shape=shapes(max_rank=2), flag=st.booleans(), index=st.integers(-1, 3))
def test_cond_and_case(client, data, shape, flag, index):
    dtype = np.dtype(np.float32)
    x = array(data, shape, dtype)
    b = Builder()
    px = b.parameter(shape, dtype)
    pf = b.parameter((), PRED)
    pi = b.parameter((), np.int32)
    one, two = b.cond(pf, lambda: (px + 1, b.exp(px)), lambda: (px - 1, b.tanh(px)))
    chosen = b.case(pi, [lambda: px * 2, lambda: px * 3, lambda: -px])
    outs = run(client, b.build(one, two, chosen), x, np.bool_(flag), np.int32(index))
    assert_close(outs[0], x + 1 if flag else x - 1, dtype)
    assert_close(outs[1], np.exp(x) if flag else np.tanh(x), dtype)
    pick = index if 0 <= index < 3 else 2
    assert_close(outs[2], [x * 2, x * 3, -x][pick], dtype)


@FEW
@given(data=st.data(), shape=shapes(max_rank=2), dtype=st.sampled_from(NUMERIC + [PRED]))
def test_constants_and_tuple_results(client, data, shape, dtype):
    value = array(data, shape, dtype)
    b = Builder()
    c = b.constant(value)
    full = b.full(shape, 1, dtype)
    prog = b.build((c, full), [c])
    assert len(prog.results) == 3
    outs = run(client, prog)
    assert_close(outs[0], value, dtype)
    assert_close(outs[1], np.ones(shape, dtype), dtype)
    assert_close(outs[2], value, dtype)


def test_scalar_operands_take_the_other_operands_dtype(client):
    b = Builder()
    x = b.parameter((3,), np.int8)
    f = b.parameter((3,), ml_dtypes.bfloat16)
    prog = b.build(2 * x - 1, 1 - x, f / 2, 0.5 ** f, b.select(x > 0, x, 0), b.clamp(0, x, 5))
    xs = np.array([-3, 0, 7], np.int8)
    fs = np.array([1, 2, 3], ml_dtypes.bfloat16)
    outs = run(client, prog, xs, fs)
    assert_close(outs[0], 2 * xs - 1, np.int8)
    assert_close(outs[1], 1 - xs, np.int8)
    assert_close(outs[2], fs.astype(np.float64) / 2, BF16)
    assert_close(outs[3], 0.5 ** fs.astype(np.float64), BF16)
    assert_close(outs[4], np.where(xs > 0, xs, 0), np.int8)
    assert_close(outs[5], np.clip(xs, 0, 5), np.int8)


# -- source locations ------------------------------------------------------------------------------

def test_ops_carry_the_callers_file_and_line():
    b = Builder()
    x = b.parameter((2,), np.float32, name="x")
    line = __import__("inspect").currentframe().f_lineno + 1
    y = b.tanh(x)
    text = str(b.build(y))
    this = re.escape(__file__)
    assert re.search(rf'"{this}":{line}:\d+', text), text
    assert re.search(r'stablehlo\.tanh .* loc\(#loc\d+\)', text)
    assert '"x"' in text  # the parameter's name labels its location


def test_locations_reach_compiler_diagnostics():
    """A program that verifies but that XLA refuses: the error names the builder's caller."""
    client = ifrt.get_client("pjrt", device_count=8)
    b = Builder()
    x = b.parameter((6,), np.float32)
    line = __import__("inspect").currentframe().f_lineno + 1
    y = b.with_sharding(b.exp(x), "{devices=[3]<=[3]}")  # 3 tiles on 8 partitions
    program = b.build(y)
    assert re.search(rf'"{re.escape(__file__)}":{line}:', str(program))
    options = ifrt.CompileOptions(devices=ifrt.DeviceList(client.devices()), num_partitions=8)
    with pytest.raises(ifrt.errors.InvalidArgumentError) as info:
        client.compile(program, options)
    assert f'source_file="{__file__}" source_line={line}' in str(info.value)


# -- the worked example of docs/builder.md ----------------------------------------------------------

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "builder.md"


def test_docs_builder_examples_run():
    """Every python block of docs/builder.md, in order, in one namespace (as the doc
    test runs them); the examples check themselves (the MLP training loop against NumPy)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 6, "docs/builder.md lost its python examples"
    namespace: dict = {"__name__": "docs_builder_example"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 - the doc's own code
    np.testing.assert_allclose(namespace["out"], namespace["expected"], rtol=1e-5, atol=1e-5)
    assert namespace["loss_after"] < namespace["loss_before"] / 2
