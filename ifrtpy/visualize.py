"""``visualize_sharding``: which device holds which block of a 1-D or 2-D array, as text.

The grid is cut at every edge of every shard's index domain; each cell is labelled with
the ids of the devices whose shard covers it (several ids: the block is replicated), and
each row and column with its half-open index range. For a 1-D array the grid is one row.
"""

from __future__ import annotations

import sys
from typing import TextIO, Union

from ifrtpy.array import Array
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import IndexDomain, Shape
from ifrtpy.sharding import Sharding

__all__ = ["visualize_sharding", "sharding_grid"]


def _cuts(domains: list[IndexDomain], dim: int, size: int) -> list[int]:
    edges = {0, size}
    for origin, shape in domains:
        edges.add(origin[dim])
        edges.add(origin[dim] + shape[dim])
    return sorted(edges)


def sharding_grid(sharding: Sharding, shape: Union[Shape, tuple[int, ...]]
                  ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[list[tuple[int, ...]]]]:
    """``(row ranges, column ranges, holders)`` of the grid :func:`visualize_sharding` draws.

    ``holders[i][j]`` are the ids (sorted, no repeats) of the devices whose shard covers
    rows ``row ranges[i]`` and columns ``column ranges[j]``; a 1-D array has one row
    range, ``(0, 1)``.
    """
    if not isinstance(sharding, Sharding):
        raise InvalidArgumentError(
            f"sharding must be an ifrtpy Sharding, got {type(sharding).__name__}")
    dims = tuple(Shape(shape))
    if len(dims) not in (1, 2):
        raise InvalidArgumentError(
            f"visualize_sharding draws 1-D and 2-D arrays; shape {list(dims)} has {len(dims)} "
            "dimensions")
    if 0 in dims:
        raise InvalidArgumentError(f"visualize_sharding cannot draw an empty array, shape {list(dims)}")
    domains = list(sharding.index_domains(dims))
    if len(dims) == 1:
        dims = (1,) + dims
        domains = [IndexDomain((0,) + tuple(o), (1,) + tuple(s)) for o, s in domains]
    rows = _cuts(domains, 0, dims[0])
    cols = _cuts(domains, 1, dims[1])
    ids = [device.id for device in sharding.devices]
    holders = []
    for r0, r1 in zip(rows, rows[1:]):
        line = []
        for c0, c1 in zip(cols, cols[1:]):
            line.append(tuple(sorted({
                ids[k] for k, (o, s) in enumerate(domains)
                if o[0] <= r0 and r1 <= o[0] + s[0] and o[1] <= c0 and c1 <= o[1] + s[1]})))
        holders.append(line)
    return list(zip(rows, rows[1:])), list(zip(cols, cols[1:])), holders


def _label(ids: tuple[int, ...]) -> str:
    return ",".join(map(str, ids)) if ids else "-"


def visualize_sharding(array_or_sharding: Union[Array, Sharding],
                       shape: Union[Shape, tuple[int, ...], None] = None, *,
                       file: TextIO | None = None) -> None:
    """Print which device holds which block of a 1-D or 2-D array.

    Pass an :class:`~ifrtpy.Array`, or a :class:`~ifrtpy.Sharding` and the array's
    ``shape``. Cells name the holding devices by id (replicated blocks list every holder,
    ``-`` marks a block no shard covers); row and column headers give index ranges.
    Prints to ``file`` (default ``sys.stdout``).
    """
    if isinstance(array_or_sharding, Array):
        if shape is not None:
            raise InvalidArgumentError("pass shape only with a sharding: an array has its own")
        sharding, shape = array_or_sharding.sharding, array_or_sharding.shape
    else:
        if shape is None:
            raise InvalidArgumentError("visualize_sharding(sharding, shape) needs the array's shape")
        sharding = array_or_sharding
    row_ranges, col_ranges, holders = sharding_grid(sharding, shape)
    one_d = len(tuple(Shape(shape))) == 1
    labels = [[_label(ids) for ids in line] for line in holders]
    heads = [f"{c0}:{c1}" for c0, c1 in col_ranges]
    widths = [max(len(h), *(len(line[j]) for line in labels)) + 2 for j, h in enumerate(heads)]
    left = 0 if one_d else max(len(f"{r0}:{r1}") for r0, r1 in row_ranges) + 1
    pad = " " * left

    def rule(a: str, b: str, c: str) -> str:
        return pad + a + b.join("─" * w for w in widths) + c

    out = [(pad + " " + " ".join(h.center(w) for h, w in zip(heads, widths))).rstrip(),
           rule("┌", "┬", "┐")]
    for i, line in enumerate(labels):
        head = "" if one_d else f"{row_ranges[i][0]}:{row_ranges[i][1]}".rjust(left - 1) + " "
        out.append(head + "│" + "│".join(t.center(w) for t, w in zip(line, widths)) + "│")
        if i + 1 < len(labels):
            out.append(rule("├", "┼", "┤"))
    out.append(rule("└", "┴", "┘"))
    print("\n".join(out), file=sys.stdout if file is None else file)
