"""The conformance laws hold a backend to what it declares in ``Client.inexact_dtypes``.

A test backend (the reference backend, two devices with the CPU plugin's three memory
kinds) holds float64 and complex128 as a TPU does, as float32 pairs
(``ifrtpy.dtypes.as_float32_pair``). Declaring it, it passes every law; declaring
nothing, the laws that compare with the input fail; declaring something else (plain
float32 rounding), the law that checks declarations fails.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.dtypes import COMPLEX128_AS_FLOAT32_PAIRS, FLOAT64_AS_FLOAT32_PAIR, InexactDType
from ifrtpy.dtypes import as_float32_pair
from ifrtpy.testing import strategies as S
from ifrtpy.testing.conformance import case_classes, laws
from ifrtpy.backends.reference.client import ReferenceClient

F64, C128 = ifrt.DType.from_numpy(np.float64), ifrt.DType.from_numpy(np.complex128)
TPU_LIKE = {F64: FLOAT64_AS_FLOAT32_PAIR, C128: COMPLEX128_AS_FLOAT32_PAIRS}


def rounded_to_float32(x):
    with np.errstate(over="ignore"):
        return x.astype(np.float32).astype(np.float64)


FLOAT32_ROUNDING = {F64: InexactDType(F64, "float64 rounded to float32 (wrong here)",
                                      rounded_to_float32)}

#: The laws that compare device values with the NumPy input.
COMPARING_LAWS = [
    laws.test_host_array_host_is_identity,
    laws.test_on_done_runs_once_and_then_the_host_data_is_free,
    laws.test_each_shard_is_the_numpy_slice_of_its_index_domain,
    laws.test_assemble_of_disassemble_is_identity,
    laws.test_copy_arrays_to_other_devices_keeps_every_value,
    laws.test_reshard_keeps_every_value,
]


class Float32PairClient(ReferenceClient):
    """Holds float64 and complex128 as float32 pairs in every memory; declares
    ``declared`` (dtype -> InexactDType) for every memory kind."""

    def __init__(self, declared):
        super().__init__(2, 2)
        self._declared = types.MappingProxyType(dict(declared))

    def inexact_dtypes(self, memory_kind=None):
        return self._declared

    def make_array_from_host_buffer(self, data, sharding, *args, **kwargs):
        data = np.asarray(data)
        if data.dtype in (np.float64, np.complex128):
            data = as_float32_pair(data)
        return super().make_array_from_host_buffer(data, sharding, *args, **kwargs)


# (a) Declared: every law passes (the suite's own draws of every dtype).
globals().update(case_classes("laws", expected_skips={
    "test_donation_deletes_exactly_the_donated_inputs": "needs 4 addressable devices"}))


@pytest.fixture(scope="module")
def client():
    return Float32PairClient(TPU_LIKE)


@pytest.fixture
def only_inexact_dtypes(monkeypatch):
    """The laws draw float64 and complex128 arrays only."""
    monkeypatch.setattr(S, "DTYPES", (np.dtype(np.float64), np.dtype(np.complex128)))


def _fails(law, client):
    """``law`` fails on ``client``, every failure hypothesis reports an AssertionError."""
    with pytest.raises((AssertionError, ExceptionGroup)) as info:
        law(client=client)
    if isinstance(info.value, ExceptionGroup):
        _, others = info.value.split(AssertionError)
        assert others is None, others


@pytest.mark.parametrize("law", COMPARING_LAWS, ids=lambda law: law.__name__)
def test_declared_values_pass_the_comparing_laws(law, client, only_inexact_dtypes):
    law(client=client)


def test_a_declaration_is_checked_against_the_devices(client):
    laws.test_declared_inexact_dtypes_are_what_the_devices_hold(client=client)


# (b) Not declared: values that change unmentioned fail the laws.
@pytest.mark.parametrize("law", COMPARING_LAWS, ids=lambda law: law.__name__)
def test_undeclared_changes_fail_the_comparing_laws(law, only_inexact_dtypes):
    _fails(law, Float32PairClient({}))


# (c) Declared wrong: the law checking declarations fails (and so do the comparing laws).
def test_a_wrong_declaration_fails(only_inexact_dtypes):
    wrong = Float32PairClient(FLOAT32_ROUNDING)
    _fails(laws.test_declared_inexact_dtypes_are_what_the_devices_hold, wrong)
    _fails(laws.test_host_array_host_is_identity, wrong)


def test_a_declaration_for_exact_values_fails():
    """Declaring float32 pairs on a backend that holds float64 exactly fails too."""
    exact = ReferenceClient(2, 2)
    exact.inexact_dtypes = lambda memory_kind=None: TPU_LIKE  # type: ignore[method-assign]
    _fails(laws.test_declared_inexact_dtypes_are_what_the_devices_hold, exact)


def test_a_backend_declaring_nothing_skips_the_declaration_law():
    reference = ifrt.get_client("reference", device_count=2)
    assert reference.inexact_dtypes() == {} and reference.inexact_dtypes("pinned_host") == {}
    with pytest.raises(pytest.skip.Exception, match="declares every dtype exact"):
        laws.test_declared_inexact_dtypes_are_what_the_devices_hold(client=reference)


class DeclaresOn:
    """A client stub declaring float32 pairs in ``kinds`` only (the TPU: device and
    pinned_host, unpinned_host exact)."""

    def __init__(self, *kinds):
        self._kinds = kinds

    def inexact_dtypes(self, memory_kind=None):
        return TPU_LIKE if (memory_kind or "device") in self._kinds else {}


def test_expected_values_apply_a_declaration_where_values_enter_its_memories():
    x = np.array([1 / 3, np.nan, -0.0, -7.29e-304])
    pairs, exact = as_float32_pair(x), x
    tpu = DeclaresOn("device", "pinned_host")
    for kinds, want in [((None,), pairs), (("unpinned_host",), exact),
                        (("device", "pinned_host", None), pairs),  # kept as they are
                        (("unpinned_host", "device"), pairs),
                        (("device", "unpinned_host"), pairs)]:
        got, nan_equal = laws.expected_values(tpu, x, *kinds)
        assert got.tobytes() == want.tobytes() and nan_equal == (want is pairs), kinds
    # -0.0 from an underflow, held as it is: not the model of -0.0 (0.0).
    assert np.signbit(laws.expected_values(tpu, x, "device", "pinned_host")[0][3])
    f32, nan_equal = laws.expected_values(tpu, x.astype(np.float32), None)
    assert not nan_equal and f32.dtype == np.float32
    assert laws.expected_values(DeclaresOn(), x, None, "device")[0] is x
