"""Shape, DynamicShape, Index, IndexDomain (after IFRT's shape_test, index_test,
index_domain_test)."""

import pickle

import numpy as np
import pytest

from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import BoundedDynamicShapeTag, DynamicShape, Index, IndexDomain, Shape

INT64_MAX = np.iinfo(np.int64).max


def roundtrip(value):
    return pickle.loads(pickle.dumps(value))


class TestShape:
    def test_large_dim(self):
        shape = Shape([INT64_MAX])
        assert shape.dims == (INT64_MAX,)
        assert shape.num_elements() == INT64_MAX

    def test_many_dims(self):
        shape = Shape([1] * 65536)
        assert len(shape) == 65536
        assert shape.num_elements() == 1

    def test_scalar_num_elements(self):
        assert Shape([]).num_elements() == 1
        assert Shape().rank == 0

    def test_zero_dim_num_elements(self):
        assert Shape([3, 0, 2]).num_elements() == 0

    def test_non_zero_dims_num_elements(self):
        assert Shape([2, 3, 4]).num_elements() == 24

    def test_tuple_like(self):
        shape = Shape(np.array([2, 3]))
        assert shape == (2, 3)
        assert shape[1] == 3
        assert np.zeros(shape).shape == (2, 3)
        assert Shape(shape) is shape

    def test_debug_string_and_repr(self):
        shape = Shape([2, 3])
        assert shape.debug_string() == "[2,3]"
        assert str(shape) == "[2,3]"
        assert eval(repr(shape)) == shape
        assert Shape([]).debug_string() == "[]"

    def test_hash_and_pickle(self):
        assert hash(Shape([2, 3])) == hash(Shape((2, 3)))
        assert len({Shape([2, 3]), Shape([2, 3]), Shape([3, 2])}) == 2
        shape = roundtrip(Shape([2, 3]))
        assert type(shape) is Shape and shape == Shape([2, 3])

    @pytest.mark.parametrize("bad", [[-1], [2, -3]])
    def test_negative_dims_rejected(self, bad):
        with pytest.raises(InvalidArgumentError, match="non-negative"):
            Shape(bad)

    def test_non_integer_rejected(self):
        with pytest.raises(InvalidArgumentError, match="integers"):
            Shape([2.5])


class TestDynamicShape:
    def test_tag_needs_a_dynamic_dim(self):
        with pytest.raises(InvalidArgumentError, match="at least one dynamic"):
            BoundedDynamicShapeTag([False, False])

    def test_size_mismatch(self):
        with pytest.raises(InvalidArgumentError, match="must have the same number of dimensions"):
            DynamicShape(Shape([2, 3, 4]), BoundedDynamicShapeTag([True, True]))

    def test_equality(self):
        a = DynamicShape(Shape([2, 4]), BoundedDynamicShapeTag([True, False]))
        assert a == DynamicShape(Shape([2, 4]), BoundedDynamicShapeTag([True, False]))
        assert a != DynamicShape(Shape([3, 4]), BoundedDynamicShapeTag([True, False]))
        assert a != DynamicShape(Shape([2, 4]), BoundedDynamicShapeTag([False, True]))
        assert a != Shape([2, 4])

    def test_is_dynamic_dim(self):
        shape = DynamicShape(Shape([2, 4, 6]), BoundedDynamicShapeTag([True, False, True]))
        assert [shape.is_dynamic_dim(i) for i in range(3)] == [True, False, True]

    def test_get_padded_shape(self):
        shape = DynamicShape(Shape([2, 4]), BoundedDynamicShapeTag([True, True]))
        assert shape.get_padded_shape() == Shape([2, 4])

    def test_to_string(self):
        both = DynamicShape(Shape([2, 4]), BoundedDynamicShapeTag([True, True]))
        assert both.debug_string() == "[<=2,<=4]"
        assert str(DynamicShape(Shape([2, 4]), BoundedDynamicShapeTag([False, True]))) == "[2,<=4]"

    def test_hash_repr_pickle(self):
        shape = DynamicShape(Shape([2, 4]), BoundedDynamicShapeTag([True, False]))
        assert hash(shape) == hash(roundtrip(shape))
        assert roundtrip(shape) == shape
        assert eval(repr(shape)) == shape


class TestIndex:
    def test_zeros(self):
        assert Index.zeros(3) == Index([0, 0, 0])

    def test_arithmetic(self):
        a, b = Index([1, 2]), Index([3, 5])
        assert a + b == Index([4, 7])
        assert b - a == Index([2, 3])
        assert a * 3 == Index([3, 6]) and 3 * a == Index([3, 6])
        assert a * (2, 10) == Index([2, 20])
        assert (10, 10) - a == Index([9, 8])
        assert -a == Index([-1, -2])
        assert type(a + (1, 1)) is Index and type((1, 1) + a) is Index

    def test_length_mismatch(self):
        with pytest.raises(InvalidArgumentError, match="same length: 2 vs 3"):
            Index([1, 2]) + Index([1, 2, 3])

    def test_value_protocol(self):
        a = Index([1, -2])
        assert eval(repr(a)) == a
        assert roundtrip(a) == a and type(roundtrip(a)) is Index
        assert a.debug_string() == "[1,-2]"
        assert hash(a) == hash(Index((1, -2)))


class TestIndexDomain:
    def test_default_origin(self):
        domain = IndexDomain(Shape([2, 3]))
        assert domain.origin == Index([0, 0]) and type(domain.origin) is Index
        assert domain.shape == Shape([2, 3]) and type(domain.shape) is Shape
        assert domain == IndexDomain([0, 0], [2, 3])

    def test_unpacks(self):
        origin, shape = IndexDomain([1, 2], [3, 4])
        assert origin == (1, 2) and shape == (3, 4)

    def test_rank_mismatch(self):
        with pytest.raises(InvalidArgumentError, match="same number of dimensions"):
            IndexDomain([0], [2, 3])

    def test_slices_select_the_box(self):
        x = np.arange(60).reshape(6, 10)
        domain = IndexDomain([2, 4], [3, 5])
        assert domain.slices() == (slice(2, 5), slice(4, 9))
        np.testing.assert_array_equal(x[domain.index], x[2:5, 4:9])
        assert IndexDomain(Shape([])).slices() == ()

    def test_shift(self):
        domain = IndexDomain([1, 1], [2, 2])
        assert domain + Index([1, 2]) == IndexDomain([2, 3], [2, 2])
        assert domain - Index([1, 1]) == IndexDomain([0, 0], [2, 2])
        with pytest.raises(InvalidArgumentError, match="2 elements, got 3"):
            domain + Index([1, 1, 1])

    def test_value_protocol(self):
        domain = IndexDomain([0, 4], [3, 2])
        assert eval(repr(domain)) == domain
        assert roundtrip(domain) == domain and type(roundtrip(domain)) is IndexDomain
        assert domain.debug_string() == "IndexDomain(origin=[0,4],shape=[3,2])"
        assert len({domain, IndexDomain([0, 4], [3, 2]), IndexDomain([0, 0], [3, 2])}) == 2
