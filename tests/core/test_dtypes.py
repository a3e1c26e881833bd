"""ifrtpy.dtypes: sizes, NumPy/ml_dtypes and PJRT_Buffer_Type mappings, rejection, pickle."""

from __future__ import annotations

import pathlib
import pickle
import re

import ml_dtypes
import numpy as np
import pytest

from ifrtpy.dtypes import NUMPY_OF_PJRT_BUFFER_TYPE, PJRT_BUFFER_TYPE_OF_NUMPY, DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.testing import strategies as S

K = DType.Kind

# kind -> (xla::PrimitiveType number, bit size, numpy dtype or None)
EXPECTED = {
    K.INVALID: (0, None, None),
    K.PRED: (1, 8, np.bool_),
    K.S2: (26, 2, ml_dtypes.int2),
    K.S4: (21, 4, ml_dtypes.int4),
    K.S8: (2, 8, np.int8),
    K.S16: (3, 16, np.int16),
    K.S32: (4, 32, np.int32),
    K.S64: (5, 64, np.int64),
    K.U2: (27, 2, ml_dtypes.uint2),
    K.U4: (22, 4, ml_dtypes.uint4),
    K.U8: (6, 8, np.uint8),
    K.U16: (7, 16, np.uint16),
    K.U32: (8, 32, np.uint32),
    K.U64: (9, 64, np.uint64),
    K.F16: (10, 16, np.float16),
    K.F32: (11, 32, np.float32),
    K.F64: (12, 64, np.float64),
    K.BF16: (16, 16, ml_dtypes.bfloat16),
    K.C64: (15, 64, np.complex64),
    K.C128: (18, 128, np.complex128),
    K.TOKEN: (17, None, None),
    K.OPAQUE: (14, None, None),
    K.F8E3M4: (29, 8, ml_dtypes.float8_e3m4),
    K.F8E4M3: (28, 8, ml_dtypes.float8_e4m3),
    K.F8E4M3FN: (20, 8, ml_dtypes.float8_e4m3fn),
    K.F8E4M3B11FNUZ: (23, 8, ml_dtypes.float8_e4m3b11fnuz),
    K.F8E4M3FNUZ: (25, 8, ml_dtypes.float8_e4m3fnuz),
    K.F8E5M2: (19, 8, ml_dtypes.float8_e5m2),
    K.F8E5M2FNUZ: (24, 8, ml_dtypes.float8_e5m2fnuz),
    K.F8E8M0FNU: (33, 8, ml_dtypes.float8_e8m0fnu),
    K.F4E2M1FN: (32, 4, ml_dtypes.float4_e2m1fn),
    K.STRING: (99, None, None),
}
WITH_NUMPY = [k for k, (_, _, np_type) in EXPECTED.items() if np_type is not None]
# STRING's host form is an object array (see test_string_arrays.py), not a NumPy dtype of its own.
WITHOUT_NUMPY = [k for k in EXPECTED if k not in WITH_NUMPY and k != K.STRING]


def test_expectations_cover_every_kind():
    assert set(EXPECTED) == set(K)


@pytest.mark.parametrize("kind", list(K), ids=lambda k: k.name)
def test_kind_numbering_matches_primitive_type(kind):
    assert int(kind) == EXPECTED[kind][0]
    assert DType(int(kind)).kind is kind


@pytest.mark.parametrize("kind", list(K), ids=lambda k: k.name)
def test_bit_and_byte_size(kind):
    bits = EXPECTED[kind][1]
    dt = DType(kind)
    assert dt.bit_size == bits
    if bits is None or bits % 8:
        assert dt.byte_size is None
    else:
        assert dt.byte_size == bits // 8


@pytest.mark.parametrize("kind", WITH_NUMPY, ids=lambda k: k.name)
def test_numpy_round_trip(kind):
    np_dtype = np.dtype(EXPECTED[kind][2])
    dt = DType(kind)
    assert dt.to_numpy() == np_dtype
    assert DType.from_numpy(np_dtype) == dt
    assert DType.from_numpy(EXPECTED[kind][2]) == dt  # a scalar type works too
    assert DType.from_numpy(np_dtype.name) == dt  # and a dtype name
    if dt.byte_size is not None:
        assert np_dtype.itemsize == dt.byte_size
    else:  # sub-byte kinds take one byte per element on the host
        assert np_dtype.itemsize == 1


def test_sub_byte_values_survive_host_round_trip():
    for np_type, values in [(ml_dtypes.int4, [-8, -1, 0, 7]), (ml_dtypes.uint2, [0, 1, 2, 3]),
                            (ml_dtypes.int2, [-2, -1, 0, 1])]:
        a = np.array(values, dtype=np_type)
        assert DType.from_numpy(a.dtype).to_numpy() == a.dtype
        np.testing.assert_array_equal(a.astype(np.int32), values)


