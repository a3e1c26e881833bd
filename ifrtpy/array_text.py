"""How an array reads as text: its values printed as NumPy prints them (read from the
shards that hold the printed elements only), and what NumPy's habits on it (``a + 1``,
``a == b``, ``bool(a)``, ``a[0]``, ``a.sum()``) say instead.

NumPy's print options decide (``np.printoptions``): an array of more than ``threshold``
elements is summarised, each dimension longer than ``2 * edgeitems`` showing only its first
and last ``edgeitems``. :func:`printed_indices` says which elements those are, so that an
array is read no further than what is printed; :func:`array_repr` and :func:`array_str`
print them exactly as NumPy prints the whole array.
"""

from __future__ import annotations

import abc
import sys
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ifrtpy.errors import InvalidArgumentError, UnimplementedError
from ifrtpy.shape import DynamicShape, IndexDomain
from ifrtpy.sharding import OpaqueSharding, SingleDeviceShardSemantics, check_reduced

if TYPE_CHECKING:
    from ifrtpy.array import Array

__all__ = ["printed_indices", "array_repr", "array_str", "refusal", "printed_values",
           "distinct_shards", "REPR_COPY_BYTES", "ArrayType", "install_refusals"]


def printed_indices(dims: Sequence[int], threshold: int, edgeitems: int
                    ) -> list[list[int]] | None:
    """For an array of ``dims``: None when NumPy reads every element to print it; else, per
    dimension, the indices of the elements it prints: all of a dimension of at most
    ``2 * edgeitems``, else its first and last ``edgeitems`` with one index between them
    standing for those left out (NumPy never reads it). NumPy reads every element of an
    array of at most ``threshold``, and (to format them) with ``edgeitems`` 0."""
    size = 1
    for n in dims:
        size *= n
    if size <= threshold or edgeitems < 1 or all(n <= 2 * edgeitems for n in dims):
        return None
    return [list(range(n)) if n <= 2 * edgeitems else
            [*range(edgeitems), edgeitems - 1, *range(n - edgeitems, n)] for n in dims]


def _threshold(values: np.ndarray, summarised: bool) -> int:
    """The threshold that makes NumPy print ``values`` (the whole array, or the elements
    :func:`printed_indices` names) as it prints the array they come from, which it
    summarises or not: where it elides elements, ``values`` has one in their place."""
    return values.size - 1 if summarised else sys.maxsize


def _values(values: np.ndarray, summarised: bool, **options) -> str:
    return np.array2string(values, threshold=_threshold(values, summarised), **options)


def array_repr(name: str, values: np.ndarray | None, summarised: bool, why: str,
               shape: tuple[int, ...] | str, dtype: str, sharding: str) -> str:
    """``name(values, shape=..., dtype=..., sharding=...)``, the values as NumPy's repr
    writes them and, with its rule, the shape where they do not show it; ``<why>`` in
    their place where ``values`` is None. A part that would pass NumPy's line width
    starts a line of its own."""
    prefix = f"{name}("
    options = np.get_printoptions()
    width = options["linewidth"]
    extras = [f"dtype={dtype}", f"sharding={sharding}"]
    if values is None:
        text, extras = f"{prefix}<{why}>,", [f"shape={shape}", *extras]
    else:
        text = prefix + _values(values, summarised, max_line_width=width, separator=", ",
                                prefix=prefix, suffix=",") + ","
        size = int(np.prod(shape)) if isinstance(shape, tuple) else values.size
        if size > options["threshold"] or (size == 0 and shape != (0,)):
            extras.insert(0, f"shape={shape}")
    for i, extra in enumerate(extras):
        piece = extra + (")" if i == len(extras) - 1 else ",")
        last_line = len(text) - (text.rfind("\n") + 1)
        text += (" " if last_line + 1 + len(piece) <= width else "\n" + " " * len(prefix)) + piece
    return text


def array_str(values: np.ndarray, summarised: bool) -> str:
    """The values as NumPy's ``str`` writes the array they come from."""
    with np.printoptions(threshold=_threshold(values, summarised)):
        return str(values)


