"""Array shapes and index boxes: Shape, DynamicShape, Index, IndexDomain.

Mirrors IFRT's ``shape.h``, ``index.h`` and ``index_domain.h``. Every type here is an
immutable value: hashable, comparable, picklable, with an evaluable ``repr`` and the IFRT
``debug_string()``. :class:`Shape` and :class:`Index` are ``tuple`` subclasses, so they
compare equal to plain tuples of the same numbers and can be passed to NumPy directly.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterable, Sequence
from typing import Union

from ifrtpy.errors import InvalidArgumentError

__all__ = ["Shape", "BoundedDynamicShapeTag", "DynamicShape", "Index", "IndexDomain"]

_tuple_new = tuple.__new__

#: The most elements (and the largest dim) of a Shape: XLA counts elements in int64.
MAX_ELEMENTS = 2**63 - 1


def int_tuple(values: Iterable[int], what: str) -> tuple[int, ...]:
    """``values`` as a tuple of ints; InvalidArgumentError naming ``what`` for anything
    that is not a sequence of integers."""
    try:
        return tuple(map(operator.index, values))
    except TypeError:
        raise InvalidArgumentError(
            f"{what} must be a sequence of integers, got {values!r}") from None


def _join(values: Iterable[object], sep: str = ",") -> str:
    return sep.join(map(str, values))


class Shape(tuple):
    """The static dimensions of an array: an immutable tuple of non-negative ints.

    ``Shape([2, 3]) == (2, 3)``; ``debug_string()`` gives ``[2,3]``.
    """

    __slots__ = ()

    def __new__(cls, dims: Iterable[int] = ()) -> Shape:
        if type(dims) is cls:
            return dims  # type: ignore[return-value]
        values = int_tuple(dims, "Shape dims")
        for d in values:
            if d < 0:
                raise InvalidArgumentError(f"Shape dims must be non-negative, got {list(values)}")
        if values and (max(values) > MAX_ELEMENTS or math.prod(values) > MAX_ELEMENTS):
            raise InvalidArgumentError(
                f"Shape {list(values)} has {math.prod(values)} elements; a shape holds at most "
                f"2**63 - 1 elements and no larger dim (XLA counts them in int64)")
        return _tuple_new(cls, values)

    @property
    def dims(self) -> tuple[int, ...]:
        """The dimensions as a plain tuple."""
        return tuple(self)

    @property
    def rank(self) -> int:
        return len(self)

    def num_elements(self) -> int:
        """Product of the dims: 1 for a scalar, 0 when any dim is 0."""
        return math.prod(self)

    def debug_string(self) -> str:
        return f"[{_join(self)}]"

    def __repr__(self) -> str:
        return f"Shape({list(self)!r})"

    __str__ = debug_string

    def __reduce__(self):
        return (Shape, (tuple(self),))


#: ``trusted_shape(dims)``: a Shape of a tuple already known to hold valid dims, without
#: the checks (for hot paths that computed the dims from valid shapes).
trusted_shape = functools.partial(_tuple_new, Shape)


class BoundedDynamicShapeTag:
    """Which dimensions of a :class:`DynamicShape` are dynamic (bounded by the static dim).

    At least one entry must be true (IFRT aborts otherwise; this raises InvalidArgumentError).
    """

    __slots__ = ("_dynamic_dims",)

    def __init__(self, dynamic_dims: Iterable[bool]):
        dyn = tuple(bool(d) for d in dynamic_dims)
        if not any(dyn):
            raise InvalidArgumentError(
                f"BoundedDynamicShapeTag must have at least one dynamic dimension, got {list(dyn)}")
        self._dynamic_dims = dyn

    @property
    def dynamic_dims(self) -> tuple[bool, ...]:
        return self._dynamic_dims

    def __len__(self) -> int:
        return len(self._dynamic_dims)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BoundedDynamicShapeTag):
            return NotImplemented
        return self._dynamic_dims == other._dynamic_dims

    def __hash__(self) -> int:
        return hash((BoundedDynamicShapeTag, self._dynamic_dims))

    def __repr__(self) -> str:
        return f"BoundedDynamicShapeTag({list(self._dynamic_dims)!r})"

    def __reduce__(self):
        return (BoundedDynamicShapeTag, (self._dynamic_dims,))


class DynamicShape:
    """A shape whose tagged dims are only upper bounds: ``[<=2,4]`` (``[2,4]``, dim 0 dynamic).

    Raises InvalidArgumentError when the shape and the tag have different ranks.
    """

    __slots__ = ("_shape", "_tag")

    def __init__(self, shape: Iterable[int], tag: BoundedDynamicShapeTag):
        shape = Shape(shape)
        if not isinstance(tag, BoundedDynamicShapeTag):
            tag = BoundedDynamicShapeTag(tag)
        if len(shape) != len(tag):
            raise InvalidArgumentError(
                "Shape and tag must have the same number of dimensions: "
                f"shape has {len(shape)}, tag has {len(tag)}")
        self._shape = shape
        self._tag = tag

    @property
    def shape(self) -> Shape:
        """The static bounds (IFRT keeps this as the DynamicShape's shape)."""
        return self._shape

    @property
    def tag(self) -> BoundedDynamicShapeTag:
        return self._tag

    @property
    def rank(self) -> int:
        return len(self._shape)

    def is_dynamic_dim(self, dimension: int) -> bool:
        return self._tag.dynamic_dims[dimension]

    def get_padded_shape(self) -> Shape:
        """The shape with every dynamic dim padded to its bound."""
        return self._shape

    def debug_string(self) -> str:
        return "[" + ",".join(
            f"<={d}" if dyn else str(d) for d, dyn in zip(self._shape, self._tag.dynamic_dims)
        ) + "]"

    __str__ = debug_string

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DynamicShape):
            return NotImplemented
        return self._shape == other._shape and self._tag == other._tag

    def __hash__(self) -> int:
        return hash((DynamicShape, self._shape, self._tag))

    def __repr__(self) -> str:
        return f"DynamicShape({self._shape!r}, {self._tag!r})"

    def __reduce__(self):
        return (DynamicShape, (self._shape, self._tag))


