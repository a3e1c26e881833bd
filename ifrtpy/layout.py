"""Device layouts: how an array's elements are ordered in a device's memory.

A :class:`Layout` is XLA's tiled layout as PJRT reports it: ``minor_to_major`` lists the
dimensions from the fastest varying to the slowest (``(1, 0)`` is row-major for rank 2,
NumPy's C order; ``(0, 1)`` column-major, Fortran order), ``tiles`` the tile shapes applied
in turn (empty for a plain dense layout; accelerators tile, e.g. ``((8, 128),)``), and
``element_size_in_bits`` the packed size of a sub-byte element (0: the dtype's own size).
Its text is XLA's (``{1,0:T(8,128)(2,1)}``, ``{0:T(1024)(128)(8,1)E(4)}``), both ways.
"""

from __future__ import annotations

import re
from typing import Iterable

from ifrtpy.errors import InvalidArgumentError

__all__ = ["Layout"]


class Layout:
    """An immutable, hashable tiled device layout (compares by value)."""

    __slots__ = ("_minor_to_major", "_tiles", "_element_size_in_bits")

    _minor_to_major: tuple[int, ...]
    _tiles: tuple[tuple[int, ...], ...]
    _element_size_in_bits: int

    def __init__(self, minor_to_major: Iterable[int], tiles: Iterable[Iterable[int]] = (),
                 element_size_in_bits: int = 0):
        m2m = tuple(minor_to_major)
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in m2m):
            raise InvalidArgumentError(f"Layout minor_to_major must hold ints, got {m2m!r}")
        if sorted(m2m) != list(range(len(m2m))):
            raise InvalidArgumentError(
                f"Layout minor_to_major must be a permutation of 0..{len(m2m) - 1}, got {m2m}")
        tile_shapes = tuple(tuple(t) for t in tiles)
        for t in tile_shapes:
            if not t or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1
                                for d in t):
                raise InvalidArgumentError(
                    f"Layout tiles must be non-empty shapes of positive ints, got {tile_shapes}")
        if (not isinstance(element_size_in_bits, int) or isinstance(element_size_in_bits, bool)
                or element_size_in_bits < 0):
            raise InvalidArgumentError(
                f"Layout element_size_in_bits must be an int >= 0, got {element_size_in_bits!r}")
        object.__setattr__(self, "_minor_to_major", m2m)
        object.__setattr__(self, "_tiles", tile_shapes)
        object.__setattr__(self, "_element_size_in_bits", element_size_in_bits)

    @classmethod
    def parse(cls, text: str | bytes) -> Layout:
        """The Layout of XLA's layout text (what PJRT plugins serialize), e.g.
        ``"{1,0:T(8,128)(2,1)}"``. A memory space (``S(n)``) is dropped, as PJRT tracks
        memories apart from layouts; InvalidArgumentError for text that is not a dense
        layout of that form (sparse, split or padded layouts are not held)."""
        if isinstance(text, bytes):
            text = text.decode("ascii", "replace")
        match = _LAYOUT_TEXT.fullmatch(text.strip())
        if match is None:
            raise InvalidArgumentError(f"not an XLA dense layout: {text!r}")
        dims, tiles, bits = match.group("dims"), match.group("tiles"), match.group("bits")
        return cls([int(d) for d in dims.split(",")] if dims else (),
                   [[int(d) for d in t.split(",")] for t in re.findall(r"\(([\d,]+)\)", tiles or "")],
                   int(bits) if bits else 0)

    @classmethod
    def row_major(cls, rank: int) -> Layout:
        """The dense major-to-minor layout (NumPy's C order), the usual default."""
        return cls(tuple(range(rank - 1, -1, -1)))

    @classmethod
    def column_major(cls, rank: int) -> Layout:
        """The dense minor-to-major layout (NumPy's Fortran order)."""
        return cls(tuple(range(rank)))

    @property
    def minor_to_major(self) -> tuple[int, ...]:
        return self._minor_to_major

    @property
    def tiles(self) -> tuple[tuple[int, ...], ...]:
        return self._tiles

    @property
    def element_size_in_bits(self) -> int:
        return self._element_size_in_bits

    @property
    def rank(self) -> int:
        return len(self._minor_to_major)

    def accepts(self, other: Layout) -> bool:
        """Whether an array in layout ``other`` is in this layout as asked for: the same
        dimension order, and this layout's tiles and element size unless it states none
        (an untiled layout asks for a dimension order, tiled as the device chooses)."""
        return (self._minor_to_major == other._minor_to_major
                and self._tiles in ((), other._tiles)
                and self._element_size_in_bits in (0, other._element_size_in_bits))

    def byte_strides(self, dims: Iterable[int], itemsize: int) -> tuple[int, ...]:
        """Strides of a dense (untiled) array of ``dims`` in this layout, NumPy-style.

        InvalidArgumentError for a tiled layout or a rank mismatch.
        """
        dims = tuple(dims)
        if self._tiles:
            raise InvalidArgumentError(f"{self} is tiled: it has no NumPy strides")
        if len(dims) != self.rank:
            raise InvalidArgumentError(f"{self} has rank {self.rank}, the dims {dims} rank {len(dims)}")
        strides = [0] * len(dims)
        step = itemsize
        for d in self._minor_to_major:
            strides[d] = step
            step *= dims[d]
        return tuple(strides)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Layout is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return (self._minor_to_major == other._minor_to_major and self._tiles == other._tiles
                and self._element_size_in_bits == other._element_size_in_bits)

    def __hash__(self) -> int:
        return hash((self._minor_to_major, self._tiles, self._element_size_in_bits))

    def __reduce__(self) -> tuple[type, tuple[tuple[int, ...], tuple[tuple[int, ...], ...], int]]:
        return (Layout, (self._minor_to_major, self._tiles, self._element_size_in_bits))

    def __repr__(self) -> str:
        tiles = f", tiles={self._tiles}" if self._tiles else ""
        bits = f", element_size_in_bits={self._element_size_in_bits}" if self._element_size_in_bits else ""
        return f"Layout(minor_to_major={self._minor_to_major}{tiles}{bits})"

    def __str__(self) -> str:
        """XLA's text of the layout (:meth:`parse` reads it back)."""
        tiles = ("T" + "".join(f"({','.join(map(str, t))})" for t in self._tiles)) if self._tiles else ""
        bits = f"E({self._element_size_in_bits})" if self._element_size_in_bits else ""
        extra = tiles + bits
        return "{" + ",".join(map(str, self._minor_to_major)) + (":" + extra if extra else "") + "}"


#: XLA's text of a dense layout: dimensions, then tiles, element size and memory space.
_LAYOUT_TEXT = re.compile(
    r"\{(?P<dims>\d+(?:,\d+)*)?(?::(?:T(?P<tiles>(?:\([\d,]+\))+))?(?:E\((?P<bits>\d+)\))?"
    r"(?:S\(\d+\))?)?\}")
