"""What XLA's client library builds out of plain ops, and the builder writes the same way:
approx_top_k (as XLA runs it off TPU: exact), regularized_incomplete_beta and is_constant,
checked against NumPy, SciPy and jax on both backends, with hypothesis for their laws."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
import scipy.special
from hypothesis import given
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.builder import Builder, approx_top_k_reduction_output_size
from ifrtpy.errors import InvalidArgumentError

from builder_helpers import FEW, array, client, run, shapes  # noqa: F401  (client is a fixture)

F32 = np.dtype(np.float32)


def _larger_first(b):
    return lambda a, c, *_: b.gt(a, c)


def _distinct(data, shape, dtype):
    """Values of ``shape``, all distinct (a shuffled range), so ties do not decide order."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    return rng.permutation(int(np.prod(shape))).reshape(shape).astype(dtype)


# -- approx_top_k ------------------------------------------------------------------------------

@FEW
@given(data=st.data(), shape=shapes(min_rank=1, max_rank=3, max_side=6),
       aggregate=st.booleans(), dtype=st.sampled_from([F32, np.dtype(np.int32)]))
def test_approx_top_k_with_recall_one_is_top_k(client, data, shape, aggregate, dtype):
    """recall_target 1.0 keeps the exact top k: what top_k gives (values and indices)."""
    x = _distinct(data, shape, dtype)
    k = data.draw(st.integers(1, shape[-1]))
    dim = len(shape) - 1
    b = Builder("approx")
    px = b.parameter(shape, dtype)
    idx = b.iota(shape, np.int32, dim)
    low = np.iinfo(dtype).min if dtype.kind == "i" else -np.inf
    values, indices = b.approx_top_k([px, idx], [low, np.int32(0)], k, dim, _larger_first(b),
                                     recall_target=1.0, aggregate_to_topk=aggregate)
    exact, where = b.top_k(px, k)
    got = run(client, b.build(values, indices, exact, where), x)
    size = k if aggregate else shape[-1]  # not aggregated: every element, sorted
    np.testing.assert_array_equal(got[0][..., :k], got[2])
    np.testing.assert_array_equal(got[1][..., :k], got[3])
    assert got[0].shape == shape[:-1] + (size,)
    np.testing.assert_array_equal(got[0], -np.sort(-x, -1)[..., :size])


@pytest.mark.parametrize("shape,dim,k,recall", [((3, 300), 1, 5, 0.9), ((300, 2), 0, 1, 0.9),
                                                ((2, 3000), 1, 10, 0.95), ((4100,), 0, 3, 0.99)])
def test_approx_top_k_not_aggregated_keeps_what_xla_keeps(client, shape, dim, k, recall):
    """Not aggregated, the kept count is XLA's (checked against jax's approx_max_k, which
    runs the same fallback on CPU); the values are the largest, in order, as NumPy's sort
    gives them, and the indices point at them."""
    rng = np.random.default_rng(0)
    x = rng.permutation(int(np.prod(shape))).reshape(shape).astype(np.float32)
    b = Builder("approx")
    px = b.parameter(shape, F32)
    values, indices = b.approx_top_k([px, b.iota(shape, np.int32, dim)], [-np.inf, np.int32(0)],
                                     k, dim, _larger_first(b), recall, aggregate_to_topk=False)
    got_values, got_indices = run(client, b.build(values, indices), x)
    want_values, want_indices = jax.lax.approx_max_k(x, k, dim, recall, aggregate_to_topk=False)
    size, _ = approx_top_k_reduction_output_size(shape[dim], len(shape), k, recall, False)
    assert got_values.shape[dim] == size == want_values.shape[dim]
    np.testing.assert_array_equal(got_values, np.asarray(want_values))
    np.testing.assert_array_equal(got_indices, np.asarray(want_indices))
    np.testing.assert_array_equal(got_values, np.take(-np.sort(-x, dim), range(size), dim))
    np.testing.assert_array_equal(np.take_along_axis(x, got_indices, dim), got_values)


