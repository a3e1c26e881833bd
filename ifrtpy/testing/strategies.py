"""Hypothesis strategies for ifrtpy values: dtypes, shapes, host arrays, meshes, specs, shardings.

Everything here draws only what every backend must accept: host arrays hold valid values
of their dtype, and shardings divide their shape evenly. Compare host arrays byte-wise
(``a.tobytes() == b.tobytes()``): float dtypes may hold NaNs with payloads, which ``==``
never equates.
"""

from __future__ import annotations

import math
from typing import Sequence

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from ifrtpy.device import Device
from ifrtpy.mesh import Mesh, NamedSharding, PartitionSpec
from ifrtpy.sharding import ConcreteEvenSharding, ConcreteSharding, SingleDeviceSharding

__all__ = [
    "DTYPES",
    "SUB_BYTE_DTYPES",
    "dtypes",
    "shapes",
    "host_arrays",
    "meshes",
    "partition_specs",
    "shardings",
]

#: Sub-byte dtypes (one byte per element on the host), with the range of valid values.
_SUB_BYTE_INT_RANGES = {
    np.dtype(ml_dtypes.int2): (-2, 1),
    np.dtype(ml_dtypes.uint2): (0, 3),
    np.dtype(ml_dtypes.int4): (-8, 7),
    np.dtype(ml_dtypes.uint4): (0, 15),
}
_FLOAT4 = np.dtype(ml_dtypes.float4_e2m1fn)
SUB_BYTE_DTYPES: tuple[np.dtype, ...] = (*_SUB_BYTE_INT_RANGES, _FLOAT4)

_FLOAT8_NAMES = ("float8_e3m4", "float8_e4m3", "float8_e4m3fn", "float8_e4m3b11fnuz",
                 "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")

#: Every dtype an ifrtpy array can hold on the host.
DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(d) for d in (
    np.bool_, np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128,
    ml_dtypes.bfloat16, *(getattr(ml_dtypes, n) for n in _FLOAT8_NAMES if hasattr(ml_dtypes, n)),
)) + SUB_BYTE_DTYPES

_AXIS_NAMES = ("x", "y", "z")


def dtypes(sub_byte: bool = True) -> st.SearchStrategy[np.dtype]:
    """Any NumPy dtype of :data:`DTYPES`; ``sub_byte=False`` leaves out the 2- and 4-bit ones."""
    return st.sampled_from([d for d in DTYPES if sub_byte or d not in SUB_BYTE_DTYPES])


def shapes(max_rank: int = 4, max_side: int = 6, min_rank: int = 0) -> st.SearchStrategy[tuple]:
    """Shapes of rank ``min_rank..max_rank`` with sides ``0..max_side`` (scalars and
    zero-size shapes included)."""
    return st.lists(st.integers(0, max_side), min_size=min_rank, max_size=max_rank).map(tuple)


@st.composite
def host_arrays(draw, dtype, shape) -> np.ndarray:
    """A C-contiguous ndarray of ``dtype`` and ``shape`` holding valid values: bool 0/1,
    sub-byte integers in range, float4 from its 16 codes, anything else from random bytes."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    n = math.prod(shape)
    if dtype == np.bool_:
        bits = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return np.array(bits, dtype).reshape(shape)
    if dtype in _SUB_BYTE_INT_RANGES:
        lo, hi = _SUB_BYTE_INT_RANGES[dtype]
        values = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
        return np.array(values, np.int8).astype(dtype).reshape(shape)
    if dtype == _FLOAT4:
        codes = draw(st.lists(st.integers(0, 15), min_size=n, max_size=n))
        return np.array(codes, np.uint8).view(dtype).reshape(shape)
    raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
    return np.frombuffer(raw, dtype).reshape(shape).copy()


def _factorisations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered way to write ``n`` as a product of ``parts`` positive integers."""
    if parts == 1:
        return [(n,)]
    return [(d, *rest) for d in range(1, n + 1) if n % d == 0
            for rest in _factorisations(n // d, parts - 1)]


@st.composite
def meshes(draw, devices: Sequence[Device], max_axes: int = 3) -> Mesh:
    """A mesh over all of ``devices`` in a random order, with 1..``max_axes`` axes
    ("x", "y", "z") whose sizes multiply to ``len(devices)``."""
    devices = list(devices)
    rank = draw(st.integers(1, max_axes))
    sizes = draw(st.sampled_from(_factorisations(len(devices), rank)))
    order = draw(st.permutations(devices))
    grid = np.empty(len(order), dtype=object)
    grid[:] = order
    return Mesh(grid.reshape(sizes), _AXIS_NAMES[:rank])


@st.composite
def partition_specs(draw, mesh: Mesh, rank: int, shape: Sequence[int] | None = None
                    ) -> PartitionSpec:
    """A spec of ``rank`` entries using each mesh axis at most once (an entry is None, one
    axis or a tuple of axes). With ``shape``, dimension ``d`` is only split into a number
    of pieces that divides ``shape[d]``."""
    remaining = list(draw(st.permutations(mesh.axis_names)))
    sizes = mesh.shape
    entries = []
    for d in range(rank):
        axes, pieces = [], 1
        for axis in list(remaining):
            fits = shape is None or shape[d] % (pieces * sizes[axis]) == 0
            if fits and draw(st.booleans()):
                axes.append(axis)
                pieces *= sizes[axis]
                remaining.remove(axis)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*entries)


def _named_to_concrete(named: NamedSharding, shape) -> ConcreteSharding:
    domains = named.index_domains(shape)
    return ConcreteSharding(named.devices, shape, [d.shape for d in domains], domains,
                            memory_kind=named.memory_kind)


@st.composite
def shardings(draw, devices: Sequence[Device], shape: Sequence[int],
              memory_kinds: Sequence | None = None):
    """A sharding of an array of ``shape`` over some of ``devices`` (a random subset in a
    random order), of any kind: SingleDeviceSharding, NamedSharding, the
    ShardingParamSharding it lowers to, a fully replicated ConcreteEvenSharding, or a
    ConcreteSharding with index domains. Shards always divide ``shape`` evenly. With
    ``memory_kinds``, the memory kind is drawn from them (else the default)."""
    shape = tuple(shape)
    kind = None if not memory_kinds else draw(st.sampled_from(list(memory_kinds)))
    which = draw(st.sampled_from(
        ["single", "named", "sharding_param", "concrete_even", "concrete"]))
    if which == "single":
        return SingleDeviceSharding(draw(st.sampled_from(list(devices))), kind)
    count = draw(st.integers(1, len(devices)))
    chosen = draw(st.permutations(list(devices)))[:count]
    if which == "concrete_even":
        return ConcreteEvenSharding(chosen, shape, shape, True, kind)
    mesh = draw(meshes(chosen))
    named = NamedSharding(mesh, draw(partition_specs(mesh, len(shape), shape)), kind)
    if which == "sharding_param":
        return named.lower(len(shape))
    if which == "concrete":
        return _named_to_concrete(named, shape)
    return named
