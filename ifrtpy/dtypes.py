"""Element types: IFRT's DType, and its mapping to NumPy/ml_dtypes and to PJRT.

A :class:`DType` wraps a :class:`DType.Kind`, numbered as ``xla::PrimitiveType`` (and so
as IFRT's ``DType::Kind``). Four tables are kept here and nowhere else:

* kind <-> NumPy dtype (bf16, f8, f4, int2/int4 from ml_dtypes; sub-byte kinds take one
  byte per element on the host, as PJRT expects; STRING is held on the host as an object
  array of ``str``/``bytes``, see :func:`host_form`),
* kind <-> ``PJRT_Buffer_Type`` (the C API's own, different numbering),
* kind -> bit size,
* kind <-> DLPack ``(type code, bits)`` for the kinds ifrtpy exchanges through DLPack.

And :class:`InexactDType`, how a device holds a dtype it cannot hold exactly (what
``Client.inexact_dtypes`` declares), with the TPU's float64 and complex128 as float32
pairs (:func:`as_float32_pair`).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable

import ml_dtypes
import numpy as np

from ifrtpy.errors import InvalidArgumentError, invalid_argument

__all__ = ["DType", "host_form", "is_string_host_dtype", "InexactDType", "as_float32_pair",
           "FLOAT64_AS_FLOAT32_PAIR", "COMPLEX128_AS_FLOAT32_PAIRS"]


class _Kind(enum.IntEnum):
    INVALID = 0
    PRED = 1
    S2 = 26
    S4 = 21
    S8 = 2
    S16 = 3
    S32 = 4
    S64 = 5
    U2 = 27
    U4 = 22
    U8 = 6
    U16 = 7
    U32 = 8
    U64 = 9
    F16 = 10
    F32 = 11
    F64 = 12
    BF16 = 16
    C64 = 15
    C128 = 18
    TOKEN = 17
    OPAQUE = 14
    F8E3M4 = 29
    F8E4M3 = 28
    F8E4M3FN = 20
    F8E4M3B11FNUZ = 23
    F8E4M3FNUZ = 25
    F8E5M2 = 19
    F8E5M2FNUZ = 24
    F8E8M0FNU = 33
    F4E2M1FN = 32
    STRING = 99


K = _Kind

# kind: (bit size or None, numpy dtype or None, PJRT_Buffer_Type or None)
_TABLE: dict[_Kind, tuple[int | None, np.dtype | None, int | None]] = {
    K.INVALID: (None, None, 0),
    K.PRED: (8, np.dtype(np.bool_), 1),
    K.S2: (2, np.dtype(ml_dtypes.int2), 24),
    K.S4: (4, np.dtype(ml_dtypes.int4), 21),
    K.S8: (8, np.dtype(np.int8), 2),
    K.S16: (16, np.dtype(np.int16), 3),
    K.S32: (32, np.dtype(np.int32), 4),
    K.S64: (64, np.dtype(np.int64), 5),
    K.U2: (2, np.dtype(ml_dtypes.uint2), 25),
    K.U4: (4, np.dtype(ml_dtypes.uint4), 22),
    K.U8: (8, np.dtype(np.uint8), 6),
    K.U16: (16, np.dtype(np.uint16), 7),
    K.U32: (32, np.dtype(np.uint32), 8),
    K.U64: (64, np.dtype(np.uint64), 9),
    K.F16: (16, np.dtype(np.float16), 10),
    K.F32: (32, np.dtype(np.float32), 11),
    K.F64: (64, np.dtype(np.float64), 12),
    K.BF16: (16, np.dtype(ml_dtypes.bfloat16), 13),
    K.C64: (64, np.dtype(np.complex64), 14),
    K.C128: (128, np.dtype(np.complex128), 15),
    K.TOKEN: (None, None, 23),
    K.OPAQUE: (None, None, None),
    K.F8E3M4: (8, np.dtype(ml_dtypes.float8_e3m4), 27),
    K.F8E4M3: (8, np.dtype(ml_dtypes.float8_e4m3), 26),
    K.F8E4M3FN: (8, np.dtype(ml_dtypes.float8_e4m3fn), 17),
    K.F8E4M3B11FNUZ: (8, np.dtype(ml_dtypes.float8_e4m3b11fnuz), 18),
    K.F8E4M3FNUZ: (8, np.dtype(ml_dtypes.float8_e4m3fnuz), 20),
    K.F8E5M2: (8, np.dtype(ml_dtypes.float8_e5m2), 16),
    K.F8E5M2FNUZ: (8, np.dtype(ml_dtypes.float8_e5m2fnuz), 19),
    K.F8E8M0FNU: (8, np.dtype(ml_dtypes.float8_e8m0fnu), 28),
    K.F4E2M1FN: (4, np.dtype(ml_dtypes.float4_e2m1fn), 29),
    K.STRING: (None, np.dtype(object), None),
}

# STRING is left out: an object array may hold anything, so its kind is decided by
# host_form, which checks the elements.
_KIND_OF_NUMPY = {np_dtype: kind for kind, (_, np_dtype, _) in _TABLE.items()
                  if np_dtype is not None and kind != K.STRING}
_KIND_OF_PJRT = {pjrt: kind for kind, (_, _, pjrt) in _TABLE.items() if pjrt is not None}

#: PJRT_Buffer_Type of each NumPy dtype an array can hold; used by the Cython layer.
PJRT_BUFFER_TYPE_OF_NUMPY: dict[np.dtype, int] = {
    np_dtype: _TABLE[kind][2] for np_dtype, kind in _KIND_OF_NUMPY.items()
}
#: NumPy dtype of each PJRT_Buffer_Type that has a host representation.
NUMPY_OF_PJRT_BUFFER_TYPE: dict[int, np.dtype] = {
    pjrt: np_dtype for np_dtype, pjrt in PJRT_BUFFER_TYPE_OF_NUMPY.items()
}

# kind -> DLPack (DLDataTypeCode, bits), from the DLPack specification. Sub-byte kinds are
# left out: the plugin packs them in its own way.
_DLPACK: dict[_Kind, tuple[int, int]] = {
    K.PRED: (6, 8),
    K.S8: (0, 8), K.S16: (0, 16), K.S32: (0, 32), K.S64: (0, 64),
    K.U8: (1, 8), K.U16: (1, 16), K.U32: (1, 32), K.U64: (1, 64),
    K.F16: (2, 16), K.F32: (2, 32), K.F64: (2, 64),
    K.BF16: (4, 16),
    K.C64: (5, 64), K.C128: (5, 128),
    K.F8E3M4: (7, 8), K.F8E4M3: (8, 8), K.F8E4M3B11FNUZ: (9, 8), K.F8E4M3FN: (10, 8),
    K.F8E4M3FNUZ: (11, 8), K.F8E5M2: (12, 8), K.F8E5M2FNUZ: (13, 8), K.F8E8M0FNU: (14, 8),
}

#: DLPack (type code, bits) of each PJRT_Buffer_Type exchanged through DLPack; used by
#: the Cython layer.
DLPACK_OF_PJRT_BUFFER_TYPE: dict[int, tuple[int, int]] = {
    pjrt: code_bits for kind, code_bits in _DLPACK.items() if (pjrt := _TABLE[kind][2]) is not None
}


class DType:
    """An element type, IFRT's ``DType``: immutable, hashable, picklable.

    ``DType(DType.Kind.F32)`` or ``DType.from_numpy(np.float32)``. It goes wherever NumPy
    takes a dtype (``np.dtype(d)``, ``np.zeros(2, d)``, ``x.astype(d)``: NumPy reads its
    :attr:`dtype`), has NumPy's :attr:`name` and :attr:`itemsize`, and equals the NumPy
    dtype of its kind. ``kind`` and ``str()`` stay IFRT's (``DType.Kind.F32``, ``f32``).
    """

    Kind = _Kind
    __slots__ = ("_kind",)

    def __init__(self, kind: _Kind | int):
        try:
            self._kind = _Kind(kind)
        except ValueError:
            raise InvalidArgumentError(f"unknown DType kind {kind!r}") from None

    @property
    def kind(self) -> _Kind:
        return self._kind

    @classmethod
    def from_numpy(cls, dtype) -> DType:
        """The DType of a NumPy dtype (or anything ``np.dtype`` accepts).

        Raises InvalidArgumentError for dtypes with no XLA kind (object, str, datetime,
        structured, ...). Object, ``StringDType`` and fixed-width ``str``/``bytes`` arrays
        of strings are STRING data, recognised by :func:`host_form` (which checks their
        elements), not here.
        """
        try:
            np_dtype = np.dtype(dtype)
        except (TypeError, ValueError):
            raise invalid_argument("dtype", "a NumPy dtype or a name NumPy knows", dtype) from None
        kind = _KIND_OF_NUMPY.get(np_dtype)
        if kind is None:
            hint = (" (object, StringDType and fixed-width str/bytes arrays are DType STRING data: "
                    "pass the array itself, or name DType(DType.Kind.STRING))"
                    if np_dtype.kind in _STRING_HOST_KINDS else "")
            raise InvalidArgumentError(
                f"NumPy dtype {np_dtype!s} (kind {np_dtype.kind!r}) has no XLA element type{hint}; "
                f"supported: {', '.join(sorted(str(d) for d in _KIND_OF_NUMPY))}"
            )
        return cls(kind)

    @classmethod
    def from_pjrt_buffer_type(cls, buffer_type: int) -> DType:
        """The DType of a ``PJRT_Buffer_Type`` value."""
        kind = _KIND_OF_PJRT.get(int(buffer_type))
        if kind is None:
            raise InvalidArgumentError(f"unknown PJRT_Buffer_Type {buffer_type}")
        return cls(kind)

    def to_numpy(self) -> np.dtype:
        """The NumPy dtype holding this kind on the host (one byte per sub-byte element;
        ``object`` for STRING, whose elements are ``str`` or ``bytes``).

        Raises InvalidArgumentError for kinds with no host form (token, opaque, invalid).
        """
        np_dtype = _TABLE[self._kind][1]
        if np_dtype is None:
            raise InvalidArgumentError(f"DType {self} has no NumPy equivalent")
        return np_dtype

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype of this kind, through which NumPy takes a DType as a dtype.
        InvalidArgumentError for the kinds that have none: token, opaque, invalid, and
        string, whose host form is an object array of ``str``/``bytes``."""
        np_dtype = _TABLE[self._kind][1]
        if np_dtype is None or self._kind == K.STRING:
            why = (": its host form is an object array of str or bytes, np.dtype(object)"
                   if self._kind == K.STRING else "")
            raise InvalidArgumentError(f"DType {self} has no NumPy dtype{why}")
        return np_dtype

    @property
    def name(self) -> str:
        """NumPy's name of the dtype (``float32``, ``bfloat16``, ``int4``); the kind in
        lower case for kinds without a NumPy dtype (``token``, ``string``)."""
        np_dtype = _TABLE[self._kind][1]
        if np_dtype is None or self._kind == K.STRING:
            return self._kind.name.lower()
        return np_dtype.name

    @property
    def itemsize(self) -> int:
        """Bytes per element on the host, as NumPy's ``itemsize`` (a sub-byte kind takes
        one byte there; :attr:`bit_size` is its size on the device). InvalidArgumentError
        for kinds without a NumPy dtype (see :attr:`dtype`)."""
        return self.dtype.itemsize

    @property
    def pjrt_buffer_type(self) -> int:
        """The ``PJRT_Buffer_Type`` value; InvalidArgumentError where PJRT has none."""
        pjrt = _TABLE[self._kind][2]
        if pjrt is None:
            raise InvalidArgumentError(f"DType {self} has no PJRT buffer type")
        return pjrt

    @property
    def bit_size(self) -> int | None:
        """Bits per element; None for token, opaque, string and invalid."""
        return _TABLE[self._kind][0]

    @property
    def byte_size(self) -> int | None:
        """Bytes per element; None for sub-byte kinds and kinds without a fixed size."""
        bits = _TABLE[self._kind][0]
        return None if bits is None or bits % 8 else bits // 8

    def __eq__(self, other: object) -> bool:
        """Equal to a DType of the same kind, and (as ``jax.Array.dtype`` is) to the NumPy
        dtype of that kind in any spelling NumPy takes: ``np.float32``, ``"float32"``,
        ``np.dtype("f4")``, ml_dtypes' types."""
        if isinstance(other, DType):
            return other._kind == self._kind
        if other is None or isinstance(other, (bool, int, float)):
            return NotImplemented  # np.dtype(None) is float64: not a spelling of a dtype
        try:
            return _KIND_OF_NUMPY.get(np.dtype(other)) == self._kind  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return NotImplemented

    def __hash__(self) -> int:
        # That of its NumPy dtype, which compares equal; kinds without one hash by kind.
        np_dtype = _TABLE[self._kind][1]
        if np_dtype is None or self._kind == K.STRING:
            return hash(("DType", int(self._kind)))
        return hash(np_dtype)

    def __reduce__(self):
        return (DType, (int(self._kind),))

    def __repr__(self) -> str:
        return f"DType(DType.Kind.{self._kind.name})"

    def __str__(self) -> str:
        return self._kind.name.lower()


