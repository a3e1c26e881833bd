from ifrtpy._pjrt.pjrt_c_api cimport *


cdef class PluginHandle:
    cdef const PJRT_Api* api
    cdef void* _library
    cdef readonly str path
    cdef readonly tuple api_version
    cdef readonly dict attributes
    cdef _load(self, str path)


cdef int check(const PJRT_Api* api, PJRT_Error* error) except -1 nogil
cdef object error_to_exception(const PJRT_Api* api, PJRT_Error* error)
cdef void drop_error(const PJRT_Api* api, PJRT_Error* error) noexcept nogil
cdef int raise_unimplemented(const PJRT_Api* api, const char* name) except -1 nogil
cdef str to_str(const char* data, size_t size)
cdef dict named_values_to_dict(const PJRT_NamedValue* values, size_t count)
cdef bint callback_enter() noexcept nogil
cdef void callback_leave() noexcept nogil


cdef inline bint has_function(const PJRT_Api* api, const void* field) noexcept nogil:
    """Whether ``field`` (a slot of ``*api``) is inside the plugin's table and non-null."""
    cdef size_t end = <size_t>(<const char*>field - <const char*>api) + sizeof(void*)
    return end <= api.struct_size and (<void* const*>field)[0] != NULL


cdef inline int require(const PJRT_Api* api, const void* field, const char* name) except -1 nogil:
    """Raise UnimplementedError unless ``field`` (a slot of ``*api``) is inside the
    plugin's table and non-null."""
    if not has_function(api, field):
        raise_unimplemented(api, name)
        return -1
    return 0

