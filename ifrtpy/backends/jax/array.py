"""JaxArray: an ifrtpy Array holding one ``jax.Array``; and the client operations that
make and move arrays.

The jax value's sharding is the array's ifrtpy sharding converted by
:mod:`ifrtpy.interop.jax` (shardings without a jax equivalent, such as uneven
ConcreteShardings, raise UnimplementedError). Every operation validates all of its
inputs before jax is called, so a failure leaves the inputs as they were. Host data is
copied unless the semantics let jax alias it (IMMUTABLE_ZERO_COPY; jax's CPU runtime
aliases aligned data), and 64-bit dtypes are kept whatever ``jax_enable_x64`` says.
Deleting or donating an array drops its reference to the jax value: buffers shared
with other arrays (REUSE_INPUT) stay alive while those hold them.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import threading
import weakref
from typing import Any, Callable, NoReturn, Sequence

import numpy as np

from ifrtpy.array import Array, ArrayCopySemantics, ArraySpec, HostBufferSemantics
from ifrtpy import _jaxlib
from ifrtpy.device import DeviceList, MemoryKind
from ifrtpy.dtypes import DType, is_string_host_dtype
from ifrtpy.errors import (
    Code, FailedPreconditionError, InvalidArgumentError, UnimplementedError, UnknownError,
    error_from_code,
)
from ifrtpy.future import Future, Promise
from ifrtpy.backends.jax._fastpath import JaxArrayCore
from ifrtpy.interop.jax import _cached_to_jax
from ifrtpy.shape import Shape
from ifrtpy.sharding import HloSharding
from ifrtpy.sharding import (
    ConcreteEvenSharding, OpaqueSharding, Sharding, ShardingParamSharding,
    SingleDeviceShardSemantics,
)

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
ALL_SHARDS = SingleDeviceShardSemantics.ALL_SHARDS
ALWAYS_COPY = ArrayCopySemantics.ALWAYS_COPY
REUSE_INPUT = ArrayCopySemantics.REUSE_INPUT
DONATE_INPUT = ArrayCopySemantics.DONATE_INPUT

_STATUS = re.compile(r"^([A-Z_]+): ")


#: jaxlib reports a failed gloo collective (CPU, several processes) with status UNKNOWN;
#: what failed is in its text: another process gone, or not there in time.
_GLOO_CAUSES = (("Connection closed by peer", Code.UNAVAILABLE),
                ("Connection reset by peer", Code.UNAVAILABLE),
                ("Connection refused", Code.UNAVAILABLE),
                ("pair closure", Code.UNAVAILABLE),  # a connection closed by an earlier failure
                ("Timed out", Code.DEADLINE_EXCEEDED))


def translate(error: BaseException) -> BaseException:
    """jax's runtime error as the ifrtpy error of its status code (others unchanged); a
    failed gloo collective as UnavailableError (a process gone) or DeadlineExceededError
    (a process late past the collective timeout)."""
    if not isinstance(error, _jaxlib.runtime_error_type()):
        return error
    text = str(error)
    match = _STATUS.match(text)
    code, message = Code.UNKNOWN, text
    if match and match.group(1) in Code.__members__:
        code, message = Code[match.group(1)], text[match.end():]
    if code == Code.UNKNOWN and "Gloo" in message:
        code = next((c for needle, c in _GLOO_CAUSES if needle in message), code)
    return error_from_code(code, message)


def call_jax(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with 64-bit dtypes kept and jax's errors made ifrtpy's."""
    import jax

    try:
        with jax.enable_x64(True):
            return fn(*args, **kwargs)
    except Exception as e:
        translated = translate(e)
        if translated is e:
            raise
        raise translated from None


#: Guards every JaxArray's _deleted/_value/_reads changes (short, rare: one lock for all
#: arrays keeps making an array cheap).
_arrays_lock = threading.Lock()
_waiters: list[concurrent.futures.ThreadPoolExecutor] = []
_pools_lock = threading.Lock()