#: NumPy dtype kinds that may hold STRING data: object ("O"), NumPy 2's StringDType ("T"),
#: and fixed-width unicode ("U") and bytes ("S").
_STRING_HOST_KINDS = "OTUS"
_STRING = DType(K.STRING)


def is_string_host_dtype(np_dtype: np.dtype) -> bool:
    """Whether arrays of ``np_dtype`` may hold STRING data (object, StringDType, or
    fixed-width unicode or bytes)."""
    return np_dtype.kind in _STRING_HOST_KINDS


def host_form(data: np.ndarray) -> tuple[np.ndarray, DType]:
    """``data`` as an array holds it on the host, and its DType.

    Numeric data is returned as it is, with ``DType.from_numpy(data.dtype)``. An object
    array whose elements are all ``str`` or ``bytes`` is STRING data and is returned as
    it is; a ``StringDType`` or fixed-width unicode array becomes an object array of
    ``str``, a fixed-width bytes array one of ``bytes`` (STRING's host form, what
    ``copy_to_host_buffer`` returns; NumPy's fixed-width elements have their trailing NULs
    stripped). InvalidArgumentError for any other dtype
    without an XLA kind, and for an object array holding anything but ``str``/``bytes``
    (naming the first such element).
    """
    if not is_string_host_dtype(data.dtype):
        return data, DType.from_numpy(data.dtype)
    if data.dtype.kind != "O":
        return data.astype(object), _STRING  # every element a str (or bytes, for "S")
    for index, element in zip(np.ndindex(data.shape), data.flat):
        if not isinstance(element, (str, bytes)):
            raise InvalidArgumentError(
                f"a STRING array holds str or bytes elements; element {list(index)} of the "
                f"{data.dtype} array is {type(element).__name__}: {element!r}")
    return data, _STRING


