"""Linear algebra, FFT, top_k, reduce_precision, optimization_barrier, custom_call,
batch_norm, map, select_and_scatter and multi-operand sort, against NumPy; and the
reference backend's compile-time refusal of the ops its interpreter cannot run."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.builder import Builder
from ifrtpy.errors import InvalidArgumentError, NotFoundError, UnimplementedError

from builder_helpers import (  # noqa: F401  (client is a fixture)
    FEW, SOME, array, client, pjrt_client, run, shapes,
)

F32, F64, C64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64)


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if np.dtype(dtype) in (F32, C64) else dict(rtol=1e-9, atol=1e-9)


def _spd(data, batch, n, dtype):
    m = array(data, batch + (n, n), np.float64, -1, 1)
    return (m @ np.swapaxes(m, -1, -2) + n * np.eye(n)).astype(dtype)


@SOME
@given(data=st.data(), batch=st.sampled_from([(), (2,)]), n=st.integers(1, 4),
       dtype=st.sampled_from([F32, F64]))
def test_cholesky(data, batch, n, dtype):
    a = _spd(data, batch, n, dtype)
    b = Builder()
    pa = b.parameter(a.shape, dtype)
    lower, upper = run(pjrt_client(), b.build(b.cholesky(pa), b.cholesky(pa, lower=False)), a)
    want = np.linalg.cholesky(a.astype(np.float64))
    np.testing.assert_allclose(np.tril(lower), want, **_tol(dtype))
    np.testing.assert_allclose(np.triu(upper), np.swapaxes(want, -1, -2), **_tol(dtype))


@FEW
@given(data=st.data(), n=st.integers(1, 4), m=st.integers(1, 3), dtype=st.sampled_from([F32, F64]),
       left_side=st.booleans(), lower=st.booleans(), unit=st.booleans(),
       transpose=st.sampled_from(["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"]))
def test_triangular_solve(data, n, m, dtype, left_side, lower, unit, transpose):
    a = (array(data, (n, n), dtype, -1, 1) + 3 * np.eye(n)).astype(dtype)
    rhs = array(data, (n, m) if left_side else (m, n), dtype, -2, 2)
    b = Builder()
    pa, pb = b.parameter(a.shape, dtype), b.parameter(rhs.shape, dtype)
    x = b.triangular_solve(pa, pb, left_side=left_side, lower=lower, unit_diagonal=unit,
                           transpose_a=transpose)
    (out,) = run(pjrt_client(), b.build(x), a, rhs)
    t = np.tril(a) if lower else np.triu(a)
    t = t.astype(np.float64)
    if unit:
        np.fill_diagonal(t, 1)
    op_a = t if transpose == "NO_TRANSPOSE" else t.T
    want = np.linalg.solve(op_a, rhs) if left_side else np.linalg.solve(op_a.T, rhs.T).T
    np.testing.assert_allclose(out, want, **_tol(dtype))


@FEW
@given(data=st.data(), shape=shapes(min_rank=1, max_rank=3, max_side=5), n=st.integers(1, 3),
       double=st.booleans())
def test_fft_all_kinds(data, shape, n, double):
    n = min(n, len(shape))
    axes = tuple(range(len(shape) - n, len(shape)))
    lengths = shape[len(shape) - n:]
    real_t, complex_t = (F64, np.dtype(np.complex128)) if double else (F32, C64)
    x = array(data, shape, real_t) + 1j * array(data, shape, real_t)
    x = x.astype(complex_t)
    r = array(data, shape, real_t)
    half = shape[:-1] + (shape[-1] // 2 + 1,)
    h = (array(data, half, real_t) + 1j * array(data, half, real_t)).astype(complex_t)
    b = Builder()
    px, pr, ph = b.parameter(shape, complex_t), b.parameter(shape, real_t), b.parameter(half, complex_t)
    program = b.build(b.fft(px, "FFT", lengths), b.fft(px, "IFFT", lengths),
                      b.fft(pr, "RFFT", lengths), b.fft(ph, "IRFFT", lengths))
    outs = run(pjrt_client(), program, x, r, h)
    want = [np.fft.fftn(x, axes=axes), np.fft.ifftn(x, axes=axes), np.fft.rfftn(r, axes=axes),
            np.fft.irfftn(h, s=lengths, axes=axes)]
    for out, w, t in zip(outs, want, [complex_t, complex_t, complex_t, real_t]):
        assert out.dtype == t
        np.testing.assert_allclose(out, w, **_tol(real_t) if double else dict(rtol=1e-3, atol=1e-3))


@FEW
@given(data=st.data(), batch=st.sampled_from([(), (3,)]), n=st.integers(1, 8),
       dtype=st.sampled_from([F32, np.dtype(np.int32)]))
def test_top_k(client, data, batch, n, dtype):
    k = data.draw(st.integers(0, n))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = np.stack([rng.permutation(n) for _ in range(int(np.prod(batch)))]).reshape(batch + (n,)).astype(dtype)
    x[..., -1] = x[..., 0]  # equal values: the lower index comes first
    b = Builder()
    px = b.parameter(x.shape, dtype)
    got_v, got_i, low_v, low_i = run(client, b.build(*b.top_k(px, k), *b.top_k(px, k, largest=False)), x)
    want_i = np.argsort(-x.astype(np.float64), axis=-1, kind="stable")[..., :k]
    np.testing.assert_array_equal(got_i, want_i.astype(np.int32))
    np.testing.assert_array_equal(got_v, np.take_along_axis(x, want_i, -1))
    want_i = np.argsort(x, axis=-1, kind="stable")[..., :k]  # the smallest, ascending
    np.testing.assert_array_equal(low_i, want_i.astype(np.int32))
    np.testing.assert_array_equal(low_v, np.take_along_axis(x, want_i, -1))


def test_total_order_compare_and_dimension_sizes(client):
    """compare with total_order (XLA's EqTotalOrder, ...): -NaN < -inf < -1 < -0 < +0 < 1 <
    inf < NaN, a NaN equal to itself; get_dimension_size is the static size."""
    order = np.array([-np.nan, -np.inf, -1.0, -0.0, 0.0, 1.0, np.inf, np.nan], np.float32)
    order[0] = -np.abs(order[0])  # a NaN with the sign bit set
    x, y = np.repeat(order, order.size), np.tile(order, order.size)
    rank = np.repeat(np.arange(order.size), order.size), np.tile(np.arange(order.size), order.size)
    b = Builder()
    px, py = b.parameter(x.shape, np.float32), b.parameter(y.shape, np.float32)
    directions = ("EQ", "NE", "LT", "LE", "GT", "GE")
    outs = run(client, b.build(*[b.compare(px, py, d, total_order=True) for d in directions],
                               b.get_dimension_size(px, 0), b.sort(px, descending=True)), x, y)
    for d, got in zip(directions, outs):
        want = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                "GT": np.greater, "GE": np.greater_equal}[d](*rank)
        np.testing.assert_array_equal(got, want, err_msg=d)
    assert outs[6] == x.size and outs[6].dtype == np.int32
    # sort's default comparator is the same order: NaN first, then inf, ..., -0, -inf, -NaN
    np.testing.assert_array_equal(outs[7].view(np.uint32), np.repeat(order[::-1], order.size).view(np.uint32))


@SOME
@given(data=st.data(), shape=shapes(max_rank=2))
def test_reduce_precision_and_optimization_barrier(client, data, shape):
    x = array(data, shape, F32, -1000, 1000)
    b = Builder()
    px = b.parameter(shape, F32)
    kept, plus = b.optimization_barrier(px, px + 1)
    program = b.build(b.reduce_precision(px, 5, 10), b.reduce_precision(px, 8, 7), kept, plus)
    half, bf16, same, more = run(client, program, x)
    np.testing.assert_array_equal(half, x.astype(np.float16).astype(F32))
    np.testing.assert_array_equal(bf16, x.astype(ml_dtypes.bfloat16).astype(F32))
    np.testing.assert_array_equal(same, x)
    np.testing.assert_array_equal(more, x + 1)


def _np_batch_norm_grad(x, scale, mean, var, g, eps, axes):
    """The gradients of batch normalization (scale, mean, var broadcastable to x)."""
    inv = 1 / np.sqrt(var + eps)
    xhat = (x - mean) * inv
    count = np.prod([x.shape[a] for a in axes])
    grad_offset = g.sum(axes, keepdims=True)
    grad_scale = (g * xhat).sum(axes, keepdims=True)
    grad_x = scale * inv * (g - grad_offset / count - xhat * grad_scale / count)
    return grad_x, grad_scale.reshape(-1), grad_offset.reshape(-1)


@FEW
@given(data=st.data(), shape=shapes(min_rank=2, max_rank=3, min_side=2), dtype=st.sampled_from([F32, F64]))
def test_batch_norm(data, shape, dtype):
    f = data.draw(st.integers(0, len(shape) - 1))
    axes = tuple(i for i in range(len(shape)) if i != f)
    features = shape[f]
    x = array(data, shape, dtype)
    g = array(data, shape, dtype)
    scale, offset = array(data, (features,), dtype, 0.5, 2), array(data, (features,), dtype)
    mean, var = array(data, (features,), dtype), array(data, (features,), dtype, 0.5, 2)
    eps = 1e-3
    b = Builder()
    px, pg = b.parameter(shape, dtype), b.parameter(shape, dtype)
    ps, po, pm, pv = (b.parameter((features,), dtype) for _ in range(4))
    out, bmean, bvar = b.batch_norm_training(px, ps, po, eps, f)
    inf = b.batch_norm_inference(px, ps, po, pm, pv, eps, f)
    grads = b.batch_norm_grad(px, ps, pm, pv, pg, eps, f)
    outs = run(pjrt_client(), b.build(out, bmean, bvar, inf, *grads), x, g, scale, offset, mean, var)
    bshape = [1] * len(shape)
    bshape[f] = features

    def v(a):
        return a.astype(np.float64).reshape(bshape)
    xd = x.astype(np.float64)
    m, s2 = xd.mean(axes), xd.var(axes)
    want = [(xd - v(m)) / np.sqrt(v(s2) + eps) * v(scale) + v(offset), m, s2,
            (xd - v(mean)) / np.sqrt(v(var) + eps) * v(scale) + v(offset)]
    gx, gs, go = _np_batch_norm_grad(xd, v(scale), v(mean), v(var), g.astype(np.float64), eps, axes)
    want += [gx, gs, go]
    for i, (o, w) in enumerate(zip(outs, want)):
        np.testing.assert_allclose(o, w, **_tol(dtype), err_msg=str(i))


@FEW
@given(data=st.data(), shape=shapes(max_rank=2))
def test_map(client, data, shape):
    x, y = array(data, shape, F32), array(data, shape, F32)
    b = Builder()
    px, py = b.parameter(shape, F32), b.parameter(shape, F32)
    scaled = b.map([px, py], lambda a, c: b.max(a, c) * 2)
    bigger = b.map([px, py], lambda a, c: a > c)
    got, flags = run(client, b.build(scaled, bigger), x, y)
    np.testing.assert_allclose(got, np.maximum(x, y) * 2)
    np.testing.assert_array_equal(flags, x > y)


@SOME
@given(data=st.data(), n=st.integers(2, 6), m=st.integers(2, 6), window=st.integers(1, 3),
       stride=st.integers(1, 3))
def test_select_and_scatter_is_the_max_pool_gradient(client, data, n, m, window, stride):
    window = min(window, n, m)
    x = array(data, (n, m), F32)
    rows, cols = (n - window) // stride + 1, (m - window) // stride + 1
    src = array(data, (rows, cols), F32)
    b = Builder()
    px, ps = b.parameter(x.shape, F32), b.parameter(src.shape, F32)
    out = b.select_and_scatter(px, ps, 0.0, "ge", "add", (window, window), (stride, stride))
    (got,) = run(client, b.build(out), x, src)
    want = np.zeros_like(x)
    for i in range(rows):
        for j in range(cols):
            block = x[i * stride:i * stride + window, j * stride:j * stride + window]
            r, c = np.unravel_index(np.argmax(block), block.shape)  # the first maximum
            want[i * stride + r, j * stride + c] += src[i, j]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@FEW
@given(data=st.data(), n=st.integers(1, 8))
def test_multi_operand_sort_with_a_comparator(client, data, n):
    """Sort by key descending, then by secondary ascending; a third operand follows."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    key = rng.integers(0, 3, n).astype(np.int32)
    second = rng.standard_normal(n).astype(F32)
    payload = np.arange(n, dtype=np.int32)
    b = Builder()
    pk, p2, pp = b.parameter((n,), np.int32), b.parameter((n,), F32), b.parameter((n,), np.int32)
    outs = b.sort([pk, p2, pp], comparator=lambda k1, k2, s1, s2, _a, _b:
                  b.or_(k1 > k2, b.and_(b.eq(k1, k2), s1 < s2)))
    got = run(client, b.build(*outs), key, second, payload)
    order = sorted(range(n), key=lambda i: (-key[i], second[i]))
    for g, w in zip(got, (key, second, payload)):
        np.testing.assert_array_equal(g, w[order])


def test_custom_call_attributes_and_missing_target():
    b = Builder()
    x = b.parameter((4,), F32)
    one = b.custom_call("my_kernel", [x], ((4,), F32), backend_config={"n": 3, "scale": 0.5, "mode": "fast"})
    pair = b.custom_call("legacy", [x, one], [((2,), np.int32), ((), F32)], backend_config="opaque",
                         api_version=2, has_side_effect=True)
    assert isinstance(pair, tuple) and pair[0].shape == (2,) and pair[1].dtype == ifrt.DType.from_numpy(F32)
    text = b.build(one, *pair).text
    assert 'stablehlo.custom_call @my_kernel' in text
    assert 'backend_config = {mode = "fast", n = 3 : i64, scale = 5.000000e-01 : f64}' in text
    assert 'api_version = 2 : i32, backend_config = "opaque", has_side_effect = true' in text
    with pytest.raises(NotFoundError, match="my_kernel"):
        pjrt_client().compile(_one_custom_call(), ifrt.CompileOptions())


def _one_custom_call():
    b = Builder()
    x = b.parameter((4,), F32)
    return b.build(b.custom_call("my_kernel", [x], ((4,), F32)))


@pytest.mark.parametrize("kwargs,message", [
    (dict(api_version=5), "api_version must be 1, 2, 3 or 4"),
    (dict(api_version=2, backend_config={"a": 1}), "api_version 2 takes a str backend_config"),
    (dict(backend_config="s"), "api_version 4 takes a dict backend_config"),
    (dict(backend_config={"a": [1]}), r"backend_config\['a'\] must be an int, float or str"),
])
def test_custom_call_errors(kwargs, message):
    b = Builder()
    with pytest.raises(InvalidArgumentError, match=message):
        b.custom_call("t", [b.parameter((2,), F32)], ((2,), F32), **kwargs)


@pytest.mark.parametrize("op,shape,dtype,message", [
    (lambda b, x: b.cholesky(x), (3, 3), np.int32, "cholesky: needs floating-point or complex operands"),
    (lambda b, x: b.cholesky(x), (3, 2), np.float32, "cholesky: a must be .* square matrices"),
    (lambda b, x: b.fft(x, "RFFT", (3,)), (3,), np.complex64, "fft: needs f32 or f64 operands"),
    (lambda b, x: b.fft(x, "FFT", (4,)), (3,), np.complex64, r"needs trailing dimensions \[4\], got \[3\]"),
    (lambda b, x: b.fft(x, "DCT", (3,)), (3,), np.complex64, "fft_type must be one of"),
    (lambda b, x: b.top_k(x, 4), (3,), np.float32, r"k \(4\) must be in \[0, 3\]"),
    (lambda b, x: b.triangular_solve(x, x, transpose_a="T"), (3, 3), np.float32, "transpose_a must be"),
    (lambda b, x: b.triangular_solve(x, b.slice(x, (0, 0), (2, 3))), (3, 3), np.float32,
     r"a \(3x3\) does not match b's rows \(2\)"),
    (lambda b, x: b.reduce_precision(x, 0, 3), (3,), np.float32, "needs exponent_bits >= 1"),
    (lambda b, x: b.rng_bit_generator(x, (2,)), (3,), np.uint64, "the THREE_FRY state must be u64"),
    (lambda b, x: b.rng_bit_generator(x, (2,), np.float32), (2,), np.uint64, "random bits come as"),
    (lambda b, x: b.random_uniform(x, (2,), minval=1, maxval=1), (2,), np.uint64, "needs minval < maxval"),
    (lambda b, x: b.random_normal(x, (2,), np.float16), (2,), np.uint64, "dtype must be f32 or f64, got f16"),
])
def test_op_errors(op, shape, dtype, message):
    b = Builder()
    with pytest.raises(InvalidArgumentError, match=message):
        op(b, b.parameter(shape, dtype))


REFUSED = {
    "batch_norm": (lambda b, x: b.batch_norm_training(x, b.full((2,), 1, F32), b.full((2,), 0, F32),
                                                      1e-3, 1)[0], "stablehlo.batch_norm_training"),
    "custom_call": (lambda b, x: b.custom_call("k", [x], ((2, 2), F32)), "custom call 'k'"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_reference_backend_refuses_at_compile_time(name):
    build, message = REFUSED[name]
    b = Builder()
    x = b.parameter((2, 2), F32)
    program = b.build(build(b, x))
    with pytest.raises(UnimplementedError, match=message):
        ifrt.get_client("reference").compile(program, ifrt.CompileOptions())


@SOME
@given(data=st.data(), batch=st.integers(1, 3), n=st.integers(1, 5), k=st.integers(1, 4))
def test_batched_gather_and_multi_operand_scatter(client, data, batch, n, k):
    """take_along_axis as a gather with batching dims; np.add.at and np.maximum.at per
    batch as one scatter of two operands."""
    x = array(data, (batch, n), F32)
    idx = array(data, (batch, k, 1), np.int32, 0, n - 1)
    u = array(data, (batch, k), F32)
    b = Builder()
    px, pi, pu = b.parameter(x.shape, F32), b.parameter(idx.shape, np.int32), b.parameter(u.shape, F32)
    taken = b.gather(px, pi, offset_dims=[], collapsed_slice_dims=[1], start_index_map=[1],
                     slice_sizes=[1, 1], operand_batching_dims=[0], start_indices_batching_dims=[0])
    added, maxed = b.scatter([px, px * 2], pi, [pu, pu],
                             lambda a1, a2, v1, v2: (a1 + v1, b.max(a2, v2)),
                             update_window_dims=[], inserted_window_dims=[1],
                             scatter_dims_to_operand_dims=[1], input_batching_dims=[0],
                             scatter_indices_batching_dims=[0])
    got_t, got_a, got_m = run(client, b.build(taken, added, maxed), x, idx, u)
    want_a, want_m = x.copy(), x * 2
    for i in range(batch):
        np.add.at(want_a[i], idx[i, :, 0], u[i])
        np.maximum.at(want_m[i], idx[i, :, 0], u[i])
    np.testing.assert_array_equal(got_t, np.take_along_axis(x, idx[..., 0], 1))
    np.testing.assert_allclose(got_a, want_a, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got_m, want_m)


def test_batching_dims_errors():
    b = Builder()
    x, i = b.parameter((3, 5), F32), b.parameter((2, 4, 1), np.int32)
    with pytest.raises(InvalidArgumentError, match=r"batching dims 0 \(size 3\) and 0 \(size 2\) differ"):
        b.gather(x, i, offset_dims=[], collapsed_slice_dims=[1], start_index_map=[1], slice_sizes=[1, 1],
                 operand_batching_dims=[0], start_indices_batching_dims=[0])
    with pytest.raises(InvalidArgumentError, match="needs as many updates as operands"):
        b.scatter([x, x], i, [b.parameter((2, 4), F32)], update_window_dims=[], inserted_window_dims=[1],
                  scatter_dims_to_operand_dims=[1], input_batching_dims=[0], scatter_indices_batching_dims=[0])
