"""What the reference backend rewrites before the StableHLO interpreter runs a program:
integer division and remainder get XLA's results where the interpreter's machine division
would kill the process (a zero divisor, and INT_MIN / -1), checked against a model of XLA's
rule in Python integers and against the PjRt backend; composites (how portable artifacts
carry CHLO ops) run as calls of their decompositions; a tensor too large for the
interpreter is refused at compile time."""

import numpy as np
import pytest

import ifrtpy as ifrt

DTYPES = [np.int8, np.int32, np.int64, np.uint8, np.uint32, np.uint64]
ELEMENT = {np.int8: "i8", np.int32: "i32", np.int64: "i64", np.uint8: "ui8", np.uint32: "ui32", np.uint64: "ui64"}


def xla(op, a, b, dtype):
    """XLA's divide / remainder of Python ints: truncating; x / 0 is all bits set,
    x % 0 is x; INT_MIN / -1 is INT_MIN (wraps), INT_MIN % -1 is 0."""
    info = np.iinfo(dtype)
    if b == 0:
        return (-1 if info.min < 0 else info.max) if op == "divide" else a
    q = abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)
    if op == "divide":
        return info.min if q > info.max else q
    return a - q * b if q <= info.max else 0


def operands(dtype):
    info = np.iinfo(dtype)
    values = sorted(v for v in {0, 1, 2, 7, info.max, info.min, -1, -2, -7}
                    if info.min <= v <= info.max)
    pairs = [(a, b) for a in values for b in values]
    return (np.array([a for a, _ in pairs], dtype), np.array([b for _, b in pairs], dtype))


@pytest.mark.parametrize("op", ["divide", "remainder"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_integer_division_gives_xlas_results_and_the_process_lives(op, dtype):
    x, y = operands(dtype)
    t = f"tensor<{len(x)}x{ELEMENT[dtype]}>"
    program = ifrt.HloProgram(f"""
func.func public @main(%x: {t}, %y: {t}) -> {t} {{
  %z = stablehlo.{op} %x, %y : {t}
  return %z : {t}
}}""")
    expected = np.array([xla(op, int(a), int(b), dtype) for a, b in zip(x, y)], dtype)
    for backend in ("reference", "pjrt"):
        client = ifrt.get_client(backend, device_count=1)
        device = client.devices()[0]
        out, = client.compile(program)(ifrt.device_put(x, device), ifrt.device_put(y, device))
        np.testing.assert_array_equal(np.asarray(out), expected, err_msg=backend)


ATANH_COMPOSITE = """
func.func private @atanh_decomposition(%x: tensor<8xf32>) -> tensor<8xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<8xf32>
  %half = stablehlo.constant dense<0.5> : tensor<8xf32>
  %p = stablehlo.add %one, %x : tensor<8xf32>
  %m = stablehlo.subtract %one, %x : tensor<8xf32>
  %q = stablehlo.divide %p, %m : tensor<8xf32>
  %l = stablehlo.log %q : tensor<8xf32>
  %r = stablehlo.multiply %half, %l : tensor<8xf32>
  return %r : tensor<8xf32>
}
func.func public @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.composite "chlo.atanh" %x {decomposition = @atanh_decomposition} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}"""


def test_a_composite_runs_as_its_decomposition():
    x = np.linspace(-0.9, 0.9, 8, dtype=np.float32)
    for backend in ("reference", "pjrt"):
        client = ifrt.get_client(backend, device_count=1)
        out, = client.compile(ifrt.HloProgram(ATANH_COMPOSITE))(
            ifrt.device_put(x, client.devices()[0]))
        np.testing.assert_allclose(np.asarray(out), np.arctanh(x), rtol=1e-5, atol=1e-6,
                                   err_msg=backend)


def test_a_tensor_too_large_for_the_interpreter_is_refused_at_compile_time():
    """jax's bernoulli over 1e8 elements (random_lax_test.py) grew a worker past 10 GB and
    ran for hours in the interpreter; a program with a tensor over the interpreter's limit
    compiles only where the NumPy evaluator runs all of it, up to its own limit; otherwise
    the compile refuses it, naming the op and the limit."""
    from ifrtpy.backends.reference.rewrite import MAX_ELEMENTS, NUMPY_MAX_ELEMENTS

    client = ifrt.get_client("reference", device_count=1)

    def program(n, op="stablehlo.negate"):
        return (f"module @big {{ func.func @main(%a: tensor<f32>) -> tensor<{n}xf32> {{\n"
                f"%0 = stablehlo.broadcast_in_dim %a, dims = [] : (tensor<f32>) -> "
                f"tensor<{n}xf32>\n%1 = {op} %0 : tensor<{n}xf32>\n"
                f"return %1 : tensor<{n}xf32> }} }}")

    with pytest.raises(ifrt.errors.UnimplementedError,
                       match=f"at most {MAX_ELEMENTS} elements; stablehlo.broadcast_in_dim "
                             r"makes tensor<200000000xf32>.*NumPy evaluator runs tensors of "
                             f"at most {NUMPY_MAX_ELEMENTS}"):
        client.compile(program(2 * 10 ** 8))
    # an f8 value: what the NumPy evaluator leaves to the interpreter
    n = MAX_ELEMENTS + 1
    with pytest.raises(ifrt.errors.UnimplementedError,
                       match=f"at most {MAX_ELEMENTS} elements.*the NumPy evaluator does not "
                             "run this program"):
        client.compile(program(n).replace(
            f"%1 = stablehlo.negate %0 : tensor<{n}xf32>",
            f"%f = stablehlo.convert %0 : (tensor<{n}xf32>) -> tensor<{n}xf8E5M2>\n"
            f"%1 = stablehlo.convert %f : (tensor<{n}xf8E5M2>) -> tensor<{n}xf32>"))
    big = client.compile(program(MAX_ELEMENTS * 4))  # NumPy runs it
    out, = big(ifrt.device_put(np.float32(1.5), client.devices()[0]))
    assert np.asarray(out).shape == (MAX_ELEMENTS * 4,) and (np.asarray(out) == -1.5).all()
    client.compile(program(MAX_ELEMENTS))  # the limit itself compiles
