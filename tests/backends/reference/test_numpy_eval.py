"""The NumPy evaluator of the reference backend's workers (``numpy_eval.py``) against its
oracle, jaxlib's StableHLO interpreter (``stablehlo.eval_module``): random programs of
each op it implements, on random inputs with the awkward values (NaN, infinities, signed
zeros, extremes of each integer type, shifts past the width, zero divisors), prepared as
the backend prepares them and run both ways in this process; results compared bit for bit
(any NaN equals any NaN). Programs of ops it does not implement run in the interpreter,
and a program through the backend gives the same results either way."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy import _jaxlib
from ifrtpy.backends.reference import numpy_eval, rewrite, worker
from ifrtpy.program import HloProgram

_SETTINGS = settings(max_examples=5, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])

ELEMENT = {np.dtype(np.bool_): "i1", np.dtype(np.int8): "i8", np.dtype(np.int16): "i16",
           np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(np.uint8): "ui8",
           np.dtype(np.uint16): "ui16", np.dtype(np.uint32): "ui32",
           np.dtype(np.uint64): "ui64", np.dtype(np.float16): "f16",
           np.dtype(np.float32): "f32", np.dtype(np.float64): "f64",
           np.dtype(ml_dtypes.bfloat16): "bf16"}
BF16 = np.dtype(ml_dtypes.bfloat16)
INTS = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                              np.uint32, np.uint64)]
FLOATS = [np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16)]
ALL = [np.dtype(np.bool_), *INTS, *FLOATS]


@pytest.fixture(scope="module")
def context():
    return worker._context(_jaxlib.register_jax_dialects_location())


def tensor(shape, dtype) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + ELEMENT[np.dtype(dtype)] + ">"


def prepared(text: str) -> str:
    """``text`` as the backend hands it to a worker (guards, widening, the wrapper main)."""
    runner, *_ = rewrite.prepare(HloProgram(text), None)
    return runner.text


def run_both(context, text: str, args, numpy_text: str | None = None):
    """(NumPy's results, the interpreter's) of ``text`` prepared; NumPy runs
    ``numpy_text`` instead where given (a program the interpreter cannot run as is)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    with context, ir.Location.unknown():
        module = ir.Module.parse(prepared(text))
        program = numpy_eval.Program(ir.Module.parse(numpy_text or prepared(text)), checked=True)
        ours = program([np.asarray(a) for a in args])
        values = [ir.Attribute.parse(
            f'dense<"0x{np.ascontiguousarray(a).tobytes().hex()}"> : {tensor(np.shape(a), np.asarray(a).dtype)}')
            for a in args]
        theirs = [worker._numpy(out, o.shape).reshape(o.shape) for out, o in
                  zip(stablehlo.eval_module(module, values), ours)]
    return ours, theirs


#: The evaluator's promise for the ops whose f64 kernel is NumPy's own loop (which may be
#: SIMD code, e.g. AVX-512's, not the C library the interpreter calls): within 4 ulp of
#: the interpreter in f64 (NumPy's loops keep their error under that; measured on AVX-512:
#: cbrt 3, the others 1), so within 1 ulp in f32, f16 and bf16 (computed in f64 and
#: rounded once). Every other op: bit for bit (docs/implementing-a-backend.md).
NUMPY_LOOPS = frozenset({"exponential", "exponential_minus_one", "log", "log_plus_one",
                         "sine", "cosine", "cbrt", "logistic"})


def ulps_allowed(op, dtype) -> int:
    if op not in NUMPY_LOOPS:
        return 0
    return 4 if np.dtype(dtype) == np.float64 else 1


def _ordered(x):
    """Integers in the order of the floats ``x`` (adjacent floats: adjacent integers;
    both zeros: 0)."""
    bits = x.view(f"i{x.dtype.itemsize}").astype(np.int64)
    top = np.int64(1) << (8 * x.dtype.itemsize - 1)
    return np.where(bits < 0, -(bits + top), bits)