def test_approx_top_k_of_one_reduces_from_the_init_values(client):
    """k = 1 keeps what the comparator puts first among the elements and the init value:
    the minimum here (a smaller-first comparator), and the init value where it is smaller."""
    x = np.array([[4.0, 2.0, 7.0], [9.0, 8.0, 6.0]], np.float32)
    b = Builder("approx")
    px = b.parameter(x.shape, F32)
    smallest = b.approx_top_k(px, 6.5, 1, 1, lambda a, c: b.lt(a, c))
    got, = run(client, b.build(smallest), x)
    np.testing.assert_array_equal(got, [[2.0], [6.0]])


@pytest.mark.parametrize("call,message", [
    (lambda b, x: b.approx_top_k(x, 0.0, 9, 1, b.gt), r"top_k \(9\) must be in \[1, 5\]"),
    (lambda b, x: b.approx_top_k(x, 0.0, 2, 2, b.gt), "reduction_dim 2 is out of range"),
    (lambda b, x: b.approx_top_k([x], [], 2, 1, b.gt), "one init value per operand"),
    (lambda b, x: b.approx_top_k(x, b.constant(np.int32(0)), 2, 1, b.gt), "scalar of its operand's dtype"),
    (lambda b, x: b.approx_top_k(x, 0.0, 2, 1, b.gt, recall_target=0.0), r"recall_target must be in \(0, 1\]"),
    (lambda b, x: b.approx_top_k(b.parameter((2, 500), F32), 0.0, 2, 1, b.gt, aggregate_to_topk=False,
                                 reduction_input_size_override=10), "must be at least the size"),
])
def test_approx_top_k_errors(call, message):
    b = Builder()
    with pytest.raises(InvalidArgumentError, match=message):
        call(b, b.parameter((2, 5), F32))


# -- is_constant -------------------------------------------------------------------------------

@FEW
@given(data=st.data())
def test_is_constant_is_independence_of_the_parameters(client, data):
    """Random expressions over two parameters and constants: is_constant says whether one
    uses a parameter (tracked while building); a constant one gives the same value for any
    parameter values."""
    b = Builder("exprs")
    params = [b.parameter((3,), F32), b.parameter((3,), F32)]
    pool = [(p, False) for p in params] + [(b.constant(np.float32([1, 2, 3])), True)]
    steps = [lambda u, v: u + v, lambda u, v: b.max(u, v), lambda u, v: b.tanh(u) * v,
             lambda u, v: b.select(u < v, u, v),
             lambda u, v: b.broadcast_to(b.reduce(u, None, (0,), "sum"), (3,)) + v,
             lambda u, v: b.cond(b.reduce(v, None, (0,), "max") > 0, lambda: u, lambda: u - 1)]
    for _ in range(data.draw(st.integers(1, 8))):
        (u, cu), (v, cv) = (pool[data.draw(st.integers(0, len(pool) - 1))] for _ in range(2))
        pool.append((data.draw(st.sampled_from(steps))(u, v), cu and cv))
    for value, constant in pool:
        assert b.is_constant(value) == constant
    constants = [v for v, c in pool if c]
    rng = np.random.default_rng(0)
    program = b.build(*constants)
    first = run(client, program, *(rng.standard_normal(3).astype(F32) for _ in params))
    second = run(client, program, *(rng.standard_normal(3).astype(F32) for _ in params))
    for a, c in zip(first, second):
        np.testing.assert_array_equal(a, c)


