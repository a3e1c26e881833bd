from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt._client cimport ClientHandle


cdef class EventHandle:
    cdef PJRT_Event* ptr
    cdef const PJRT_Api* api
    cdef ClientHandle owner
    cdef object _guard
    cdef bint _is_ready(self) except -1
    cdef int _await(self) except -1

    @staticmethod
    cdef EventHandle wrap(ClientHandle owner, const PJRT_Api* api, PJRT_Event* ptr)


cdef int keep_alive_until(const PJRT_Api* api, PJRT_Event* event, object obj) except -1
cdef bint fired_without_error(const PJRT_Api* api, PJRT_Event* event) noexcept nogil