def assert_same(ours, theirs, what="", bf16=False, ulps=0):
    """Bit for bit (``ulps``: within that many units in the last place), any NaN equal
    to any NaN; ``bf16``: the int16 results are bf16 ones (the backend's wrapper main
    hands them over bitcast)."""
    for a, b in zip(ours, theirs):
        if bf16 and a.dtype == np.int16:
            a, b = a.view(BF16), b.view(BF16)
        assert a.dtype == b.dtype and a.shape == b.shape, what
        if a.dtype.kind == "f" or a.dtype == BF16:
            nan = np.isnan(a) & np.isnan(b)
            bits = a.view(f"u{a.dtype.itemsize}") == b.view(f"u{b.dtype.itemsize}")
            if ulps:  # same sign (the difference of the integers cannot overflow)
                same_side = (np.signbit(a) == np.signbit(b)) | ((a == 0) & (b == 0))
                distance = np.abs(np.where(same_side, _ordered(a) - _ordered(b), ulps + 1))
                bits |= ((distance <= ulps) & ~np.isnan(a) & ~np.isnan(b)
                         & (np.isinf(a) == np.isinf(b)))
            bad = ~(nan | bits)
            assert not bad.any(), f"{what}: {a[bad][:5]} against the interpreter's {b[bad][:5]}"
        else:
            assert np.array_equal(a, b), f"{what}: {a} against the interpreter's {b}"


def values(dtype, n):
    """A strategy of arrays of ``n`` elements of ``dtype``, awkward values often."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        element = st.booleans()
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        element = st.one_of(st.sampled_from(sorted({0, 1, 2, -1 % (info.max + 1) if dtype.kind == "u" else -1,
                                                     info.min, info.max, info.max - 1,
                                                     dtype.itemsize * 8, dtype.itemsize * 8 - 1})),
                            st.integers(int(info.min), int(info.max)))
    else:
        info = ml_dtypes.finfo(dtype)
        special = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, np.inf, -np.inf, np.nan,
                   float(info.max), float(info.tiny), 1e-3, 3e9]
        width = 32 if dtype == BF16 else dtype.itemsize * 8
        element = st.one_of(st.sampled_from(special),
                            st.floats(width=width, allow_nan=True, allow_infinity=True),
                            st.floats(-30, 30, width=width))
    return st.lists(element, min_size=n, max_size=n).map(
        lambda xs: np.array(xs, dtype))


UNARY_FLOAT = ["negate", "abs", "sign", "floor", "ceil", "round_nearest_even",
               "round_nearest_afz", "sqrt", "rsqrt", "cbrt", "exponential",
               "exponential_minus_one", "log", "log_plus_one", "logistic", "sine", "cosine",
               "tan", "tanh"]
UNARY_INT = ["negate", "abs", "sign", "not", "popcnt", "count_leading_zeros"]


def unary_program(op, dtype, n, out=None):
    t, o = tensor((n,), dtype), tensor((n,), out or dtype)
    return f"""func.func public @main(%x: {t}) -> {o} {{
  %0 = stablehlo.{op} %x : ({t}) -> {o}
  return %0 : {o}
}}"""


UNARY_CASES = [(op, d) for op in UNARY_FLOAT for d in FLOATS] + [
    (op, d) for op in UNARY_INT for d in INTS
    if not (d.kind == "u" and op in ("negate", "abs", "sign"))]  # signed integers only


@pytest.mark.parametrize("op,dtype", UNARY_CASES, ids=lambda v: str(v))
@_SETTINGS
@given(data=st.data())
def test_unary_ops_agree(context, op, dtype, data):
    x = data.draw(values(dtype, 6))
    assert_same(*run_both(context, unary_program(op, dtype, 6), [x]), f"{op} {x}",
                bf16=dtype == BF16, ulps=ulps_allowed(op, dtype))


def test_the_ulp_bound_is_a_bound():
    """assert_same's tolerance: 1 ulp apart passes at 1, fails at 0; inf is not near max."""
    one = np.array([1.0, -2.5, 0.0])
    assert_same([np.nextafter(one, np.inf)], [one], ulps=1)
    with pytest.raises(AssertionError):
        assert_same([np.nextafter(one, np.inf)], [one])
    with pytest.raises(AssertionError):
        assert_same([np.array([np.inf])], [np.array([np.finfo(np.float64).max])], ulps=4)
    assert_same([np.array([-0.0])], [np.array([0.0])], ulps=1)


def binary_program(op, dtype, n, out=None, extra=""):
    t, o = tensor((n,), dtype), tensor((n,), out or dtype)
    return f"""func.func public @main(%x: {t}, %y: {t}) -> {o} {{
  %0 = stablehlo.{op} %x, %y {extra}: ({t}, {t}) -> {o}
  return %0 : {o}
}}"""