#: What ifrtpy arrays are, and what to do instead of NumPy's operations on one.
_WHAT_THEY_ARE = (
    "ifrtpy arrays are runtime buffers on devices, not a NumPy or jax array library: "
    "compile a program to compute on them (ifrtpy.builder, StableHLO text or a function "
    "lowered by jax: docs/programs.md), read the values with np.asarray(a){then}, or use "
    "jax on the same buffers with ifrt.to_jax(a){then}")


def refusal(start: str, then: str = "") -> str:
    """The message of NumPy's habit ``start`` (Python's own words for it) on an ifrtpy
    array; ``then`` is the same habit on ``np.asarray(a)`` and ``ifrt.to_jax(a)``
    (``.sum()``)."""
    return f"{start}. {_WHAT_THEY_ARE.format(then=then)}"


def dims_of(shape: Any) -> tuple[int, ...]:
    """The dimensions of a Shape (or of any sequence of ints) as a tuple."""
    dims = getattr(shape, "dims", shape)
    if callable(dims):
        dims = dims()
    return tuple(int(d) for d in dims)


def num_elements(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def shape_text(shape: Any) -> str:
    """``[2, 3]`` for a static shape; a DynamicShape's ``[<=2,3]``."""
    if isinstance(shape, DynamicShape):
        return shape.debug_string()
    return str(list(dims_of(shape)))


def distinct_shards(array: Array, shards: Sequence[Any]) -> dict[IndexDomain, Any]:
    """For a read of the whole ``array`` (a print, ``copy_to_host_buffer``): the first of
    ``shards`` (one item per addressable shard, in device order: buffers, data,
    single-device arrays) holding each index domain, by domain. InvalidArgumentError for an
    OpaqueSharding or unreduced axes (the shards hold partial values), UnimplementedError
    when the addressable shards do not hold every element."""
    if isinstance(array.sharding, OpaqueSharding):
        raise InvalidArgumentError("an array with an OpaqueSharding cannot be copied to the host")
    check_reduced(array.sharding, "copy_to_host_buffer")
    domains = array.sharding.index_domains(
        array.shape, SingleDeviceShardSemantics.ADDRESSABLE_SHARDS)
    distinct: dict[IndexDomain, Any] = {}
    for domain, shard in zip(domains, shards):
        distinct.setdefault(domain, shard)  # replicas of a domain are read once
    covered = sum(num_elements(dims_of(d.shape)) for d in distinct)
    size = num_elements(dims_of(array.shape))
    if covered != size:
        raise UnimplementedError(
            f"copy_to_host_buffer: the addressable shards hold {covered} of the {size} "
            f"elements of {array.debug_string()}")
    return distinct


#: The most bytes a repr copies whole from shards the host cannot view (device memory of
#: an accelerator; arrays whose backend offers no view) to print their elements; a repr that
#: would copy more says so instead of printing them.
REPR_COPY_BYTES = 64 << 20


def printed_values(array: Array) -> tuple[np.ndarray | None, bool, str]:
    """What ``print(array)`` shows: ``(values, summarised, "")``, the whole array or, where
    NumPy's print options summarise it (``summarised``), the elements NumPy prints
    (:func:`ifrtpy.array_text.printed_indices`), read from the shards that hold them only;
    or ``(None, False, why)`` without reading anything of a deleted or donated array, an
    error array or one whose shards are partly in other processes, and for one whose
    printed elements lie in shards the host cannot view, of more than
    :data:`REPR_COPY_BYTES` in all. A shard the host can view (NumPy's ``__array__`` with
    ``copy=False``: host memory) gives only the printed elements. Never raises."""
    if array.is_deleted():
        return None, False, "deleted or donated"
    if array.error is not None:
        return None, False, f"error: {_one_line(array.error)}"
    try:
        return _read_printed(array)
    except Exception as e:  # a repr must not fail: it says why it shows no values
        return None, False, f"values not read: {_one_line(e)}"


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:200] + '...' if len(text) > 200 else text}"


