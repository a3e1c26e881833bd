# cython: language_level=3, binding=True, embedsignature=True
"""PJRT clients, devices and memories.

Differences from the C API:

* ``create_client`` hands each option to the plugin typed as given (a str, an int64, a
  float, a bool or a list of int64); it refuses only values no PJRT named value can hold.
  What a plugin accepts is the caller's to check: the PjRt backend checks options against
  the plugin's table (``ifrtpy.plugins.options``; an XLA CPU plugin aborts the process on
  a ``cpu_device_count`` that is not an int64).
* A ClientHandle builds one DeviceHandle per device and one MemoryHandle per addressable
  memory at creation, so lookups return the same objects. Device and memory handles
  borrow their C pointers and keep the client alive.
* Strings come back as ``str``; named values as dicts.
"""

from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
cimport cython

from ifrtpy._pjrt._api cimport *
from ifrtpy._pjrt._base cimport to_str, named_values_to_dict, raise_unimplemented_in
from ifrtpy import errors as _errors
from ifrtpy import dtypes as _dtypes

cdef bytes layout_text(const PJRT_Api* api, PJRT_Layouts_MemoryLayout* layout):
    """The serialized text of a layout of the layouts extension, which this call destroys;
    where serializing fails, its error is raised (the destroy's, if it fails too, dropped)."""
    cdef PJRT_Layouts_MemoryLayout_Serialize_Args text = PJRT_Layouts_MemoryLayout_Serialize_Args_new()
    cdef PJRT_Layouts_MemoryLayout_Destroy_Args destroy = PJRT_Layouts_MemoryLayout_Destroy_Args_new()
    cdef bytes out
    text.layout = layout
    destroy.layout = layout
    try:
        PJRT_Layouts_MemoryLayout_Serialize(api, &text)
        try:
            out = (b"" if text.serialized_bytes == NULL
                   else text.serialized_bytes[:text.serialized_bytes_size])
        finally:
            if text.serialized_layout_deleter != NULL:
                text.serialized_layout_deleter(text.serialized_layout)
    except BaseException:
        PJRT_Layouts_MemoryLayout_Destroy_quiet(api, &destroy)  # the first error stands
        raise
    PJRT_Layouts_MemoryLayout_Destroy(api, &destroy)
    return out


cdef int need_layouts(const PJRT_Api* api) except -1:
    """UnimplementedError unless the plugin's layouts extension can serialize and destroy
    the layouts it hands out."""
    if not has_PJRT_Layouts_MemoryLayout_Serialize(api):
        raise_unimplemented_in(api, b"Layouts", b"PJRT_Layouts_MemoryLayout_Serialize")
    if not has_PJRT_Layouts_MemoryLayout_Destroy(api):
        raise_unimplemented_in(api, b"Layouts", b"PJRT_Layouts_MemoryLayout_Destroy")
    return 0


def create_client(PluginHandle plugin not None, options=None, KeyValueCallbacks kv_callbacks=None):
    """A new client of ``plugin`` with named ``options`` (str -> str, int, float, bool or
    list of int), each handed to the plugin typed as given, and, if given, the key-value
    store callbacks (``_kv.KeyValueCallbacks``, kept alive by the client). Raises
    InvalidArgumentError for a name that is no str and a value no PJRT named value holds;
    whether the plugin takes an option is the caller's to check (an XLA CPU plugin aborts
    the process on a ``cpu_device_count`` that is not an int)."""
    cdef dict opts = dict(options or {})
    for name, value in opts.items():
        if not isinstance(name, str):
            raise _errors.InvalidArgumentError(f"client option names must be str, got {name!r}")
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63:
                raise _errors.InvalidArgumentError(
                    f"client option {name!r}: {v} does not fit in an int64")
    cdef ClientHandle client = ClientHandle.__new__(ClientHandle)
    client.plugin = plugin
    client.api = plugin.api
    client.kv_callbacks = kv_callbacks
    if kv_callbacks is not None:
        # The plugin calls back with this object until PJRT_Client_Destroy returns, but the
        # cyclic GC may clear kv_callbacks before __dealloc__: a reference it cannot clear.
        Py_INCREF(kv_callbacks)
        client._kv_keep = <PyObject*>kv_callbacks
    client._create(opts, kv_callbacks)
    return client


