"""Values: IFRT's ``Value``, ``Array``, ``Tuple`` and ``ArraySpec``, and the semantics enums.

:class:`Value` and :class:`Array` are abstract; each backend subclasses them (or
``.register()``\\ s a Cython type). :class:`Tuple` is concrete and works over any backend's
values. Arrays are thread-safe: every method may be called from any thread.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import importlib
import threading
import contextlib
from typing import TYPE_CHECKING, Any, ContextManager, Iterable, Sequence

import numpy as np

from ifrtpy.array_text import (
    ArrayType, array_str, dims_of as _dims, distinct_shards, install_refusals,
    num_elements as _num_elements, printed_values, shape_text as _shape_text, text_of,
)
from ifrtpy.dtypes import DType
from ifrtpy.errors import (
    FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError, UnimplementedError, check_enum, check_int,
    check_type, invalid_argument,
)
from ifrtpy.future import Future, join_futures, then_value
from ifrtpy.shape import DynamicShape, Shape
from ifrtpy.sharding import (
    Sharding, SingleDeviceSharding, SingleDeviceShardSemantics, check_reduced,
)
from ifrtpy.user_context import UserContext

if TYPE_CHECKING:
    from ifrtpy.client import Client
    from ifrtpy.device import Device

__all__ = [
    "ArrayCopySemantics",
    "HostBufferSemantics",
    "Value",
    "Array",
    "ArraySpec",
    "Shard",
    "Tuple",
]


class ArrayCopySemantics(enum.IntEnum):
    """How an operation producing arrays from arrays treats the inputs' buffers."""

    #: The outputs get new buffers; the inputs are untouched.
    ALWAYS_COPY = 0
    #: The outputs may share buffers with the inputs (mutating one may affect the other).
    REUSE_INPUT = 1
    #: The outputs take the inputs' buffers; the inputs become deleted/unusable.
    DONATE_INPUT = 2


class HostBufferSemantics(enum.IntEnum):
    """What the runtime may do with a host buffer passed to it (= ``PJRT_HostBufferSemantics``).

    Ordered from most to least restrictive for the runtime.
    """

    #: Not touched after the call returns; ``on_done`` runs before the call returns.
    IMMUTABLE_ONLY_DURING_CALL = 0
    #: The caller keeps it alive and unchanged until the transfer completes (``on_done``,
    #: or the array's ready future).
    IMMUTABLE_UNTIL_TRANSFER_COMPLETES = 1
    #: The array may alias the buffer for its whole life; ``on_done`` runs when the array
    #: is freed. Implementations may fall back to copying.
    IMMUTABLE_ZERO_COPY = 2
    #: As IMMUTABLE_ZERO_COPY, and the runtime may also write to the buffer.
    MUTABLE_ZERO_COPY = 3


def single_device_piece(array: Array, pieces: tuple[Any, ...], what: str) -> Any:
    """For a backend's zero-copy exports: the one piece (buffer, shard data) of the
    single-device ``array``; InvalidArgumentError naming ``what`` for an array on several
    devices."""
    if len(pieces) != 1 or len(array.sharding.devices) != 1:
        raise InvalidArgumentError(
            f"{what} needs a single-device array; this one is on "
            f"{len(array.sharding.devices)} devices: export each shard of "
            "disassemble_into_single_device_arrays() instead")
    return pieces[0]


def numpy_of_view(view: np.ndarray, dtype: Any, copy: bool | None) -> np.ndarray:
    """``__array__(dtype, copy)`` of an array whose data ``view`` is (read-only): the view
    itself, NumPy's copy of it with ``copy=True``, or its conversion to another ``dtype``
    (ValueError with ``copy=False``)."""
    if copy is True:
        return np.array(view, dtype=dtype, copy=True)
    if dtype is None or np.dtype(dtype) == view.dtype:
        return view
    if copy is False:
        raise ValueError(f"viewing a {view.dtype} array as {np.dtype(dtype)} needs a copy")
    return view.astype(dtype)


#: What makes an array unusable, and how to keep one: said by every use of such an array.
GONE = ("delete() frees an array; an execution takes the arguments it donates (parameters "
        "marked jax.buffer_donor, jax's donate_argnums) unless "
        "ExecuteOptions(non_donatable_input_indices=...) lists them; DONATE_INPUT hands an "
        "array's buffers to the array made from it")