def _waiter() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that wait on jax values for futures that are not ready yet."""
    with _pools_lock:
        if not _waiters:
            _waiters.append(concurrent.futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="ifrtpy-jax-wait"))
        return _waiters[0]


def future_of(value: Any, result: Callable[[], Any] = lambda: None) -> Future[Any]:
    """A future that fails as jax value ``value`` does, else holds ``result()``."""
    def wait() -> Any:
        try:
            value.block_until_ready()
        except Exception as e:
            raise translate(e) from None
        return result()

    if value.is_ready():
        try:
            return Future.ready(wait())
        except Exception as e:
            return Future.failed(e)
    promise: Promise[Any] = Promise()

    def run() -> None:
        try:
            promise.set_result(wait())
        except BaseException as e:
            promise.set_exception(e)

    _waiter().submit(run)
    return promise.future


class JaxArray(JaxArrayCore, Array):
    """An array of a JaxClient: ``value`` is the ``jax.Array`` holding its data (None for
    an error array). Made by the client's operations.

    Its fields, and ``block_until_ready``, live in the C-level ``JaxArrayCore`` (for the
    execute fast path)."""

    __slots__ = ()

    def __init__(self, client: Any, dtype: DType, shape: Shape, sharding: Sharding,
                 value: Any, error: BaseException | None = None):
        self._client = client
        self._dtype = dtype
        self._shape = shape
        self._sharding = sharding
        self._value = value
        self._error = error
        self._deleted = False
        self._reads = ()

    @property
    def client(self) -> Any:
        return self._client

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def sharding(self) -> Sharding:
        return self._sharding

    @property
    def error(self) -> BaseException | None:
        """The error of an error array (its ready future fails with it), else None."""
        return self._error

    @property
    def jax_value(self) -> Any:
        """The ``jax.Array`` holding the data; FailedPreconditionError once deleted."""
        value = self._value
        if self._deleted or value is None or value.is_deleted():
            raise FailedPreconditionError(f"Array has been deleted: {self.debug_string()}")
        return value

    # -- lifetime -------------------------------------------------------------------------

    def ready_future(self) -> Future[None]:
        if self._error is not None:
            return Future.failed(self._error)
        try:
            value = self.jax_value
        except FailedPreconditionError as e:
            return Future.failed(e)
        return future_of(value)

    def _wait_failed(self, error: Exception | None) -> NoReturn:
        """Raise for ``block_until_ready``: FailedPreconditionError if deleted (here or
        through jax), else jax's ``error`` as an ifrtpy error."""
        value = self.jax_value  # raises FailedPreconditionError once deleted
        raise translate(error) if error is not None else UnknownError(
            f"waiting for {value!r} failed") from None

    def delete(self) -> Future[None]:
        with _arrays_lock:
            self._deleted = True
            self._value = None
        return Future.ready(None)

    def is_deleted(self) -> bool:
        value = self._value
        return self._deleted or (value is not None and value.is_deleted())

    def take(self, semantics: ArrayCopySemantics) -> Any:
        """The jax value as ``semantics`` says: a copy, shared, or taken (then this array
        reads as deleted). None for an error array (which donation deletes too)."""
        if semantics == DONATE_INPUT:
            with _arrays_lock:
                value = None if self._error is not None else self.jax_value
                self._deleted = True
                self._value = None
            return value
        if self._error is not None:
            return None
        value = self.jax_value
        if semantics == ALWAYS_COPY:
            return call_jax(_device_put, value, value.sharding, may_alias=False)
        return value

    # -- shards ---------------------------------------------------------------------------

    def disassemble_into_single_device_arrays(
        self, copy_semantics: ArrayCopySemantics = REUSE_INPUT,
        single_device_shard_semantics: SingleDeviceShardSemantics = ADDRESSABLE,
    ) -> list[Array]:
        if (SingleDeviceShardSemantics(single_device_shard_semantics) == ALL_SHARDS
                and not self._sharding.devices.is_fully_addressable):
            raise InvalidArgumentError(
                "disassemble with ALL_SHARDS needs every device addressable; "
                f"{self._sharding!r} has non-addressable devices")
        if isinstance(self._sharding, OpaqueSharding):
            raise InvalidArgumentError("an array with an OpaqueSharding cannot be disassembled")
        if self._error is None:
            self.jax_value
        pieces = self._sharding.disassemble(self._shape, ADDRESSABLE)
        value = self.take(ArrayCopySemantics(copy_semantics))
        if value is None:  # each piece fails as this array does
            return [JaxArray(self._client, self._dtype, _static(shape), sharding, None,
                             self._error) for shape, sharding in pieces]
        shards = {s.device.id: s.data for s in value.addressable_shards}
        return [JaxArray(self._client, self._dtype, _static(shape), sharding,
                         shards[sharding.devices[0].id]) for shape, sharding in pieces]

    # -- host -----------------------------------------------------------------------------

    def copy_to_host_buffer(self, out: np.ndarray | None = None,
                            byte_strides: Sequence[int] | None = None) -> Future[np.ndarray]:
        if self._error is not None:
            return Future.failed(self._error)
        value = self.jax_value
        if isinstance(self._sharding, OpaqueSharding):
            raise InvalidArgumentError("an array with an OpaqueSharding cannot be copied to the host")
        if not self._sharding.devices.is_fully_addressable:
            others = sorted({d.process_index for d in self._sharding.devices
                             if not d.is_addressable})
            raise UnimplementedError(
                f"copy_to_host_buffer of an array that is not fully addressable: it has shards "
                f"in processes {others}, which this process ({self._client.process_index()}) "
                "cannot read; reshard it to devices of this process first, or copy its "
                "addressable shards (disassemble_into_single_device_arrays)")
        out = self._host_buffer(out, byte_strides)
        value.copy_to_host_async()

        def fill() -> np.ndarray:
            np.copyto(out, np.asarray(value), casting="no")
            return out

        future = future_of(value, fill)
        if not future.done():
            with _arrays_lock:
                self._reads = [f for f in self._reads if not f.done()] + [future]
        return future

    def wait_for_reads(self) -> None:
        """Wait for the host copies enqueued so far (before jax donates the buffer)."""
        with _arrays_lock:
            reads, self._reads = self._reads, ()
        for read in reads:
            read.exception()


