"""PjrtClient, PjrtDevice and PjrtMemory: IFRT's client, device and memory over a PJRT
plugin. Array operations live in :mod:`ifrtpy.backends.pjrt.array`."""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Mapping

from ifrtpy import _pjrt, distributed
from ifrtpy._pjrt._kv import KeyValueCallbacks
from ifrtpy.backends.pjrt import copies as _copies
from ifrtpy.backends.pjrt import dlpack_import as _dlpack_import
from ifrtpy.backends.pjrt import executable as _executable
from ifrtpy.backends.pjrt import layouts as _layouts
from ifrtpy.backends.pjrt import precision as _precision
from ifrtpy.backends.pjrt import operations as _operations
from ifrtpy.backends.pjrt import put as _put
from ifrtpy.backends.pjrt import reshard as _reshard
from ifrtpy.array import ArrayCopySemantics, HostBufferSemantics
from ifrtpy.client import Client
from ifrtpy.device import Device, Memory, MemoryKind
from ifrtpy.errors import (IfrtError, InvalidArgumentError, NotFoundError, UnimplementedError,
                           check_int)
from ifrtpy.plugins import check_options, find_plugin, known_options, preload_nvidia_libraries
from ifrtpy.plugins.options import check_cpu_device_count
from ifrtpy.plugins.builds import build_at, default_cpu_library
from ifrtpy.plugins.held_tpu import tpu_in_use_error
from ifrtpy.sharding import SingleDeviceShardSemantics


def create_client(plugin: str | None = None, device_count: int | None = None,
                  options: Mapping[str, Any] | None = None, *, name: str | None = None,
                  **named_options: Any) -> PjrtClient:
    """A PjrtClient of a PJRT plugin.

    ``plugin`` is a library path or a plugin name (see :mod:`ifrtpy.plugins`); ``name``
    names the plugin whose option table applies (default: ``plugin`` when it is a name).
    Neither given: the default CPU plugin (:func:`ifrtpy.plugins.builds.default_cpu_library`),
    the only case that needs a CPU build installed.
    ``device_count`` sets ``cpu_device_count``. ``options`` and ``named_options`` are the
    plugin's create options, checked against its table in :mod:`ifrtpy.plugins.options`
    where ifrtpy knows the plugin (a known CPU build's own table, whatever its name). After
    :func:`ifrtpy.distributed.initialize`, the client gets the job's key-value store
    callbacks, and ``node_id`` / ``num_nodes`` where the plugin's table has them.
    """
    opts: dict[str, Any] = {}
    said: dict[str, str] = {}  # option -> how the call gave it
    given = [(f"options[{k!r}]={v!r}", k, v) for k, v in (options or {}).items()]
    given += [(f"{k}={v!r}", k, v) for k, v in named_options.items()]
    if device_count is not None:
        given.append((f"device_count={device_count!r}", "cpu_device_count", device_count))
    for how, key, value in given:
        if key in opts and opts[key] != value:
            raise InvalidArgumentError(
                f"create option {key!r} is given twice, as {said[key]} and as {how}: give it "
                "once (device_count= sets cpu_device_count)")
        opts[key], said[key] = value, how
    if plugin is None and name is None:
        path, name = default_cpu_library(), "cpu"
    elif plugin is None or not _is_path(plugin):
        name = name if plugin is None else (name or plugin)
        path = find_plugin(plugin or name).path
    else:
        path = plugin
    build = build_at(path)
    table_name = build.name if build is not None else name
    if ((build is not None or name == "cpu") and "cpu_device_count" not in opts
            and host_device_count() is not None):
        opts["cpu_device_count"] = host_device_count()
    kv_callbacks = None
    if distributed.is_initialized():  # a multi-process job: node ids and the KV store
        table = known_options(table_name) if table_name is not None else None
        if table is not None and "num_nodes" in table:
            opts.setdefault("node_id", distributed.process_id())
            opts.setdefault("num_nodes", distributed.num_processes())
        kv_callbacks = job_kv_callbacks(name or os.path.basename(path))
    if table_name is not None:
        opts = check_options(table_name, opts)
    check_cpu_device_count(opts)  # creating a client costs time quadratic in the count
    if name in ("cuda", "gpu"):
        preload_nvidia_libraries()
    try:
        handle = _pjrt.create_client(_pjrt.load_plugin(path), opts, kv_callbacks)
    except IfrtError as error:
        held = tpu_in_use_error(error)  # libtpu's refusal of a chip another process holds
        if held is None:
            raise
        raise held from None  # its message holds libtpu's
    return PjrtClient(handle)


def host_device_count() -> int | None:
    """The CPU device count this process gives XLA's CPU clients, jax's among them:
    ``jax_num_cpu_devices`` where jax is loaded and sets it, else
    ``--xla_force_host_platform_device_count`` in ``XLA_FLAGS``; None when neither does."""
    jax = sys.modules.get("jax")
    count = getattr(getattr(jax, "config", None), "jax_num_cpu_devices", -1) if jax else -1
    if isinstance(count, int) and count > 0:
        return count
    found = re.findall(r"--xla_force_host_platform_device_count=(\d+)",
                       os.environ.get("XLA_FLAGS", ""))
    return int(found[-1]) if found else None


