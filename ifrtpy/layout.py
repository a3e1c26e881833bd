"""Device layouts: how an array's elements are ordered in a device's memory.

A :class:`Layout` is XLA's tiled layout as PJRT reports it (``PJRT_Buffer_MemoryLayout``
of type Tiled): ``minor_to_major`` lists the dimensions from the fastest varying to the
slowest (``(1, 0)`` is row-major for rank 2, NumPy's C order; ``(0, 1)`` column-major,
Fortran order), and ``tiles`` the tile shapes applied in turn (empty for a plain dense
layout; accelerators tile, e.g. ``((8, 128),)``).
"""

from __future__ import annotations

from typing import Iterable

from ifrtpy.errors import InvalidArgumentError

__all__ = ["Layout"]


class Layout:
    """An immutable, hashable tiled device layout (compares by value)."""

    __slots__ = ("_minor_to_major", "_tiles")

    _minor_to_major: tuple[int, ...]
    _tiles: tuple[tuple[int, ...], ...]

    def __init__(self, minor_to_major: Iterable[int], tiles: Iterable[Iterable[int]] = ()):
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
        object.__setattr__(self, "_minor_to_major", m2m)
        object.__setattr__(self, "_tiles", tile_shapes)

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
    def rank(self) -> int:
        return len(self._minor_to_major)

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
        return self._minor_to_major == other._minor_to_major and self._tiles == other._tiles

    def __hash__(self) -> int:
        return hash((self._minor_to_major, self._tiles))

    def __reduce__(self) -> tuple[type, tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]]:
        return (Layout, (self._minor_to_major, self._tiles))

    def __repr__(self) -> str:
        tiles = f", tiles={self._tiles}" if self._tiles else ""
        return f"Layout(minor_to_major={self._minor_to_major}{tiles})"

    def __str__(self) -> str:
        tiles = "".join(f"T({','.join(map(str, t))})" for t in self._tiles)
        return "{" + ",".join(map(str, self._minor_to_major)) + (":" + tiles if tiles else "") + "}"
