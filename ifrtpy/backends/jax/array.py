"""JaxArray: an ifrtpy Array holding one ``jax.Array``.

The jax value's sharding is the array's ifrtpy sharding converted by
:mod:`ifrtpy.backends.jax_shardings` (shardings without a jax equivalent, such as uneven
ConcreteShardings, raise UnimplementedError). 64-bit dtypes are kept whatever
``jax_enable_x64`` says. Deleting or donating an array drops its reference to the jax
value: buffers shared with other arrays (REUSE_INPUT) stay alive while those hold them.
The put path is :mod:`.put`, the client operations :mod:`.operations`.
"""

from __future__ import annotations

import threading
from typing import Any, NoReturn, Sequence

import numpy as np

from ifrtpy.array import Array, ArrayCopySemantics, StoredArray, deleted_error
from ifrtpy.array_plans import plan_disassemble
from ifrtpy.dtypes import DType
from ifrtpy.errors import (
    FailedPreconditionError, InvalidArgumentError, UnimplementedError, UnknownError,
)
from ifrtpy.future import Future
from ifrtpy.backends.jax._fastpath import JaxArrayCore
from ifrtpy.backends.jax.calls import call_jax, translate
from ifrtpy.backends.jax.futures import future_of
from ifrtpy.shape import Shape
from ifrtpy.backends.jax_shardings import cached_to_jax
from ifrtpy.sharding import HloSharding
from ifrtpy.sharding import (
    ConcreteEvenSharding, OpaqueSharding, Sharding, ShardingParamSharding,
    SingleDeviceShardSemantics, check_reduced,
)
from ifrtpy.user_context import current_user_context

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
ALWAYS_COPY = ArrayCopySemantics.ALWAYS_COPY
REUSE_INPUT = ArrayCopySemantics.REUSE_INPUT
DONATE_INPUT = ArrayCopySemantics.DONATE_INPUT

#: Guards every JaxArray's _deleted/_value/_reads changes (short, rare: one lock for all
#: arrays keeps making an array cheap).
_arrays_lock = threading.Lock()


class JaxArray(JaxArrayCore, StoredArray):
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
        self._user_context = current_user_context()

    @property
    def jax_value(self) -> Any:
        """The ``jax.Array`` holding the data; FailedPreconditionError once deleted."""
        value = self._value
        if self._deleted or value is None or value.is_deleted():
            raise deleted_error(self)
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

    _take_lock = _arrays_lock

    def _data(self) -> Any:
        return None if self._error is not None else self.jax_value

    def _copy_of(self, value: Any) -> Any:
        return call_jax(_device_put, value, value.sharding, may_alias=False)

    def _drop_data(self) -> None:
        self._deleted = True
        self._value = None

    # -- shards ---------------------------------------------------------------------------

    def disassemble_into_single_device_arrays(
        self, copy_semantics: ArrayCopySemantics = REUSE_INPUT,
        single_device_shard_semantics: SingleDeviceShardSemantics = ADDRESSABLE,
    ) -> list[Array]:
        plan = plan_disassemble(self, copy_semantics, single_device_shard_semantics)
        value = self._take(plan.copy_semantics)
        if value is None:  # each piece fails as this array does
            return [JaxArray(self._client, self._dtype, shape, sharding, None, self._error)
                    for shape, sharding in plan.pieces]
        shards = {s.device.id: s.data for s in value.addressable_shards}
        return [JaxArray(self._client, self._dtype, shape, sharding,
                         shards[sharding.devices[0].id]) for shape, sharding in plan.pieces]

    # -- host -----------------------------------------------------------------------------

    def copy_to_host_buffer(self, out: np.ndarray | None = None,
                            byte_strides: Sequence[int] | None = None) -> Future[np.ndarray]:
        if self._error is not None:
            return Future.failed(self._error)
        value = self.jax_value
        if isinstance(self._sharding, OpaqueSharding):
            raise InvalidArgumentError("an array with an OpaqueSharding cannot be copied to the host")
        check_reduced(self._sharding, "copy_to_host_buffer")
        if not self._sharding.devices.is_fully_addressable:
            if self._addressable_shards_hold_it_all():  # replicated: read this process's
                return self._gather_to_host_buffer(out, byte_strides)
            others = sorted({d.process_index for d in self._sharding.devices
                             if not d.is_addressable})
            raise UnimplementedError(
                f"copy_to_host_buffer of an array that is not fully addressable: it has shards "
                f"in processes {others}, which this process ({self._client.process_index()}) "
                "cannot read; reshard it to devices of this process (or to a replicated "
                "sharding) first, or copy its addressable shards "
                "(disassemble_into_single_device_arrays)")
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

    def _addressable_shards_hold_it_all(self) -> bool:
        """Whether this process's shards hold every element (a replicated array does)."""
        if self._sharding.is_fully_replicated:
            return bool(self._sharding.devices.addressable_device_list())
        domains = set(self._sharding.index_domains(self._shape, ADDRESSABLE))
        covered: int = sum(d.shape.num_elements() for d in domains)
        return covered == Shape(self._shape).num_elements()

    def wait_for_reads(self) -> None:
        """Wait for the host copies enqueued so far (before jax donates the buffer)."""
        with _arrays_lock:
            reads, self._reads = self._reads, ()
        for read in reads:
            read.exception()


# -- helpers of the backend's modules -----------------------------------------------------------

def _device_put(value: Any, jax_sharding: Any, **kwargs: Any) -> Any:
    import jax

    return jax.device_put(value, jax_sharding, **kwargs)


def to_jax_sharding(sharding: Sharding) -> Any:
    """The jax sharding of ``sharding`` (UnimplementedError where jax has none)."""
    if isinstance(sharding, OpaqueSharding):
        raise UnimplementedError(
            f"the jax backend cannot hold arrays of {sharding!r}: a jax.Array needs a "
            "sharding with shard information")
    return cached_to_jax(_jax_expressible(sharding))


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


def jax_device(device: Any) -> Any:
    """The jax Device of one of this backend's devices."""
    return device.jax_device