def deleted_error(array: Any) -> FailedPreconditionError:
    """The error of any use of ``array`` once it is deleted or donated: one message for
    every backend and every use (a read, a view, a copy, an execute)."""
    return FailedPreconditionError(
        f"Array has been deleted or donated: {array.debug_string()}. {GONE}")


def array_sequence(value: Any, parameter: str) -> list[Any]:
    """``value`` (any sequence, not one array, string or NumPy array) as a list;
    InvalidArgumentError naming ``parameter`` otherwise. Its items are not checked."""
    if isinstance(value, (str, bytes, np.ndarray, Array)) or not hasattr(value, "__iter__"):
        raise invalid_argument(parameter, "a sequence of Arrays", value)
    return list(value)


def check_of_client(client: Any, array: Any, what: str, array_type: Any) -> Any:
    """``array`` if it is an array of ``client`` (an instance of ``array_type``, the
    backend's array class); InvalidArgumentError naming ``what``, both clients and how to
    bring the array over otherwise (a jax.Array: ``from_jax``)."""
    if not isinstance(array, Array):
        if type(array).__module__.partition(".")[0] in ("jax", "jaxlib"):  # not importing jax
            raise InvalidArgumentError(
                f"{what} is a jax.Array, not an ifrtpy array: bring it in with "
                f"ifrt.from_jax(x, client) (its shards, without a copy on CPU)")
        raise invalid_argument(what, "an Array of this client", array)
    if not isinstance(array, array_type) or array.client is not client:
        other = array.client
        raise InvalidArgumentError(
            f"{what} is not an array of this client: it is a {type(array).__name__} of "
            f"{other!r} (at {id(other):#x}), this client is {client!r} (at {id(client):#x}). "
            "Make arrays on the client that uses them (ifrt.from_jax(x, client), "
            "ifrt.from_dlpack(x, device=client), ifrt.device_put(x, device) with one of its "
            "devices; ifrt.get_client() without options is the default client those use), or "
            "move this one: ifrt.device_put(np.asarray(array), sharding) with a sharding of "
            "this client (copy_arrays moves arrays between devices of one client)")
    return array


def plan_fully_replicated_shard(array: Array) -> SingleDeviceSharding:
    """The sharding of ``array.fully_replicated_shard()``: its first addressable device,
    in its memory kind; InvalidArgumentError unless ``array`` is fully replicated and has
    an addressable shard."""
    sharding = array.sharding
    if not sharding.is_fully_replicated:
        raise InvalidArgumentError(
            f"fully_replicated_shard needs a fully replicated array; sharding is {sharding!r}")
    devices = sharding.devices.addressable_device_list()
    if not devices:
        raise InvalidArgumentError("fully_replicated_shard: the array has no addressable shard")
    return SingleDeviceSharding(devices[0], sharding.memory_kind)


