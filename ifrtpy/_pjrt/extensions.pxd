# The plugin extensions the layer calls that the core header does not carry, declared
# from their published layouts (pjrt_c_api_layouts_extension.h and
# pjrt_c_api_stream_extension.h; neither ships with ifrtpy's dependencies): the layouts
# extension (PJRT_Extension_Type_Layouts), whose first four functions have held these
# places since its first version (later versions append others), and the stream extension
# (PJRT_Extension_Type_Stream). The FFI extension is declared in xla_ffi.pxd. Each struct's
# STRUCT_SIZE is its size up to its last field, as the headers' PJRT_DEFINE_STRUCT_TRAITS
# give it. The functions are called through the wrappers _api.pxd generates from
# api_functions.txt (its `extension` lines).

from libc.stdint cimport int64_t, intptr_t
from ifrtpy._pjrt.pjrt_c_api cimport *

cdef extern from *:
    """
    #include <stddef.h>
    #include <stdint.h>
    #ifndef IFRTPY_STRUCT_SIZE
    #define IFRTPY_STRUCT_SIZE(type, last) (offsetof(type, last) + sizeof(((type*)0)->last))
    #endif

    /* --- layouts --- */
    typedef struct ifrtpy_PJRT_Layouts_MemoryLayout ifrtpy_PJRT_Layouts_MemoryLayout;
    typedef struct {
      size_t struct_size; PJRT_Extension_Base* extension_start;
      ifrtpy_PJRT_Layouts_MemoryLayout* layout;
    } ifrtpy_PJRT_Layouts_MemoryLayout_Destroy_Args;
    typedef struct {
      size_t struct_size; PJRT_Extension_Base* extension_start;
      ifrtpy_PJRT_Layouts_MemoryLayout* layout;
      const char* serialized_bytes;   /* out, alive until the deleter runs */
      size_t serialized_bytes_size;   /* out */
      void* serialized_layout;        /* out */
      void (*serialized_layout_deleter)(void*);  /* out */
    } ifrtpy_PJRT_Layouts_MemoryLayout_Serialize_Args;
    typedef struct {
      size_t struct_size; PJRT_Extension_Base* extension_start;
      PJRT_Client* client; PJRT_Buffer_Type type; const int64_t* dims; size_t num_dims;
      ifrtpy_PJRT_Layouts_MemoryLayout* layout;  /* out, destroyed by the caller */
    } ifrtpy_PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args;
    typedef struct {
      size_t struct_size; PJRT_Extension_Base* extension_start;
      PJRT_Buffer* buffer;
      ifrtpy_PJRT_Layouts_MemoryLayout* layout;  /* out, destroyed by the caller */
    } ifrtpy_PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args;
    typedef struct {
      PJRT_Extension_Base base;
      PJRT_Error* (*PJRT_Layouts_MemoryLayout_Destroy)(ifrtpy_PJRT_Layouts_MemoryLayout_Destroy_Args*);
      PJRT_Error* (*PJRT_Layouts_MemoryLayout_Serialize)(ifrtpy_PJRT_Layouts_MemoryLayout_Serialize_Args*);
      PJRT_Error* (*PJRT_Layouts_PJRT_Client_GetDefaultLayout)(ifrtpy_PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args*);
      PJRT_Error* (*PJRT_Layouts_PJRT_Buffer_MemoryLayout)(ifrtpy_PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args*);
    } ifrtpy_PJRT_Layouts_Extension;

    /* --- stream --- */
    typedef struct {
      size_t struct_size; PJRT_Device* device;
      intptr_t stream;  /* out */
    } ifrtpy_PJRT_Get_Stream_For_External_Ready_Events_Args;
    typedef struct {
      PJRT_Extension_Base base;
      PJRT_Error* (*PJRT_Get_Stream_For_External_Ready_Events)(ifrtpy_PJRT_Get_Stream_For_External_Ready_Events_Args*);
      void* PJRT_Wait_Until_Buffer_Ready_On_Stream;  /* not called */
    } ifrtpy_PJRT_Stream_Extension;

    enum {
      ifrtpy_PJRT_Layouts_MemoryLayout_Destroy_Args_STRUCT_SIZE =
          IFRTPY_STRUCT_SIZE(ifrtpy_PJRT_Layouts_MemoryLayout_Destroy_Args, layout),
      ifrtpy_PJRT_Layouts_MemoryLayout_Serialize_Args_STRUCT_SIZE =
          IFRTPY_STRUCT_SIZE(ifrtpy_PJRT_Layouts_MemoryLayout_Serialize_Args, serialized_layout_deleter),
      ifrtpy_PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args_STRUCT_SIZE =
          IFRTPY_STRUCT_SIZE(ifrtpy_PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args, layout),
      ifrtpy_PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args_STRUCT_SIZE =
          IFRTPY_STRUCT_SIZE(ifrtpy_PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args, layout),
      ifrtpy_PJRT_Get_Stream_For_External_Ready_Events_Args_STRUCT_SIZE =
          IFRTPY_STRUCT_SIZE(ifrtpy_PJRT_Get_Stream_For_External_Ready_Events_Args, stream),
    };
    """
    ctypedef struct PJRT_Layouts_MemoryLayout "ifrtpy_PJRT_Layouts_MemoryLayout"

    ctypedef struct PJRT_Layouts_MemoryLayout_Destroy_Args "ifrtpy_PJRT_Layouts_MemoryLayout_Destroy_Args":
        size_t struct_size
        PJRT_Layouts_MemoryLayout* layout

    ctypedef struct PJRT_Layouts_MemoryLayout_Serialize_Args "ifrtpy_PJRT_Layouts_MemoryLayout_Serialize_Args":
        size_t struct_size
        PJRT_Layouts_MemoryLayout* layout
        const char* serialized_bytes
        size_t serialized_bytes_size
        void* serialized_layout
        void (*serialized_layout_deleter)(void*) noexcept nogil

    ctypedef struct PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args "ifrtpy_PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args":
        size_t struct_size
        PJRT_Client* client
        PJRT_Buffer_Type type
        const int64_t* dims
        size_t num_dims
        PJRT_Layouts_MemoryLayout* layout

    ctypedef struct PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args "ifrtpy_PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args":
        size_t struct_size
        PJRT_Buffer* buffer
        PJRT_Layouts_MemoryLayout* layout

    ctypedef struct PJRT_Layouts_Extension "ifrtpy_PJRT_Layouts_Extension":
        PJRT_Extension_Base base
        PJRT_Error* (*PJRT_Layouts_MemoryLayout_Destroy)(PJRT_Layouts_MemoryLayout_Destroy_Args*) noexcept nogil
        PJRT_Error* (*PJRT_Layouts_MemoryLayout_Serialize)(PJRT_Layouts_MemoryLayout_Serialize_Args*) noexcept nogil
        PJRT_Error* (*PJRT_Layouts_PJRT_Client_GetDefaultLayout)(PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args*) noexcept nogil
        PJRT_Error* (*PJRT_Layouts_PJRT_Buffer_MemoryLayout)(PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args*) noexcept nogil

    ctypedef struct PJRT_Get_Stream_For_External_Ready_Events_Args "ifrtpy_PJRT_Get_Stream_For_External_Ready_Events_Args":
        size_t struct_size
        PJRT_Device* device
        intptr_t stream

    ctypedef struct PJRT_Stream_Extension "ifrtpy_PJRT_Stream_Extension":
        PJRT_Extension_Base base
        PJRT_Error* (*PJRT_Get_Stream_For_External_Ready_Events)(PJRT_Get_Stream_For_External_Ready_Events_Args*) noexcept nogil

    enum:
        PJRT_Layouts_MemoryLayout_Destroy_Args_STRUCT_SIZE "ifrtpy_PJRT_Layouts_MemoryLayout_Destroy_Args_STRUCT_SIZE"
        PJRT_Layouts_MemoryLayout_Serialize_Args_STRUCT_SIZE "ifrtpy_PJRT_Layouts_MemoryLayout_Serialize_Args_STRUCT_SIZE"
        PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args_STRUCT_SIZE "ifrtpy_PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args_STRUCT_SIZE"
        PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args_STRUCT_SIZE "ifrtpy_PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args_STRUCT_SIZE"
        PJRT_Get_Stream_For_External_Ready_Events_Args_STRUCT_SIZE "ifrtpy_PJRT_Get_Stream_For_External_Ready_Events_Args_STRUCT_SIZE"
