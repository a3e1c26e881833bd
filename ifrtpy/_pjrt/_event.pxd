from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt._api cimport *
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


cdef inline bint fired_without_error(const PJRT_Api* api, PJRT_Event* event) noexcept nogil:
    """Whether ``event`` has fired without an error, asked without waiting; False where
    the plugin cannot tell so (no PJRT_Event_IsReady or PJRT_Event_Error, or no event)."""
    cdef PJRT_Event_IsReady_Args is_ready
    cdef PJRT_Event_Error_Args error
    cdef PJRT_Error* failure = NULL
    if event == NULL or not (has_PJRT_Event_IsReady(api) and has_PJRT_Event_Error(api)):
        return False
    is_ready = PJRT_Event_IsReady_Args_new()
    is_ready.event = event
    PJRT_Event_IsReady_raw(api, &is_ready, &failure)
    if failure != NULL or not is_ready.is_ready:
        drop_error(api, failure)
        return False
    error = PJRT_Event_Error_Args_new()
    error.event = event
    PJRT_Event_Error_raw(api, &error, &failure)
    if failure != NULL:
        drop_error(api, failure)
        return False
    return True
