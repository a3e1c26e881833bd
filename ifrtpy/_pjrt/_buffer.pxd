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


cdef class BufferHandle:
    cdef PJRT_Buffer* ptr
    cdef readonly ClientHandle client
    cdef object __weakref__
    # Launch guards (read and written with the GIL held; see pin_for_launch):
    cdef Py_ssize_t _launches  # executes between pinning this buffer and their launch's return
    cdef bint _delete_requested  # delete() was called; done once _launches is 0
    cdef bint _donating  # a launch in flight donates it
    cdef bint _is_deleted(self) except -1
    cdef int _delete_now(self) except -1
    cdef object ready_error(self)

    @staticmethod
    cdef BufferHandle wrap(ClientHandle client, PJRT_Buffer* ptr)


cdef int keep_alive_until(const PJRT_Api* api, PJRT_Event* event, object obj) except -1


cdef int pin_for_launch(BufferHandle buffer, bint donate, Py_ssize_t argument) except -1
cdef void unpin_after_launch(BufferHandle buffer, bint donate) noexcept