# -- validation helpers --------------------------------------------------------------------

def _device_put(value: Any, jax_sharding: Any, **kwargs: Any) -> Any:
    import jax

    return jax.device_put(value, jax_sharding, **kwargs)


def to_jax_sharding(sharding: Sharding) -> Any:
    """The jax sharding of ``sharding`` (UnimplementedError where jax has none)."""
    if isinstance(sharding, OpaqueSharding):
        raise UnimplementedError(
            f"the jax backend cannot hold arrays of {sharding!r}: a jax.Array needs a "
            "sharding with shard information")
    return _cached_to_jax(_jax_expressible(sharding))


def _jax_expressible(sharding: Sharding) -> Sharding:
    """``sharding``, or an HloSharding with the same shards per device for the kinds the
    interop conversions do not take (ShardingParam; fully replicated ConcreteEven)."""
    if isinstance(sharding, ShardingParamSharding):
        param = sharding.sharding_param
        if param.num_shards == 1:  # every device holds the whole array (rank 0 included)
            return HloSharding(sharding.devices, "{replicated}", sharding.memory_kind)
        tiles = sharding.tile_of_device()
        order = sorted(range(len(tiles)), key=lambda position: tiles[position])  # stable
        replication = len(tiles) // param.num_shards
        dims = list(param.dim_shards) + ([replication] if replication > 1 else [])
        text = (f"{{devices=[{','.join(map(str, dims))}]{','.join(map(str, order))}"
                + (" last_tile_dim_replicate}" if replication > 1 else "}"))
        return HloSharding(sharding.devices, text, sharding.memory_kind)
    if isinstance(sharding, ConcreteEvenSharding) and sharding.is_fully_replicated:
        return HloSharding(sharding.devices, "{replicated}", sharding.memory_kind)
    return sharding


