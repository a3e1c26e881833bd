"""How an array reads as text: its values printed as NumPy prints them, and what NumPy's
habits on it (``a + 1``, ``a[0]``, ``a.sum()``) say instead.

NumPy's print options decide (``np.printoptions``): an array of more than ``threshold``
elements is summarised, each dimension longer than ``2 * edgeitems`` showing only its first
and last ``edgeitems``. :func:`printed_indices` says which elements those are, so that an
array is read no further than what is printed; :func:`array_repr` and :func:`array_str`
print them exactly as NumPy prints the whole array.
"""

from __future__ import annotations

import sys
from typing import Sequence

import numpy as np

__all__ = ["printed_indices", "array_repr", "array_str", "refusal"]


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