def job_kv_callbacks(plugin_name: str) -> Any:
    """The PJRT key-value callbacks of a client of ``plugin_name`` in the job: the job's
    store under the prefix ``ifrtpy:<plugin_name>:`` (so clients of other plugins, and
    jax's, do not mix)."""
    return KeyValueCallbacks(
        distributed.key_value_store().with_prefix(f"ifrtpy:{plugin_name}:"))


def _is_path(plugin: Any) -> bool:
    """Whether ``plugin`` names a file (a path-like, or a str with a separator or ``.so``)."""
    if not isinstance(plugin, str):
        return True
    return os.sep in plugin or plugin.endswith(".so") or os.path.isfile(plugin)


class PjrtMemory(Memory):
    """A memory space of a PJRT device."""

    __slots__ = ("_client", "_handle", "_kind")

    def __init__(self, client: PjrtClient, handle):
        self._client = client
        self._handle = handle
        self._kind = MemoryKind(handle.kind)

    @property
    def id(self) -> int:
        return self._handle.id

    @property
    def kind(self) -> MemoryKind:
        return self._kind

    def devices(self) -> list[Device]:
        return [self._client._device_of_handle[h.id] for h in self._handle.devices]

    def to_string(self) -> str:
        return self._handle.to_string

    def debug_string(self) -> str:
        return self._handle.debug_string


class PjrtDevice(Device):
    """A device of a PJRT client. Compares by identity; one object per device."""

    __slots__ = ("_client", "_handle", "_memories", "_default_memory")

    def __init__(self, client: PjrtClient, handle):
        self._client = client
        self._handle = handle
        self._memories = tuple(PjrtMemory(client, m) for m in handle.memories)
        default = handle.default_memory
        self._default_memory = next((m for m in self._memories if m._handle is default), None)

    @property
    def client(self) -> PjrtClient:
        return self._client

    @property
    def id(self) -> int:
        return self._handle.id

    @property
    def kind(self) -> str:
        return self._handle.kind

    @property
    def attributes(self) -> Mapping[str, Any]:
        return self._handle.attributes

    @property
    def is_addressable(self) -> bool:
        return self._handle.is_addressable

    @property
    def process_index(self) -> int:
        return self._handle.process_index

    @property
    def local_hardware_id(self) -> int:
        return self._handle.local_hardware_id

    def memories(self) -> tuple[PjrtMemory, ...]:
        return self._memories

    def default_memory(self) -> PjrtMemory:
        if self._default_memory is None:
            raise NotFoundError(f"device {self.to_string()} has no default memory")
        return self._default_memory

    def memory_stats(self) -> dict[str, int]:
        """Allocator statistics; UnimplementedError where the plugin has none."""
        return self._handle.memory_stats()

    def to_string(self) -> str:
        return self._handle.to_string

    def debug_string(self) -> str:
        return self._handle.debug_string