def check_devices(client: Any, sharding: Sharding) -> None:
    """Every device is this client's and has the sharding's memory kind."""
    if not isinstance(sharding, Sharding):
        raise InvalidArgumentError(f"expected a Sharding, got {type(sharding).__name__}")
    for device in sharding.devices:
        if device.client is not client:
            raise InvalidArgumentError(f"device {device} belongs to another client")
        device.memory(sharding.memory_kind)  # type: ignore[attr-defined]


def jax_device(device: Any) -> Any:
    """The jax Device of one of this backend's devices."""
    return device.jax_device


def check_array(client: Any, array: Any, i: int) -> JaxArray:
    """``array`` is an array of ``client`` (not checked: whether it is alive)."""
    if not isinstance(array, JaxArray) or array.client is not client:
        raise InvalidArgumentError(f"array {i} is not an array of this client")
    return array


def _check_live(array: JaxArray) -> None:
    if array.error is None:
        array.jax_value


def _static(shape: Any) -> Shape:
    return shape if isinstance(shape, Shape) else Shape(shape)


def _canonical_kind(sharding: Sharding) -> MemoryKind:
    return sharding.memory_kind.canonicalize(sharding.devices[0])


# -- making arrays -------------------------------------------------------------------------

class _HostData:
    """The owner of the host data handed to jax: every view jax keeps of it (shards are
    slices) refers to this object, so it is freed exactly when jax lets go of the data."""

    __slots__ = ("__array_interface__", "_data", "__weakref__")

    def __init__(self, data: np.ndarray):
        self._data = data
        raw = f"|V{data.dtype.itemsize}"  # NumPy's interface cannot name ml_dtypes
        self.__array_interface__ = dict(data.__array_interface__, typestr=raw,
                                        descr=[("", raw)])


def make_array_from_host_buffer(client: Any, data: Any, sharding: Sharding,
                                semantics: HostBufferSemantics,
                                on_done: Callable[[], None] | None, layout: Any) -> JaxArray:
    """Each addressable device of ``sharding`` gets its shard of ``data``.

    jax's CPU runtime aliases suitably aligned host data, so with the two IMMUTABLE_*
    semantics that forbid that the data is copied first and ``on_done`` runs before the
    call returns. With the ZERO_COPY semantics jax gets the data itself, and ``on_done``
    runs once jax no longer holds it (at once where jax copied it; when the last array
    aliasing it is freed otherwise)."""
    if layout is not None:
        raise UnimplementedError("custom layouts are not supported by the jax backend")
    check_devices(client, sharding)
    semantics = HostBufferSemantics(semantics)
    if on_done is not None and not callable(on_done):
        raise InvalidArgumentError(f"on_done must be callable, got {on_done!r}")
    if isinstance(sharding, OpaqueSharding):
        raise InvalidArgumentError(f"{sharding!r} has no shard information to split data by")
    data = data if isinstance(data, np.ndarray) else np.asarray(data)
    if is_string_host_dtype(data.dtype):
        raise UnimplementedError("the jax backend has no STRING arrays: jax arrays hold no strings; "
                                 "use the pjrt or reference backend")
    dtype = DType.from_numpy(data.dtype)
    if not sharding.devices.addressable_device_list():
        raise InvalidArgumentError(f"{sharding!r} has no addressable device to put the array on")
    jax_sharding = to_jax_sharding(sharding)
    shape = Shape(data.shape)
    if semantics < HostBufferSemantics.IMMUTABLE_ZERO_COPY:
        value = call_jax(_put_by_shard, data, shape, sharding, jax_sharding, True)
        if on_done is not None:
            on_done()
    else:
        owner = _HostData(data)
        if on_done is not None:
            weakref.finalize(owner, on_done)
        value = call_jax(_put_by_shard, np.asarray(owner).view(data.dtype), shape, sharding,
                         jax_sharding, False)
        del owner
    return JaxArray(client, dtype, shape, sharding, value)


