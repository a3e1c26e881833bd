from cpython.ref cimport PyObject
from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt._base cimport PluginHandle
from ifrtpy._pjrt._kv cimport KeyValueCallbacks
from ifrtpy._pjrt.extensions cimport PJRT_Layouts_MemoryLayout


cdef bytes layout_text(const PJRT_Api* api, PJRT_Layouts_MemoryLayout* layout)
cdef int need_layouts(const PJRT_Api* api) except -1


cdef class ClientHandle:
    cdef PJRT_Client* ptr
    cdef const PJRT_Api* api
    cdef readonly PluginHandle plugin
    cdef readonly KeyValueCallbacks kv_callbacks
    cdef PyObject* _kv_keep  # kv_callbacks again, held until the plugin's client is gone
    cdef readonly tuple devices
    cdef readonly tuple addressable_devices
    cdef dict _device_of_ptr
    cdef dict _memory_of_ptr
    cdef DeviceHandle device_of(self, PJRT_Device* ptr)
    cdef MemoryHandle memory_of(self, PJRT_Memory* ptr)
    cdef _create(self, dict opts, KeyValueCallbacks kv)
    cdef _load_topology(self)


cdef class DeviceHandle:
    cdef PJRT_Device* ptr
    cdef PJRT_DeviceDescription* description
    cdef readonly ClientHandle client
    cdef readonly int id
    cdef readonly bint is_addressable
    cdef tuple _memories
    cdef MemoryHandle _default_memory
    cdef _load_memories(self)

    @staticmethod
    cdef DeviceHandle _wrap(ClientHandle client, PJRT_Device* ptr)


cdef class MemoryHandle:
    cdef PJRT_Memory* ptr
    cdef readonly ClientHandle client
    cdef readonly int id
    cdef readonly str kind

    @staticmethod
    cdef MemoryHandle _wrap(ClientHandle client, PJRT_Memory* ptr)