class Value(abc.ABC):
    """Base of everything a program consumes or produces (IFRT ``Value``): Array, Tuple.

    Thread-safe. Not copyable: a Value stands for device-side resources.
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def client(self) -> Client:
        """The client that owns this value."""

    @abc.abstractmethod
    def ready_future(self) -> Future[None]:
        """A future that is ready when the value's data is (or failed to be) computed.

        Never blocks. It fails with the value's error (a failed computation, a donated or
        deleted value, an error array).
        """

    @abc.abstractmethod
    def delete(self) -> Future[None]:
        """Release the device resources; reads already enqueued still complete.

        Idempotent: every call returns a future that resolves with the same status.
        :meth:`is_deleted` is true as soon as this returns. Later uses of the value fail.
        """

    @abc.abstractmethod
    def is_deleted(self) -> bool:
        """Whether :meth:`delete` was called, or the value was donated. Never blocks."""

    @abc.abstractmethod
    def debug_string(self) -> str:
        """A human-readable description, for logs and error messages."""

    @property
    def user_context(self) -> UserContext | None:
        """The :class:`~ifrtpy.user_context.UserContext` active at the call that made this
        value (None outside any ``UserContextScope``, or where the backend keeps none)."""
        return None

    def __copy__(self):
        raise TypeError(f"{type(self).__name__} is not copyable; use Client.copy_arrays")

    def __deepcopy__(self, memo):
        return self.__copy__()


class Array(Value, metaclass=ArrayType):
    """A (possibly sharded) array on one or more devices (IFRT ``Array``).

    Abstract: ``client``, ``ready_future``, ``delete``, ``is_deleted``, ``dtype``,
    ``shape``, ``sharding``, ``disassemble_into_single_device_arrays`` and
    ``copy_to_host_buffer``. The rest has defaults built on those: ``print(a)`` and
    ``repr(a)`` show the values as NumPy does (:func:`ifrtpy.array_text.printed_values`),
    and NumPy's operations (``a + 1``, ``a == b``, ``bool(a)``, ``a[0]``, ``len(a)``,
    ``a.sum()``) raise TypeError or AttributeError saying what ifrtpy arrays are and what to
    do instead (:func:`ifrtpy.array_text.install_refusals`). An array hashes by identity: it
    is a dict key or set member as itself, never by its values.
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def dtype(self) -> DType:
        """The element type."""

    @property
    @abc.abstractmethod
    def shape(self) -> Shape:
        """The global (unsharded) shape."""

    @property
    @abc.abstractmethod
    def sharding(self) -> Sharding:
        """How the array is laid out over devices; the same object as was given on creation."""

    @property
    def layout(self) -> Any:
        """The on-device layout; None means the default layout for the dtype/shape/memory."""
        return None

    @property
    def error(self) -> BaseException | None:
        """The error of an error array (``Client.make_error_arrays``, or one made from an
        error array): its ready future fails with it. None for other arrays, whose
        computation may still fail (see :meth:`ready_future`)."""
        return None

    @abc.abstractmethod
    def disassemble_into_single_device_arrays(
        self,
        copy_semantics: ArrayCopySemantics = ArrayCopySemantics.REUSE_INPUT,
        single_device_shard_semantics: SingleDeviceShardSemantics = (
            SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
        ),
    ) -> list[Array]:
        """One single-device array per shard, in ``sharding.devices`` order.

        The inverse of ``Client.assemble_array_from_single_device_arrays``. With
        DONATE_INPUT this array is deleted afterwards; with REUSE_INPUT the pieces may
        share buffers with it. ``single_device_shard_semantics`` selects this process's
        shards (the default) or all shards; ALL_SHARDS raises InvalidArgumentError when
        some devices are not addressable. Does not block on the data.
        """

    def fully_replicated_shard(
        self, copy_semantics: ArrayCopySemantics = ArrayCopySemantics.REUSE_INPUT
    ) -> Array:
        """A single-device array holding the whole value (fast path for replicated arrays).

        InvalidArgumentError unless ``sharding.is_fully_replicated``. The default
        disassembles and keeps the first shard.
        """
        plan_fully_replicated_shard(self)
        return self.disassemble_into_single_device_arrays(copy_semantics)[0]

    @abc.abstractmethod
    def copy_to_host_buffer(
        self, out: np.ndarray | None = None, byte_strides: Sequence[int] | None = None
    ) -> Future[np.ndarray]:
        """Copy the whole (global) array to host memory; the future resolves to the buffer.

        ``out`` is a writable ndarray of dtype ``dtype.to_numpy()`` and the array's shape,
        with any strides; it must stay alive and untouched until the future is ready.
        None allocates one: C-contiguous, or laid out by ``byte_strides`` (see
        :meth:`_host_buffer`; bytes between strided elements are zeros). Does not block; errors of the array's computation arrive
        through the future. Raises InvalidArgumentError for a bad ``out``, for dtypes
        with no host form and for shardings without index domains (opaque), and
        UnimplementedError when part of the array is on non-addressable devices.
        Implementations with a native single-device copy can serve sharded arrays with
        :meth:`_gather_to_host_buffer`.
        """

    # -- derived defaults --------------------------------------------------------------

    # What jax.Array has and means the same here.

    @property
    def ndim(self) -> int:
        """The rank (``len(shape)``)."""
        return len(_dims(self.shape))

    @property
    def size(self) -> int:
        """The number of elements."""
        return _num_elements(_dims(self.shape))

    @property
    def nbytes(self) -> int:
        """``size`` times the bytes of an element on the host (a sub-byte element: 1)."""
        return self.size * self.dtype.to_numpy().itemsize

    @property
    def is_fully_addressable(self) -> bool:
        """Whether every device of the sharding belongs to this process."""
        return self.sharding.devices.is_fully_addressable

    @property
    def is_fully_replicated(self) -> bool:
        """Whether every shard holds the whole array."""
        return self.sharding.is_fully_replicated

    @property
    def addressable_shards(self) -> list[Shard]:
        """This process's shards, in the sharding's device order, as ``jax.Array``'s: each
        with its device, the NumPy index of the global array it holds, its replica id
        (how many shards before it hold the same index) and its data (a single-device
        array sharing this array's buffers). InvalidArgumentError for a sharding with
        unreduced axes, whose shards hold partial values (jax refuses their ``index``):
        ``disassemble_into_single_device_arrays`` gives each device's."""
        check_reduced(self.sharding, "addressable_shards",
                      "disassemble_into_single_device_arrays gives each device's partial values")
        semantics = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
        domains = self.sharding.index_domains(self.shape, semantics)
        pieces = self.disassemble_into_single_device_arrays(ArrayCopySemantics.REUSE_INPUT,
                                                            semantics)
        replicas: dict[Any, int] = {}
        shards = []
        for domain, piece in zip(domains, pieces):
            replica = replicas[domain] = replicas.get(domain, -1) + 1
            shards.append(Shard(piece.sharding.devices[0], domain.slices(), replica, piece))
        return shards

    def debug_string(self) -> str:
        return (
            f"{type(self).__name__}(dtype={self.dtype}, shape={_shape_text(self.shape)}, "
            f"sharding={self.sharding!r})"
        )

    def dlpack_shards(self) -> list[Any]:
        """A legacy (unversioned) DLPack capsule of each addressable shard, in the
        sharding's device order, each keeping its shard's memory alive until consumed: how
        the jax bridge hands an array to jax. The default exports each single-device
        array of :meth:`disassemble_into_single_device_arrays` (those must be DLPack
        producers); UnimplementedError where they are not."""
        if self.error is not None:
            raise self.error
        shards = self.disassemble_into_single_device_arrays()
        if not all(hasattr(s, "__dlpack__") for s in shards):
            raise UnimplementedError(f"the shards of {self.debug_string()} are not DLPack producers")
        return [getattr(s, "__dlpack__")() for s in shards]

    def block_until_ready(self) -> Array:
        """Wait (releasing the GIL) until the data is ready; raise its error; return self."""
        self.ready_future().result()
        return self

    def __jax_array__(self) -> Any:
        """jax's protocol: ``jnp.asarray(a)``, ``jnp.array(a)`` and jax.numpy's functions
        take the array as :func:`ifrtpy.to_jax` gives it (without a copy where that is).
        ``jax.jit(f)(a)`` does not (jax refuses the protocol in its arguments): pass
        ``ifrt.to_jax(a)``."""
        module, _, name = JAX_BRIDGE.partition(":")
        return getattr(importlib.import_module(module), name)(self)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        if copy is False:
            raise ValueError("an ifrtpy Array cannot be viewed as NumPy without a copy")
        out = self.copy_to_host_buffer().result()
        return out if dtype is None else out.astype(dtype, copy=False)

    def devices(self) -> set[Device]:
        """The devices of the array's sharding, as ``jax.Array.devices()``."""
        return set(self.sharding.devices)

    def __repr__(self) -> str:
        """The values as NumPy prints them (:func:`ifrtpy.array_text.printed_values`),
        with the shape where NumPy would show it, the dtype and the sharding."""
        return text_of(self, *printed_values(self))

    def __str__(self) -> str:
        values, summarised, why = printed_values(self)
        return text_of(self, values, summarised, why) if values is None else array_str(values, summarised)

    # -- helper for implementations --------------------------------------------------------

    def _host_buffer(
        self, out: np.ndarray | None, byte_strides: Sequence[int] | None = None
    ) -> np.ndarray:
        """For copy_to_host_buffer: validate ``out``, or allocate it as ``byte_strides`` say."""
        np_dtype = self.dtype.to_numpy()
        dims = _dims(self.shape)
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise InvalidArgumentError(f"out must be a numpy.ndarray, not {type(out).__name__}")
            if out.dtype != np_dtype or out.shape != dims:
                raise InvalidArgumentError(
                    f"out is {out.dtype}{list(out.shape)}, the array is {np_dtype}{list(dims)}"
                )
            if not out.flags.writeable:
                raise InvalidArgumentError("out is not writeable")
            if byte_strides is not None and _byte_strides(byte_strides) != out.strides:
                raise InvalidArgumentError(
                    f"byte_strides {list(byte_strides)} differ from out.strides {list(out.strides)}"
                )
            _check_no_overlap(dims, out.strides, out.itemsize, "out.strides")
            return out
        if byte_strides is None:
            return np.empty(dims, np_dtype)
        return _strided_zeros(dims, np_dtype, _byte_strides(byte_strides))


    def _gather_to_host_buffer(
        self, out: np.ndarray | None = None, byte_strides: Sequence[int] | None = None
    ) -> Future[np.ndarray]:
        """copy_to_host_buffer for a sharded array, built on its single-device shards.

        Disassembles (REUSE_INPUT, addressable shards) and copies each distinct shard
        into its index-domain slice of ``out`` with the shard's own
        ``copy_to_host_buffer`` (so those must not call back into this helper).
        """
        out = self._host_buffer(out, byte_strides)
        shards = self.disassemble_into_single_device_arrays(
            ArrayCopySemantics.REUSE_INPUT, SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
        )
        futures = [
            shard.copy_to_host_buffer(_view(out, domain.slices()))
            for domain, shard in distinct_shards(self, shards).items()
        ]
        return then_value(join_futures(futures), out)