#: Host data of at least this size is copied shard by shard on several threads (NumPy
#: copies without the GIL): 2.5x to 4x faster for 64 MiB over 8 shards on 2 cores.
_PARALLEL_COPY_BYTES = 1 << 20
_copiers: list[concurrent.futures.ThreadPoolExecutor] = []


def _copier() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that copy the shards of large host data."""
    with _pools_lock:
        if not _copiers:
            _copiers.append(concurrent.futures.ThreadPoolExecutor(
                max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="ifrtpy-jax-copy"))
        return _copiers[0]


def _aligned_copy(data: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``data`` at a 64-byte aligned address (jax aliases host data
    only at such addresses, and copies it otherwise)."""
    size = data.size * data.dtype.itemsize
    raw = np.empty(size + 64, np.uint8)
    start = -raw.ctypes.data % 64
    out = raw[start:start + size].view(data.dtype).reshape(data.shape)
    np.copyto(out, data, casting="no")
    return out


def _put_by_shard(data: np.ndarray, shape: Shape, sharding: Sharding, jax_sharding: Any,
                  copy: bool) -> Any:
    """A jax.Array of ``data`` split as ``sharding`` says: each addressable device gets its
    slice, a fresh copy (which jax then aliases: one copy in all) with ``copy`` or for a
    second replica of a slice, else the slice itself (which jax may alias)."""
    import jax

    devices = sharding.devices.addressable_device_list()
    slices: list[tuple[Any, ...]]
    if sharding.is_fully_replicated:
        slices = [(Ellipsis,)] * len(devices)
    else:
        slices = [(*d.slices(), Ellipsis) for d in sharding.index_domains(shape, ADDRESSABLE)]
    pieces, copies, aliased = [], [], set()
    for key in slices:  # without copy, only one replica of a slice aliases the data
        alias = not copy and repr(key) not in aliased
        aliased.add(repr(key))
        pieces.append(data[key])
        if not alias:
            copies.append(len(pieces) - 1)
    if len(copies) > 1 and data.nbytes >= _PARALLEL_COPY_BYTES:
        copied = list(_copier().map(_aligned_copy, [pieces[i] for i in copies]))
    else:
        copied = [_aligned_copy(pieces[i]) for i in copies]
    for i, piece in zip(copies, copied):
        pieces[i] = piece
    kind = str(sharding.memory_kind) if sharding.memory_kind else None
    places = [jax.sharding.SingleDeviceSharding(jax_device(d), memory_kind=kind) for d in devices]
    return jax.make_array_from_single_device_arrays(
        tuple(shape.dims), jax_sharding, _device_put(pieces, places))


def make_error_arrays(client: Any, error: BaseException, specs: Sequence[ArraySpec]
                      ) -> list[JaxArray]:
    if not isinstance(error, BaseException):
        raise InvalidArgumentError(f"make_error_arrays needs an exception, got {error!r}")
    specs = list(specs)
    for i, spec in enumerate(specs):
        if not isinstance(spec, ArraySpec):
            raise InvalidArgumentError(f"spec {i} is not an ArraySpec: {spec!r}")
        check_devices(client, spec.sharding)
    return [JaxArray(client, spec.dtype, Shape(spec.shape), spec.sharding, None, error)
            for spec in specs]


