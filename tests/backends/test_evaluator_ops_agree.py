"""Ops the reference backend's NumPy evaluator runs that jaxlib's interpreter ran before:
complex values, ``select_and_scatter``, scatters of any computation, unstable sorts and
``reduce_precision``. Each program runs on the reference and PjRt backends (XLA's CPU
compiler: the oracle) and on NumPy where NumPy says what the answer is."""

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.backends.reference import rewrite
from ifrtpy.backends.reference.interpreter import MLIR_LOCK
from ifrtpy.program import mlir


@pytest.fixture(scope="module")
def clients():
    return [ifrt.get_client("reference", device_count=1), ifrt.get_client("pjrt", device_count=1)]


def _run(client, text: str, *args) -> list[np.ndarray]:
    executable = client.compile(text)
    (device,) = executable.devices()
    arrays = [client.make_array_from_host_buffer(np.asarray(a), ifrt.SingleDeviceSharding(device))
              for a in args]
    result = executable.execute(arrays, ifrt.ExecuteOptions(fill_status=True))
    result.status.result(timeout=120)
    return [np.asarray(out) for out in result.outputs]


def _both(clients, text, *args) -> list[list[np.ndarray]]:
    """The results on each backend; the reference's computed by the NumPy evaluator."""
    prepared = clients[0].compile(text)._interpretable.text
    with MLIR_LOCK, mlir.context():
        assert rewrite._numpy_runs(prepared) is None
    return [_run(client, text, *args) for client in clients]


COMPLEX = """
module @complex {
  func.func public @main(%re: tensor<3x4xf32>, %im: tensor<3x4xf32>) -> (tensor<3x4xcomplex<f32>>, tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x3xcomplex<f32>>, tensor<4xcomplex<f32>>, tensor<3x4xi1>) {
    %z = stablehlo.complex %re, %im : tensor<3x4xcomplex<f32>>
    %e = stablehlo.exponential %z : tensor<3x4xcomplex<f32>>
    %l = stablehlo.log_plus_one %z : tensor<3x4xcomplex<f32>>
    %m = stablehlo.multiply %e, %l : tensor<3x4xcomplex<f32>>
    %q = stablehlo.divide %m, %z : tensor<3x4xcomplex<f32>>
    %a = stablehlo.abs %q : (tensor<3x4xcomplex<f32>>) -> tensor<3x4xf32>
    %r = stablehlo.real %q : (tensor<3x4xcomplex<f32>>) -> tensor<3x4xf32>
    %c = stablehlo.convert %q : (tensor<3x4xcomplex<f32>>) -> tensor<3x4xf32>
    %s = stablehlo.add %r, %c : tensor<3x4xf32>
    %t = stablehlo.transpose %z, dims = [1, 0] : (tensor<3x4xcomplex<f32>>) -> tensor<4x3xcomplex<f32>>
    %d = stablehlo.dot_general %z, %t, contracting_dims = [1] x [0] : (tensor<3x4xcomplex<f32>>, tensor<4x3xcomplex<f32>>) -> tensor<3x3xcomplex<f32>>
    %zero = stablehlo.constant dense<(0.0, 0.0)> : tensor<complex<f32>>
    %sum = stablehlo.reduce(%z init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<3x4xcomplex<f32>>, tensor<complex<f32>>) -> tensor<4xcomplex<f32>>
    %eq = stablehlo.compare EQ, %z, %q : (tensor<3x4xcomplex<f32>>, tensor<3x4xcomplex<f32>>) -> tensor<3x4xi1>
    return %q, %a, %s, %d, %sum, %eq : tensor<3x4xcomplex<f32>>, tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x3xcomplex<f32>>, tensor<4xcomplex<f32>>, tensor<3x4xi1>
  }
}
"""


def test_complex_values(clients):
    rng = np.random.default_rng(0)
    re, im = (rng.uniform(-2, 2, (3, 4)).astype(np.float32) for _ in range(2))
    z = (re + 1j * im).astype(np.complex64)
    q = np.exp(z) * np.log1p(z) / z
    expected = [q, np.abs(q), 2 * q.real, z @ z.T, z.sum(0), z == q]
    for outs in _both(clients, COMPLEX, re, im):
        for out, want in zip(outs, expected):
            np.testing.assert_allclose(out, want, rtol=2e-5, atol=1e-5)