install_refusals(Array)


def _view(out: np.ndarray, slices: tuple[slice, ...]) -> np.ndarray:
    """``out[slices]`` as an array: a view also of a rank-0 ``out``, where ``out[()]``
    would be a NumPy scalar."""
    index: tuple[Any, ...] = (*slices, Ellipsis)
    return out[index]


#: What :meth:`Array.__jax_array__` converts with, imported on first use as the backends'
#: registry imports a factory: the jax bridge sits above the interfaces.
JAX_BRIDGE = "ifrtpy.interop.jax:to_jax"


class StoredArray(Array):
    """For implementations: an Array whose ``client``, ``dtype``, ``shape``, ``sharding``,
    ``error`` and ``user_context`` are the attributes ``_client``, ``_dtype``, ``_shape``,
    ``_sharding``, ``_error`` and ``_user_context`` (slots of a subclass, or fields of a C
    base class), as every backend of ifrtpy keeps them.

    Its :meth:`_take` gives the array's data to an array made from it, as the copy
    semantics say, over three methods of the backend: ``_data`` (the data of a live
    array, the empty data of an error array; FailedPreconditionError once deleted),
    ``_copy_of(data)`` (new buffers holding the same values) and ``_drop_data`` (the array
    reads as deleted from then on, without freeing data another array now holds)."""

    __slots__ = ()

    #: Held while data is taken by donation, so that only one new array gets it: the
    #: backend's lock where its arrays may be donated from several threads at once.
    _take_lock: ContextManager[Any] = contextlib.nullcontext()

    @abc.abstractmethod
    def _data(self) -> Any:
        """The data of a live array (the empty data of an error array); FailedPreconditionError
        once deleted."""

    @abc.abstractmethod
    def _copy_of(self, data: Any) -> Any:
        """New buffers holding the values of ``data``."""

    @abc.abstractmethod
    def _drop_data(self) -> None:
        """Read as deleted from now on, without freeing data another array holds now."""

    def _take(self, semantics: Any) -> Any:
        """The data for an array made from this one: a copy (ALWAYS_COPY), the same data
        (REUSE_INPUT), or the data itself, this array reading as deleted afterwards
        (DONATE_INPUT, which deletes an error array too). An error array gives its empty
        data; a deleted one FailedPreconditionError; nothing changes on an error."""
        semantics = check_enum(ArrayCopySemantics, semantics, "copy_semantics")
        if semantics != ArrayCopySemantics.DONATE_INPUT:
            data = self._data()
            if semantics == ArrayCopySemantics.ALWAYS_COPY and self._error is None:
                return self._copy_of(data)
            return data
        with self._take_lock:
            data = self._data()
            self._drop_data()
        return data
    _client: Client
    _dtype: DType
    _shape: Shape
    _sharding: Sharding
    _error: BaseException | None
    _user_context: UserContext | None

    @property
    def client(self) -> Client:
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
        return self._error

    @property
    def user_context(self) -> UserContext | None:
        return self._user_context