BINARY_INT = ["add", "subtract", "multiply", "maximum", "minimum", "and", "or", "xor",
              "shift_left", "shift_right_logical", "shift_right_arithmetic", "divide",
              "remainder"]
BINARY_FLOAT = ["add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum",
                "power", "atan2"]


BINARY_CASES = [(op, d) for op in BINARY_FLOAT for d in FLOATS] + [
    (op, d) for op in BINARY_INT for d in INTS]


@pytest.mark.parametrize("op,dtype", BINARY_CASES, ids=lambda v: str(v))
@_SETTINGS
@given(data=st.data())
def test_binary_ops_agree(context, op, dtype, data):
    x, y = data.draw(values(dtype, 6)), data.draw(values(dtype, 6))
    text = binary_program(op, dtype, 6)
    # the interpreter runs integer division guarded (as the backend does); NumPy unguarded too
    unguarded = text if op in ("divide", "remainder") and dtype.kind in "iu" else None
    assert_same(*run_both(context, text, [x, y], numpy_text=unguarded), f"{op} {x} {y}",
                bf16=dtype == BF16)


@pytest.mark.parametrize("op", ["add", "multiply", "maximum", "minimum", "and", "or", "xor"])
@_SETTINGS
@given(data=st.data())
def test_boolean_ops_agree(context, op, data):
    x, y = data.draw(values(np.bool_, 6)), data.draw(values(np.bool_, 6))
    assert_same(*run_both(context, binary_program(op, np.bool_, 6), [x, y]), op)


@pytest.mark.parametrize("dtype", ALL, ids=str)
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_compare_and_select_agree(context, dtype, data):
    direction = data.draw(st.sampled_from(["EQ", "NE", "LT", "LE", "GT", "GE"]))
    x, y = data.draw(values(dtype, 6)), data.draw(values(dtype, 6))
    t, b = tensor((6,), dtype), tensor((6,), np.bool_)
    text = f"""func.func public @main(%x: {t}, %y: {t}) -> ({b}, {t}, {t}) {{
  %p = stablehlo.compare {direction}, %x, %y : ({t}, {t}) -> {b}
  %s = stablehlo.select %p, %x, %y : {b}, {t}
  %c = stablehlo.clamp %y, %x, %s : {t}
  return %p, %s, %c : {b}, {t}, {t}
}}"""
    if dtype == np.bool_:
        text = text.replace("  %c = stablehlo.clamp %y, %x, %s : {t}\n".format(t=t), "") \
            .replace("%p, %s, %c", "%p, %s, %s")
    assert_same(*run_both(context, text, [x, y]), f"{direction} {x} {y}", bf16=dtype == BF16)


@pytest.mark.parametrize("source", ALL, ids=str)
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_convert_agrees(context, source, data):
    target = data.draw(st.sampled_from(ALL))
    x = data.draw(values(source, 8))
    assert_same(*run_both(context, unary_program("convert", source, 8, target), [x]),
                f"{source}->{target} {x}", bf16=target == BF16)


@pytest.mark.parametrize("pair", [("i32", "f32"), ("ui32", "f32"), ("f32", "ui32"),
                                  ("i64", "f64"), ("f64", "ui64"), ("i16", "f16"),
                                  ("ui8", "i8")])
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bitcast_convert_agrees(context, pair, data):
    source = {v: k for k, v in ELEMENT.items()}[pair[0]]
    target = {v: k for k, v in ELEMENT.items()}[pair[1]]
    x = data.draw(values(source, 4))
    assert_same(*run_both(context, unary_program("bitcast_convert", source, 4, target), [x]))


# -- programs of jax's: shapes, reductions, dots, gathers, control flow ----------------------

def lowered(function, *args) -> str:
    jax = pytest.importorskip("jax")
    from jaxlib.mlir import ir

    from ifrtpy.program import mlir
    text = jax.jit(function).lower(*args).as_text()
    if "chlo." in text:
        with mlir.context():
            module = ir.Module.parse(text)
            mlir._expand_chlo(module)
            text = str(module)
    return text