def _read_printed(array: Array) -> tuple[np.ndarray | None, bool, str]:
    shards = array.disassemble_into_single_device_arrays()  # moves no data
    try:
        distinct = distinct_shards(array, shards)  # before any read
    except UnimplementedError:
        return None, False, (f"not fully addressable: this process holds {len(shards)} of its "
                             f"{len(array.sharding.devices)} shards")
    dims = dims_of(array.shape)
    options = np.get_printoptions()
    indices = printed_indices(dims, options["threshold"], options["edgeitems"])
    reads: list[tuple[Array, Any, Any]] = []  # (shard, places in values, places in the shard)
    for domain, shard in distinct.items():
        if indices is None:
            reads.append((shard, domain.slices(), ...))
            continue
        origin, shape = domain
        places = [[(j, i - start) for j, i in enumerate(printed) if start <= i < start + n]
                  for printed, start, n in zip(indices, origin, dims_of(shape))]
        if all(places):
            reads.append((shard, np.ix_(*[[j for j, _ in p] for p in places]),
                          np.ix_(*[[i for _, i in p] for p in places])))
    views = [_host_view(shard) for shard, _, _ in reads]
    copied = [shard for (shard, _, _), view in zip(reads, views) if view is None]
    size = sum(shard.nbytes for shard in copied)
    if size > REPR_COPY_BYTES:
        return None, False, (
            f"values not read: printing them would copy {len(copied)} shards ({size} bytes) "
            f"the host cannot view, more than the {REPR_COPY_BYTES} bytes a repr copies; "
            "np.asarray(a) copies the whole array")
    values = np.empty(dims if indices is None else [len(i) for i in indices],
                      array.dtype.to_numpy())
    copies = iter([shard.copy_to_host_buffer() for shard in copied])
    for (_, into, take), view in zip(reads, views):
        values[into] = (next(copies).result() if view is None else view)[take]
    return values, num_elements(dims) > options["threshold"], ""


def _host_view(shard: Array) -> np.ndarray | None:
    """The data of single-device ``shard`` without a copy where the host can view it."""
    try:
        return shard.__array__(None, copy=False)
    except (ValueError, TypeError):  # a copy is needed; an __array__ without copy=
        return None


def text_of(array: Array, values: np.ndarray | None, summarised: bool, why: str) -> str:
    """``repr(array)`` for what :func:`printed_values` gave."""
    shape = array.shape
    shown = shape_text(shape) if isinstance(shape, DynamicShape) else dims_of(shape)
    return array_repr(type(array).__name__, values, summarised, why, shown, array.dtype.name,
                      repr(array.sharding))


# -- NumPy's habits, refused with what to do instead -------------------------------------


def _refuse_binary(symbol: str, reflected: bool) -> Any:
    def refuse(self: Any, other: Any) -> Any:
        left, right = type(self).__name__, type(other).__name__
        if reflected:
            left, right = right, left
        raise TypeError(refusal(f"unsupported operand type(s) for {symbol}: {left!r} and {right!r}"))
    return refuse


def _compared(symbol: str, left: Any, right: Any) -> TypeError:
    return TypeError(refusal(f"{symbol!r} not supported between instances of "
                             f"{type(left).__name__!r} and {type(right).__name__!r}"))


def _refuse_comparison(symbol: str) -> Any:
    def refuse(self: Any, other: Any) -> Any:
        raise _compared(symbol, self, other)
    return refuse


def _refuse_unary(symbol: str) -> Any:
    def refuse(self: Any) -> Any:
        raise TypeError(refusal(f"bad operand type for {symbol}: {type(self).__name__!r}"))
    return refuse


def _refuse_call(start: str, then: str = "") -> Any:
    def refuse(self: Any, *args: Any) -> Any:
        raise TypeError(refusal(start.format(type(self).__name__), then))
    return refuse


class _NumpyOnly:
    """A public attribute of NumPy's ndarray that ifrtpy arrays lack: reading it raises
    AttributeError (so ``hasattr`` stays false) saying what to do instead."""

    def __init__(self, name: str, method: bool):
        self.name, self.then = name, f".{name}(...)" if method else f".{name}"

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        owner = type(obj) if obj is not None else owner
        raise AttributeError(refusal(
            f"{owner.__name__!r} object has no attribute {self.name!r}", self.then))


_BINARY = [("add", "+"), ("sub", "-"), ("mul", "*"), ("matmul", "@"), ("truediv", "/"),
           ("floordiv", "//"), ("mod", "%"), ("divmod", "divmod()"), ("pow", "** or pow()"),
           ("lshift", "<<"), ("rshift", ">>"), ("and", "&"), ("xor", "^"), ("or", "|")]