cdef class ClientHandle:
    """Owns a ``PJRT_Client*``; destroyed when the last handle made from it is gone.

    A client and its device and memory handles refer to each other; the garbage
    collector may clear the client's side of that cycle (its ``__dealloc__`` needs only
    the C pointers), while every other handle keeps its references to the end.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("use ifrtpy._pjrt.create_client(plugin, options)")

    cdef _create(self, dict opts, KeyValueCallbacks kv):
        cdef const PJRT_Api* api = self.api
        cdef size_t n = len(opts), i = 0
        cdef PJRT_NamedValue* values = <PJRT_NamedValue*>malloc(max(n, 1) * sizeof(PJRT_NamedValue))
        cdef list keep = []
        cdef bytes name_bytes, text
        cdef int64_t[::1] ints
        cdef PJRT_Client_Create_Args args
        try:
            memset(values, 0, max(n, 1) * sizeof(PJRT_NamedValue))
            for name, value in opts.items():
                name_bytes = name.encode()
                keep.append(name_bytes)
                values[i] = PJRT_NamedValue_new()
                values[i].name = name_bytes
                values[i].name_size = len(name_bytes)
                if isinstance(value, bool):
                    values[i].type = PJRT_NamedValue_kBool
                    values[i].bool_value = value
                    values[i].value_size = 1
                elif isinstance(value, int):
                    values[i].type = PJRT_NamedValue_kInt64
                    values[i].int64_value = value
                    values[i].value_size = 1
                elif isinstance(value, float):
                    values[i].type = PJRT_NamedValue_kFloat
                    values[i].float_value = value
                    values[i].value_size = 1
                elif isinstance(value, str):
                    text = value.encode()
                    keep.append(text)
                    values[i].type = PJRT_NamedValue_kString
                    values[i].string_value = text
                    values[i].value_size = len(text)
                elif isinstance(value, (list, tuple)) and all(
                        isinstance(v, int) and not isinstance(v, bool) for v in value):
                    import numpy
                    array = numpy.ascontiguousarray(value, dtype=numpy.int64)
                    keep.append(array)
                    values[i].type = PJRT_NamedValue_kInt64List
                    if len(value):
                        ints = array
                        values[i].int64_array_value = &ints[0]
                    values[i].value_size = len(value)
                else:
                    raise _errors.InvalidArgumentError(
                        f"client option {name!r} has unsupported type {type(value).__name__}; "
                        "expected str, int, float, bool or a list of int"
                    )
                i += 1
            args = PJRT_Client_Create_Args_new()
            args.create_options = values
            args.num_options = n
            if kv is not None:
                kv.fill(&args)
            PJRT_Client_Create(api, &args)
        finally:
            free(values)
        self.ptr = args.client
        self._load_topology()

    cdef _load_topology(self):
        cdef const PJRT_Api* api = self.api
        cdef PJRT_Client_Devices_Args dev_args
        cdef PJRT_Client_AddressableDevices_Args addr_args
        cdef size_t i
        dev_args = PJRT_Client_Devices_Args_new()
        dev_args.client = self.ptr
        PJRT_Client_Devices(api, &dev_args)
        self._device_of_ptr = {}
        self._memory_of_ptr = {}
        devices = []
        for i in range(dev_args.num_devices):
            device = DeviceHandle._wrap(self, dev_args.devices[i])
            self._device_of_ptr[<size_t>dev_args.devices[i]] = device
            devices.append(device)
        self.devices = tuple(devices)
        addr_args = PJRT_Client_AddressableDevices_Args_new()
        addr_args.client = self.ptr
        PJRT_Client_AddressableDevices(api, &addr_args)
        self.addressable_devices = tuple(
            self.device_of(addr_args.addressable_devices[i])
            for i in range(addr_args.num_addressable_devices)
        )
        for device in self.addressable_devices:
            (<DeviceHandle>device)._load_memories()

    cdef DeviceHandle device_of(self, PJRT_Device* ptr):
        device = self._device_of_ptr.get(<size_t>ptr)
        if device is None:
            raise _errors.InternalError("the plugin returned a device this client does not know")
        return device

    cdef MemoryHandle memory_of(self, PJRT_Memory* ptr):
        memory = self._memory_of_ptr.get(<size_t>ptr)
        if memory is None:
            memory = MemoryHandle._wrap(self, ptr)
            self._memory_of_ptr[<size_t>ptr] = memory
        return memory

    def __dealloc__(self):
        cdef PJRT_Client_Destroy_Args args
        if self.ptr != NULL:
            args = PJRT_Client_Destroy_Args_new()
            args.client = self.ptr
            self.ptr = NULL
            with nogil:
                PJRT_Client_Destroy_quiet(self.api, &args)  # an error has no one to go to
        Py_XDECREF(self._kv_keep)
        self._kv_keep = NULL

    @property
    def platform_name(self):
        cdef PJRT_Client_PlatformName_Args args = PJRT_Client_PlatformName_Args_new()
        args.client = self.ptr
        PJRT_Client_PlatformName(self.api, &args)
        return to_str(args.platform_name, args.platform_name_size)

    @property
    def platform_version(self):
        cdef PJRT_Client_PlatformVersion_Args args = PJRT_Client_PlatformVersion_Args_new()
        args.client = self.ptr
        PJRT_Client_PlatformVersion(self.api, &args)
        return to_str(args.platform_version, args.platform_version_size)

    @property
    def process_index(self):
        cdef PJRT_Client_ProcessIndex_Args args = PJRT_Client_ProcessIndex_Args_new()
        args.client = self.ptr
        PJRT_Client_ProcessIndex(self.api, &args)
        return args.process_index

    def lookup_device(self, device_id):
        """The DeviceHandle with global id ``device_id``; NotFoundError (or the plugin's
        error) when there is none."""
        cdef PJRT_Client_LookupDevice_Args args
        cdef int id = _errors.check_int(device_id, "device_id", -2**31, 2**31 - 1)
        args = PJRT_Client_LookupDevice_Args_new()
        args.client = self.ptr
        args.id = id
        PJRT_Client_LookupDevice(self.api, &args)
        return self.device_of(args.device)

    def default_device_assignment(self, int num_replicas, int num_partitions):
        """Device ids, replica-major: ``num_replicas * num_partitions`` ints from
        PJRT_Client_DefaultDeviceAssignment. Both counts must be at least 1."""
        cdef const PJRT_Api* api = self.api
        cdef PJRT_Client_DefaultDeviceAssignment_Args args
        if num_replicas < 1 or num_partitions < 1:
            raise _errors.InvalidArgumentError(
                f"num_replicas and num_partitions must be at least 1, got {num_replicas} and "
                f"{num_partitions}")
        cdef size_t n = <size_t>num_replicas * <size_t>num_partitions
        import numpy
        ids = numpy.zeros(n, dtype=numpy.intc)
        cdef int[::1] view = ids
        args = PJRT_Client_DefaultDeviceAssignment_Args_new()
        args.client = self.ptr
        args.num_replicas = num_replicas
        args.num_partitions = num_partitions
        args.default_assignment_size = n
        args.default_assignment = &view[0]
        PJRT_Client_DefaultDeviceAssignment(api, &args)
        return [int(i) for i in ids]

    def default_layout(self, int buffer_type, dims):
        """The plugin's serialized default layout (XLA's layout text, e.g. ``b"{0:T(128)}"``)
        of an array of PJRT_Buffer_Type ``buffer_type`` and ``dims``, from the layouts
        extension's PJRT_Layouts_PJRT_Client_GetDefaultLayout. UnimplementedError where the
        plugin has no layouts extension."""
        need_layouts(self.api)
        if buffer_type not in _dtypes.NUMPY_OF_PJRT_BUFFER_TYPE:
            raise _errors.InvalidArgumentError(
                f"buffer_type must be a PJRT_Buffer_Type of an array dtype, got {buffer_type}")
        cdef list sizes = [_errors.check_int(d, "dims", 0, 2**63 - 1) for d in dims]
        cdef size_t n = len(sizes), i
        cdef int64_t* c_dims = <int64_t*>malloc(max(n, 1) * sizeof(int64_t))
        if c_dims == NULL:
            raise MemoryError()
        cdef PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args args = (
            PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args_new())
        try:
            for i in range(n):
                c_dims[i] = sizes[i]
            args.client = self.ptr
            args.type = <PJRT_Buffer_Type>buffer_type
            args.dims = c_dims
            args.num_dims = n
            PJRT_Layouts_PJRT_Client_GetDefaultLayout(self.api, &args)
        finally:
            free(c_dims)
        return layout_text(self.api, args.layout)

    def __repr__(self):
        return f"<ClientHandle {self.platform_name} with {len(self.devices)} devices>"


@cython.no_gc_clear
cdef class DeviceHandle:
    """A device of a client (borrowed pointer; keeps the client alive)."""

    def __init__(self, *args, **kwargs):
        raise TypeError("devices come from ClientHandle.devices")

    @staticmethod
    cdef DeviceHandle _wrap(ClientHandle client, PJRT_Device* ptr):
        cdef const PJRT_Api* api = client.api
        cdef DeviceHandle self = DeviceHandle.__new__(DeviceHandle)
        self.client = client
        self.ptr = ptr
        cdef PJRT_Device_GetDescription_Args d = PJRT_Device_GetDescription_Args_new()
        d.device = ptr
        PJRT_Device_GetDescription(api, &d)
        self.description = d.device_description
        cdef PJRT_DeviceDescription_Id_Args i = PJRT_DeviceDescription_Id_Args_new()
        i.device_description = self.description
        PJRT_DeviceDescription_Id(api, &i)
        self.id = i.id
        cdef PJRT_Device_IsAddressable_Args a = PJRT_Device_IsAddressable_Args_new()
        a.device = ptr
        PJRT_Device_IsAddressable(api, &a)
        self.is_addressable = a.is_addressable
        self._memories = ()
        return self

    cdef _load_memories(self):
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Device_AddressableMemories_Args m
        cdef PJRT_Device_DefaultMemory_Args dm
        cdef size_t k
        m = PJRT_Device_AddressableMemories_Args_new()
        m.device = self.ptr
        PJRT_Device_AddressableMemories(api, &m)
        self._memories = tuple(self.client.memory_of(m.memories[k]) for k in range(m.num_memories))
        dm = PJRT_Device_DefaultMemory_Args_new()
        dm.device = self.ptr
        PJRT_Device_DefaultMemory(api, &dm)
        self._default_memory = self.client.memory_of(dm.memory) if dm.memory != NULL else None

    @property
    def process_index(self):
        cdef PJRT_DeviceDescription_ProcessIndex_Args args = PJRT_DeviceDescription_ProcessIndex_Args_new()
        args.device_description = self.description
        PJRT_DeviceDescription_ProcessIndex(self.client.api, &args)
        return args.process_index

    @property
    def kind(self):
        cdef PJRT_DeviceDescription_Kind_Args args = PJRT_DeviceDescription_Kind_Args_new()
        args.device_description = self.description
        PJRT_DeviceDescription_Kind(self.client.api, &args)
        return to_str(args.device_kind, args.device_kind_size)

    @property
    def debug_string(self):
        cdef PJRT_DeviceDescription_DebugString_Args args = PJRT_DeviceDescription_DebugString_Args_new()
        args.device_description = self.description
        PJRT_DeviceDescription_DebugString(self.client.api, &args)
        return to_str(args.debug_string, args.debug_string_size)

    @property
    def to_string(self):
        cdef PJRT_DeviceDescription_ToString_Args args = PJRT_DeviceDescription_ToString_Args_new()
        args.device_description = self.description
        PJRT_DeviceDescription_ToString(self.client.api, &args)
        return to_str(args.to_string, args.to_string_size)

    @property
    def attributes(self):
        cdef PJRT_DeviceDescription_Attributes_Args args = PJRT_DeviceDescription_Attributes_Args_new()
        args.device_description = self.description
        PJRT_DeviceDescription_Attributes(self.client.api, &args)
        return named_values_to_dict(args.attributes, args.num_attributes)

    @property
    def local_hardware_id(self):
        """The plugin's local hardware id; -1 where it has none."""
        cdef PJRT_Device_LocalHardwareId_Args args = PJRT_Device_LocalHardwareId_Args_new()
        args.device = self.ptr
        PJRT_Device_LocalHardwareId(self.client.api, &args)
        return args.local_hardware_id

    @property
    def memories(self):
        """The device's addressable memories (empty for a non-addressable device)."""
        return self._memories

    @property
    def default_memory(self):
        return self._default_memory

    def memory_stats(self):
        """Allocator statistics as a dict (only the fields the plugin sets);
        UnimplementedError where the plugin has none (the CPU plugin)."""
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Device_MemoryStats_Args a = PJRT_Device_MemoryStats_Args_new()
        a.device = self.ptr
        PJRT_Device_MemoryStats(api, &a)
        stats = {"bytes_in_use": a.bytes_in_use}
        for name, is_set, value in (
            ("peak_bytes_in_use", a.peak_bytes_in_use_is_set, a.peak_bytes_in_use),
            ("num_allocs", a.num_allocs_is_set, a.num_allocs),
            ("largest_alloc_size", a.largest_alloc_size_is_set, a.largest_alloc_size),
            ("bytes_limit", a.bytes_limit_is_set, a.bytes_limit),
            ("bytes_reserved", a.bytes_reserved_is_set, a.bytes_reserved),
            ("peak_bytes_reserved", a.peak_bytes_reserved_is_set, a.peak_bytes_reserved),
            ("bytes_reservable_limit", a.bytes_reservable_limit_is_set, a.bytes_reservable_limit),
            ("largest_free_block_bytes", a.largest_free_block_bytes_is_set, a.largest_free_block_bytes),
        ):
            if is_set:
                stats[name] = value
        return stats

    def __repr__(self):
        return f"<DeviceHandle id={self.id} {self.to_string}>"


