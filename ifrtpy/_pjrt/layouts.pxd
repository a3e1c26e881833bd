# The plugin's layouts extension (PJRT_Extension_Type_Layouts), declared from its
# published layout: the core header does not carry it. Its first four functions have held
# these places since its first version; later versions append others.
from libc.stdint cimport int64_t
from ifrtpy._pjrt.pjrt_c_api cimport *

ctypedef struct LayoutDestroyArgs:
    size_t struct_size
    PJRT_Extension_Base* extension_start
    void* layout

ctypedef struct LayoutSerializeArgs:
    size_t struct_size
    PJRT_Extension_Base* extension_start
    void* layout
    const char* serialized_bytes  # out, alive until the deleter runs
    size_t serialized_bytes_size  # out
    void* serialized_layout  # out
    void (*serialized_layout_deleter)(void*) noexcept nogil  # out

ctypedef struct DefaultLayoutArgs:
    size_t struct_size
    PJRT_Extension_Base* extension_start
    PJRT_Client* client
    PJRT_Buffer_Type type
    const int64_t* dims
    size_t num_dims
    void* layout  # out, destroyed by the caller

ctypedef struct BufferLayoutArgs:
    size_t struct_size
    PJRT_Extension_Base* extension_start
    PJRT_Buffer* buffer
    void* layout  # out, destroyed by the caller

ctypedef struct LayoutsExtension:
    PJRT_Extension_Base base
    PJRT_Error* (*destroy)(LayoutDestroyArgs*) noexcept nogil
    PJRT_Error* (*serialize)(LayoutSerializeArgs*) noexcept nogil
    PJRT_Error* (*default_layout)(DefaultLayoutArgs*) noexcept nogil
    PJRT_Error* (*buffer_layout)(BufferLayoutArgs*) noexcept nogil


cdef inline const LayoutsExtension* layouts_extension(const PJRT_Api* api) noexcept nogil:
    """The plugin's layouts extension, or NULL where it has none (or one too short to hold
    the four functions ifrtpy calls)."""
    cdef const PJRT_Extension_Base* ext = api.extension_start
    while ext != NULL and ext.type != PJRT_Extension_Type_Layouts:
        ext = ext.next
    if ext == NULL or ext.struct_size < sizeof(LayoutsExtension):
        return NULL
    cdef const LayoutsExtension* layouts = <const LayoutsExtension*>ext
    if (layouts.destroy == NULL or layouts.serialize == NULL or layouts.default_layout == NULL
            or layouts.buffer_layout == NULL):
        return NULL
    return layouts