def test_is_constant_refuses_what_xla_does_not_fold():
    """Not constant: parameters (of main, or of the region being built), stateful or
    device-dependent ops, and values a region captures from outside."""
    b = Builder("kinds")
    x = b.parameter((2,), F32)
    one = b.constant(np.float32([1, 1]))
    assert b.is_constant(b.iota((2,), F32) + one)
    assert not b.is_constant(b.replica_id())
    assert not b.is_constant(b.rng_uniform(0, 5, (2,), np.int32))  # stateful
    # bits from a constant state are a constant, as XLA counts them
    assert b.is_constant(b.rng_bit_generator(b.constant(np.uint64([1, 2])), (2,))[1])
    assert not b.is_constant(b.custom_call("target", [one], ((2,), F32)))
    assert not b.is_constant(b.cond(b.constant(True), lambda: one, lambda: x))  # x captured
    assert b.is_constant(b.cond(b.constant(True), lambda: one, lambda: one + 1))
    seen = []

    def body(i):
        seen.append((b.is_constant(i), b.is_constant(one * 2)))
        return i + 1
    counted = b.while_loop(lambda i: i < 3, body, b.constant(np.int32(0)))
    assert seen == [(False, True)] and not b.is_constant(counted)


# -- regularized_incomplete_beta ---------------------------------------------------------------

BETA_SIZE = 32
#: Tolerances against SciPy's float64 betainc.
BETA_TOLERANCE = {np.dtype(np.float64): 1e-12, F32: 2e-5, np.dtype(ml_dtypes.bfloat16): 2e-2}
_BETA_PROGRAMS: dict = {}


def _betainc(client, dtype, a, b, x):
    """``(I_x(a, b), I_{1-x}(b, a))``, the program compiled once per client and dtype."""
    key = (client, dtype)
    if key not in _BETA_PROGRAMS:
        bld = Builder("betainc")
        pa, pb, px = (bld.parameter((BETA_SIZE,), dtype) for _ in range(3))
        _BETA_PROGRAMS[key] = client.compile(bld.build(
            bld.regularized_incomplete_beta(pa, pb, px),
            bld.regularized_incomplete_beta(pb, pa, 1.0 - px)), ifrt.CompileOptions())
    device = client.devices()[0]
    outs = _BETA_PROGRAMS[key](*[ifrt.device_put(v.astype(dtype), device) for v in (a, b, x)])
    return [np.asarray(o).astype(np.float64) for o in outs]


@FEW
@given(data=st.data(), dtype=st.sampled_from(list(BETA_TOLERANCE)))
def test_regularized_incomplete_beta_against_scipy_and_its_symmetry(client, data, dtype):
    """I_x(a, b) as scipy.special.betainc gives it, and I_x(a, b) = 1 - I_{1-x}(b, a);
    NaN outside the domain (a or b not positive, x outside [0, 1])."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    a, b = (rng.uniform(0.2, 8.0, BETA_SIZE).astype(dtype) for _ in range(2))
    x = rng.uniform(0.0, 1.0, BETA_SIZE).astype(dtype)
    x[:2] = [0.0, 1.0]
    a[2], b[3], x[4], x[5] = -1.0, 0.0, -0.5, 1.5  # out of the domain
    got, mirrored = _betainc(client, dtype, a, b, x)
    a64, b64, x64 = (v.astype(np.float64) for v in (a, b, x))
    want = scipy.special.betainc(a64, b64, x64)
    want[[2, 3, 4, 5]] = np.nan  # SciPy: NaN for x outside [0, 1]; b = 0 has a limit there
    tol = BETA_TOLERANCE[np.dtype(dtype)]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    inside = ~np.isnan(want)
    np.testing.assert_allclose(got[inside] + mirrored[inside], 1.0, rtol=0, atol=2 * tol)


def test_regularized_incomplete_beta_refuses_other_dtypes():
    b = Builder()
    x = b.parameter((2,), np.int32)
    with pytest.raises(InvalidArgumentError, match="needs f16, bf16, f32 or f64 operands"):
        b.regularized_incomplete_beta(x, x, x)
    y = b.parameter((2,), F32)
    with pytest.raises(InvalidArgumentError, match="the same shape and dtype"):
        b.regularized_incomplete_beta(y, y, b.parameter((3,), F32))
