from ifrtpy._pjrt.pjrt_c_api cimport *


cdef class PluginHandle:
    cdef const PJRT_Api* api
    cdef void* _library
    cdef readonly str path
    cdef readonly tuple api_version
    cdef readonly dict attributes
    cdef readonly tuple missing_functions
    cdef _load(self, str path)


# The error machinery of the wrappers in _api.pxd (the C layer calls those, not these).
cdef int check(const PJRT_Api* api, PJRT_Error* error) except -1 nogil
cdef object error_to_exception(const PJRT_Api* api, PJRT_Error* error)
cdef void drop_error(const PJRT_Api* api, PJRT_Error* error) noexcept nogil
cdef int raise_unimplemented(const PJRT_Api* api, const char* name) except -1 nogil
cdef int raise_unimplemented_in(const PJRT_Api* api, const char* extension,
                                const char* name) except -1 nogil
cdef str to_str(const char* data, size_t size)
cdef dict named_values_to_dict(const PJRT_NamedValue* values, size_t count)
cdef bint callback_enter() noexcept nogil
cdef void callback_leave() noexcept nogil
