"""Dtypes a device cannot hold exactly: the float32-pair model (the TPU's float64 and
complex128, ``ifrtpy.dtypes.as_float32_pair``), ``InexactDType``, the PjRt backend's
table by platform (``ifrtpy.backends.pjrt.precision``) and the NaN-aware comparison of
``ifrtpy.testing.asserts``."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.backends.pjrt import precision
from ifrtpy.dtypes import (
    COMPLEX128_AS_FLOAT32_PAIRS, FLOAT64_AS_FLOAT32_PAIR, DType, InexactDType, as_float32_pair,
)
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.testing.asserts import assert_same_values

F64, C128 = DType(DType.Kind.F64), DType(DType.Kind.C128)

# x -> what the model gives; a TPU v5e gave the same for 1/3, pi, +-6.805647e38,
# +-7.29e-304, 2**-149, +-0 and +-inf (measured, through ifrtpy and through jax).
MEASURED = [
    (1 / 3, 0.33333333333333304),
    (np.pi, 3.1415926535897967),
    (6.805647e38, np.inf),                # beyond float32's range
    (-6.805647e38, -np.inf),
    (3.4028234663852886e38, 3.4028234663852886e38),   # float32's largest, kept
    (7.29e-304, 0.0),                     # below float32's smallest subnormal
    (-7.29e-304, -0.0),                   # a negative underflow keeps its sign
    (2.0 ** -149, 2.0 ** -149),           # float32's smallest subnormal, kept
    (1.0 + 2.0 ** -40, 1.0 + 2.0 ** -40),  # 40 bits of mantissa, kept
    (0.0, 0.0),
    (-0.0, 0.0),                          # -0.0 + 0.0: the chip gives 0.0 too
    (np.inf, np.inf),
    (-np.inf, -np.inf),
]


def _bits(x) -> list[int]:
    return np.asarray(x, np.float64).view(np.uint64).tolist()


def test_float32_pair_model_gives_the_measured_values():
    x = np.array([v for v, _ in MEASURED])
    out = as_float32_pair(x)
    assert out.dtype == np.float64 and out.shape == x.shape
    assert _bits(out) == _bits([held for _, held in MEASURED])


def test_float32_pair_model_keeps_nan_and_shape_and_leaves_the_input_alone():
    x = np.array([[np.nan, -np.nan], [1 / 3, 1.0]])
    before = x.tobytes()
    out = as_float32_pair(x)
    assert x.tobytes() == before and out is not x and out.shape == (2, 2)
    assert np.isnan(out[0]).all() and out[1, 1] == 1.0
    assert as_float32_pair(np.float64(1 / 3)).shape == ()


def test_float32_pair_model_is_float32_rounding_plus_a_float32_remainder():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000) * 10.0 ** rng.integers(-20, 20, 1000)
    out = as_float32_pair(x)
    assert (out.astype(np.float32) == x.astype(np.float32)).all()
    assert (np.abs(out - x) <= np.abs(x) * 2.0 ** -47).all()  # about 48 bits kept
    assert (as_float32_pair(out) == out).all()  # what it gives back it holds exactly


def test_complex128_is_the_model_of_each_part():
    re = np.array([v for v, _ in MEASURED])
    im = re[::-1].copy()
    out = as_float32_pair(_complex(re, im))
    assert out.dtype == np.complex128
    assert _bits(out.real) == _bits(as_float32_pair(re))
    assert _bits(out.imag) == _bits(as_float32_pair(im))


def _complex(re, im):
    out = np.empty(re.shape, np.complex128)
    out.real, out.imag = re, im  # (re + 1j * im would turn inf * 1j into nan parts)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.complex64, np.int64])
def test_float32_pair_model_refuses_other_dtypes(dtype):
    with pytest.raises(InvalidArgumentError, match="float64 or complex128"):
        as_float32_pair(np.zeros(2, dtype))


def test_ready_made_descriptions():
    assert FLOAT64_AS_FLOAT32_PAIR.dtype == F64 and COMPLEX128_AS_FLOAT32_PAIRS.dtype == C128
    assert "float32" in FLOAT64_AS_FLOAT32_PAIR.summary and "\n" not in FLOAT64_AS_FLOAT32_PAIR.summary
    x = np.array([1 / 3])
    assert FLOAT64_AS_FLOAT32_PAIR.held_values(x).tobytes() == as_float32_pair(x).tobytes()
    with pytest.raises(InvalidArgumentError, match="takes float64 arrays, got a float32 array"):
        FLOAT64_AS_FLOAT32_PAIR.held_values(x.astype(np.float32))
    assert pickle.loads(pickle.dumps(COMPLEX128_AS_FLOAT32_PAIRS)) == COMPLEX128_AS_FLOAT32_PAIRS
    assert repr(FLOAT64_AS_FLOAT32_PAIR).endswith(", ifrtpy.dtypes.as_float32_pair)")
    assert ifrt.InexactDType is InexactDType


def test_inexact_dtype_checks_its_fields_and_the_model_output():
    assert InexactDType(np.float64, "s", as_float32_pair).dtype == F64  # a NumPy dtype taken
    with pytest.raises(InvalidArgumentError, match="model"):
        InexactDType(F64, "s", None)  # type: ignore[arg-type]
    bad = InexactDType(F64, "s", lambda x: x.astype(np.float32))
    with pytest.raises(InvalidArgumentError, match="gave a float32"):
        bad.held_values(np.zeros(3))


def test_base_client_declares_every_dtype_exact():
    client = ifrt.get_client("reference", device_count=1)
    for kind in (None, "device", "pinned_host", "unpinned_host"):
        assert dict(client.inexact_dtypes(kind)) == {}


# -- the PjRt backend's table ------------------------------------------------------------------

@pytest.mark.parametrize("kind", [None, "device", "pinned_host", ifrt.MemoryKind("device")])
def test_pjrt_tpu_holds_float64_and_complex128_as_float32_pairs(kind):
    declared = precision.inexact_dtypes("tpu", kind)
    assert dict(declared) == {F64: FLOAT64_AS_FLOAT32_PAIR, C128: COMPLEX128_AS_FLOAT32_PAIRS}
    assert declared[np.dtype(np.float64)] is FLOAT64_AS_FLOAT32_PAIR  # DType hashes as NumPy's


@pytest.mark.parametrize("platform, kind", [("cpu", None), ("cpu", "device"), ("cuda", None),
                                            ("tpu", "unpinned_host"), ("tpu", "other_kind")])
def test_pjrt_other_platforms_and_kinds_are_exact(platform, kind):
    assert dict(precision.inexact_dtypes(platform, kind)) == {}


# -- NaN-aware comparison ----------------------------------------------------------------------

def test_nan_equal_takes_any_nan_for_any_nan_and_nothing_else():
    quiet = np.array([np.nan, 1.0])
    payload = quiet.copy()
    payload.view(np.uint64)[0] |= 1  # another NaN
    with pytest.raises(AssertionError, match="bytes"):
        assert_same_values(payload, quiet)
    assert_same_values(payload, quiet, nan_equal=True)
    with pytest.raises(AssertionError):
        assert_same_values(np.array([np.nan, 2.0]), quiet, nan_equal=True)
    with pytest.raises(AssertionError):
        assert_same_values(np.array([-0.0, 1.0]), np.array([0.0, 1.0]), nan_equal=True)


def test_nan_equal_compares_complex_parts_apart():
    a, b = _complex(np.array([np.nan]), np.array([1.0])), _complex(np.array([np.nan]), np.array([2.0]))
    with pytest.raises(AssertionError):
        assert_same_values(a, b, nan_equal=True)
    assert_same_values(a, _complex(np.array([-np.nan]), np.array([1.0])), nan_equal=True)
    assert_same_values(np.arange(3), np.arange(3), nan_equal=True)  # no NaNs in the dtype
