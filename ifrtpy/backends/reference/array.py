"""ReferenceArray: the reference backend's array, one NumPy array per addressable shard.

The array and its client operations are the host-held arrays of
:mod:`ifrtpy.backends.host_arrays` (shared with the PjRt backend's STRING arrays).
"""

from __future__ import annotations

from ifrtpy.backends.host_arrays import HostArray

__all__ = ["ReferenceArray"]


class ReferenceArray(HostArray):
    """An array of a ReferenceClient: ``shards[i]`` is the data of the i-th addressable
    shard of ``sharding`` (read-only NumPy arrays; object arrays of ``str``/``bytes`` for
    DType STRING). Made by the client's operations."""

    __slots__ = ()
