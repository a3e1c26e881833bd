# The part of the XLA FFI C ABI (xla/ffi/api/c_api.h) and of the PJRT FFI extension
# (pjrt_c_api_ffi_extension.h) that ifrtpy uses, declared here from their published
# layouts: the xla-cpu-pjrt package ships neither header. Every struct below starts with
# its own size, so a newer framework reads what an older caller wrote; the layouts are
# those of XLA FFI 0.1 to 0.5 (no field used here moved in those versions; 0.5 renamed a
# few: every C name here carries ifrtpy's prefix, so the header compiles beside it) and of
# the PJRT FFI extension from PJRT 0.81 (measured the same on the 0.81, 0.106 and 0.115 CPU
# plugins: 48-byte extension, Register_Handler args without an api_version field).

from libc.stdint cimport int64_t, uint32_t, uint64_t

from ifrtpy._pjrt.pjrt_c_api cimport PJRT_Error, PJRT_Extension_Base, PJRT_ExecuteContext

cdef extern from *:
    """
    #include <stddef.h>
    #include <stdint.h>
    #define IFRTPY_STRUCT_SIZE(type, last) (offsetof(type, last) + sizeof(((type*)0)->last))

    /* --- XLA FFI --- */
    typedef struct ifrtpy_XLA_FFI_Extension_Base {
      size_t struct_size;
      int type;                                   /* 1: metadata */
      struct ifrtpy_XLA_FFI_Extension_Base* next;
    } ifrtpy_XLA_FFI_Extension_Base;
    typedef struct ifrtpy_XLA_FFI_Error ifrtpy_XLA_FFI_Error;  /* opaque */
    typedef struct ifrtpy_XLA_FFI_ExecutionContext ifrtpy_XLA_FFI_ExecutionContext;  /* opaque */
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      int major_version; int minor_version;
    } ifrtpy_XLA_FFI_Api_Version;
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      const char* message; int errc;
    } ifrtpy_XLA_FFI_Error_Create_Args;
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      ifrtpy_XLA_FFI_Error* error; const char* message;
    } ifrtpy_XLA_FFI_Error_GetMessage_Args;
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      ifrtpy_XLA_FFI_Error* error;
    } ifrtpy_XLA_FFI_Error_Destroy_Args;
    typedef struct { int64_t type_id; } ifrtpy_XLA_FFI_TypeId;
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      ifrtpy_XLA_FFI_ExecutionContext* ctx; ifrtpy_XLA_FFI_TypeId* type_id; void* data;
    } ifrtpy_XLA_FFI_ExecutionContext_Get_Args;
    /* The function table: the fields up to those used here. */
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      ifrtpy_XLA_FFI_Api_Version api_version;
      const void* internal_api;
      ifrtpy_XLA_FFI_Error* (*XLA_FFI_Error_Create)(ifrtpy_XLA_FFI_Error_Create_Args*);
      void (*XLA_FFI_Error_GetMessage)(ifrtpy_XLA_FFI_Error_GetMessage_Args*);
      void (*XLA_FFI_Error_Destroy)(ifrtpy_XLA_FFI_Error_Destroy_Args*);
      void* XLA_FFI_Handler_Register;
      void* XLA_FFI_Stream_Get;
      void* XLA_FFI_Type_Register;
      ifrtpy_XLA_FFI_Error* (*XLA_FFI_ExecutionContext_Get)(ifrtpy_XLA_FFI_ExecutionContext_Get_Args*);
    } ifrtpy_XLA_FFI_Api;
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      int dtype; void* data; int64_t rank; int64_t* dims;
    } ifrtpy_XLA_FFI_Buffer;
    typedef struct { const char* ptr; size_t len; } ifrtpy_XLA_FFI_ByteSpan;
    typedef struct { int dtype; void* value; } ifrtpy_XLA_FFI_Scalar;
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      int64_t size; int* types; void** args;
    } ifrtpy_XLA_FFI_Args;
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      int64_t size; int* types; void** rets;
    } ifrtpy_XLA_FFI_Rets;
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      int64_t size; int* types; ifrtpy_XLA_FFI_ByteSpan** names; void** attrs;
    } ifrtpy_XLA_FFI_Attrs;
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Extension_Base* extension_start;
      const ifrtpy_XLA_FFI_Api* api; ifrtpy_XLA_FFI_ExecutionContext* ctx; int stage;
      ifrtpy_XLA_FFI_Args args; ifrtpy_XLA_FFI_Rets rets; ifrtpy_XLA_FFI_Attrs attrs;
      void* future;
    } ifrtpy_XLA_FFI_CallFrame;
    typedef struct {
      size_t struct_size; ifrtpy_XLA_FFI_Api_Version api_version; uint32_t traits;
      ifrtpy_XLA_FFI_TypeId state_type_id;
    } ifrtpy_XLA_FFI_Metadata;
    typedef struct {
      ifrtpy_XLA_FFI_Extension_Base extension_base; ifrtpy_XLA_FFI_Metadata* metadata;
    } ifrtpy_XLA_FFI_Metadata_Extension;
    typedef ifrtpy_XLA_FFI_Error* (*ifrtpy_XLA_FFI_Handler)(ifrtpy_XLA_FFI_CallFrame*);
    enum {
      ifrtpy_XLA_FFI_Api_Version_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_Api_Version, minor_version),
      ifrtpy_XLA_FFI_Error_Create_Args_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_Error_Create_Args, errc),
      ifrtpy_XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_Error_GetMessage_Args, message),
      ifrtpy_XLA_FFI_Error_Destroy_Args_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_Error_Destroy_Args, error),
      ifrtpy_XLA_FFI_ExecutionContext_Get_Args_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_ExecutionContext_Get_Args, data),
      ifrtpy_XLA_FFI_Args_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_Args, args),
      ifrtpy_XLA_FFI_Rets_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_Rets, rets),
      ifrtpy_XLA_FFI_Attrs_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_Attrs, attrs),
      ifrtpy_XLA_FFI_CallFrame_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_CallFrame, attrs),
      ifrtpy_XLA_FFI_Metadata_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_Metadata, traits),
      ifrtpy_XLA_FFI_Metadata_Extension_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_Metadata_Extension, metadata),
      /* The end of the last table field used here: a table at least this long has them. */
      ifrtpy_XLA_FFI_Api_USED_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_XLA_FFI_Api, XLA_FFI_ExecutionContext_Get),
    };

    /* --- the PJRT FFI extension (PJRT_Extension_Type_FFI) --- */
    typedef struct {
      size_t struct_size;
      const char* target_name; size_t target_name_size;
      void* handler;         /* the execute stage's XLA_FFI_Handler* */
      const char* platform_name; size_t platform_name_size;
      uint32_t traits;
    } ifrtpy_PJRT_FFI_Register_Handler_Args;
    typedef struct { void (*deleter)(void*); void* serialize; void* deserialize; } ifrtpy_PJRT_FFI_Type_Info;
    typedef struct {
      size_t struct_size; PJRT_Extension_Base* extension_start;
      const char* type_name; size_t type_name_size;
      int64_t type_id;       /* in/out: 0 asks for a new id */
      ifrtpy_PJRT_FFI_Type_Info* type_info;
    } ifrtpy_PJRT_FFI_Type_Register_Args;
    typedef struct {
      size_t struct_size; PJRT_Extension_Base* extension_start;
      PJRT_ExecuteContext* context; int64_t type_id; void* data;
    } ifrtpy_PJRT_FFI_UserData_Add_Args;
    /* The extension's fields are named after its functions, as in the layers' other
       extensions (the header names them type_register, user_data_add, register_handler). */
    typedef struct {
      PJRT_Extension_Base base;
      PJRT_Error* (*PJRT_FFI_Type_Register)(ifrtpy_PJRT_FFI_Type_Register_Args*);
      PJRT_Error* (*PJRT_FFI_UserData_Add)(ifrtpy_PJRT_FFI_UserData_Add_Args*);
      PJRT_Error* (*PJRT_FFI_Register_Handler)(ifrtpy_PJRT_FFI_Register_Handler_Args*);
    } ifrtpy_PJRT_FFI_Extension;
    enum {
      ifrtpy_PJRT_FFI_Extension_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_PJRT_FFI_Extension, PJRT_FFI_Register_Handler),
      ifrtpy_PJRT_FFI_Register_Handler_Args_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_PJRT_FFI_Register_Handler_Args, traits),
      ifrtpy_PJRT_FFI_Type_Register_Args_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_PJRT_FFI_Type_Register_Args, type_info),
      ifrtpy_PJRT_FFI_UserData_Add_Args_STRUCT_SIZE = IFRTPY_STRUCT_SIZE(ifrtpy_PJRT_FFI_UserData_Add_Args, data),
    };
    /* Values of the C enums used here. */
    enum {
      ifrtpy_XLA_FFI_Extension_Metadata = 1,
      ifrtpy_XLA_FFI_ExecutionStage_EXECUTE = 3,
      ifrtpy_XLA_FFI_ArgType_BUFFER = 1,
      ifrtpy_XLA_FFI_RetType_BUFFER = 1,
      ifrtpy_XLA_FFI_AttrType_SCALAR = 3,
      ifrtpy_XLA_FFI_DataType_TOKEN = 17,
      ifrtpy_XLA_FFI_DataType_S64 = 5,
      ifrtpy_XLA_FFI_DataType_U64 = 9,
      ifrtpy_XLA_FFI_Error_Code_INVALID_ARGUMENT = 3,
      ifrtpy_XLA_FFI_Error_Code_FAILED_PRECONDITION = 9,
      ifrtpy_XLA_FFI_Error_Code_UNIMPLEMENTED = 12,
      ifrtpy_XLA_FFI_Error_Code_INTERNAL = 13,
      ifrtpy_XLA_FFI_Error_Code_UNAVAILABLE = 14,
    };
    """
    ctypedef struct XLA_FFI_Error "ifrtpy_XLA_FFI_Error"
    ctypedef struct XLA_FFI_ExecutionContext "ifrtpy_XLA_FFI_ExecutionContext"
    ctypedef struct XLA_FFI_Extension_Base "ifrtpy_XLA_FFI_Extension_Base":
        size_t struct_size
        int type
        XLA_FFI_Extension_Base* next
    ctypedef struct XLA_FFI_Api_Version "ifrtpy_XLA_FFI_Api_Version":
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        int major_version
        int minor_version
    ctypedef struct XLA_FFI_Error_Create_Args "ifrtpy_XLA_FFI_Error_Create_Args":
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        const char* message
        int errc
    ctypedef struct XLA_FFI_Error_GetMessage_Args "ifrtpy_XLA_FFI_Error_GetMessage_Args":
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        XLA_FFI_Error* error
        const char* message
    ctypedef struct XLA_FFI_Error_Destroy_Args "ifrtpy_XLA_FFI_Error_Destroy_Args":
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        XLA_FFI_Error* error
    ctypedef struct XLA_FFI_TypeId "ifrtpy_XLA_FFI_TypeId":
        int64_t type_id
    ctypedef struct XLA_FFI_ExecutionContext_Get_Args "ifrtpy_XLA_FFI_ExecutionContext_Get_Args":
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        XLA_FFI_ExecutionContext* ctx
        XLA_FFI_TypeId* type_id
        void* data
    ctypedef struct XLA_FFI_Api "ifrtpy_XLA_FFI_Api":
        size_t struct_size
        XLA_FFI_Api_Version api_version
        XLA_FFI_Error* (*XLA_FFI_Error_Create)(XLA_FFI_Error_Create_Args*) noexcept nogil
        void (*XLA_FFI_Error_GetMessage)(XLA_FFI_Error_GetMessage_Args*) noexcept nogil
        void (*XLA_FFI_Error_Destroy)(XLA_FFI_Error_Destroy_Args*) noexcept nogil
        XLA_FFI_Error* (*XLA_FFI_ExecutionContext_Get)(XLA_FFI_ExecutionContext_Get_Args*) noexcept nogil
    ctypedef struct XLA_FFI_Buffer "ifrtpy_XLA_FFI_Buffer":
        size_t struct_size
        int dtype
        void* data
        int64_t rank
        int64_t* dims
    ctypedef struct XLA_FFI_ByteSpan "ifrtpy_XLA_FFI_ByteSpan":
        const char* ptr
        size_t len
    ctypedef struct XLA_FFI_Scalar "ifrtpy_XLA_FFI_Scalar":
        int dtype
        void* value
    ctypedef struct XLA_FFI_Args "ifrtpy_XLA_FFI_Args":
        size_t struct_size
        int64_t size
        int* types
        void** args
    ctypedef struct XLA_FFI_Rets "ifrtpy_XLA_FFI_Rets":
        size_t struct_size
        int64_t size
        int* types
        void** rets
    ctypedef struct XLA_FFI_Attrs "ifrtpy_XLA_FFI_Attrs":
        size_t struct_size
        int64_t size
        int* types
        XLA_FFI_ByteSpan** names
        void** attrs
    ctypedef struct XLA_FFI_CallFrame "ifrtpy_XLA_FFI_CallFrame":
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        const XLA_FFI_Api* api
        XLA_FFI_ExecutionContext* ctx
        int stage
        XLA_FFI_Args args
        XLA_FFI_Rets rets
        XLA_FFI_Attrs attrs
        void* future
    ctypedef struct XLA_FFI_Metadata "ifrtpy_XLA_FFI_Metadata":
        size_t struct_size
        XLA_FFI_Api_Version api_version
        uint32_t traits
        XLA_FFI_TypeId state_type_id
    ctypedef struct XLA_FFI_Metadata_Extension "ifrtpy_XLA_FFI_Metadata_Extension":
        XLA_FFI_Extension_Base extension_base
        XLA_FFI_Metadata* metadata
    ctypedef XLA_FFI_Error* (*XLA_FFI_Handler "ifrtpy_XLA_FFI_Handler")(XLA_FFI_CallFrame*) noexcept nogil

    enum:
        XLA_FFI_Api_Version_STRUCT_SIZE "ifrtpy_XLA_FFI_Api_Version_STRUCT_SIZE"
        XLA_FFI_Error_Create_Args_STRUCT_SIZE "ifrtpy_XLA_FFI_Error_Create_Args_STRUCT_SIZE"
        XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE "ifrtpy_XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE"
        XLA_FFI_Error_Destroy_Args_STRUCT_SIZE "ifrtpy_XLA_FFI_Error_Destroy_Args_STRUCT_SIZE"
        XLA_FFI_ExecutionContext_Get_Args_STRUCT_SIZE "ifrtpy_XLA_FFI_ExecutionContext_Get_Args_STRUCT_SIZE"
        XLA_FFI_Args_STRUCT_SIZE "ifrtpy_XLA_FFI_Args_STRUCT_SIZE"
        XLA_FFI_Rets_STRUCT_SIZE "ifrtpy_XLA_FFI_Rets_STRUCT_SIZE"
        XLA_FFI_Attrs_STRUCT_SIZE "ifrtpy_XLA_FFI_Attrs_STRUCT_SIZE"
        XLA_FFI_CallFrame_STRUCT_SIZE "ifrtpy_XLA_FFI_CallFrame_STRUCT_SIZE"
        XLA_FFI_Metadata_STRUCT_SIZE "ifrtpy_XLA_FFI_Metadata_STRUCT_SIZE"
        XLA_FFI_Metadata_Extension_STRUCT_SIZE "ifrtpy_XLA_FFI_Metadata_Extension_STRUCT_SIZE"
        XLA_FFI_Api_USED_SIZE "ifrtpy_XLA_FFI_Api_USED_SIZE"

    ctypedef struct PJRT_FFI_Register_Handler_Args "ifrtpy_PJRT_FFI_Register_Handler_Args":
        size_t struct_size
        const char* target_name
        size_t target_name_size
        void* handler
        const char* platform_name
        size_t platform_name_size
        uint32_t traits
    ctypedef struct PJRT_FFI_Type_Info "ifrtpy_PJRT_FFI_Type_Info":
        void (*deleter)(void*) noexcept nogil
        void* serialize
        void* deserialize
    ctypedef struct PJRT_FFI_Type_Register_Args "ifrtpy_PJRT_FFI_Type_Register_Args":
        size_t struct_size
        PJRT_Extension_Base* extension_start
        const char* type_name
        size_t type_name_size
        int64_t type_id
        PJRT_FFI_Type_Info* type_info
    ctypedef struct PJRT_FFI_UserData_Add_Args "ifrtpy_PJRT_FFI_UserData_Add_Args":
        size_t struct_size
        PJRT_Extension_Base* extension_start
        PJRT_ExecuteContext* context
        int64_t type_id
        void* data
    ctypedef struct PJRT_FFI_Extension "ifrtpy_PJRT_FFI_Extension":
        PJRT_Extension_Base base
        PJRT_Error* (*PJRT_FFI_Type_Register)(PJRT_FFI_Type_Register_Args*) noexcept nogil
        PJRT_Error* (*PJRT_FFI_UserData_Add)(PJRT_FFI_UserData_Add_Args*) noexcept nogil
        PJRT_Error* (*PJRT_FFI_Register_Handler)(PJRT_FFI_Register_Handler_Args*) noexcept nogil

    enum:
        PJRT_FFI_Extension_STRUCT_SIZE "ifrtpy_PJRT_FFI_Extension_STRUCT_SIZE"
        PJRT_FFI_Register_Handler_Args_STRUCT_SIZE "ifrtpy_PJRT_FFI_Register_Handler_Args_STRUCT_SIZE"
        PJRT_FFI_Type_Register_Args_STRUCT_SIZE "ifrtpy_PJRT_FFI_Type_Register_Args_STRUCT_SIZE"
        PJRT_FFI_UserData_Add_Args_STRUCT_SIZE "ifrtpy_PJRT_FFI_UserData_Add_Args_STRUCT_SIZE"

    enum:
        XLA_FFI_Extension_Metadata "ifrtpy_XLA_FFI_Extension_Metadata"
        XLA_FFI_ExecutionStage_EXECUTE "ifrtpy_XLA_FFI_ExecutionStage_EXECUTE"
        XLA_FFI_ArgType_BUFFER "ifrtpy_XLA_FFI_ArgType_BUFFER"
        XLA_FFI_RetType_BUFFER "ifrtpy_XLA_FFI_RetType_BUFFER"
        XLA_FFI_AttrType_SCALAR "ifrtpy_XLA_FFI_AttrType_SCALAR"
        XLA_FFI_DataType_TOKEN "ifrtpy_XLA_FFI_DataType_TOKEN"
        XLA_FFI_DataType_S64 "ifrtpy_XLA_FFI_DataType_S64"
        XLA_FFI_DataType_U64 "ifrtpy_XLA_FFI_DataType_U64"
        XLA_FFI_Error_Code_INVALID_ARGUMENT "ifrtpy_XLA_FFI_Error_Code_INVALID_ARGUMENT"
        XLA_FFI_Error_Code_FAILED_PRECONDITION "ifrtpy_XLA_FFI_Error_Code_FAILED_PRECONDITION"
        XLA_FFI_Error_Code_UNIMPLEMENTED "ifrtpy_XLA_FFI_Error_Code_UNIMPLEMENTED"
        XLA_FFI_Error_Code_INTERNAL "ifrtpy_XLA_FFI_Error_Code_INTERNAL"
        XLA_FFI_Error_Code_UNAVAILABLE "ifrtpy_XLA_FFI_Error_Code_UNAVAILABLE"
