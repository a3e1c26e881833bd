"""The client: IFRT's ``Client`` and ``Compiler`` interfaces.

A :class:`Client` is the entry point of one backend: it lists devices, makes arrays from
host data, moves arrays between devices and compiles programs. Get one with
:func:`ifrtpy.get_client` (the backend registry is :mod:`ifrtpy.backends`).
"""

from __future__ import annotations

import abc
import dataclasses
import types
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ifrtpy.array import (
    Array,
    ArrayCopySemantics,
    ArraySpec,
    HostBufferSemantics,
    Tuple,
    Value,
    _dims,
)
from ifrtpy.array_plans import dlpack_devices
from ifrtpy.dtypes import DType, InexactDType, host_form, is_string_host_dtype
from ifrtpy.errors import InvalidArgumentError, NotFoundError, UnimplementedError, check_int
from ifrtpy.executable import CompileOptions, ExecuteResult, LoadedExecutable
from ifrtpy.future import Future, join_futures
from ifrtpy.device import DeviceList
from ifrtpy.layout import Layout
from ifrtpy.remap import remap_arrays
from ifrtpy.shape import Shape
from ifrtpy.sharding import SingleDeviceSharding, SingleDeviceShardSemantics

_DEFAULT_COMPILE_OPTIONS = CompileOptions()  # one object: its hash is computed once
_EVERY_DTYPE_EXACT: Mapping[DType, InexactDType] = types.MappingProxyType({})

if TYPE_CHECKING:
    from ifrtpy.device import Device, MemoryKind
    from ifrtpy.sharding import Sharding

__all__ = ["Client", "Compiler", "HostBufferShards"]


class Compiler(abc.ABC):
    """Compiles programs for one client (IFRT ``Compiler``). Thread-safe."""

    __slots__ = ()

    @abc.abstractmethod
    def compile(self, program: Any, options: CompileOptions) -> LoadedExecutable:
        """Compile ``program`` (e.g. an ``HloProgram``) and load it onto ``options.devices``.

        Blocks until done. Raises InvalidArgumentError for a program type the compiler does
        not take or options it cannot honour, and the backend's compile error otherwise.
        """

    @abc.abstractmethod
    def deserialize_loaded_executable(
        self, data: bytes, options: CompileOptions | None = None
    ) -> LoadedExecutable:
        """Load bytes made by ``LoadedExecutable.serialize`` (onto ``options.devices`` if given).

        Blocks until done. InvalidArgumentError for bytes it cannot read;
        UnimplementedError where the backend cannot deserialize.
        """


@dataclasses.dataclass(frozen=True, eq=False)
class HostBufferShards:
    """One array to make from host buffers (IFRT ``MakeArraysFromHostBufferShardsSpec``).

    ``buffers`` pairs a sequence of shard indices (positions among the addressable
    shards of ``array_spec.sharding``, in device order) with the ndarray that holds
    each of those shards. Every addressable shard must be covered exactly once.
    """

    buffers: Sequence[tuple[Sequence[int], np.ndarray]]
    array_spec: ArraySpec


