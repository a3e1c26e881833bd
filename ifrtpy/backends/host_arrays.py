"""HostArray: an array held as one read-only NumPy array per addressable shard, and the
client operations over such arrays.

The reference backend's arrays are HostArrays, and so are the PjRt backend's STRING arrays
(PJRT buffers hold no strings; IFRT's ``BasicStringArray`` is held the same way). Each
operation takes the array class it makes (``array_type``), so both backends get arrays of
their own class. Shard data is never written in place once an array holds it, so arrays
may share it (REUSE_INPUT) without copies. Every operation is checked completely first
(:mod:`ifrtpy.array_plans`), so a failure leaves the inputs as they were. Transfers are
synchronous: every ready future is already resolved.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from ifrtpy.array import (
    ArrayCopySemantics, ArraySpec, HostBufferSemantics, StoredArray, deleted_error,
    distinct_shards, numpy_of_view, plan_fully_replicated_shard, single_device_piece,
)
from ifrtpy.array_plans import (
    addressable_domains, check_placement, plan_assemble, plan_copy, plan_disassemble,
    plan_error_arrays, plan_reshard,
)
from ifrtpy.bitcast import plan_bitcast
from ifrtpy.dtypes import DType, host_form
from ifrtpy.errors import (
    InvalidArgumentError, UnimplementedError, check_enum,
)
from ifrtpy.future import Future
from ifrtpy.layout import Layout
from ifrtpy.shape import Shape
from ifrtpy.user_context import current_user_context
from ifrtpy.sharding import OpaqueSharding, Sharding, SingleDeviceShardSemantics

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
REUSE_INPUT = ArrayCopySemantics.REUSE_INPUT
DONATE_INPUT = ArrayCopySemantics.DONATE_INPUT


class HostArray(StoredArray):
    """An array whose ``shards[i]`` is the data of the i-th addressable shard of
    ``sharding`` (read-only NumPy arrays; object arrays of ``str``/``bytes`` for DType
    STRING). Made by the operations of this module."""

    __slots__ = ("_client", "_dtype", "_shape", "_sharding", "_shards", "_error", "_deleted",
                 "_take_lock", "_user_context", "_layout", "__weakref__")

    def __init__(self, client, dtype: DType, shape: Shape, sharding: Sharding,
                 shards: tuple, error: BaseException | None = None,
                 layout: Layout | None = None):
        self._client = client
        self._dtype = dtype
        self._shape = shape
        self._sharding = sharding
        self._shards = shards
        self._error = error
        self._deleted = False
        self._take_lock = threading.Lock()
        self._user_context = current_user_context()
        self._layout = layout  # the one it was made in; else read from the shards' strides

    @property
    def layout(self) -> Layout | None:
        """The memory order of the shards' data as a dense Layout (row-major unless made
        with another one); None for an error array or one with no addressable shard."""
        if self._error is not None or not self._shards:
            return None
        shard = self._live_shards()[0]
        return self._layout if self._layout is not None else _layout_of(shard)

    @property
    def shards(self) -> tuple:
        """The NumPy data of each addressable shard, in device order (read-only)."""
        return self._live_shards()

    def _live_shards(self) -> tuple:
        if self._deleted:
            raise deleted_error(self)
        return self._shards

    # -- lifetime -------------------------------------------------------------------------

    def ready_future(self) -> Future[None]:
        if self._error is not None:
            return Future.failed(self._error)
        if self._deleted:
            return Future.failed(
                deleted_error(self))
        return Future.ready(None)

    def delete(self) -> Future[None]:
        with self._take_lock:
            self._deleted = True
            self._shards = ()
        return Future.ready(None)

    def is_deleted(self) -> bool:
        return self._deleted

    def _data(self) -> tuple:
        return self._shards if self._error is not None else self._live_shards()

    def _copy_of(self, shards: tuple) -> tuple:
        return tuple(_frozen(s.copy(order="K")) for s in shards)

    def _drop_data(self) -> None:
        self._deleted = True
        self._shards = ()

    # -- shards ---------------------------------------------------------------------------

    def disassemble_into_single_device_arrays(self, copy_semantics=REUSE_INPUT,
                                              single_device_shard_semantics=ADDRESSABLE):
        opaque = isinstance(self._sharding, OpaqueSharding) and self._error is None
        plan = plan_disassemble(self, copy_semantics, single_device_shard_semantics,
                                [s.shape for s in self._shards] if opaque else None)
        shards = self._take(plan.copy_semantics)
        if self._error is not None:  # each piece fails as this array does
            return [type(self)(self._client, self._dtype, shape, sharding, (), self._error)
                    for shape, sharding in plan.pieces]
        return [type(self)(self._client, self._dtype, shape, sharding, (shard,),
                           layout=self._layout)
                for (shape, sharding), shard in zip(plan.pieces, shards)]

    def fully_replicated_shard(self, copy_semantics=REUSE_INPUT):
        sharding = plan_fully_replicated_shard(self)
        shards = self._take(copy_semantics)
        return type(self)(self._client, self._dtype, self._shape, sharding, shards[:1],
                          self._error)

    # -- host -----------------------------------------------------------------------------

    def copy_to_host_buffer(self, out=None, byte_strides=None) -> Future[np.ndarray]:
        if self._error is not None:
            return Future.failed(self._error)
        shards = self._live_shards()
        out = self._host_buffer(out, byte_strides)
        np.copyto(out, global_value(self, shards))
        return Future.ready(out)


    # -- zero-copy exchange (DLPack, NumPy views) -----------------------------------------

    def _single_shard(self, what: str) -> np.ndarray:
        """The data of a single-device numeric array, for ``what``; clear errors otherwise."""
        if self._error is not None:
            raise self._error
        shard = single_device_piece(self, self._live_shards(), what)
        if self._dtype.kind == DType.Kind.STRING:
            raise UnimplementedError(f"{what}: a STRING array holds Python objects, which "
                                     "DLPack cannot carry")
        return shard

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(kDLCPU, 0)`` for a single-device array: the reference backend's memory is the
        host's."""
        self._single_shard("__dlpack_device__()")
        return (1, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule of a single-device array's (read-only) data, as NumPy exports
        it: zero-copy and versioned, with the read-only flag, where ``max_version`` allows
        DLPack 1.x; a legacy capsule (which cannot say read-only) of a copy otherwise, and
        UnimplementedError for one with ``copy=False``, or for dtypes DLPack has no code
        for."""
        shard = self._single_shard("__dlpack__()")
        if copy is None and (max_version is None or max_version[0] < 1):
            copy = True
        try:
            return shard.__dlpack__(stream=stream, max_version=max_version,
                                    dl_device=dl_device, copy=copy)
        except (BufferError, TypeError) as e:
            raise UnimplementedError(f"__dlpack__ of {self.debug_string()}: {e}") from None

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """NumPy form of the array: a single-device numeric array is its own (read-only)
        data, without a copy unless ``copy=True``; other arrays are gathered into a new
        array, and ``copy=False`` raises ValueError for them."""
        shards = self._shards
        if (len(shards) == 1 and len(self._sharding.devices) == 1 and self._error is None
                and not self._deleted and self._dtype.kind != DType.Kind.STRING):
            return numpy_of_view(shards[0], dtype, copy)
        return super().__array__(dtype, copy)


def _frozen(data: np.ndarray) -> np.ndarray:
    data.flags.writeable = False
    return data


def global_value(array: HostArray, shards: tuple | None = None) -> np.ndarray:
    """The whole value of ``array`` as one (read-only) NumPy array, from its shards.

    InvalidArgumentError for an opaque sharding, UnimplementedError when the addressable
    shards do not cover the array."""
    shards = array._live_shards() if shards is None else shards
    sharding, dims = array.sharding, array.shape.dims
    if shards and sharding.is_fully_replicated:
        return shards[0]
    unique = distinct_shards(array, shards)
    out = np.empty(dims, array.dtype.to_numpy())
    for domain, shard in unique.items():
        out[(*domain.slices(), ...)] = shard
    return _frozen(out)


def split(data: np.ndarray, sharding: Sharding, shape: Shape, layout: Layout | None = None
          ) -> tuple:
    """The data of each addressable shard of ``sharding`` for the global value ``data``
    (fresh, read-only arrays; in ``layout``'s memory order, row-major where None)."""
    domains = addressable_domains(sharding, shape)
    if layout is not None and layout != Layout.row_major(layout.rank):
        return tuple(_frozen(_in_layout(data[(*d.slices(), ...)], layout)) for d in domains)
    return tuple(_frozen(np.array(data[(*d.slices(), ...)], order="C", copy=True))
                 for d in domains)


# -- layouts: the memory order of a shard's NumPy data ----------------------------------------

def check_layout(layout: Layout | None, rank: int) -> None:
    if layout is None:
        return
    if not isinstance(layout, Layout):
        raise InvalidArgumentError(f"layout must be an ifrtpy.Layout or None, got {layout!r}")
    if layout.rank != rank:
        raise InvalidArgumentError(f"layout {layout} has rank {layout.rank}, the data rank {rank}")
    if layout.tiles:
        raise UnimplementedError(f"arrays held as NumPy data have no tiled layouts, got {layout}")


def _in_layout(data: np.ndarray, layout: Layout) -> np.ndarray:
    """A copy of ``data`` whose memory holds the elements in ``layout``'s order."""
    major_to_minor = layout.minor_to_major[::-1]
    base = np.empty([data.shape[d] for d in major_to_minor], data.dtype)
    view = base.transpose(np.argsort(major_to_minor))
    view[...] = data
    return view


def _layout_of(data: np.ndarray) -> Layout:
    """The dense layout of ``data``'s memory order, read from its strides. A dimension of
    size 1 has the stride of the next more major one (dense strides: each is the product
    of the sizes of the more minor dimensions): it goes before it. Where several such
    dimensions share a stride, nothing tells their order: the answer puts them in
    decreasing order, as row-major does."""
    if data.flags.c_contiguous:
        return Layout.row_major(data.ndim)
    return Layout(sorted(range(data.ndim),
                         key=lambda d: (data.strides[d], data.shape[d] != 1, -d)))


# -- the client operations (each takes the array class it makes) ----------------------------

def make_array_from_host_buffer(array_type: type[HostArray], client: Any, data: Any,
                                sharding: Any, semantics: Any, on_done: Any, layout: Any
                                ) -> HostArray:
    """Each addressable device of ``sharding`` receives a copy of its own shard of
    ``data`` (the whole of it where the sharding replicates). The data is always copied
    before the call returns, so ``on_done`` runs before it returns too."""
    check_placement(client, sharding)
    check_enum(HostBufferSemantics, semantics, "semantics")
    if on_done is not None and not callable(on_done):
        raise InvalidArgumentError(f"on_done must be callable, got {on_done!r}")
    data = data if isinstance(data, np.ndarray) else np.asarray(data)
    check_layout(layout, data.ndim)
    data, dtype = host_form(data)
    shape = Shape(data.shape)
    if not sharding.devices.addressable_device_list():
        raise InvalidArgumentError(f"{sharding!r} has no addressable device to put the array on")
    shards = split(data, sharding, shape, layout)
    array = array_type(client, dtype, shape, sharding, shards, layout=layout)
    if on_done is not None:
        on_done()
    return array


def make_error_arrays(array_type: type[HostArray], client: Any, error: Any,
                      specs: Sequence[ArraySpec]) -> list[HostArray]:
    return [array_type(client, spec.dtype, Shape(spec.shape), spec.sharding, (), error)
            for spec in plan_error_arrays(client, error, specs)]


def assemble(array_type: type[HostArray], client: Any, shape: Any, sharding: Any, arrays: Any,
             copy_semantics: Any, shard_semantics: Any, dtype: Any) -> HostArray:
    plan = plan_assemble(client, shape, sharding, arrays, copy_semantics, shard_semantics, dtype,
                         array_type)
    taken = [a._take(plan.copy_semantics) for a in plan.arrays]
    if plan.error is not None:  # the result fails as its first failing input does
        return array_type(client, plan.dtype, plan.shape, plan.sharding, (), plan.error)
    return array_type(client, plan.dtype, plan.shape, plan.sharding, tuple(t[0] for t in taken))


def bitcast_arrays(array_type: type[HostArray], client: Any, arrays: Any, specs: Any,
                   semantics: Any) -> list[HostArray]:
    """Each shard's bytes viewed as the spec's dtype and shard shape (NumPy ``view``)."""
    plans = plan_bitcast(client, arrays, specs, semantics, array_type)
    out = []
    for plan in plans:
        spec, error = plan.spec, plan.array.error
        shards = plan.array._take(semantics)
        if error is not None:
            out.append(array_type(client, spec.dtype, Shape(spec.shape), spec.sharding, (), error))
            continue
        np_dtype = spec.dtype.to_numpy()
        new = tuple(_frozen(np.ascontiguousarray(s).reshape(-1).view(np_dtype).reshape(dims))
                    for s, dims in zip(shards, plan.new_shards))
        out.append(array_type(client, spec.dtype, Shape(spec.shape), spec.sharding, new))
    return out


def copy_arrays(array_type: type[HostArray], client: Any, arrays: Any, devices: Any,
                memory_kind: Any, semantics: Any) -> list[HostArray]:
    """Shard data is immutable, so a copy shares it unless ALWAYS_COPY asks for new
    buffers (a host device's memory is just where the array says it is); an error array's
    copy fails the same way."""
    plan = plan_copy(client, arrays, devices, memory_kind, semantics, array_type)
    return [array_type(client, array.dtype, array.shape, target, array._take(plan.semantics),
                       array.error, array._layout)
            for array, target in zip(plan.arrays, plan.targets)]


def reshard_arrays(array_type: type[HostArray], client: Any, arrays: Any, specs: Any,
                   semantics: Any) -> list[HostArray]:
    plan = plan_reshard(client, arrays, specs, semantics, array_type)
    values = [None if a.error is not None else global_value(a) for a in plan.arrays]
    out = []
    for array, spec, value in zip(plan.arrays, plan.specs, values):
        if value is None:
            out.append(array_type(client, spec.dtype, array.shape, spec.sharding, (), array.error))
        else:
            out.append(array_type(client, spec.dtype, array.shape, spec.sharding,
                                  split(value, spec.sharding, array.shape)))
        if plan.semantics == DONATE_INPUT:
            array._take(DONATE_INPUT)
    return out