# -- dtypes a device cannot hold exactly -------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class InexactDType:
    """How a device holds a dtype whose values it does not keep exactly (what
    ``Client.inexact_dtypes`` declares): ``model`` maps a host array of ``dtype`` to the
    values the device gives back for it, elementwise; ``summary`` says it in one line.

    The model's NaNs are NaNs whose payloads are not promised: compare NaN-aware. Immutable,
    hashable, picklable (where ``model`` is a module-level function).
    """

    dtype: DType
    summary: str
    model: Callable[[np.ndarray], np.ndarray]

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            object.__setattr__(self, "dtype", DType.from_numpy(self.dtype))
        if not callable(self.model):
            raise invalid_argument("model", "a function of a host array", self.model)

    def held_values(self, x: np.ndarray) -> np.ndarray:
        """The values a device gives back for host array ``x`` of :attr:`dtype` (a new
        array of that dtype and shape); InvalidArgumentError for another dtype."""
        x = np.asarray(x)
        if x.dtype != self.dtype:
            raise InvalidArgumentError(f"the model of {self.dtype} ({self.model.__name__}) takes "
                                       f"{self.dtype.to_numpy()} arrays, got a {x.dtype} array")
        out = np.asarray(self.model(x))
        if out.dtype != x.dtype or out.shape != x.shape:
            raise InvalidArgumentError(
                f"{self.model.__name__} gave a {out.dtype}{list(out.shape)} array for a "
                f"{x.dtype}{list(x.shape)} one")
        return out

    def __repr__(self) -> str:
        model = f"{getattr(self.model, '__module__', '?')}.{getattr(self.model, '__qualname__', '?')}"
        return f"InexactDType({self.dtype!r}, {self.summary!r}, {model})"