def jax_programs():
    jnp = pytest.importorskip("jax.numpy")
    lax = pytest.importorskip("jax.lax")
    return {
        "broadcast_transpose_reshape": (lambda x: (jnp.broadcast_to(x[:, None, :], (3, 2, 4))
                                                   .transpose(2, 0, 1).reshape(6, 4) * 2), "f"),
        "slices_pad_reverse": (lambda x: (x[1:, ::2], jnp.pad(x, ((1, 2), (0, 3))),
                                          lax.pad(x, 0.0, [(-1, 2, 1), (1, -1, 2)]),
                                          jnp.flip(x, 1), jnp.concatenate([x, x[:1]])), "f"),
        "sum_prod_max_min": (lambda x: (x.sum(), x.sum(0), x.prod(1), x.max(0), x.min(),
                                        jnp.mean(x, 1)), "f"),
        "integer_reductions": (lambda x: (x.sum(0), x.prod(), x.max(1), x.min(0),
                                          jnp.bitwise_xor.reduce(x, 0)), "i"),
        "argmax_argmin": (lambda x: (jnp.argmax(x, 0), jnp.argmin(x, 1), jnp.argmax(x)), "f"),
        "cumulative": (lambda x: (jnp.cumsum(x, 0), jnp.cumprod(x, 1), lax.cummax(x, 1),
                                  lax.cummin(x, 0)), "f"),
        "windows": (lambda x: (lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 2), "SAME"),
                               lax.reduce_window(x, 0.0, lax.add, (2, 3), (2, 1),
                                                 [(1, 0), (2, 1)], base_dilation=(1, 2),
                                                 window_dilation=(2, 1))), "f"),
        "any_all": (lambda x: (jnp.any(x > 0, 0), jnp.all(x > -1, 1)), "f"),
        "dot_matmul_einsum": (lambda x: (x @ x.T, jnp.einsum("ij,ik->jk", x, x),
                                         jnp.dot(x[0], x[1])), "f"),
        "integer_dot": (lambda x: (x @ x.T, jnp.einsum("ij,ij->i", x, x)), "i"),
        "gather_take_indexing": (lambda x: (x[jnp.array([2, 0, 2])], x[:, jnp.array([1, -1])],
                                            jnp.take(x, jnp.array([[0, 5], [7, 1]])),
                                            x[jnp.array([0, 2]), jnp.array([3, 1])],
                                            jnp.take_along_axis(x, jnp.abs(x[:, :2]).astype(int) % 4, 1)),
                                 "f"),
        "dynamic_slice_update": (lambda x: (lax.dynamic_slice(x, (1, 2), (2, 2)),
                                            lax.dynamic_slice(x, (5, -3), (2, 2)),
                                            lax.dynamic_update_slice(x, x[:1, :2] * 0, (2, 3)),
                                            x.at[1].set(7.0)), "f"),
        # one sort or scatter a program, of an operand used nowhere else: jaxlib's
        # interpreter writes their results into their operand's storage, so a program
        # using the operand after one gets the wrong values from it
        "sort_rows": (lambda x: jnp.sort(x, axis=1), "f"),
        "sort_columns": (lambda x: jnp.sort(x, axis=0), "f"),
        "argsort": (lambda x: jnp.argsort(x[0]), "f"),
        "sort_two": (lambda x: lax.sort((x[0], x[1]), num_keys=1)[1], "f"),
        "scatter_add": (lambda x: x.at[jnp.array([0, 2, 0])].add(x[:3] * 2), "f"),
        "scatter_set": (lambda x: x.at[1, jnp.array([3, 1, 3])].set(jnp.array([1.0, 2.0, 3.0])),
                        "f"),
        "scatter_drop": (lambda x: x.at[jnp.array([5, -9, 1])].add(1.0, mode="drop"), "f"),
        "segment_sum": (lambda x: jax_ops_segment_sum(x.ravel()), "f"),
        "scatter_max": (lambda x: x.at[jnp.array([0, 2, 0])].max(x[:3] * 3), "i"),
        "scatter_min": (lambda x: x.at[:, jnp.array([1, 1])].min(-x[:, :2]), "i"),
        "scatter_mul": (lambda x: x.at[jnp.array([2, 1])].mul(3), "i"),
        "scatter_max_float": (lambda x: x.at[jnp.array([0, 2, 0])].max(x[:3] * -1), "f"),
        "scatter_min_float": (lambda x: x.at[:, jnp.array([1, 1])].min(-x[:, :2]), "f"),
        "convolutions": (lambda x: (
            lax.conv_general_dilated(x[None, None], x[None, None, :2, :2], (1, 1), "SAME"),
            lax.conv_general_dilated(x[None, None], x[None, None, :2, :3], (2, 1),
                                     [(1, 0), (0, 2)], lhs_dilation=(1, 2), rhs_dilation=(2, 1)),
            lax.conv_general_dilated(jnp.stack([x, -x])[None], jnp.stack([x[:2, :2], x[1:, 1:3]])[:, None],
                                     (1, 1), "VALID", feature_group_count=2),
            lax.conv_transpose(x[None, :, :, None], x[:2, :2, None, None], (2, 1), "SAME")), "f"),
        "integer_convolutions": (lambda x: (
            lax.conv_general_dilated(x[None, None], x[None, None, :2, :2], (1, 2), [(1, 1), (0, 1)]),
            lax.conv_general_dilated(jnp.stack([x, x * 2])[None], jnp.stack([x[:2, :2], -x[:2, :2]])[:, None],
                                     (1, 1), "SAME", feature_group_count=2)), "i"),
        "while_fori": (lambda x: lax.fori_loop(0, 5, lambda i, c: c * 0.5 + x[i % 3], x[0]), "f"),
        "cond_switch": (lambda x: (lax.cond(x[0, 0] > 0, lambda v: v + 1, lambda v: v * 2, x),
                                   lax.switch(jnp.int32(x[0, 1] > 0) + 1,
                                              [lambda v: v, lambda v: -v, lambda v: v * v], x)),
                        "f"),
        "bitcasts_between_widths": (lambda x: (
            lax.bitcast_convert_type(x, jnp.uint8),
            lax.bitcast_convert_type(x.astype(jnp.uint16).reshape(3, 2, 2), jnp.uint32)), "i"),
        "iota_shifts_bits": (lambda x: (jnp.arange(12).reshape(3, 4) << (x % 5),
                                        lax.shift_right_logical(x, jnp.int32(3)),
                                        lax.population_count(x), lax.clz(x)), "i"),
        "erf_inv_and_friends": (lambda x: (lax.erf_inv(jnp.tanh(x)), jnp.log1p(jnp.abs(x)),
                                           lax.logistic(x), jnp.expm1(x), lax.rsqrt(x * x + 1)),
                                "f"),
    }


