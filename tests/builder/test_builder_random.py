"""Random bits and numbers: rng_bit_generator equals jax.lax.rng_bit_generator (the same
algorithms, as the oracle); random_uniform and random_normal have the right range,
distribution (Kolmogorov-Smirnov distance) and key handling; XLA's stateful rng_uniform
(integers and floats) and rng_normal have the right range and distribution, and new
values on every run, on the PjRt and reference backends."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.builder import Builder
from ifrtpy.errors import InvalidArgumentError

from builder_helpers import client, pjrt_client, run  # noqa: F401  (client is a fixture)

N = 20000
_COMPILED: dict = {}


def _run_cached(key, build, *inputs):
    """Compile once per key (the tests vary only the random key)."""
    if key not in _COMPILED:
        _COMPILED[key] = pjrt_client().compile(build(), ifrt.CompileOptions())
    device = pjrt_client().devices()[0]
    return [np.asarray(o) for o in _COMPILED[key](*[ifrt.device_put(x, device) for x in inputs])]


def _ks(sample, cdf) -> float:
    """The Kolmogorov-Smirnov distance of a sample from a distribution."""
    x = np.sort(sample.astype(np.float64))
    f = cdf(x)
    n = len(x)
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), algorithm=st.sampled_from(["THREE_FRY", "PHILOX"]),
       dtype=st.sampled_from([np.uint32, np.uint8, np.uint16]))  # u64 needs jax x64
def test_rng_bit_generator_equals_jax(seed, algorithm, dtype):
    state = np.array([seed, seed ^ 0x9E3779B97F4A7C15], np.uint64)

    def build():
        b = Builder()
        return b.build(*b.rng_bit_generator(b.parameter((2,), np.uint64), (3, 5), dtype, algorithm))

    new_state, bits = _run_cached(("bits", algorithm, dtype), build, state)
    alg = getattr(jax.lax.RandomAlgorithm, f"RNG_{algorithm}")
    want_state, want_bits = jax.lax.rng_bit_generator(state.view(np.uint32), (3, 5), np.dtype(dtype), alg)
    np.testing.assert_array_equal(bits, np.asarray(want_bits))
    np.testing.assert_array_equal(new_state, np.asarray(want_state).view(np.uint64))
    assert not np.array_equal(new_state, state)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), dtype=st.sampled_from([np.float32, np.float64]),
       bounds=st.sampled_from([(0.0, 1.0), (-3.0, 5.0)]))
def test_random_uniform(seed, dtype, bounds):
    lo, hi = bounds

    def build():
        b = Builder()
        key = b.parameter((2,), np.uint64)
        k1, first = b.random_uniform(key, (N,), dtype, lo, hi)
        _, second = b.random_uniform(k1, (N,), dtype, lo, hi)
        _, again = b.random_uniform(key, (N,), dtype, lo, hi)
        return b.build(first, second, again)

    first, second, again = _run_cached(("uniform", dtype, bounds), build, np.array([seed, 7], np.uint64))
    assert first.dtype == dtype
    assert first.min() >= lo and first.max() < hi
    np.testing.assert_array_equal(first, again)  # same key, same numbers
    assert not np.array_equal(first, second)  # the next key, other numbers
    for sample in (first, second):
        assert _ks(sample, lambda x: (x - lo) / (hi - lo)) < 0.02


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), dtype=st.sampled_from([np.float32, np.float64]))
def test_random_normal(seed, dtype):
    def build():
        b = Builder()
        return b.build(*b.random_normal(b.parameter((2,), np.uint64), (N,), dtype))

    new_key, sample = _run_cached(("normal", dtype), build, np.array([seed, 1], np.uint64))
    assert sample.dtype == dtype and np.all(np.isfinite(sample))
    assert abs(sample.mean()) < 0.05 and abs(sample.std() - 1) < 0.05
    normal_cdf = np.vectorize(lambda v: 0.5 * (1 + math.erf(v / math.sqrt(2))))
    assert _ks(sample, normal_cdf) < 0.02
    assert new_key.dtype == np.uint64 and new_key.shape == (2,)


@pytest.mark.parametrize("algorithm,dtype", [("THREE_FRY", np.uint32), ("PHILOX", np.uint64),
                                             ("DEFAULT", np.uint8)])
def test_reference_backend_draws_the_plugins_bits(algorithm, dtype):
    """The reference backend has XLA's bit generators (in its NumPy evaluator): its bits
    and next state are the CPU plugin's."""
    b = Builder()
    program = b.build(*b.rng_bit_generator(b.parameter((2,), np.uint64), (3, 5), dtype,
                                            algorithm=algorithm))
    state = np.array([2**63 + 12345, 2**64 - 3], np.uint64)
    reference = ifrt.get_client("reference")
    ours = reference.compile(program, ifrt.CompileOptions())(
        ifrt.device_put(state, reference.devices()[0]))
    theirs = run(pjrt_client(), program, state)
    for got, want in zip(ours, theirs):
        np.testing.assert_array_equal(np.asarray(got), want)
        assert np.asarray(got).dtype == want.dtype


