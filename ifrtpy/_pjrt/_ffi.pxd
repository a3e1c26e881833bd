from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt.xla_ffi cimport (
    XLA_FFI_CallFrame, XLA_FFI_Error, XLA_FFI_Api, XLA_FFI_Extension_Metadata)
from ifrtpy._pjrt._base cimport PluginHandle
from ifrtpy._pjrt._client cimport ClientHandle


cdef class ExecuteContext:
    cdef PJRT_ExecuteContext* ptr
    cdef readonly ClientHandle client
    cdef readonly dict user_data


cdef inline bint is_metadata_call(XLA_FFI_CallFrame* frame) noexcept nogil:
    """Whether XLA calls a handler to ask for its metadata (the FFI version it claims)."""
    return frame.extension_start != NULL and frame.extension_start.type == XLA_FFI_Extension_Metadata


cdef XLA_FFI_Error* answer_metadata(XLA_FFI_CallFrame* frame) noexcept nogil
cdef XLA_FFI_Error* make_error(const XLA_FFI_Api* api, int code, const char* message) noexcept nogil
cdef const XLA_FFI_Api* framework_api(PluginHandle plugin) except NULL
cdef object capsule(void* pointer)