def _float64_as_float32_pair(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        hi = x.astype(np.float32)  # to nearest: beyond float32's range inf, below it 0
        lo = (x - hi.astype(np.float64)).astype(np.float32)
    lo = np.where(np.isfinite(hi), lo, np.float32(0))
    return hi.astype(np.float64) + lo.astype(np.float64)  # -0.0 + 0.0: -0.0 becomes 0.0


def as_float32_pair(x: np.ndarray) -> np.ndarray:
    """The values of float64 array ``x`` held as a pair of float32 (complex128: each part
    apart), as a TPU holds them, measured bit for bit on a v5e (libtpu, through PjRt and
    through jax)::

        hi = float32(x)                  # to nearest; beyond float32's range +-inf,
                                         # below it +-0 or a float32 subnormal
        lo = float32(x - float64(hi))    # taken as 0 where hi is not finite
        result = float64(hi) + float64(lo)

    So -0.0 becomes 0.0 (-0.0 + 0.0), as on the chip, while a negative value that
    underflows becomes -0.0; NaN stays NaN (payload not promised). A new array of ``x``'s
    dtype and shape; InvalidArgumentError for other dtypes.
    """
    x = np.asarray(x)
    if x.dtype == np.complex128:
        out = np.empty(x.shape, np.complex128)
        out.real = _float64_as_float32_pair(x.real)
        out.imag = _float64_as_float32_pair(x.imag)
        return out
    if x.dtype != np.float64:
        raise InvalidArgumentError(f"as_float32_pair takes float64 or complex128 arrays, got {x.dtype}")
    return _float64_as_float32_pair(x)


#: float64 on a TPU.
FLOAT64_AS_FLOAT32_PAIR = InexactDType(
    DType(K.F64),
    "float64 held as a pair of float32: about 48 bits of mantissa for 2e-31 < |x| < 3.4e38, "
    "fewer below; |x| > 3.4e38 becomes inf, |x| < 1.4e-45 becomes 0 or 1.4e-45, -0.0 becomes 0.0",
    as_float32_pair)

#: complex128 on a TPU.
COMPLEX128_AS_FLOAT32_PAIRS = InexactDType(
    DType(K.C128),
    "complex128 held as two float64 parts, each a pair of float32 (see float64)",
    as_float32_pair)