SELECT_AND_SCATTER = """
module @sas {
  func.func public @main(%x: tensor<5x6xf32>, %s: tensor<5x6xf32>) -> tensor<5x6xf32> {
    %init = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = "stablehlo.select_and_scatter"(%x, %s, %init) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %ge = stablehlo.compare GE, %a, %b : (tensor<f32>, tensor<f32>) -> tensor<i1>
        stablehlo.return %ge : tensor<i1>
    }, {
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %add = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %add : tensor<f32>
    }) {window_dimensions = array<i64: 3, 2>, window_strides = array<i64: 1, 1>, padding = dense<[[1, 1], [0, 1]]> : tensor<2x2xi64>} : (tensor<5x6xf32>, tensor<5x6xf32>, tensor<f32>) -> tensor<5x6xf32>
    return %0 : tensor<5x6xf32>
  }
}
"""


def test_select_and_scatter_with_overlapping_padded_windows(clients):
    rng = np.random.default_rng(1)
    x = rng.permutation(30).reshape(5, 6).astype(np.float32)
    x[2, 3] = x[2, 4] = -1.0  # ties: the first of the window is kept (GE)
    source = rng.integers(1, 9, (5, 6)).astype(np.float32)
    # NumPy: each window's maximum (the first among ties) gets its source value
    expected = np.zeros_like(x)
    padded = np.pad(x, [(1, 1), (0, 1)], constant_values=-np.inf)
    for i in range(5):
        for j in range(6):
            window = padded[i:i + 3, j:j + 2]
            k = np.argmax(window)  # the first maximum in row-major order
            a, b = divmod(int(k), 2)
            expected[i + a - 1, j + b] += source[i, j]
    for (out,) in _both(clients, SELECT_AND_SCATTER, x, source):
        np.testing.assert_array_equal(out, expected)


SCATTER_SUBTRACT = """
module @scatter {
  func.func public @main(%x: tensor<5xf32>, %i: tensor<6x1xi32>, %u: tensor<6xf32>) -> (tensor<5xf32>, tensor<5xi32>) {
    %0 = "stablehlo.scatter"(%x, %i, %u) ({
      ^bb0(%current: tensor<f32>, %update: tensor<f32>):
        %d = stablehlo.subtract %update, %current : tensor<f32>
        %m = stablehlo.multiply %d, %update : tensor<f32>
        stablehlo.return %m : tensor<f32>
    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>} : (tensor<5xf32>, tensor<6x1xi32>, tensor<6xf32>) -> tensor<5xf32>
    %xi = stablehlo.convert %x : (tensor<5xf32>) -> tensor<5xi32>
    %ui = stablehlo.convert %u : (tensor<6xf32>) -> tensor<6xi32>
    %xj = stablehlo.negate %xi : tensor<5xi32>
    %1:2 = "stablehlo.scatter"(%xi, %xj, %i, %ui, %ui) ({
      ^bb0(%c0: tensor<i32>, %c1: tensor<i32>, %u0: tensor<i32>, %u1: tensor<i32>):
        %s = stablehlo.subtract %c0, %u0 : tensor<i32>
        %p = stablehlo.maximum %c1, %u1 : tensor<i32>
        stablehlo.return %s, %p : tensor<i32>, tensor<i32>
    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>} : (tensor<5xi32>, tensor<5xi32>, tensor<6x1xi32>, tensor<6xi32>, tensor<6xi32>) -> (tensor<5xi32>, tensor<5xi32>)
    %2 = stablehlo.add %1#0, %1#1 : tensor<5xi32>
    return %0, %2 : tensor<5xf32>, tensor<5xi32>
  }
}
"""


def test_scatters_of_any_computation_apply_updates_in_order(clients):
    x = np.array([1, 2, 3, 4, 5], np.float32)
    indices = np.array([[1], [3], [1], [9], [1], [0]], np.int32)  # 9: outside, skipped
    updates = np.array([2, 3, 4, 5, 6, 7], np.float32)
    want, ints, peak = x.copy(), x.astype(np.int32), -x.astype(np.int32)
    for (k,), u in zip(indices, updates):
        if 0 <= k < 5:
            want[k] = (u - want[k]) * u
            ints[k] -= int(u)
            peak[k] = max(peak[k], int(u))
    for out, summed in _both(clients, SCATTER_SUBTRACT, x, indices, updates):
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(summed, ints + peak)


