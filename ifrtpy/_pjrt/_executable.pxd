from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt._client cimport ClientHandle


cdef class ExecutableHandle:
    cdef PJRT_LoadedExecutable* ptr
    cdef PJRT_Executable* executable
    cdef readonly ClientHandle client
    cdef readonly str name
    cdef readonly Py_ssize_t num_outputs
    cdef readonly tuple addressable_devices

    @staticmethod
    cdef ExecutableHandle _wrap(ClientHandle client, PJRT_LoadedExecutable* ptr)