def jax_conv_gradients(x):
    """The gradients of a strided, padded convolution (jax's: window reversal, lhs
    dilation, and a convolution over the batch for the kernel's)."""
    jax = pytest.importorskip("jax")

    def loss(a, k):
        out = jax.lax.conv_general_dilated(a, k, (2, 1), [(1, 2), (0, 1)], rhs_dilation=(1, 2))
        return (out * out).sum()
    return jax.grad(loss, argnums=(0, 1))(jax.numpy.stack([x, x * 0.5])[:, None],
                                         jax.numpy.stack([x[:2, :2], x[1:, :2]])[:, None])


def jax_ops_segment_sum(x):
    jax = pytest.importorskip("jax")
    return jax.ops.segment_sum(x, jax.numpy.arange(x.size) % 4, num_segments=4)


JAX_PROGRAMS = ["sort_rows", "sort_columns", "argsort", "sort_two", "scatter_add", "scatter_set", "scatter_drop", "segment_sum",
                "scatter_max", "scatter_min", "scatter_mul", "scatter_max_float", "scatter_min_float",
                "broadcast_transpose_reshape", "slices_pad_reverse", "sum_prod_max_min",
                "integer_reductions", "argmax_argmin", "cumulative", "windows", "any_all", "dot_matmul_einsum",
                "integer_dot", "gather_take_indexing", "dynamic_slice_update", "convolutions",
                "integer_convolutions", "while_fori",
                "cond_switch", "bitcasts_between_widths", "iota_shifts_bits", "erf_inv_and_friends"]


@pytest.mark.parametrize("name", JAX_PROGRAMS)
@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_jax_programs_agree(context, name, data):
    function, kind = jax_programs()[name]
    dtype = np.dtype(np.float32 if kind == "f" else np.int32)
    if kind == "f":
        x = data.draw(st.lists(st.floats(-4, 4, width=32), min_size=12, max_size=12))
    else:
        x = data.draw(st.lists(st.integers(-40, 40), min_size=12, max_size=12))
    x = np.array(x, dtype).reshape(3, 4)
    assert_same(*run_both(context, lowered(function, x), [x]), name)


