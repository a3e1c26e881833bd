from ifrtpy._pjrt.pjrt_c_api cimport *


cdef class KeyValueCallbacks:
    cdef readonly object store
    cdef void fill(self, PJRT_Client_Create_Args* args) noexcept
