"""The ops jaxlib's StableHLO interpreter does not run, in NumPy: what the reference
backend computes between the interpreter's stages (:mod:`.stages`).

* ``stablehlo.fft`` (FFT, IFFT, RFFT, IRFFT over the trailing ``fft_length``
  dimensions, as XLA defines them; results in the op's type: c64 stays c64) with
  ``numpy.fft``;
* ``stablehlo.rng`` (XLA's stateful RngUniform and RngNormal): uniform in [a, b) for
  floats and integers (b <= a gives a), normal with mean a and deviation b, drawn from
  the executable's own NumPy generator, so every run gives new values;
* ``stablehlo.cholesky`` (the other triangle zero; NaN where a matrix is not positive
  definite) and ``stablehlo.triangular_solve``, with the LAPACK routines of :mod:`.lapack`
  (f16 and bf16 computed in f32);
* jaxlib's LAPACK custom calls, :mod:`.lapack`.

A kernel is made at compile time from its op (attributes read, anything it cannot run
refused with UnimplementedError) and holds no MLIR object: it maps the operands' values to
the results' values.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from ifrtpy.backends.reference import lapack
from ifrtpy.backends.reference.interpreter import element_name
from ifrtpy.dtypes import DType
from ifrtpy.errors import UnimplementedError
from ifrtpy.program import mlir

__all__ = ["Kernel", "Generator", "is_kernel_op", "kernel", "tensor_spec"]

Kernel = Callable[[list[np.ndarray]], list[np.ndarray]]

#: The StableHLO ops computed here.
_OPS = frozenset({"stablehlo.fft", "stablehlo.rng", "stablehlo.cholesky",
                  "stablehlo.triangular_solve"})
#: The LAPACK type letter of each dtype LAPACK computes in.
_LETTER = {np.dtype(np.float32): "s", np.dtype(np.float64): "d",
           np.dtype(np.complex64): "c", np.dtype(np.complex128): "z"}


class Generator:
    """An executable's random state (XLA's RngUniform and RngNormal keep one): a NumPy
    generator seeded from the operating system, drawn from by one thread at a time."""

    def __init__(self) -> None:
        self._generator = np.random.default_rng()
        self._lock = threading.Lock()

    def draw(self, how: Callable[[np.random.Generator], np.ndarray]) -> np.ndarray:
        with self._lock:
            return how(self._generator)


def is_kernel_op(op) -> bool:
    """Whether ``op`` is computed here rather than by the interpreter."""
    name = op.operation.name
    if name in _OPS:
        return True
    if name == "stablehlo.custom_call":
        from jaxlib.mlir import ir
        return lapack.is_target(ir.StringAttr(op.attributes["call_target_name"]).value)
    return False


def tensor_spec(type_) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and NumPy dtype of a ranked tensor type."""
    from jaxlib.mlir import ir
    return (tuple(ir.RankedTensorType(type_).shape),
            DType(mlir.ELEMENT_TYPES[element_name(type_)]).to_numpy())


def kernel(op, generator: Generator) -> Kernel:
    """The kernel of ``op`` (one for which :func:`is_kernel_op` holds)."""
    name = op.operation.name
    results = [tensor_spec(r.type) for r in op.results]
    if name == "stablehlo.custom_call":
        return _custom_call(op, results)
    if name == "stablehlo.fft":
        return _fft(op, results[0])
    if name == "stablehlo.rng":
        return _rng(op, results[0], generator)
    if name == "stablehlo.cholesky":
        return _cholesky(op, results[0])
    return _triangular_solve(op, results[0])


def _custom_call(op, results) -> Kernel:
    """A LAPACK custom call: its attributes as :mod:`.lapack` takes them (character
    enums as letters)."""
    from jaxlib.mlir import ir
    target = ir.StringAttr(op.attributes["call_target_name"]).value
    attrs: dict[str, Any] = {}
    for key in ("backend_config", "mhlo.backend_config"):
        if key in op.attributes and isinstance(op.attributes[key], ir.DictAttr):
            config = ir.DictAttr(op.attributes[key])
            for i in range(len(config)):
                named = config[i]
                attrs[named.name] = _attr_value(named.attr)
    operands = [tensor_spec(v.type) for v in op.operands]
    batch_rank = len(operands[0][0]) - (1 if "gtsv" in target or "tridiagonal" in target else 2)
    if "mhlo.frontend_attributes" in op.attributes:
        frontend = ir.DictAttr(op.attributes["mhlo.frontend_attributes"])
        if "num_batch_dims" in frontend:
            batch_rank = int(ir.StringAttr(frontend["num_batch_dims"]).value)
    return lapack.kernel(target, attrs, operands, results, batch_rank)


