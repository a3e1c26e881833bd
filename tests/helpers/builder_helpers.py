"""What the builder's tests share: the backends to run on (a module-scoped ``client``
fixture: PjRt, and the reference backend where it exists), ``run`` (compile for one
device and run), tolerances and random inputs."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.errors import UnimplementedError

FEW = settings(max_examples=8, deadline=None)
SOME = settings(max_examples=4, deadline=None)  # tests that compile a large program per example
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(t) for t in (np.float32, np.float64, np.float16)] + [BF16]
SIGNED = [np.dtype(t) for t in (np.int8, np.int32, np.int64)]
UNSIGNED = [np.dtype(t) for t in (np.uint8, np.uint32)]
INTS = SIGNED + UNSIGNED
NUMERIC = FLOATS + INTS
PRED = np.dtype(np.bool_)


def isfloat(dtype) -> bool:
    return np.dtype(dtype) in FLOATS


def _backends():
    params = [pytest.param("pjrt", id="pjrt")]
    try:
        import ifrtpy.backends.reference  # noqa: F401
        params.append(pytest.param("reference", id="reference"))
    except ImportError:
        pass
    return params


@pytest.fixture(scope="module", params=_backends())
def client(request):
    try:
        return ifrt.get_client(request.param, device_count=8)
    except (ImportError, UnimplementedError, NotImplementedError) as e:  # pragma: no cover
        pytest.skip(f"backend {request.param} unavailable: {e}")


def run(client, program, *inputs):
    """Compile ``program`` for one device, run it on ``inputs``, return NumPy results."""
    try:
        exe = client.compile(program, ifrt.CompileOptions())
        device = client.devices()[0]
        outs = exe(*[ifrt.device_put(np.asarray(x), device) for x in inputs])
    except (UnimplementedError, NotImplementedError) as e:
        if client.__class__.__module__.startswith("ifrtpy.backends.reference"):
            pytest.skip(f"the reference backend lacks this: {e}")
        raise
    return [np.asarray(o) for o in outs]


def tolerance(dtype):
    dtype = np.dtype(dtype)
    if dtype == BF16:
        return dict(rtol=2e-2, atol=2e-2)
    if dtype == np.float16:
        return dict(rtol=2e-3, atol=2e-3)
    if dtype == np.float32:
        return dict(rtol=2e-5, atol=1e-5)
    if dtype == np.float64:
        return dict(rtol=1e-10, atol=1e-12)
    return dict(rtol=0, atol=0)


def assert_close(actual, expected, dtype=None):
    expected = np.asarray(expected)
    dtype = np.dtype(dtype or expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    if dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected.astype(dtype))
    else:
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                                   **tolerance(dtype))


# -- strategies --------------------------------------------------------------------------------

def shapes(min_rank=0, max_rank=3, min_side=1, max_side=4):
    return st.lists(st.integers(min_side, max_side), min_size=min_rank, max_size=max_rank).map(tuple)


def array(data, shape, dtype, lo=-3.0, hi=3.0):
    """Random values of ``dtype`` in [lo, hi] (integers: that range clipped to the dtype)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    if dtype == PRED:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(int(lo), info.min), min(int(hi), info.max) + 1, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def is_reference(client) -> bool:
    return client.__class__.__module__.startswith("ifrtpy.backends.reference")


def optimized_hlo(executable) -> str:
    """The HLO text of a PjRt executable's optimized module (what the compiler made of
    the program, with its metadata)."""
    from jaxlib._hlo import HloModule

    from ifrtpy._xla import proto_field as _proto_field

    fmt, code = executable._handle.optimized_program()
    if fmt == "hlo_with_config":
        code = _proto_field(code, 1)
    assert fmt in ("hlo", "hlo_with_config"), fmt
    return HloModule.from_serialized_hlo_module_proto(code).to_string()


@functools.lru_cache(maxsize=None)
def pjrt_client():
    """One PjRt client (8 CPU devices) for the tests that run only there."""
    return ifrt.get_client("pjrt", device_count=8)