@pytest.mark.parametrize("kind", WITHOUT_NUMPY, ids=lambda k: k.name)
def test_kinds_without_host_form_refuse_to_numpy(kind):
    with pytest.raises(InvalidArgumentError, match=kind.name.lower()):
        DType(kind).to_numpy()


@pytest.mark.parametrize(
    "bad",
    [
        np.dtype(object),
        np.dtype("U5"),
        np.dtype("S5"),
        np.dtype("datetime64[ns]"),
        np.dtype("timedelta64[s]"),
        np.dtype([("a", np.int32), ("b", np.float32)]),
        np.dtype(">f4"),
        np.dtype(">i8"),
        np.dtype("V8"),
        np.dtype(np.longdouble) if np.dtype(np.longdouble).itemsize > 8 else np.dtype("O"),
    ],
    ids=str,
)
def test_unsupported_numpy_dtypes_are_rejected_clearly(bad):
    with pytest.raises(InvalidArgumentError) as info:
        DType.from_numpy(bad)
    msg = str(info.value)
    assert str(bad) in msg and "no XLA element type" in msg
    assert isinstance(info.value, ValueError)


def test_big_endian_is_rejected_but_native_accepted():
    assert DType.from_numpy(np.dtype("<f4")) == DType(K.F32)
    with pytest.raises(InvalidArgumentError):
        DType.from_numpy(np.dtype(">f4"))


def _header_buffer_types() -> dict[str, int] | None:
    """PJRT_Buffer_Type_* name -> value, parsed from the plugin package's header."""
    try:
        import xla_plugins.xla_cpu_pjrt as pkg
    except ImportError:
        return None
    header = pathlib.Path(pkg.__path__[0]) / "include" / "pjrt_c_api.h"
    if not header.exists():
        return None
    body = re.search(r"typedef enum \{([^{}]*)\} PJRT_Buffer_Type;", header.read_text(), re.S)
    body = re.sub(r"//[^\n]*", "", body.group(1))
    names = re.findall(r"PJRT_Buffer_Type_(\w+)", body)
    assert "=" not in body  # the enum is implicitly numbered from 0
    return {name: i for i, name in enumerate(names)}


PJRT_KINDS = [k for k in K if k not in (K.OPAQUE, K.STRING)]


@pytest.mark.parametrize("kind", PJRT_KINDS, ids=lambda k: k.name)
def test_pjrt_buffer_type_round_trip(kind):
    dt = DType(kind)
    assert DType.from_pjrt_buffer_type(dt.pjrt_buffer_type) == dt


def test_pjrt_buffer_types_match_the_c_header():
    table = _header_buffer_types()
    if table is None:
        pytest.skip("pjrt_c_api.h (xla-cpu-pjrt) not installed")
    for kind in PJRT_KINDS:
        assert DType(kind).pjrt_buffer_type == table[kind.name], kind
    assert len({DType(k).pjrt_buffer_type for k in PJRT_KINDS}) == len(PJRT_KINDS)


@pytest.mark.parametrize("kind", [K.OPAQUE, K.STRING], ids=lambda k: k.name)
def test_kinds_without_pjrt_type(kind):
    with pytest.raises(InvalidArgumentError):
        DType(kind).pjrt_buffer_type


def test_numpy_pjrt_tables_agree():
    for np_dtype, pjrt in PJRT_BUFFER_TYPE_OF_NUMPY.items():
        assert NUMPY_OF_PJRT_BUFFER_TYPE[pjrt] == np_dtype
        assert DType.from_numpy(np_dtype).pjrt_buffer_type == pjrt
    assert len(PJRT_BUFFER_TYPE_OF_NUMPY) == len(WITH_NUMPY)


def test_unknown_kind_and_buffer_type():
    with pytest.raises(InvalidArgumentError, match="unknown DType kind"):
        DType(1234)
    with pytest.raises(InvalidArgumentError, match="unknown PJRT_Buffer_Type"):
        DType.from_pjrt_buffer_type(999)


@pytest.mark.parametrize("kind", list(K), ids=lambda k: k.name)
def test_pickle_hash_eq_repr(kind):
    dt = DType(kind)
    back = pickle.loads(pickle.dumps(dt))
    assert back == dt and hash(back) == hash(dt)
    assert eval(repr(dt), {"DType": DType}) == dt
    assert str(dt) == kind.name.lower()


def test_equality_and_hash_distinguish_kinds():
    dts = [DType(k) for k in K]
    assert len(set(dts)) == len(dts)
    assert DType(K.F32) != DType(K.F64)
    assert {DType(K.F32): 1}[DType.from_numpy(np.float32)] == 1


