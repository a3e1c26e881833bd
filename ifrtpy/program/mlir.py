"""jaxlib's MLIR, as ifrtpy uses it: one context with every dialect a program may use
(shared by the program readers, the builder and the reference backend's interpreter), the
element types of StableHLO by name, the StableHLO version jaxlib writes, CHLO's expansion
into StableHLO, and portable artifacts (and text) for an older StableHLO."""

from __future__ import annotations

import functools
from typing import Any

from ifrtpy._jaxlib import register_jax_dialects
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError

__all__ = ["ELEMENT_TYPES", "context", "parse", "stablehlo_version", "legalize_chlo",
           "portable_artifact", "text_for_version", "ops_inside", "functions"]

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


def ops_inside(op: Any) -> list:
    """Every op inside ``op``'s regions, at any depth, in program order (each op before
    the ops inside it)."""
    found: list = []

    def visit(outer: Any) -> None:
        for region in outer.regions:
            for block in region.blocks:
                for inner in block.operations:
                    found.append(inner)
                    visit(inner.operation)
    visit(op)
    return found


def functions(module: Any) -> dict:
    """The ``func.func`` ops of ``module`` by symbol name."""
    from jaxlib.mlir import ir

    return {ir.StringAttr(op.attributes["sym_name"]).value: op
            for op in module.body.operations if op.operation.name == "func.func"}


def parse(text: str) -> Any:
    """The module of StableHLO ``text`` (the MLIR text parser fails cleanly on anything)."""
    from jaxlib.mlir import ir

    with context():
        try:
            return ir.Module.parse(text)
        except Exception as e:  # noqa: BLE001 - MLIR raises its own error types
            raise InvalidArgumentError(f"not a StableHLO module: {e}") from None


def legalize_chlo(text: str) -> str:
    """StableHLO ``text`` with its CHLO ops expanded into StableHLO (as XLA does when it
    compiles), keeping their locations: a plain StableHLO module, which serializes as a
    portable artifact and which the reference interpreter runs."""
    from jaxlib.mlir import ir

    with context():
        module = ir.Module.parse(text)
        _expand_chlo(module)
        return module.operation.get_asm(enable_debug_info=True)


#: The dialects a portable artifact may carry besides StableHLO's (as plain MLIR bytecode).
_BESIDE_STABLEHLO = ("sdy",)


def portable_artifact(text: str, version: str) -> bytes | None:
    """The portable artifact of StableHLO ``text`` for StableHLO ``version`` (CHLO ops
    expanded first, and ``fma`` where the version predates it; Shardy's ops and
    attributes as plain MLIR bytecode beside the versioned StableHLO), or None where the
    module cannot be one (it needs a newer version, or holds ops of another dialect).
    Quiet: MLIR's diagnostics of a failure are dropped."""
    from jaxlib.mlir.dialects import stablehlo

    ctx = context()
    with ctx:
        handler = ctx.attach_diagnostic_handler(lambda diagnostic: True)
        try:
            module = _for_version(text, version)
            dialects = {op.operation.name.partition(".")[0] for op in ops_inside(module.operation)}
            if dialects - {"stablehlo", "func", *_BESIDE_STABLEHLO}:
                return None
            return stablehlo.serialize_portable_artifact(module, version, True)
        except Exception:  # noqa: BLE001 - MLIRError, ValueError, ...: the text goes instead
            return None
        finally:
            handler.detach()


def text_for_version(text: str, version: str) -> str:
    """StableHLO ``text`` with the ops newer than ``version`` that ifrtpy can rewrite
    (``fma``) rewritten: the text a consumer of that version parses where no portable
    artifact could be made; ``text`` itself where nothing needs rewriting."""
    from ifrtpy.program.fma import FMA_VERSION

    if "stablehlo.fma" not in text or _version_tuple(version) >= FMA_VERSION:
        return text
    with context():
        return _for_version(text, version).operation.get_asm(enable_debug_info=True)


def _for_version(text: str, version: str) -> Any:
    """The module of ``text``, its CHLO ops expanded, and ``fma`` for a version before it."""
    from jaxlib.mlir import ir

    from ifrtpy.program.fma import FMA_VERSION, expand_fma

    module = ir.Module.parse(text)
    if "chlo." in text:
        _expand_chlo(module)
    if "stablehlo.fma" in text and _version_tuple(version) < FMA_VERSION:
        expand_fma([op for op in ops_inside(module.operation)
                    if op.operation.name == "stablehlo.fma"])
    return module


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _expand_chlo(module: Any) -> None:
    """Run CHLO's legalization to StableHLO on ``module``, in place."""
    from jaxlib.mlir import passmanager

    _register_passes()
    passmanager.PassManager.parse("builtin.module(func.func(chlo-legalize-to-stablehlo))").run(
        module.operation)


@functools.lru_cache(maxsize=None)
def _register_passes() -> None:
    from jaxlib.mlir.dialects import stablehlo

    stablehlo.register_stablehlo_passes()