def test_same_program_runs_again_with_the_same_key():
    b = Builder()
    _, values = b.random_uniform(b.constant(np.array([3, 4], np.uint64)), (8,))
    program = b.build(values)
    first = run(pjrt_client(), program)[0]
    np.testing.assert_array_equal(first, run(pjrt_client(), program)[0])


@pytest.mark.parametrize("dtype,lo,hi", [(np.int32, -3, 5), (np.int64, -7, 1 << 40),
                                         (np.uint32, 3, 10), (np.uint64, 0, 1 << 63),
                                         (np.int32, -(1 << 31), (1 << 31) - 1)])
def test_rng_uniform_integers(client, dtype, lo, hi):
    """XLA's RngUniform of integers: every value in [lo, hi), each of a small range about
    equally often (chi-square), the whole range otherwise spread (Kolmogorov-Smirnov), and
    other values on the next run (the generator keeps its state)."""
    b = Builder()
    program = b.build(b.rng_uniform(lo, hi, (N,), dtype))
    exe = client.compile(program, ifrt.CompileOptions())
    first, second = (np.asarray(exe()[0]) for _ in range(2))
    assert first.dtype == dtype and first.min() >= lo and first.max() < hi
    assert not np.array_equal(first, second)
    if hi - lo <= 16:
        counts = np.bincount((first.astype(np.int64) - lo), minlength=hi - lo)
        expected = N / (hi - lo)
        assert ((counts - expected) ** 2 / expected).sum() < 3 * (hi - lo) + 30
    else:
        assert _ks(first.astype(np.float64), lambda x: (x - float(lo)) / (float(hi) - float(lo))) < 0.02


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_rng_uniform_and_normal_floats(client, dtype):
    b = Builder()
    x = b.parameter((), dtype)
    program = b.build(b.rng_uniform(x, x + 4, (N,)), b.rng_normal(x, x + 3, (N,)))
    uniform, normal = run(client, program, np.asarray(-1, dtype))
    assert uniform.dtype == normal.dtype == dtype
    assert uniform.min() >= -1 and uniform.max() <= 3  # f16 may round up to the bound
    assert _ks(uniform, lambda v: (v + 1) / 4) < 0.02
    normal = normal.astype(np.float64)
    assert abs(normal.mean() + 1) < 0.05 and abs(normal.std() - 2) < 0.05  # N(-1, 2)
    normal_cdf = np.vectorize(lambda v: 0.5 * (1 + math.erf(v / math.sqrt(2))))
    assert _ks((normal + 1) / 2, normal_cdf) < 0.02


def test_rng_errors():
    """What would abort XLA's compiler (an 8-bit generator) is refused when building."""
    b = Builder()
    with pytest.raises(InvalidArgumentError, match="makes s32, s64, u32, u64, f16, bf16, f32 or f64 values, not u8"):
        b.rng_uniform(0, 5, (3,), np.uint8)
    with pytest.raises(InvalidArgumentError, match="makes f16, bf16, f32 or f64 values, not s32"):
        b.rng_normal(0, 1, (3,), np.int32)
    with pytest.raises(InvalidArgumentError, match="give a dtype"):
        b.rng_uniform(0, 5, (3,))
    with pytest.raises(InvalidArgumentError, match="scalars of one dtype"):
        b.rng_uniform(b.parameter((2,), np.float32), 1.0, (3,))