def _attr_value(attr) -> Any:
    """A backend_config value: a bool, a letter (an unsigned 8-bit enum) or an int."""
    from jaxlib.mlir import ir
    if isinstance(attr, ir.BoolAttr):
        return attr.value
    if isinstance(attr, ir.IntegerAttr):
        integer = ir.IntegerType(attr.type)
        value = ir.IntegerAttr(attr).value
        return chr(value) if integer.width == 8 and integer.is_unsigned else value
    return str(attr)


def _fft(op, result) -> Kernel:
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo
    kind = stablehlo.FftTypeAttr(op.attributes["fft_type"]).value
    lengths = tuple(ir.DenseI64ArrayAttr(op.attributes["fft_length"]))
    shape, dtype = result
    axes = tuple(range(-len(lengths), 0))
    transform = {"FFT": lambda x: np.fft.fftn(x, axes=axes),
                 "IFFT": lambda x: np.fft.ifftn(x, axes=axes),
                 "RFFT": lambda x: np.fft.rfftn(x, s=lengths, axes=axes),
                 "IRFFT": lambda x: np.fft.irfftn(x, s=lengths, axes=axes)}[kind]

    def run(values):
        if 0 in shape or 0 in lengths:
            return [np.zeros(shape, dtype)]
        return [transform(values[0]).astype(dtype, copy=False)]
    return run


def _rng(op, result, generator: Generator) -> Kernel:
    from jaxlib.mlir.dialects import stablehlo
    distribution = stablehlo.RngDistributionAttr(op.attributes["rng_distribution"]).value
    shape, dtype = result
    integer = np.issubdtype(dtype, np.integer)
    if distribution == "NORMAL" and integer:
        raise UnimplementedError(f"stablehlo.rng: NORMAL draws floats, not {dtype}")

    def run(values):
        a, b = values[0].item(), values[1].item()
        if distribution == "NORMAL":
            drawn = generator.draw(lambda g: g.standard_normal(shape))
            return [(a + b * drawn).astype(dtype)]
        if integer:
            if b <= a:
                return [np.full(shape, a, dtype)]
            return [generator.draw(lambda g: g.integers(a, b, shape, dtype=dtype))]
        drawn = generator.draw(lambda g: g.random(shape))
        value = (a + (float(b) - a) * drawn).astype(dtype)
        if a < b:  # rounding can reach b: the largest value below it instead
            below = np.nextafter(np.asarray(b, dtype), np.asarray(a, dtype))
            value = np.where(value >= np.asarray(b, dtype), below, value)
        return [value]
    return run


def _lapack_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype LAPACK computes ``dtype`` in (f16 and bf16 in f32)."""
    return dtype if dtype in _LETTER else np.dtype(np.float32)


def _cholesky(op, result) -> Kernel:
    from jaxlib.mlir import ir
    lower = "lower" in op.attributes and ir.BoolAttr(op.attributes["lower"]).value
    shape, dtype = result
    work = _lapack_dtype(dtype)
    batch = shape[:-2]
    potrf = lapack.kernel(f"lapack_{_LETTER[work]}potrf_ffi", {"uplo": "L" if lower else "U"},
                          [(shape, work)], [(shape, work), (batch, np.dtype(np.int32))],
                          len(batch))

    def run(values):
        factor, info = potrf([values[0].astype(work)])
        factor = np.tril(factor) if lower else np.triu(factor)
        factor[info != 0] = np.nan
        return [factor.astype(dtype)]
    return run


def _triangular_solve(op, result) -> Kernel:
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo
    attrs = {name: ir.BoolAttr(op.attributes[name]).value
             for name in ("left_side", "lower", "unit_diagonal")}
    transpose = stablehlo.TransposeAttr(op.attributes["transpose_a"]).value
    shape, dtype = result
    work = _lapack_dtype(dtype)
    a_shape = tensor_spec(op.operands[0].type)[0]
    trsm = lapack.kernel(
        f"lapack_{_LETTER[work]}trsm_ffi",
        {"side": "L" if attrs["left_side"] else "R", "uplo": "L" if attrs["lower"] else "U",
         "diag": "U" if attrs["unit_diagonal"] else "N",
         "trans_x": {"NO_TRANSPOSE": "N", "TRANSPOSE": "T", "ADJOINT": "C"}[transpose]},
        [(a_shape, work), (shape, work)], [(shape, work)], len(shape) - 2)

    def run(values):
        return [trsm([v.astype(work) for v in values])[0].astype(dtype)]
    return run

