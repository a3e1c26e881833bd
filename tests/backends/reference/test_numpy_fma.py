"""``stablehlo.fma`` in the reference backend's NumPy evaluator: ``a * b + c`` rounded
once, in every float type, against exact rational arithmetic (``tests/helpers/exact_float.py``),
and (on a jaxlib whose StableHLO has the op) a program of it against jaxlib's interpreter."""

import numpy as np
import pytest

from ifrtpy.backends.reference import numpy_eval
import exact_float


@pytest.mark.parametrize("dtype", sorted(exact_float.FORMATS, key=str), ids=str)
def test_fma_rounds_once_as_exact_arithmetic_does(dtype):
    a, b, c = exact_float.hard_cases(dtype, 3000, seed=7)
    out = numpy_eval._fma(a, b, c)
    assert out.dtype == dtype
    wrong = [(x, y, z, o) for x, y, z, o in zip(a, b, c, out)
             if not exact_float.same(o, exact_float.fma(x, y, z, dtype))]
    assert not wrong, f"{len(wrong)} of {len(out)} wrong, e.g. (a, b, c, ours) {wrong[:3]}"


def test_a_sum_rounded_twice_would_miss_the_tie_that_fma_breaks():
    """(1 + 2^-12)^2 + 2^-100 in f32: just above a tie; f64 rounding first makes it the
    tie itself, which then goes to even (down): the single rounding goes up."""
    a = np.array([1 + 2.0 ** -12], np.float32)
    c = np.array([2.0 ** -100], np.float32)
    twice = np.float32(a.astype(np.float64) ** 2 + c.astype(np.float64))
    once = numpy_eval._fma(a, a, c)
    assert once[0] == np.float32(1 + 2.0 ** -11 + 2.0 ** -23) != twice[0]


def test_a_program_of_fma_runs_as_the_interpreter_runs_it():
    from ifrtpy import _jaxlib
    from ifrtpy.backends.reference import worker
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    context = worker._context(_jaxlib.register_jax_dialects_location())
    text = """func.func public @main(%a: tensor<64xf32>, %b: tensor<64xf32>, %c: tensor<64xf32>) -> tensor<64xf32> {
  %0 = stablehlo.fma %a, %b, %c : tensor<64xf32>
  return %0 : tensor<64xf32>
}"""
    with context, ir.Location.unknown():
        try:
            module = ir.Module.parse(text)
        except Exception as e:  # noqa: BLE001 - MLIRError
            if "unknown" not in str(e):
                raise
            pytest.skip(f"jaxlib's StableHLO {stablehlo.get_current_version()} has no fma")
        args = exact_float.hard_cases(np.float32, 64, seed=3)
        ours, = numpy_eval.Program(module, checked=True)(list(args))
        values = [ir.Attribute.parse(f'dense<"0x{a.tobytes().hex()}"> : tensor<64xf32>')
                  for a in args]
        theirs = worker._numpy(stablehlo.eval_module(ir.Module.parse(text), values)[0], (64,))
    want = [exact_float.fma(*row, np.float32) for row in zip(*args)]
    assert all(exact_float.same(o, w) for o, w in zip(ours, want))
    assert all(exact_float.same(o, t) for o, t in zip(ours, theirs))