def run_numpy(context, text, args):
    from jaxlib.mlir import ir

    with context, ir.Location.unknown():
        program = numpy_eval.Program(ir.Module.parse(prepared(text)), checked=True)
        return program([np.asarray(a) for a in args])


@pytest.mark.parametrize("name", ["sort_nan_and_zeros", "scatters_of_one_operand",
                                  "scatter_max_and_its_operand", "scatter_windows_that_overhang"])
def test_where_the_interpreter_is_wrong_the_evaluator_gives_jaxs_results(context, name):
    """jaxlib's interpreter compares in IEEE total order as in float order (a NaN then
    sorts among the numbers, -0 ties +0), writes a sort's or scatter's result into its
    operand's storage (a later use of the operand sees it), and applies the part of a
    scatter's update window that fits where XLA skips the window; XLA, and the
    evaluator, do none of these."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = np.array([[0.0, -0.0, 2.0, 0.0], [np.nan, 1.0, -0.0, 3.0], [0.0, 5.0, -1.0, 0.0]],
                 np.float32)
    function = {
        "sort_nan_and_zeros": lambda x: (jnp.sort(x.ravel()), jnp.sort(x, axis=0)),
        "scatters_of_one_operand": lambda x: (
            x.at[jnp.array([0, 2, 0])].add(x[:3] * 2),
            x.at[1, jnp.array([3, 1, 3])].set(jnp.array([1.0, 2.0, 3.0])),
            x.at[jnp.array([5, -9, 1])].add(1.0, mode="drop"), x * 1),
        # as scatter_max's gradient does: where the operand took the maximum (zeros of both
        # signs, a NaN among the updates)
        "scatter_max_and_its_operand": lambda x: (
            lambda out: (out, out == x, x.at[:, jnp.array([0, 0, 1])].min(-x[:, :3])))(
                x.at[jnp.array([0, 2, 0])].max(-x)),
        # XLA skips an update window that does not fit whole (the interpreter, only the
        # elements that fall outside)
        "scatter_windows_that_overhang": lambda x: (
            jax.lax.scatter_add(x.ravel(), jnp.array([[11], [3], [10]]), x[:, :2] + 1,
                                jax.lax.ScatterDimensionNumbers(
                                    update_window_dims=(1,), inserted_window_dims=(),
                                    scatter_dims_to_operand_dims=(0,)),
                                mode=jax.lax.GatherScatterMode.FILL_OR_DROP),),
    }[name]
    expected = [np.asarray(out) for out in jax.jit(function)(x)]
    assert_same(run_numpy(context, lowered(function, x), [x]), expected, name)


@pytest.mark.parametrize("name", ["gradients", "int8_preferred_f32_and_i32"])
def test_convolutions_the_interpreter_aborts_on_agree_with_jax(context, name):
    """jaxlib's interpreter aborts the process on some convolutions: one of a strided,
    padded convolution's gradients (``LLVM ERROR: Incompatible index and shape found
    while flattening index``), int8 operands into a wider result (``Element is not an
    integer``). The evaluator runs them: the gradients within rounding of jax's CPU
    client (which sums in another order), small integers exactly."""
    jax = pytest.importorskip("jax")
    lax = jax.lax
    x = np.array([[0.5, -1.0, 2.0, 0.0], [1.5, 3.0, -2.5, 1.0], [-0.5, 4.0, 1.0, -3.0]],
                 np.float32)
    if name == "gradients":
        function = jax_conv_gradients
    else:
        x = (x * 2).astype(np.int8)

        def function(x):
            return tuple(lax.conv_general_dilated(x[None, None], x[None, None, :2, :2], (1, 2),
                                                  [(1, 1), (0, 1)], preferred_element_type=t)
                         for t in (np.float32, np.int32))
    ours = run_numpy(context, lowered(function, x), [x])
    expected = function(x)
    assert len(ours) == len(expected) == 2
    for got, want in zip(ours, expected):
        assert got.dtype == np.asarray(want).dtype
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6, atol=1e-5)


def test_jax_rejection_sampler_agrees(context):
    """One of jax's rejection samplers (gamma: while loops over uniform draws), the kind
    of program that took the interpreter a minute over 12000 samples."""
    jax = pytest.importorskip("jax")
    key = np.asarray(jax.random.key_data(jax.random.key(3)))
    text = lowered(lambda k: jax.random.gamma(jax.random.wrap_key_data(k), 0.7, shape=(40,)),
                   key)
    ours, theirs = run_both(context, text, [key])
    assert_same(ours, theirs, "gamma")


def test_unsupported_ops_leave_the_program_to_the_interpreter(context):
    """An f8 value; an unstable sort runs in the evaluator (any order of ties is one an
    unstable sort may give)."""
    from jaxlib.mlir import ir

    sort = """func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "stablehlo.sort"(%x) ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %p = stablehlo.compare LT, %a, %b : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  }) {dimension = 0 : i64, is_stable = false} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}"""
    f8 = unary_program("negate", np.float32, 4).replace("f32", "f8E5M2")
    with context, ir.Location.unknown():
        assert numpy_eval.compile_module(ir.Module.parse(prepared(f8))) is None
        assert numpy_eval.compile_module(ir.Module.parse(prepared(sort))) is not None
    client = ifrt.get_client("reference", device_count=1)
    x = np.array([3.0, -1.0, 2.0, 0.0], np.float32)
    out, = client.compile(ifrt.HloProgram(sort))(ifrt.device_put(x, client.devices()[0]))
    np.testing.assert_array_equal(np.asarray(out), np.sort(x))


def test_a_convolution_past_the_evaluators_limit_is_left_to_the_interpreter(context, monkeypatch):
    """A convolution's windows count against the evaluator's limit of elements: past
    it, the program is left to the interpreter, which holds no such intermediate."""
    from jaxlib.mlir import ir

    jax = pytest.importorskip("jax")
    x = np.ones((3, 4), np.float32)
    text = lowered(lambda x: jax.lax.conv_general_dilated(x[None, None], x[None, None, :2, :2],
                                                          (1, 1), "SAME"), x)
    why: list[str] = []
    with context, ir.Location.unknown():
        assert numpy_eval.compile_module(ir.Module.parse(prepared(text))) is not None
        monkeypatch.setattr(numpy_eval, "MAX_ELEMENTS", 47)  # its windows: 1 * 12 * 4 * 1
        assert numpy_eval.compile_module(ir.Module.parse(prepared(text)), why) is None
    assert "a convolution whose windows hold 48 elements" in why[0]


def test_the_backend_gives_the_same_results_with_either_evaluator(monkeypatch):
    """A worker started with IFRTPY_REFERENCE_EVALUATOR=interpreter runs every program in
    the interpreter; the results are the same bits."""
    from ifrtpy.backends.reference import pool

    program = ifrt.HloProgram(binary_program("divide", np.int32, 4))
    x = np.array([7, -7, 5, np.iinfo(np.int32).min], np.int32)
    y = np.array([2, 0, -3, -1], np.int32)
    outs = []
    for evaluator in ("numpy", "interpreter"):
        monkeypatch.setenv(worker.EVALUATOR_VARIABLE, evaluator)
        pool._pool.close()  # workers start again, with the variable
        client = ifrt.get_client("reference", device_count=1)
        device = client.devices()[0]
        out, = client.compile(program)(ifrt.device_put(x, device), ifrt.device_put(y, device))
        outs.append(np.asarray(out))
    pool._pool.close()
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], [3, -1, -1, np.iinfo(np.int32).min])


def test_bf16_constants_are_read_from_their_text(context):
    """The Python bindings read no bf16 elements: the evaluator reads a constant's text
    (numbers, the hex bits of NaNs and infinities, or the hex of its data)."""
    big = np.arange(40, dtype=np.float32).astype(BF16)  # printed as hex data
    text = f"""func.func public @main(%x: tensor<5xbf16>) -> (tensor<5xbf16>, tensor<40xbf16>) {{
  %c = stablehlo.constant dense<[1.5, -0.0, 0x7FC0, 0xFF80, 3.0e+10]> : tensor<5xbf16>
  %d = stablehlo.constant dense<"0x{big.tobytes().hex()}"> : tensor<40xbf16>
  %0 = stablehlo.add %x, %c : tensor<5xbf16>
  return %0, %d : tensor<5xbf16>, tensor<40xbf16>
}}"""
    x = np.array([0.0, 0.0, 1.0, 1.0, -1.0], BF16)
    assert_same(*run_both(context, text, [x]), "bf16 constants", bf16=True)