def assemble(client: Any, shape: Any, sharding: Sharding, arrays: Sequence[Array],
             copy_semantics: ArrayCopySemantics, shard_semantics: SingleDeviceShardSemantics,
             dtype: DType | None) -> JaxArray:
    shape = shape if isinstance(shape, Shape) else Shape(shape)
    arrays = list(arrays)
    copy_semantics = ArrayCopySemantics(copy_semantics)
    check_devices(client, sharding)
    if (SingleDeviceShardSemantics(shard_semantics) == ALL_SHARDS
            and not sharding.devices.is_fully_addressable):
        raise InvalidArgumentError(
            "SingleDeviceShardSemantics.ALL_SHARDS was requested, but the sharding has "
            f"non-addressable devices: {sharding!r}")
    devices = sharding.devices.addressable_device_list()
    if len(arrays) != len(devices):
        raise InvalidArgumentError(
            f"assemble needs one array per addressable device of the sharding: "
            f"{len(devices)} devices, got {len(arrays)} arrays")
    if dtype is None:
        if not arrays:
            raise InvalidArgumentError("assemble of no arrays needs a dtype")
        dtype = arrays[0].dtype
    dtype = dtype if isinstance(dtype, DType) else DType.from_numpy(dtype)
    jax_sharding = to_jax_sharding(sharding)
    shard_shapes = [_static(s) for s, _ in sharding.disassemble(shape, ADDRESSABLE)]
    if copy_semantics == DONATE_INPUT and len({id(a) for a in arrays}) != len(arrays):
        raise InvalidArgumentError("assemble with DONATE_INPUT got the same array more than once")
    kind = _canonical_kind(sharding)
    checked = [check_array(client, array, i) for i, array in enumerate(arrays)]
    for i, (array, device) in enumerate(zip(checked, devices)):
        if len(array.sharding.devices) != 1:
            raise InvalidArgumentError(
                f"array {i} is not a single-device array: it is on "
                f"{len(array.sharding.devices)} devices")
        if array.dtype != dtype:
            raise InvalidArgumentError(f"array {i} has dtype {array.dtype}, expected {dtype}")
        if array.shape != shard_shapes[i]:
            raise InvalidArgumentError(
                f"array {i} has shape {array.shape}, shard {i} of {shape} is {shard_shapes[i]}")
        held = array.sharding.devices[0]
        if held is not device:
            raise InvalidArgumentError(
                f"array {i} is on device {held}, shard {i} of the sharding is on {device}")
        if _canonical_kind(array.sharding) != kind:
            raise InvalidArgumentError(
                f"array {i} is in memory kind {_canonical_kind(array.sharding)}, the sharding "
                f"puts shard {i} in {kind}")
        _check_live(array)
    error = next((a.error for a in checked if a.error is not None), None)
    values = [a.take(copy_semantics) for a in checked]
    if error is not None:  # the result fails as its first failing input does
        return JaxArray(client, dtype, shape, sharding, None, error)
    import jax

    value = call_jax(jax.make_array_from_single_device_arrays, tuple(shape.dims), jax_sharding,
                     values)
    return JaxArray(client, dtype, shape, sharding, value)


def _check_same_placement(client: Any, arrays: list[JaxArray], what: str) -> Sharding:
    """All arrays are this client's, live, on one device list and memory kind: the first's
    sharding."""
    first = check_array(client, arrays[0], 0).sharding
    for i, array in enumerate(arrays):
        check_array(client, array, i)
        if array.sharding.devices != first.devices:
            raise InvalidArgumentError(
                f"{what} needs every input on the same devices: array {i} is on "
                f"{array.sharding.devices.to_string()}, array 0 on {first.devices.to_string()}")
        if _canonical_kind(array.sharding) != _canonical_kind(first):
            raise InvalidArgumentError(
                f"{what} needs every input in the same memory kind: array {i} is in "
                f"{_canonical_kind(array.sharding)}, array 0 in {_canonical_kind(first)}")
        _check_live(array)
    return first


def _moved(client: Any, arrays: list[JaxArray], targets: list[Sharding],
           semantics: ArrayCopySemantics, by_shard: bool) -> list[JaxArray]:
    """Each array's value put on its target sharding, inputs taken as ``semantics`` says.
    ``by_shard``: shard i moves to the target's device i (copy_arrays, within this
    process); else jax moves the data (resharding, across processes too). Everything is
    already validated."""
    may_alias = semantics != ALWAYS_COPY
    out = []
    for array, target in zip(arrays, targets):
        if array.error is not None:  # an error array's copy fails the same way
            out.append(JaxArray(client, array.dtype, array.shape, target, None, array.error))
        else:
            move = _moved_by_shard if by_shard else _moved_whole
            value = call_jax(move, array.jax_value, array.sharding, target, may_alias)
            out.append(JaxArray(client, array.dtype, array.shape, target, value))
    if semantics == DONATE_INPUT:
        for array in arrays:
            array.take(DONATE_INPUT)
    return out


