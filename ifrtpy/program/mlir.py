"""jaxlib's MLIR, as ifrtpy uses it: one context with every dialect a program may use
(shared by the program readers, the builder and the reference backend's interpreter), the
element types of StableHLO by name, and the StableHLO version jaxlib writes."""

from __future__ import annotations

import functools
from typing import Any

from ifrtpy._jaxlib import register_jax_dialects
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError

__all__ = ["ELEMENT_TYPES", "context", "parse", "stablehlo_version"]

K = DType.Kind
#: StableHLO's element type names and the DType kind of each.
ELEMENT_TYPES = {
    "i1": K.PRED, "i2": K.S2, "i4": K.S4, "i8": K.S8, "i16": K.S16, "i32": K.S32, "i64": K.S64,
    "ui2": K.U2, "ui4": K.U4, "ui8": K.U8, "ui16": K.U16, "ui32": K.U32, "ui64": K.U64,
    "f16": K.F16, "f32": K.F32, "f64": K.F64, "bf16": K.BF16,
    "complex<f32>": K.C64, "complex<f64>": K.C128,
    "f8E3M4": K.F8E3M4, "f8E4M3": K.F8E4M3, "f8E4M3FN": K.F8E4M3FN,
    "f8E4M3B11FNUZ": K.F8E4M3B11FNUZ, "f8E4M3FNUZ": K.F8E4M3FNUZ, "f8E5M2": K.F8E5M2,
    "f8E5M2FNUZ": K.F8E5M2FNUZ, "f8E8M0FNU": K.F8E8M0FNU, "f4E2M1FN": K.F4E2M1FN,
}


def stablehlo_version() -> tuple[int, ...]:
    """The StableHLO version jaxlib writes (the producer's version)."""
    from jaxlib.mlir.dialects import stablehlo

    return tuple(int(p) for p in stablehlo.get_current_version().split("."))


@functools.lru_cache(maxsize=None)
def context() -> Any:
    """The MLIR context (one per process) with the dialects of StableHLO programs."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import chlo, mhlo, sdy, stablehlo

    ctx = ir.Context()
    registry = ir.DialectRegistry()
    register_jax_dialects(registry)  # func and the other upstream dialects
    ctx.append_dialect_registry(registry)
    ctx.load_all_available_dialects()
    stablehlo.register_dialect(ctx)
    chlo.register_dialect(ctx)
    sdy.register_dialect(ctx)
    mhlo.register_mhlo_dialect(ctx)
    return ctx


def parse(text: str) -> Any:
    """The module of StableHLO ``text`` (the MLIR text parser fails cleanly on anything)."""
    from jaxlib.mlir import ir

    with context():
        try:
            return ir.Module.parse(text)
        except Exception as e:  # noqa: BLE001 - MLIR raises its own error types
            raise InvalidArgumentError(f"not a StableHLO module: {e}") from None