#: Comparisons, by dunder and by NumPy's ufunc: jax and NumPy compare elementwise, so
#: neither identity (Python's default) nor an elementwise NumPy array is answered.
_COMPARISONS = [("lt", "less", "<"), ("le", "less_equal", "<="), ("gt", "greater", ">"),
                ("ge", "greater_equal", ">="), ("eq", "equal", "=="), ("ne", "not_equal", "!=")]
_UFUNC_SYMBOL = {ufunc: symbol for _, ufunc, symbol in _COMPARISONS}


def _array_ufunc(self: Any, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """NumPy's comparisons with an ifrtpy array (``x == a``) refused as ``a == x`` is; any
    other ufunc takes the array's values (``np.sum(a)``), as through ``__array__``."""
    if method == "__call__" and ufunc.__name__ in _UFUNC_SYMBOL and len(inputs) == 2:
        raise _compared(_UFUNC_SYMBOL[ufunc.__name__], *inputs)
    inputs = tuple(np.asarray(x) if getattr(type(x), "__array_ufunc__", None) is _array_ufunc
                   else x for x in inputs)
    return getattr(ufunc, method)(*inputs, **kwargs)


def _instance_dir(self: Any) -> list[str]:
    hidden = type(self)._refused
    return [name for name in object.__dir__(self) if name not in hidden]


class ArrayType(abc.ABCMeta):
    """The type of ``ifrtpy.Array``: ``dir(Array)`` (and so ``help(ifrt.Array)``) lists what
    an array does, not the refusals :func:`install_refusals` puts on it."""

    def __dir__(cls) -> list[str]:
        hidden: frozenset[str] = getattr(cls, "_refused", frozenset())
        return [name for name in super().__dir__() if name not in hidden]


def install_refusals(cls: Any) -> None:
    """Put NumPy's habits on array class ``cls`` (of type :class:`ArrayType`), each refused
    with what ifrtpy arrays are and what to do instead: operators, comparisons and truth
    tests (``a == 1``, ``x == a`` with a NumPy ``x``, ``bool(a)``), indexing, ``len``,
    iteration, conversions, and every public attribute of NumPy's ndarray ``cls`` lacks
    (``a.sum()``, ``a.T``: AttributeError, so that ``hasattr`` stays false). Arrays stay
    hashable by identity (dict keys, set members, ``a in [a]``)."""
    refusals: dict[str, Any] = {}
    for name, symbol in _BINARY:
        refusals[f"__{name}__"] = _refuse_binary(symbol, False)
        refusals[f"__r{name}__"] = _refuse_binary(symbol, True)
    for name, _, symbol in _COMPARISONS:
        refusals[f"__{name}__"] = _refuse_comparison(symbol)
    for name, symbol in [("neg", "unary -"), ("pos", "unary +"), ("invert", "unary ~"),
                         ("abs", "abs()")]:
        refusals[f"__{name}__"] = _refuse_unary(symbol)
    refusals.update(
        __bool__=_refuse_call("the truth value of a {!r} object is not defined (bool(a), "
                              "if a, a and b)", ".any()"),
        __getitem__=_refuse_call("{!r} object is not subscriptable"),
        __setitem__=_refuse_call("{!r} object does not support item assignment"),
        __len__=_refuse_call("object of type {!r} has no len()"),
        __iter__=_refuse_call("{!r} object is not iterable"),
        __float__=_refuse_call("float() argument must be a string or a real number, not {!r}"),
        __int__=_refuse_call("int() argument must be a string, a bytes-like object or a real "
                             "number, not {!r}"),
        __complex__=_refuse_call("complex() first argument must be a string or a number, not {!r}"),
        __array_ufunc__=_array_ufunc,
    )
    refusals.update({name: _NumpyOnly(name, callable(getattr(np.ndarray, name)))
                     for name in dir(np.ndarray)
                     if not name.startswith("_") and not hasattr(cls, name)})
    for name, refuse in refusals.items():
        setattr(cls, name, refuse)
    cls.__dir__ = _instance_dir
    cls.__hash__ = object.__hash__  # by identity, as before __eq__ was refused
    cls._refused = frozenset(refusals)