def _byte_strides(byte_strides: Any) -> tuple[int, ...]:
    if isinstance(byte_strides, (str, bytes)) or not isinstance(byte_strides, Iterable):
        raise invalid_argument("byte_strides", "a sequence of ints", byte_strides)
    return tuple(check_int(s, f"byte_strides[{i}]") for i, s in enumerate(byte_strides))


def _check_no_overlap(dims: Sequence[int], strides: Sequence[int], itemsize: int,
                      parameter: str) -> None:
    """InvalidArgumentError unless every element of an array of ``dims`` laid out with byte
    ``strides`` has bytes of its own. Sufficient test: taken by increasing magnitude, each
    stride (of a dim longer than 1) steps over everything the smaller ones span."""
    if 0 in dims:
        return
    span = itemsize
    for stride, dim in sorted((abs(s), d) for s, d in zip(strides, dims) if d > 1):
        if stride < span:
            raise InvalidArgumentError(
                f"{parameter} {list(strides)} make elements of a {list(dims)} array share "
                f"memory (each stride must step past all the elements of the faster dims)")
        span = stride * (dim - 1) + span


def _strided_zeros(dims: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...]) -> np.ndarray:
    """A zeroed array with the given byte strides (may be negative or padded): the padding
    between elements holds zeros, never what the memory held before."""
    if len(strides) != len(dims):
        raise InvalidArgumentError(
            f"byte_strides has {len(strides)} entries for a rank-{len(dims)} array"
        )
    if any(s % dtype.itemsize for s in strides):
        raise InvalidArgumentError(
            f"byte_strides {list(strides)} are not multiples of the element size {dtype.itemsize}"
        )
    _check_no_overlap(dims, strides, dtype.itemsize, "byte_strides")
    if 0 in dims:
        return np.empty(dims, dtype)
    lo = sum(s * (d - 1) for s, d in zip(strides, dims) if s < 0)
    hi = sum(s * (d - 1) for s, d in zip(strides, dims) if s > 0)
    span = hi - lo + dtype.itemsize
    if span > np.iinfo(np.intp).max:
        raise InvalidArgumentError(
            f"byte_strides {list(strides)} span {span} bytes; at most {np.iinfo(np.intp).max}")
    try:
        base = np.zeros(span, np.uint8)  # calloc: large spans are zero pages until written
    except (MemoryError, ValueError):
        raise ResourceExhaustedError(
            f"byte_strides {list(strides)} need {span} bytes of host memory") from None
    return np.ndarray(dims, dtype, buffer=base, offset=-lo, strides=strides)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One addressable shard of an array (``Array.addressable_shards``), as jax's: the
    ``device`` holding it, the ``index`` (a tuple of slices) of the global array it
    holds, its ``replica_id`` among the shards holding that index, and its ``data``."""

    device: Device
    index: tuple[slice, ...]
    replica_id: int
    data: Array


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """What an array will be, without its data (IFRT ``ArraySpec``): immutable, hashable.

    ``dtype`` accepts anything ``DType.from_numpy`` does; ``layout`` None is the default.
    """

    dtype: DType
    shape: Shape
    sharding: Sharding
    layout: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            object.__setattr__(self, "dtype", DType.from_numpy(self.dtype))
        if not isinstance(self.shape, (Shape, DynamicShape)):
            object.__setattr__(self, "shape", Shape(self.shape))
        if self.sharding is not None:  # None: "no sharding", refused where one is needed
            check_type(self.sharding, Sharding, "ArraySpec.sharding", "a Sharding or None")


class Tuple(Value):
    """An ordered group of values (IFRT ``Tuple``); backend-neutral, may nest.

    Deleting the tuple deletes its elements; deleting any element makes the tuple
    report :meth:`is_deleted`. Build one with ``Client.make_tuple``.
    """

    __slots__ = ("_client", "_values", "_lock", "_delete_future", "__weakref__")

    def __init__(self, client: Client, values: Iterable[Value] = ()):
        self._client = client
        self._values: tuple[Value, ...] = tuple(values)
        for v in self._values:
            if not isinstance(v, Value):
                raise InvalidArgumentError(f"Tuple elements must be Values, not {type(v).__name__}")
        self._lock = threading.Lock()
        self._delete_future: Future[None] | None = None

    @property
    def client(self) -> Client:
        return self._client

    def arity(self) -> int:
        """The number of elements."""
        return len(self._values)

    def unpack(self) -> list[Value]:
        """The elements themselves (not copies), in order."""
        return list(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self):
        return iter(self._values)

    def ready_future(self) -> Future[None]:
        """Ready when every element is; fails with an element's error."""
        return join_futures(v.ready_future() for v in self._values)

    def delete(self) -> Future[None]:
        """Delete every element; idempotent (the same future each time)."""
        with self._lock:
            if self._delete_future is None:
                self._delete_future = join_futures([v.delete() for v in self._values])
            return self._delete_future

    def is_deleted(self) -> bool:
        return self._delete_future is not None or any(v.is_deleted() for v in self._values)

    def debug_string(self) -> str:
        return f"Tuple({', '.join(v.debug_string() for v in self._values)})"

    def __repr__(self) -> str:
        return f"<{self.debug_string()}>"