class Index(tuple):
    """An integer vector (a position in an array): ``+``/``-`` elementwise, ``*`` by a scalar
    or elementwise by a sequence of the same length. Unlike a tuple, ``+`` and ``*`` are
    arithmetic, never concatenation or repetition."""

    __slots__ = ()

    def __new__(cls, elements: Iterable[int] = ()) -> Index:
        if type(elements) is cls:
            return elements  # type: ignore[return-value]
        return _tuple_new(cls, int_tuple(elements, "Index elements"))

    @classmethod
    def zeros(cls, num_elements: int) -> Index:
        return _tuple_new(cls, (0,) * num_elements)

    @property
    def elements(self) -> tuple[int, ...]:
        return tuple(self)

    def _other(self, other: object, op: str) -> tuple[int, ...]:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            if len(other) != len(self):
                raise InvalidArgumentError(
                    f"Index {op} needs operands of the same length: {len(self)} vs {len(other)}")
            return other  # type: ignore[return-value]
        return NotImplemented  # type: ignore[return-value]

    def __add__(self, other: Sequence[int]) -> Index:  # type: ignore[override]
        o = self._other(other, "+")
        if o is NotImplemented:
            return NotImplemented
        return _tuple_new(Index, tuple(map(operator.add, self, o)))

    __radd__ = __add__

    def __sub__(self, other: Sequence[int]) -> Index:
        o = self._other(other, "-")
        if o is NotImplemented:
            return NotImplemented
        return _tuple_new(Index, tuple(map(operator.sub, self, o)))

    def __rsub__(self, other: Sequence[int]) -> Index:
        o = self._other(other, "-")
        if o is NotImplemented:
            return NotImplemented
        return _tuple_new(Index, tuple(map(operator.sub, o, self)))

    def __mul__(self, other: Union[int, Sequence[int]]) -> Index:  # type: ignore[override]
        if isinstance(other, Sequence):
            o = self._other(other, "*")
            return _tuple_new(Index, tuple(map(operator.mul, self, o)))
        try:
            k = operator.index(other)
        except TypeError:
            return NotImplemented
        return _tuple_new(Index, tuple(e * k for e in self))

    __rmul__ = __mul__

    def __neg__(self) -> Index:
        return _tuple_new(Index, tuple(-e for e in self))

    def debug_string(self) -> str:
        return f"[{_join(self)}]"

    def __repr__(self) -> str:
        return f"Index({list(self)!r})"

    __str__ = debug_string

    def __reduce__(self):
        return (Index, (tuple(self),))


class IndexDomain(tuple):
    """The box ``[origin, origin + shape)`` of a global array that one shard holds.

    ``IndexDomain(shape)`` has a zero origin; ``IndexDomain(origin, shape)`` a given one.
    It is a 2-tuple of plain origin tuple and :class:`Shape` (so ``origin, shape = domain``
    works); :attr:`origin` gives the origin as an :class:`Index`. ``+``/``-`` with an
    Index shift the origin, and :meth:`slices` / :attr:`index` give the NumPy index that
    selects the box: ``global_array[domain.index]`` is the shard.
    """

    __slots__ = ()

    def __new__(cls, origin_or_shape: Iterable[int],
                shape: Iterable[int] | None = None) -> IndexDomain:
        if shape is None:
            shape = Shape(origin_or_shape)
            origin = (0,) * len(shape)
        else:
            origin = int_tuple(origin_or_shape, "IndexDomain origin")
            shape = Shape(shape)
            if len(origin) != len(shape):
                raise InvalidArgumentError(
                    "IndexDomain origin and shape must have the same number of dimensions: "
                    f"origin [{_join(origin)}] vs shape {shape.debug_string()}")
        return _tuple_new(cls, (origin, shape))

    @property
    def origin(self) -> Index:
        """The first index in the box."""
        return _tuple_new(Index, self[0])

    shape = property(operator.itemgetter(1), doc="The extent of the box (a Shape).")

    def slices(self) -> tuple[slice, ...]:
        """One ``slice(start, stop)`` per dimension: the NumPy basic index of the box."""
        return tuple(map(slice, self[0], map(operator.add, self[0], self[1])))

    @property
    def index(self) -> tuple[slice, ...]:
        """Same as :meth:`slices`."""
        return self.slices()

    def _shifted(self, offset: Sequence[int], op) -> IndexDomain:
        if len(offset) != len(self[1]):
            raise InvalidArgumentError(
                f"IndexDomain offset must have {len(self[1])} elements, got {len(offset)}")
        return _tuple_new(IndexDomain, (tuple(map(op, self[0], offset)), self[1]))

    def __add__(self, offset: Sequence[int]) -> IndexDomain:  # type: ignore[override]
        return self._shifted(offset, operator.add)

    def __sub__(self, offset: Sequence[int]) -> IndexDomain:
        return self._shifted(offset, operator.sub)

    def __mul__(self, other):  # tuple repetition makes no sense here
        return NotImplemented

    __rmul__ = __mul__

    def debug_string(self) -> str:
        return f"IndexDomain(origin=[{_join(self[0])}],shape={self[1].debug_string()})"

    __str__ = debug_string

    def __repr__(self) -> str:
        return f"IndexDomain({list(self[0])!r}, {list(self[1])!r})"

    def __reduce__(self):
        return (IndexDomain, (self[0], tuple(self[1])))
