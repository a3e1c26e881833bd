"""``Value``: one SSA value of a program being built, with its shape and dtype.

Operators build ops on the value's builder: ``a + b``, ``a * 2`` (a Python scalar becomes a
constant of the other operand's dtype and shape), ``a @ b`` (dot), ``a < b`` (compare),
``a & b``, ``~a``, ``-a``, ``abs(a)``, ``a ** b``. ``==`` and ``!=`` also build compares,
so a Value has no truth value; it is hashed by identity.
"""

from __future__ import annotations

from typing import Any, Callable

from ifrtpy.dtypes import DType
from ifrtpy.shape import Shape

from ifrtpy.builder._types import fmt


class Value:
    """A value of a :class:`~ifrtpy.builder.Builder`: ``shape`` (a Shape), ``dtype`` (a
    DType), ``rank``. Valid only in the region that made it and regions nested in it."""

    __slots__ = ("_builder", "_ir", "_shape", "_dtype", "_scope", "__weakref__")
    __array_priority__ = 1000  # numpy scalars on the left defer to Value's reflected ops

    def __init__(self, builder, ir_value, shape: Shape, dtype: DType, scope):
        self._builder = builder
        self._ir = ir_value
        self._shape = shape
        self._dtype = dtype
        self._scope = scope

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def rank(self) -> int:
        return len(self._shape)

    @property
    def builder(self):
        return self._builder

    def __repr__(self) -> str:
        return f"<Value {fmt(self._shape, self._dtype)}>"

    def __bool__(self):
        raise TypeError("a builder Value has no truth value (it is known only when the program "
                        "runs); use Builder.cond or select")

    __hash__ = object.__hash__

    # -- conveniences ------------------------------------------------------------------------

    def reshape(self, *shape) -> Value:
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        return self._builder.reshape(self, shape)

    def transpose(self, *permutation) -> Value:
        if not permutation:
            permutation = tuple(reversed(range(self.rank)))
        elif len(permutation) == 1 and not isinstance(permutation[0], int):
            permutation = tuple(permutation[0])
        return self._builder.transpose(self, permutation)

    @property
    def T(self) -> Value:
        return self.transpose()

    def astype(self, dtype: Any) -> Value:
        return self._builder.convert(self, dtype)

    # -- operators ---------------------------------------------------------------------------

    def _binary(name: str, reflected: bool = False) -> Callable[[Value, Any], Value]:  # noqa: N805 - a factory
        def method(self: Value, other: Any) -> Value:
            b = self._builder
            if reflected:
                return getattr(b, name)(other, self)
            return getattr(b, name)(self, other)
        method.__name__ = f"__{'r' if reflected else ''}{name}__"
        return method

    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("sub"), _binary("sub", True)
    __mul__, __rmul__ = _binary("mul"), _binary("mul", True)
    __truediv__, __rtruediv__ = _binary("div"), _binary("div", True)
    __mod__, __rmod__ = _binary("rem"), _binary("rem", True)
    __pow__, __rpow__ = _binary("pow"), _binary("pow", True)
    __and__, __rand__ = _binary("and_"), _binary("and_", True)
    __or__, __ror__ = _binary("or_"), _binary("or_", True)
    __xor__, __rxor__ = _binary("xor"), _binary("xor", True)
    __matmul__, __rmatmul__ = _binary("dot"), _binary("dot", True)
    __lt__, __le__ = _binary("lt"), _binary("le")
    __gt__, __ge__ = _binary("gt"), _binary("ge")
    __eq__, __ne__ = _binary("eq"), _binary("ne")  # type: ignore[assignment]
    del _binary

    def __neg__(self) -> Value:
        return self._builder.neg(self)

    def __abs__(self) -> Value:
        return self._builder.abs(self)

    def __invert__(self) -> Value:
        return self._builder.not_(self)
