"""Random bits and numbers: rng_bit_generator equals jax.lax.rng_bit_generator (the same
algorithms, as the oracle); random_uniform and random_normal have the right range,
distribution (Kolmogorov-Smirnov distance) and key handling."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.builder import Builder
from ifrtpy.errors import UnimplementedError

from builder_helpers import pjrt_client, run

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


def test_reference_backend_refuses_random_bits():
    b = Builder()
    program = b.build(b.rng_bit_generator(b.parameter((2,), np.uint64), (4,))[1])
    with pytest.raises(UnimplementedError, match="rng_bit_generator"):
        ifrt.get_client("reference").compile(program, ifrt.CompileOptions())


def test_same_program_runs_again_with_the_same_key():
    b = Builder()
    _, values = b.random_uniform(b.constant(np.array([3, 4], np.uint64)), (8,))
    program = b.build(values)
    first = run(pjrt_client(), program)[0]
    np.testing.assert_array_equal(first, run(pjrt_client(), program)[0])