def _moved_whole(value: Any, source: Sharding, target: Sharding, may_alias: bool) -> Any:
    return _device_put(value, to_jax_sharding(target), may_alias=may_alias)


def _moved_by_shard(value: Any, source: Sharding, target: Sharding, may_alias: bool) -> Any:
    import jax

    shards = {s.device.id: s.data for s in value.addressable_shards}
    kind = str(target.memory_kind) if target.memory_kind else None
    pieces, places = [], []
    for old, new in zip(source.devices, target.devices):
        if old.is_addressable:
            pieces.append(shards[old.id])
            places.append(jax.sharding.SingleDeviceSharding(jax_device(new), memory_kind=kind))
    moved = _device_put(pieces, places, may_alias=may_alias)
    return jax.make_array_from_single_device_arrays(
        value.shape, to_jax_sharding(target), moved)


def copy_arrays(client: Any, arrays: Sequence[Array], devices: DeviceList | None,
                memory_kind: MemoryKind | None, semantics: ArrayCopySemantics
                ) -> list[JaxArray]:
    if not arrays:
        return []
    checked = [check_array(client, array, i) for i, array in enumerate(arrays)]
    semantics = ArrayCopySemantics(semantics)
    first = _check_same_placement(client, checked, "copy_arrays")
    if devices is not None and not isinstance(devices, DeviceList):
        devices = DeviceList(devices)
    if devices is not None and len(devices) != len(first.devices):
        raise InvalidArgumentError(
            f"copy_arrays: the new device list has {len(devices)} devices, the arrays are on "
            f"{len(first.devices)}")
    targets = []
    for array in checked:
        target = array.sharding.with_device_assignment(devices, memory_kind)
        check_devices(client, target)
        if target.devices.addressable_mask() != array.sharding.devices.addressable_mask():
            raise UnimplementedError(
                "copy_arrays: shards would move between processes; use reshard_arrays, "
                "which lets jax move data across processes")
        targets.append(target)
    return _moved(client, checked, targets, semantics, by_shard=True)


def reshard_arrays(client: Any, arrays: Sequence[Array], specs: Sequence[ArraySpec],
                   semantics: ArrayCopySemantics) -> list[JaxArray]:
    specs = list(specs)
    semantics = ArrayCopySemantics(semantics)
    if len(arrays) != len(specs):
        raise InvalidArgumentError(f"reshard_arrays got {len(arrays)} arrays and {len(specs)} specs")
    if semantics == REUSE_INPUT:
        raise InvalidArgumentError(
            "reshard_arrays does not allow REUSE_INPUT; use ALWAYS_COPY or DONATE_INPUT")
    checked = [check_array(client, array, i) for i, array in enumerate(arrays)]
    for i, (array, spec) in enumerate(zip(checked, specs)):
        if not isinstance(spec, ArraySpec):
            raise InvalidArgumentError(f"spec {i} is not an ArraySpec: {spec!r}")
        if spec.dtype != array.dtype or Shape(spec.shape) != array.shape:
            raise InvalidArgumentError(
                f"reshard_arrays keeps dtype and shape: array {i} is {array.dtype}{array.shape}, "
                f"spec {i} is {spec.dtype}{spec.shape}")
        if spec.layout is not None:
            raise InvalidArgumentError("reshard_arrays supports only the default layout")
        check_devices(client, spec.sharding)
        to_jax_sharding(spec.sharding)
        _check_live(array)
    return _moved(client, checked, [s.sharding for s in specs], semantics, by_shard=False)