class PjrtClient(Client):
    """IFRT's client over one PJRT client (``ifrtpy._pjrt.ClientHandle``).

    Thread-safe: the plugin is, and the client's own state is fixed at creation.
    """

    def __init__(self, handle):
        self._handle = handle
        self._devices = [PjrtDevice(self, h) for h in handle.devices]
        self._device_of_handle = {d.id: d for d in self._devices}
        self._addressable = [self._device_of_handle[h.id] for h in handle.addressable_devices]
        self._memory_cache: dict = {}  # id(SingleDeviceSharding) -> (it, MemoryHandle), for fast puts
        self._read_plans: dict = {}  # (Sharding, Shape) -> PjrtArray._read_plan's plan
        self._host_platform = handle.platform_name == "cpu"  # every memory is host RAM
        self._host_views = _copies.host_views(handle.plugin)  # NumPy views, DLPack exports
        self._dlpack_devices: dict = {}  # memory id -> (DLDeviceType, device id)
        self._compiler = _executable.PjrtCompiler(self)
        self._default_layouts: dict = {}  # (dtype, dims, host memory) -> Layout

    # -- topology -----------------------------------------------------------------------

    @property
    def runtime_type(self) -> str:
        return "pjrt_ifrt"

    @property
    def platform_name(self) -> str:
        return self._handle.platform_name

    @property
    def platform_version(self) -> str:
        return self._handle.platform_version

    @property
    def platform_id(self) -> int:
        import zlib
        return zlib.crc32(self.platform_name.encode())

    def process_index(self) -> int:
        return self._handle.process_index

    def attributes(self) -> Mapping[str, Any]:
        plugin = self._handle.plugin
        return {
            **plugin.attributes,
            "pjrt_c_api_major_version": plugin.api_version[0],
            "pjrt_c_api_minor_version": plugin.api_version[1],
            "supports_executable_serialization": True,
        }

    @property
    def plugin(self):
        """The ``ifrtpy._pjrt.PluginHandle`` this client runs on."""
        return self._handle.plugin

    def devices(self) -> list[PjrtDevice]:
        return list(self._devices)

    def addressable_devices(self) -> list[PjrtDevice]:
        return list(self._addressable)

    def lookup_device(self, device_id: int) -> PjrtDevice:
        # a dict lookup (a plugin may have thousands), of a checked int: 1.0 or True is no id
        device = self._device_of_handle.get(check_int(device_id, "device_id"))
        return device if device is not None else super().lookup_device(device_id)

    def default_device_assignment(self, num_replicas: int, num_partitions: int):
        """The plugin's own assignment (PJRT_Client_DefaultDeviceAssignment), after the
        base class's checks of the counts."""
        import numpy as np

        super().default_device_assignment(num_replicas, num_partitions)
        ids = self._handle.default_device_assignment(num_replicas, num_partitions)
        return np.array(ids, dtype=np.int64).reshape(num_replicas, num_partitions)

    def inexact_dtypes(self, memory_kind=None):
        """The dtypes this platform's memories do not hold exactly (a TPU: f64 and c128 as
        float32 pairs in ``device`` and ``pinned_host`` memory), see :mod:`.precision`."""
        return _precision.inexact_dtypes(self.platform_name, memory_kind)

    def get_default_layout(self, dtype, dims, device, memory_kind=None):
        """The plugin's default layout (its layouts extension; row-major without one, and
        in ``unpinned_host`` memory), e.g. ``{1,0:T(8,128)}`` for f32[256, 256] on a TPU."""
        return _layouts.default_layout(self, dtype, dims, device, memory_kind)

    # -- arrays -------------------------------------------------------------------------

    def make_array_from_host_buffer(self, data, sharding, semantics=HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
                                    on_done=None, *, layout=None):
        return _put.make_array_from_host_buffer(self, data, sharding, semantics, on_done, layout)

    def assemble_array_from_single_device_arrays(
            self, shape, sharding, arrays, copy_semantics=ArrayCopySemantics.REUSE_INPUT,
            single_device_shard_semantics=SingleDeviceShardSemantics.ADDRESSABLE_SHARDS, dtype=None):
        return _operations.assemble(self, shape, sharding, arrays, copy_semantics,
                              single_device_shard_semantics, dtype)

    def copy_arrays(self, arrays, devices=None, memory_kind=None,
                    semantics=ArrayCopySemantics.ALWAYS_COPY):
        return _operations.copy_arrays(self, arrays, devices, memory_kind, semantics)

    def reshard_arrays(self, arrays, specs, semantics=ArrayCopySemantics.ALWAYS_COPY):
        return _reshard.reshard_arrays(self, arrays, specs, semantics)

    def bitcast_arrays(self, arrays, specs, semantics=ArrayCopySemantics.ALWAYS_COPY):
        return _operations.bitcast_arrays(self, arrays, specs, semantics)

    def make_error_arrays(self, error, specs):
        return _operations.make_error_arrays(self, error, specs)

    def from_dlpack(self, x: Any, device: Device | None = None, copy: bool | None = None) -> Any:
        """A single-device array holding ``x``, any DLPack producer (NumPy, jax, torch,
        cupy, TensorFlow) or an unconsumed DLPack capsule.

        Zero-copy where the plugin can alias the memory (dense, row-major, aligned: 64
        bytes on the CPU plugin; the producer's memory is held until the array's buffer is
        destroyed); else one copy, or ValueError where ``copy=False``. ``copy=True`` always
        copies. The array lands on ``device`` if given, else on the device the tensor is on
        (accelerators, by local hardware id) or the first device for host memory.
        """
        return _dlpack_import.from_dlpack(self, x, device, copy)

    def assemble_array_from_dlpack(self, shape, sharding, tensors, dtype=None):
        """On a plugin whose memories are host RAM (the CPU plugin): each host-memory
        tensor aliased in place where the plugin can, else copied, in one step. Elsewhere
        :meth:`ifrtpy.Client.assemble_array_from_dlpack`'s way."""
        if not self._host_platform:
            return super().assemble_array_from_dlpack(shape, sharding, tensors, dtype)
        return _dlpack_import.assemble_from_dlpack(self, shape, sharding, tensors, dtype)

    # -- programs -----------------------------------------------------------------------

    def default_compiler(self) -> _executable.PjrtCompiler:
        return self._compiler

    def cancel_execution(self, result, error=None) -> bool:
        """UnimplementedError: the PJRT C API has no call that cancels a launched execution
        (wait for ``result.status`` instead)."""
        plugin = self.plugin
        raise UnimplementedError(
            f"the PJRT C API (plugin {self.platform_name}, PJRT {plugin.api_version[0]}."
            f"{plugin.api_version[1]}) has no call to cancel a launched execution; wait for "
            f"result.status instead")

    def __repr__(self) -> str:
        return (f"<PjrtClient {self.platform_name} PJRT {self.plugin.api_version[0]}."
                f"{self.plugin.api_version[1]}, {len(self._devices)} devices>")