class Client(abc.ABC):
    """One backend's view of a set of devices (IFRT ``Client``).

    Thread-safe: every method may be called from any thread. Methods that create arrays
    return at once; the arrays' data becomes available through their ready futures, and
    errors of the transfer or computation arrive there too. Arguments are checked
    before anything is enqueued: bad input raises InvalidArgumentError at the call.
    Operations a backend does not support raise UnimplementedError.
    """

    __slots__ = ()

    # -- identity ---------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def runtime_type(self) -> str:
        """An informational name of the implementation, e.g. ``"pjrt_ifrt"``."""

    @property
    @abc.abstractmethod
    def platform_name(self) -> str:
        """The platform, as PJRT names it: ``"cpu"``, ``"cuda"``, ..."""

    @property
    @abc.abstractmethod
    def platform_version(self) -> str:
        """The platform's version string."""

    @property
    @abc.abstractmethod
    def platform_id(self) -> int:
        """A numeric platform id (PJRT's)."""

    @abc.abstractmethod
    def process_index(self) -> int:
        """The index of this process among the processes sharing the devices (>= 0)."""

    def attributes(self) -> Mapping[str, Any]:
        """Capabilities and properties of the client (IFRT ``AttributeMap``), e.g.
        ``supports_executable_serialization``. The default is empty."""
        return {}

    # -- devices ----------------------------------------------------------------------------

    @abc.abstractmethod
    def devices(self) -> list[Device]:
        """Every device of the client, addressable or not, sorted by id."""

    def addressable_devices(self) -> list[Device]:
        """The devices this process can drive, sorted by id. The default keeps the
        addressable ones of :meth:`devices`."""
        return [d for d in self.devices() if d.is_addressable]

    def device_count(self) -> int:
        return len(self.devices())

    def addressable_device_count(self) -> int:
        return len(self.addressable_devices())

    def lookup_device(self, device_id: int) -> Device:
        """The device with this id (the same object each time); NotFoundError naming the
        ids there are. The default searches :meth:`devices`."""
        device_id = check_int(device_id, "device_id")
        devices = self.devices()
        for device in devices:
            if device.id == device_id:
                return device
        raise NotFoundError(f"no device with id {device_id}; ids are {sorted(d.id for d in devices)}")

    def default_device_assignment(self, num_replicas: int, num_partitions: int) -> np.ndarray:
        """Device ids for a computation of ``num_replicas`` x ``num_partitions``, as an int
        array of that shape (IFRT ``GetDefaultDeviceAssignment``). The default takes the
        addressable devices in id order, replica-major; InvalidArgumentError for counts
        below 1 or more than there are addressable devices."""
        for name, value in (("num_replicas", num_replicas), ("num_partitions", num_partitions)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")
        devices = self.addressable_devices()
        if num_replicas * num_partitions > len(devices):
            raise InvalidArgumentError(
                f"a {num_replicas} x {num_partitions} assignment needs "
                f"{num_replicas * num_partitions} devices; the client has {len(devices)} addressable")
        ids = [d.id for d in devices[: num_replicas * num_partitions]]
        return np.array(ids, dtype=np.int64).reshape(num_replicas, num_partitions)

    def make_device_list(self, devices: Sequence[Device]) -> DeviceList:
        """An ordered DeviceList over ``devices`` (repeats allowed)."""
        return DeviceList(devices)

    def get_default_layout(
        self, dtype: DType, dims: Sequence[int], device: Device,
        memory_kind: MemoryKind | str | None = None,
    ) -> Layout:
        """The device layout an array of ``dtype`` and ``dims`` gets by default on
        ``device`` in ``memory_kind`` (IFRT ``GetDefaultLayout``). The base answer is the
        dense row-major layout, which is what the CPU plugin and the reference backend use.
        """
        return Layout.row_major(len(dims))

    def inexact_dtypes(
        self, memory_kind: MemoryKind | str | None = None,
    ) -> Mapping[DType, InexactDType]:
        """The dtypes whose values change on the way to this client's devices in
        ``memory_kind`` (None: their default memory), each with the values the devices
        give back (e.g. a TPU holds float64 as a pair of float32:
        :data:`ifrtpy.dtypes.FLOAT64_AS_FLOAT32_PAIR`). Every other dtype round-trips
        bit for bit.

        A backend that changes values of a dtype on the way to its devices must declare it
        here: the conformance laws expect the declared values for these dtypes and the
        input's own bytes for every other, and check each declaration against the devices.
        The base answer is empty (every dtype exact), as on the CPU plugin, the reference
        backend and jax on CPU.
        """
        return _EVERY_DTYPE_EXACT

    # -- arrays -----------------------------------------------------------------------------

    @abc.abstractmethod
    def make_array_from_host_buffer(
        self,
        data: np.ndarray,
        sharding: Sharding,
        semantics: HostBufferSemantics = HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
        on_done: Callable[[], None] | None = None,
        *,
        layout: Any = None,
    ) -> Array:
        """An array holding ``data`` (dtype, shape and byte strides taken from the ndarray).

        Every addressable device of ``sharding`` gets its own shard of ``data`` (the
        whole of it where the sharding replicates), as ``jax.device_put`` does; a
        backend may support only single-device and fully replicated shardings and raise
        InvalidArgumentError for others (IFRT's minimum). A sharding without shard
        information (OpaqueSharding) raises InvalidArgumentError.
        ``semantics`` says how long ``data`` must stay alive and unchanged, and when
        ``on_done`` (called once, from any thread, only if this call succeeds) runs; see
        :class:`HostBufferSemantics`. The result's ``sharding`` is the object passed in.
        Returns at once; the transfer completes asynchronously.
        """

    def make_arrays_from_host_buffer_shards(
        self,
        specs: Sequence[HostBufferShards],
        semantics: HostBufferSemantics = HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
    ) -> list[Array]:
        """One array per spec, each assembled from host buffers holding its shards.

        All specs must share one device list and memory kind (InvalidArgumentError).
        The default makes one single-device array per shard with
        :meth:`make_array_from_host_buffer` and assembles them (DONATE_INPUT).
        """
        specs = [s if isinstance(s, HostBufferShards) else HostBufferShards(*s) for s in specs]
        if specs:
            first = specs[0].array_spec.sharding
            for i, s in enumerate(specs[1:], 1):
                other = s.array_spec.sharding
                if other.devices != first.devices or other.memory_kind != first.memory_kind:
                    raise InvalidArgumentError(
                        f"make_arrays_from_host_buffer_shards: spec {i} is on {other!r}, spec 0 "
                        f"on {first!r}; all specs must have the same devices and memory kind"
                    )
        addressable = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
        plans = []  # per spec: the host buffer and SingleDeviceSharding of each shard
        for i, spec in enumerate(specs):
            aspec = spec.array_spec
            pieces = aspec.sharding.disassemble(aspec.shape, addressable)
            np_dtype = aspec.dtype.to_numpy()
            plan: list[Any] = [None] * len(pieces)  # (buffer, sharding) per shard, all set below
            for indices, data in spec.buffers:
                data = np.asarray(data)
                if is_string_host_dtype(data.dtype):  # STRING data: the host form, elements checked
                    data = host_form(data)[0]
                for j in indices:
                    if not 0 <= j < len(pieces):
                        raise InvalidArgumentError(
                            f"spec {i}: shard index {j} out of range [0, {len(pieces)})"
                        )
                    if plan[j] is not None:
                        raise InvalidArgumentError(f"spec {i}: shard {j} is given twice")
                    shard_shape, shard_sharding = pieces[j]
                    dims = _dims(shard_shape)
                    if data.dtype != np_dtype or data.shape != dims:
                        raise InvalidArgumentError(
                            f"spec {i}: shard {j} is {np_dtype}{list(dims)}, but its host buffer "
                            f"is {data.dtype}{list(data.shape)}"
                        )
                    plan[j] = (data, shard_sharding)
            missing = [j for j, p in enumerate(plan) if p is None]
            if missing:
                raise InvalidArgumentError(f"spec {i}: no host buffer for shards {missing}")
            plans.append(plan)
        arrays = []
        for spec, plan in zip(specs, plans):  # everything checked: now transfer
            aspec = spec.array_spec
            shards = [self.make_array_from_host_buffer(d, sh, semantics, layout=aspec.layout)
                      for d, sh in plan]
            arrays.append(
                self.assemble_array_from_single_device_arrays(
                    aspec.shape, aspec.sharding, shards, ArrayCopySemantics.DONATE_INPUT,
                    addressable, dtype=aspec.dtype,
                )
            )
        return arrays

    @abc.abstractmethod
    def assemble_array_from_single_device_arrays(
        self,
        shape: Shape,
        sharding: Sharding,
        arrays: Sequence[Array],
        copy_semantics: ArrayCopySemantics = ArrayCopySemantics.REUSE_INPUT,
        single_device_shard_semantics: SingleDeviceShardSemantics = (
            SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
        ),
        dtype: DType | None = None,
    ) -> Array:
        """One array of global ``shape`` from per-shard single-device arrays.

        ``arrays`` holds one array per (addressable, or with ALL_SHARDS every) shard of
        ``sharding``, in its device order, each on that device with the shard's shape;
        ``single_device_shard_semantics`` says which of the two is meant. ``dtype``
        (needed when ``arrays`` is empty) defaults to the inputs'. With DONATE_INPUT the
        inputs are deleted; with REUSE_INPUT the result may share their buffers.
        InvalidArgumentError for mismatched counts, devices, dtypes or shapes.
        """

    @abc.abstractmethod
    def copy_arrays(
        self,
        arrays: Sequence[Array],
        devices: DeviceList | None = None,
        memory_kind: MemoryKind | None = None,
        semantics: ArrayCopySemantics = ArrayCopySemantics.ALWAYS_COPY,
    ) -> list[Array]:
        """Copy whole arrays to other devices and/or another memory kind.

        ``devices`` (same count as the arrays' devices) and ``memory_kind`` default to the
        current ones; each result's sharding is
        ``sharding.with_device_assignment(devices, memory_kind)``. All inputs must share
        one device list and memory kind (InvalidArgumentError). DONATE_INPUT deletes the
        inputs; REUSE_INPUT may share buffers that need no move. Returns at once;
        UnimplementedError for transfers the backend cannot do (e.g. across hosts).
        """

    def remap_arrays(
        self, plan: Any, arrays: Sequence[Array], semantics: ArrayCopySemantics
    ) -> list[Array]:
        """Regroup shards of ``arrays`` into new arrays as ``plan`` (a RemapPlan) says,
        without moving data. REUSE_INPUT only when each output draws on one input;
        ALWAYS_COPY is not allowed. The default (:func:`ifrtpy.remap.remap_arrays`)
        validates the plan and the inputs, then disassembles and assembles."""
        return remap_arrays(self, plan, arrays, semantics)

    def reshard_arrays(
        self,
        arrays: Sequence[Array],
        specs: Sequence[ArraySpec],
        semantics: ArrayCopySemantics = ArrayCopySemantics.ALWAYS_COPY,
    ) -> list[Array]:
        """Move each array's data into the dtype/shape/sharding of the matching spec.

        REUSE_INPUT is not allowed (InvalidArgumentError). UnimplementedError by default.
        """
        raise UnimplementedError(f"{type(self).__name__} does not implement reshard_arrays")

    def bitcast_arrays(
        self,
        arrays: Sequence[Array],
        specs: Sequence[ArraySpec],
        semantics: ArrayCopySemantics = ArrayCopySemantics.ALWAYS_COPY,
    ) -> list[Array]:
        """Each array's shard bytes read as the matching spec (IFRT ``BitcastArrays``):
        same addressable devices and memory kind, same bytes per shard, no conversion; see
        :mod:`ifrtpy.bitcast`. The result's sharding is the spec's. DONATE_INPUT deletes
        the inputs. InvalidArgumentError for a mismatch; UnimplementedError by default.
        """
        raise UnimplementedError(f"{type(self).__name__} does not implement bitcast_arrays")

    def make_error_arrays(self, error: BaseException, specs: Sequence[ArraySpec]) -> list[Array]:
        """Arrays of the given specs whose ready futures fail with ``error``.

        UnimplementedError by default.
        """
        raise UnimplementedError(f"{type(self).__name__} does not implement make_error_arrays")

    def from_dlpack(self, x: Any, device: Device | None = None, copy: bool | None = None) -> Array:
        """A single-device array holding ``x``, a DLPack producer with host memory (or an
        unconsumed capsule), on ``device`` (default: the first addressable device).

        This default copies once (``copy=False`` raises ValueError); backends that can
        alias the producer's memory override it (the PjRt backend does).
        """
        if copy is False:
            raise ValueError(f"{type(self).__name__}.from_dlpack always copies; copy=False forbids it")
        if device is None:
            device = self.addressable_devices()[0]
        host = np.from_dlpack(x) if hasattr(x, "__dlpack__") else np.from_dlpack(_CapsuleHolder(x))
        return self.make_array_from_host_buffer(host, SingleDeviceSharding(device))

    def assemble_array_from_dlpack(self, shape: Shape | Sequence[int], sharding: Sharding,
                                   tensors: Sequence[Any], dtype: Any = None) -> Array:
        """One array of global ``shape`` and ``sharding`` from one DLPack producer (or
        unconsumed capsule) per addressable shard, in the sharding's device order: how the
        jax bridge brings a ``jax.Array`` in. ``dtype`` (a NumPy dtype or DType) is needed
        when there are no tensors. The default takes each tensor with :meth:`from_dlpack`
        onto its shard's device and assembles them; backends that can alias the tensors'
        memory in one step override it (the PjRt backend on host platforms does).
        """
        pieces = [self.from_dlpack(t, d) for t, d in zip(tensors, dlpack_devices(sharding, tensors))]
        if dtype is not None and not isinstance(dtype, DType):
            dtype = DType.from_numpy(dtype)
        return self.assemble_array_from_single_device_arrays(
            Shape(shape), sharding, pieces, ArrayCopySemantics.DONATE_INPUT, dtype=dtype)

    def cancel_execution(self, result: ExecuteResult, error: BaseException | None = None) -> bool:
        """Best-effort cancellation of the execution that gave ``result`` (IFRT
        ``CancelExecution``): True when it was cancelled (its status and outputs then fail
        with ``error``, default CancelledError), False when it had already finished.
        Calling it again is harmless. UnimplementedError, saying why, where the backend
        cannot cancel executions.
        """
        raise UnimplementedError(f"{type(self).__name__} cannot cancel executions")

    def get_ready_future(self, values: Sequence[Value]) -> Future[None]:
        """Ready once every value is; fails with one failing value's error. Never blocks."""
        return join_futures(v.ready_future() for v in values)

    def make_tuple(self, values: Sequence[Value]) -> Tuple:
        """A :class:`Tuple` of ``values`` (which stay shared with the caller)."""
        return Tuple(self, values)

    # -- compilation ------------------------------------------------------------------------

    @abc.abstractmethod
    def default_compiler(self) -> Compiler:
        """The compiler for this client's devices."""

    @property
    def compiler(self) -> Compiler:
        """Shorthand for :meth:`default_compiler`."""
        return self.default_compiler()

    def compile(self, program: Any, options: CompileOptions | None = None) -> LoadedExecutable:
        """``default_compiler().compile(program, options or CompileOptions())``."""
        return self.default_compiler().compile(
            program, _DEFAULT_COMPILE_OPTIONS if options is None else options
        )

    def deserialize_executable(
        self, data: bytes, options: CompileOptions | None = None
    ) -> LoadedExecutable:
        """``default_compiler().deserialize_loaded_executable(data, options)``."""
        return self.default_compiler().deserialize_loaded_executable(data, options)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.platform_name} ({self.runtime_type}), "
            f"{self.device_count()} device(s)>"
        )


class _CapsuleHolder:
    """A bare DLPack capsule dressed as a producer on the host, for ``np.from_dlpack``."""

    def __init__(self, capsule: Any):
        self._capsule = capsule

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)