UNSTABLE_SORT = """
module @sort {
  func.func public @main(%k: tensor<4x7xf32>, %v: tensor<4x7xi32>) -> (tensor<4x7xf32>, tensor<4x7xi32>) {
    %0:2 = "stablehlo.sort"(%k, %v) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
        %lt = stablehlo.compare GT, %a, %b : (tensor<f32>, tensor<f32>) -> tensor<i1>
        stablehlo.return %lt : tensor<i1>
    }) {dimension = 1 : i64, is_stable = false} : (tensor<4x7xf32>, tensor<4x7xi32>) -> (tensor<4x7xf32>, tensor<4x7xi32>)
    return %0#0, %0#1 : tensor<4x7xf32>, tensor<4x7xi32>
  }
}
"""


def test_unstable_sorts_of_distinct_keys(clients):
    keys = np.random.default_rng(2).permutation(28).reshape(4, 7).astype(np.float32)
    values = np.arange(28, dtype=np.int32).reshape(4, 7)
    order = np.argsort(-keys, axis=1)
    for out_keys, out_values in _both(clients, UNSTABLE_SORT, keys, values):
        np.testing.assert_array_equal(out_keys, np.take_along_axis(keys, order, 1))
        np.testing.assert_array_equal(out_values, np.take_along_axis(values, order, 1))


REDUCE_PRECISION = """
module @rp {
  func.func public @main(%x: tensor<14xf32>) -> (tensor<14xf32>, tensor<14xf32>) {
    %0 = stablehlo.reduce_precision %x, format = e5m10 : tensor<14xf32>
    %1 = stablehlo.reduce_precision %x, format = e8m7 : tensor<14xf32>
    return %0, %1 : tensor<14xf32>, tensor<14xf32>
  }
}
"""


def test_reduce_precision_as_xla_rounds_the_bits(clients):
    import ml_dtypes

    x = np.array([1.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504.0, 65520.0, 1e6, 6e-5, 3e-8,
                  -2.5e-9, np.inf, -np.inf, np.nan, -0.0, 1 / 3], np.float32)
    with np.errstate(over="ignore"):  # e5m10: f16's rounding, without subnormals
        half = x.astype(np.float16).astype(np.float32)
    half[np.abs(x) < 2.0 ** -14] = np.copysign(0.0, x[np.abs(x) < 2.0 ** -14])
    brain = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    reference, pjrt = _both(clients, REDUCE_PRECISION, x)
    for outs in (reference, pjrt):
        np.testing.assert_array_equal(outs[0], half)
        np.testing.assert_array_equal(outs[1], brain)
    for a, b in zip(reference, pjrt):
        np.testing.assert_array_equal(a.view(np.uint32)[~np.isnan(a)], b.view(np.uint32)[~np.isnan(b)])


MIXED_DOT = """
module @dot {
  func.func public @main(%a: tensor<3x4xi8>, %b: tensor<4x2xi8>) -> (tensor<3x2xi32>, tensor<3x2xi1>) {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<3x4xi8>, tensor<4x2xi8>) -> tensor<3x2xi32>
    %z = stablehlo.constant dense<0> : tensor<3x4xi8>
    %p = stablehlo.compare GT, %a, %z : (tensor<3x4xi8>, tensor<3x4xi8>) -> tensor<3x4xi1>
    %y = stablehlo.constant dense<0> : tensor<4x2xi8>
    %q = stablehlo.compare GT, %b, %y : (tensor<4x2xi8>, tensor<4x2xi8>) -> tensor<4x2xi1>
    %1 = stablehlo.dot_general %p, %q, contracting_dims = [1] x [0] : (tensor<3x4xi1>, tensor<4x2xi1>) -> tensor<3x2xi1>
    return %0, %1 : tensor<3x2xi32>, tensor<3x2xi1>
  }
}
"""


def test_dots_of_narrower_or_boolean_operands(clients):
    """int8 operands into an int32 result (converted first: no wrapping at 8 bits), and
    booleans (an or of ands)."""
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (3, 4)).astype(np.int8)
    b = rng.integers(-128, 128, (4, 2)).astype(np.int8)
    b[:, 1] = -1  # a column with no positive entry: false everywhere
    for wide, logical in _both(clients, MIXED_DOT, a, b):
        np.testing.assert_array_equal(wide, a.astype(np.int32) @ b.astype(np.int32))
        np.testing.assert_array_equal(logical, ((a > 0).astype(int) @ (b > 0).astype(int)) > 0)
