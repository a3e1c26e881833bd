"""Types and constants from Python values: shape_from_pyval (XLA's rule: NumPy's dtype,
tuples are tuples) and constants from nested lists and tuples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ifrtpy as ifrt
from ifrtpy.builder import Builder, shape_from_pyval
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.program import TensorType

from builder_helpers import FEW, client, run  # noqa: F401  (client is a fixture)

DTYPES = [np.float32, np.float64, np.int8, np.int32, np.uint16, np.bool_, np.complex64]


@FEW
@given(value=st.sampled_from(DTYPES).flatmap(
    lambda t: hnp.arrays(t, hnp.array_shapes(min_dims=0, max_dims=3, max_side=3))))
def test_shape_from_pyval_and_parameter_round_trip(client, value):
    t = shape_from_pyval(value)
    assert t == TensorType(ifrt.DType.from_numpy(value.dtype), ifrt.Shape(value.shape))
    b = Builder()
    p = b.parameter(t)
    assert (p.shape, p.dtype) == (t.shape, t.dtype)
    out = run(client, b.build(p), value)[0]
    np.testing.assert_array_equal(out, value)


def test_shape_from_pyval_python_values_and_tuples():
    assert shape_from_pyval(3) == TensorType(ifrt.DType.from_numpy(np.int64), ifrt.Shape(()))
    assert str(shape_from_pyval(2.5)) == "f64[]"
    assert str(shape_from_pyval([[1, 2, 3], [4, 5, 6]])) == "s64[2, 3]"
    nested = shape_from_pyval((np.zeros((2,), np.float32), (True, np.int8(1))))
    assert [str(nested[0]), str(nested[1][0]), str(nested[1][1])] == ["f32[2]", "pred[]", "s8[]"]


@pytest.mark.parametrize("value", [[[1, 2], [3]], ["a", "b"], [object()]])
def test_non_numeric_or_ragged_values_are_refused(value):
    with pytest.raises(InvalidArgumentError, match="shape_from_pyval: "):
        shape_from_pyval(value)
    with pytest.raises(InvalidArgumentError, match="constant: "):
        Builder().constant(value)


def test_parameter_takes_a_type_or_a_shape_and_dtype():
    b = Builder()
    with pytest.raises(InvalidArgumentError, match="not both"):
        b.parameter(shape_from_pyval(1.0), np.float32)
    with pytest.raises(InvalidArgumentError, match="a shape needs a dtype"):
        b.parameter((2,))


def test_constants_from_nested_tuples_and_lists(client):
    b = Builder()
    values = [((1, 2, 3), (4, 5, 6)), [(1.5, -2.0)], ((True,), (False,)), ((1 + 2j, 3j),)]
    program = b.build(*[b.constant(v) for v in values], b.constant(((1, 2),), np.float16))
    outs = run(client, program)
    for out, v in zip(outs, values):
        np.testing.assert_array_equal(out, np.asarray(v))
        assert out.dtype == np.asarray(v).dtype
    np.testing.assert_array_equal(outs[-1], np.array([[1, 2]], np.float16))
    assert outs[-1].dtype == np.float16
