"""The dtypes each PJRT platform holds inexactly, by memory kind: what a PjRt client
declares in ``Client.inexact_dtypes`` (measured; a platform or memory kind not listed
holds every dtype exactly, as the CPU plugin does).

The TPU (libtpu, PJRT 0.112, measured on a v5e through this backend and through jax
0.10.2 with x64 on, bit-identical) has no float64: in its ``device`` and ``pinned_host``
memories float64 and complex128 come back as float32 pairs
(:func:`ifrtpy.dtypes.as_float32_pair`, bit for bit over random values of the whole
range, ±0, ±inf, NaN, overflow and underflow); in ``unpinned_host`` they come back exactly. Every other dtype
round-trips exactly.

Not a precision matter, and not declared: a put of complex128 host data into
``pinned_host`` comes back with its imaginary part in both parts (libtpu; jax does the
same); a copy of a ``device`` array into ``pinned_host`` keeps both parts.
"""

from __future__ import annotations

import types
from typing import Mapping

from ifrtpy.device import MemoryKind
from ifrtpy.dtypes import COMPLEX128_AS_FLOAT32_PAIRS, FLOAT64_AS_FLOAT32_PAIR, DType, InexactDType

__all__ = ["TPU_FLOAT32_PAIR_KINDS", "INEXACT_DTYPES", "inexact_dtypes"]

_FLOAT32_PAIRS: Mapping[DType, InexactDType] = types.MappingProxyType({
    FLOAT64_AS_FLOAT32_PAIR.dtype: FLOAT64_AS_FLOAT32_PAIR,
    COMPLEX128_AS_FLOAT32_PAIRS.dtype: COMPLEX128_AS_FLOAT32_PAIRS,
})
_EXACT: Mapping[DType, InexactDType] = types.MappingProxyType({})

#: TPU memory kinds measured to hold float64/complex128 as float32 pairs; ``unpinned_host``
#: was measured exact. A kind not listed is declared exact: list one once measured.
TPU_FLOAT32_PAIR_KINDS = ("device", "pinned_host")

#: platform name -> memory kind -> dtype -> how it is held.
INEXACT_DTYPES: Mapping[str, Mapping[str, Mapping[DType, InexactDType]]] = {
    "tpu": {kind: _FLOAT32_PAIRS for kind in TPU_FLOAT32_PAIR_KINDS},
}


def inexact_dtypes(platform_name: str,
                   memory_kind: MemoryKind | str | None = None) -> Mapping[DType, InexactDType]:
    """What a PjRt client of ``platform_name`` declares for ``memory_kind`` (None: the
    default memory, ``"device"`` on every platform listed): empty for a platform or kind
    not in :data:`INEXACT_DTYPES`."""
    kind = MemoryKind(memory_kind).value or "device"
    return INEXACT_DTYPES.get(platform_name, {}).get(kind, _EXACT)