@pytest.mark.parametrize("np_dtype", [d for d in S.DTYPES])
def test_a_dtype_equals_its_numpy_dtype_in_every_spelling(np_dtype):
    """As jax.Array.dtype (a NumPy dtype) does: ``a.dtype == np.float32``."""
    dtype = DType.from_numpy(np_dtype)
    for spelling in (np_dtype, np_dtype.type, np_dtype.name, str(np_dtype)):
        assert dtype == spelling and spelling == dtype and not dtype != spelling
    assert hash(dtype) == hash(np_dtype)  # so NumPy dtypes find it in dicts, and back
    assert {np_dtype: 1}[dtype] == 1 and {dtype: 1}[np_dtype] == 1
    others = [d for d in S.DTYPES if d != np_dtype]
    assert all(dtype != d and d != dtype for d in others)


def test_a_dtype_is_not_equal_to_what_is_no_dtype():
    f32 = DType(K.F32)
    for other in (None, 0, 1.0, True, "no such type", object(), [np.float32]):
        assert f32 != other and not f32 == other
    assert DType(K.STRING) != np.dtype(object)  # STRING's host form is no NumPy dtype of it
    assert DType(K.TOKEN) != np.float32


def test_dtype_is_immutable():
    dt = DType(K.F32)
    with pytest.raises(AttributeError):
        dt.foo = 1  # __slots__


# -- a DType goes wherever NumPy takes a dtype ----------------------------------------------

@pytest.mark.parametrize("kind", WITH_NUMPY, ids=lambda k: k.name)
def test_a_dtype_goes_wherever_numpy_takes_a_dtype(kind):
    """NumPy reads a ``dtype`` attribute holding a NumPy dtype (as it does for jax's
    ``jnp.float32``): ``np.dtype(a.dtype)``, ``np.zeros(2, a.dtype)``, ``x.astype(a.dtype)``."""
    dtype, np_dtype = DType(kind), np.dtype(EXPECTED[kind][2])
    assert dtype.dtype == np_dtype and type(dtype.dtype) is type(np_dtype)
    assert np.dtype(dtype) == np_dtype
    assert np.zeros(2, dtype).dtype == np_dtype
    assert np.zeros(2).astype(dtype).dtype == np_dtype
    assert np.array([1], dtype=dtype).dtype == np_dtype
    assert (dtype.name, dtype.itemsize) == (np_dtype.name, np_dtype.itemsize)
    assert np_dtype == dtype and dtype == np_dtype  # NumPy's side too
    assert DType.from_numpy(dtype) == dtype


def test_numpy_and_jax_functions_take_a_dtype():
    import jax.numpy as jnp

    f32, bf16, s8 = DType(K.F32), DType(K.BF16), DType(K.S8)
    assert np.finfo(f32).bits == 32 and np.iinfo(s8).max == 127
    assert ml_dtypes.finfo(bf16).bits == 16
    assert jnp.zeros(2, f32).dtype == np.float32 and jnp.zeros(2, bf16).dtype == ml_dtypes.bfloat16
    assert np.issubdtype(f32, np.floating) and not np.issubdtype(s8, np.floating)


def test_sub_byte_kinds_take_a_byte_per_element_on_the_host():
    """As NumPy holds ml_dtypes' int4: ``itemsize`` is the host's byte, ``bit_size`` the
    device's element."""
    for kind, bits in [(K.S4, 4), (K.U4, 4), (K.S2, 2), (K.U2, 2), (K.F4E2M1FN, 4)]:
        dtype = DType(kind)
        assert (dtype.itemsize, dtype.bit_size, dtype.byte_size) == (1, bits, None)
        assert np.dtype(dtype).itemsize == 1


@pytest.mark.parametrize("kind", [*WITHOUT_NUMPY, K.STRING], ids=lambda k: k.name)
def test_kinds_without_a_numpy_dtype_say_so_where_numpy_asks(kind):
    dtype = DType(kind)
    assert dtype.name == kind.name.lower()
    with pytest.raises(InvalidArgumentError, match=f"DType {kind.name.lower()} has no NumPy dtype"):
        dtype.dtype
    with pytest.raises(InvalidArgumentError, match="has no NumPy dtype"):
        dtype.itemsize
    with pytest.raises((InvalidArgumentError, TypeError)):  # NumPy 1.26 says TypeError
        np.dtype(dtype)
    assert np.dtype(object) != dtype and dtype != np.dtype(object)


def test_string_says_what_its_host_form_is():
    with pytest.raises(InvalidArgumentError, match=r"object array of str or bytes.*np\.dtype\(object\)"):
        DType(K.STRING).dtype