@cython.no_gc_clear
cdef class MemoryHandle:
    """A memory space of a client (borrowed pointer; keeps the client alive)."""

    def __init__(self, *args, **kwargs):
        raise TypeError("memories come from DeviceHandle.memories")

    @staticmethod
    cdef MemoryHandle _wrap(ClientHandle client, PJRT_Memory* ptr):
        cdef const PJRT_Api* api = client.api
        cdef MemoryHandle self = MemoryHandle.__new__(MemoryHandle)
        self.client = client
        self.ptr = ptr
        cdef PJRT_Memory_Id_Args i = PJRT_Memory_Id_Args_new()
        i.memory = ptr
        PJRT_Memory_Id(api, &i)
        self.id = i.id
        cdef PJRT_Memory_Kind_Args k = PJRT_Memory_Kind_Args_new()
        k.memory = ptr
        PJRT_Memory_Kind(api, &k)
        self.kind = to_str(k.kind, k.kind_size)
        return self

    @property
    def kind_id(self):
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Memory_Kind_Id_Args args = PJRT_Memory_Kind_Id_Args_new()
        args.memory = self.ptr
        PJRT_Memory_Kind_Id(api, &args)
        return args.kind_id

    @property
    def debug_string(self):
        cdef PJRT_Memory_DebugString_Args args = PJRT_Memory_DebugString_Args_new()
        args.memory = self.ptr
        PJRT_Memory_DebugString(self.client.api, &args)
        return to_str(args.debug_string, args.debug_string_size)

    @property
    def to_string(self):
        cdef PJRT_Memory_ToString_Args args = PJRT_Memory_ToString_Args_new()
        args.memory = self.ptr
        PJRT_Memory_ToString(self.client.api, &args)
        return to_str(args.to_string, args.to_string_size)

    @property
    def devices(self):
        """The devices that can address this memory."""
        cdef PJRT_Memory_AddressableByDevices_Args args
        cdef size_t i
        args = PJRT_Memory_AddressableByDevices_Args_new()
        args.memory = self.ptr
        PJRT_Memory_AddressableByDevices(self.client.api, &args)
        return tuple(self.client.device_of(args.devices[i]) for i in range(args.num_devices))

    def __repr__(self):
        return f"<MemoryHandle id={self.id} kind={self.kind!r}>"
