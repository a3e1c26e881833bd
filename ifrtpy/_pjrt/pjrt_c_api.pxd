# Declarations from the PJRT C API header (pjrt_c_api.h, shipped by the xla-cpu-pjrt
# package): C names unchanged, only the types, fields and functions ifrtpy uses.
# Cython lays out nothing itself: every field is accessed by name and the C compiler
# uses the real header, so omitted fields are harmless.

from libc.stdint cimport int64_t, intptr_t, uintptr_t

cdef extern from "pjrt_c_api.h" nogil:
    enum: PJRT_API_MAJOR
    enum: PJRT_API_MINOR

    ctypedef struct PJRT_Extension_Base:
        size_t struct_size
        int type
        PJRT_Extension_Base* next

    ctypedef struct PJRT_Api_Version:
        int major_version
        int minor_version

    ctypedef struct PJRT_Error
    ctypedef struct PJRT_Client
    ctypedef struct PJRT_Device
    ctypedef struct PJRT_DeviceDescription
    ctypedef struct PJRT_Memory
    ctypedef struct PJRT_Buffer
    ctypedef struct PJRT_Event
    ctypedef struct PJRT_Executable
    ctypedef struct PJRT_LoadedExecutable
    ctypedef struct PJRT_SerializedExecutable
    ctypedef struct PJRT_ExecuteContext

    ctypedef enum PJRT_Extension_Type:
        PJRT_Extension_Type_Stream
        PJRT_Extension_Type_Layouts
        PJRT_Extension_Type_FFI

    ctypedef enum PJRT_Error_Code:
        PJRT_Error_Code_OK

    ctypedef enum PJRT_NamedValue_Type:
        PJRT_NamedValue_kString
        PJRT_NamedValue_kInt64
        PJRT_NamedValue_kInt64List
        PJRT_NamedValue_kFloat
        PJRT_NamedValue_kBool

    ctypedef enum PJRT_Buffer_Type:
        PJRT_Buffer_Type_INVALID
        PJRT_Buffer_Type_TOKEN

    ctypedef enum PJRT_HostBufferSemantics:
        PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
        PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes
        PJRT_HostBufferSemantics_kImmutableZeroCopy
        PJRT_HostBufferSemantics_kMutableZeroCopy

    ctypedef enum PJRT_Buffer_MemoryLayout_Type:
        PJRT_Buffer_MemoryLayout_Type_Tiled
        PJRT_Buffer_MemoryLayout_Type_Strides

    ctypedef struct PJRT_NamedValue:
        size_t struct_size
        const char* name
        size_t name_size
        PJRT_NamedValue_Type type
        const char* string_value
        int64_t int64_value
        const int64_t* int64_array_value
        float float_value
        bint bool_value
        size_t value_size
    enum: PJRT_NamedValue_STRUCT_SIZE

    # --- errors -------------------------------------------------------------------------
    ctypedef struct PJRT_Error_Destroy_Args:
        size_t struct_size
        PJRT_Error* error
    enum: PJRT_Error_Destroy_Args_STRUCT_SIZE
    ctypedef struct PJRT_Error_Message_Args:
        size_t struct_size
        const PJRT_Error* error
        const char* message
        size_t message_size
    enum: PJRT_Error_Message_Args_STRUCT_SIZE
    ctypedef struct PJRT_Error_GetCode_Args:
        size_t struct_size
        const PJRT_Error* error
        PJRT_Error_Code code
    enum: PJRT_Error_GetCode_Args_STRUCT_SIZE

    # --- plugin -------------------------------------------------------------------------
    ctypedef struct PJRT_Plugin_Initialize_Args:
        size_t struct_size
    enum: PJRT_Plugin_Initialize_Args_STRUCT_SIZE
    ctypedef struct PJRT_Plugin_Attributes_Args:
        size_t struct_size
        const PJRT_NamedValue* attributes
        size_t num_attributes
    enum: PJRT_Plugin_Attributes_Args_STRUCT_SIZE

    # --- events -------------------------------------------------------------------------
    ctypedef void (*PJRT_Event_OnReadyCallback)(PJRT_Error* error, void* user_arg) noexcept
    ctypedef struct PJRT_Event_Destroy_Args:
        size_t struct_size
        PJRT_Event* event
    enum: PJRT_Event_Destroy_Args_STRUCT_SIZE
    ctypedef struct PJRT_Event_IsReady_Args:
        size_t struct_size
        PJRT_Event* event
        bint is_ready
    enum: PJRT_Event_IsReady_Args_STRUCT_SIZE
    ctypedef struct PJRT_Event_Error_Args:
        size_t struct_size
        PJRT_Event* event
    enum: PJRT_Event_Error_Args_STRUCT_SIZE
    ctypedef struct PJRT_Event_Await_Args:
        size_t struct_size
        PJRT_Event* event
    enum: PJRT_Event_Await_Args_STRUCT_SIZE
    ctypedef struct PJRT_Event_OnReady_Args:
        size_t struct_size
        PJRT_Event* event
        PJRT_Event_OnReadyCallback callback
        void* user_arg
    enum: PJRT_Event_OnReady_Args_STRUCT_SIZE

    # --- client -------------------------------------------------------------------------
    ctypedef PJRT_Error* (*PJRT_CallbackError)(PJRT_Error_Code code, const char* message,
                                               size_t message_size) noexcept nogil
    ctypedef void (*PJRT_KeyValueGetCallback_ValueDeleter)(char* value) noexcept nogil
    ctypedef void (*PJRT_KeyValueTryGetCallback_ValueDeleter)(char* value) noexcept nogil
    ctypedef struct PJRT_KeyValueGetCallback_Args:
        size_t struct_size
        const char* key
        size_t key_size
        int timeout_in_ms
        PJRT_CallbackError* callback_error
        void* user_arg
        char* value
        size_t value_size
        PJRT_KeyValueGetCallback_ValueDeleter value_deleter_callback
    enum: PJRT_KeyValueGetCallback_Args_STRUCT_SIZE
    ctypedef struct PJRT_KeyValueTryGetCallback_Args:
        size_t struct_size
        const char* key
        size_t key_size
        PJRT_CallbackError* callback_error
        void* user_arg
        char* value
        size_t value_size
        PJRT_KeyValueTryGetCallback_ValueDeleter value_deleter_callback
    enum: PJRT_KeyValueTryGetCallback_Args_STRUCT_SIZE
    ctypedef struct PJRT_KeyValuePutCallback_Args:
        size_t struct_size
        const char* key
        size_t key_size
        const char* value
        size_t value_size
        PJRT_CallbackError* callback_error
        void* user_arg
    enum: PJRT_KeyValuePutCallback_Args_STRUCT_SIZE
    ctypedef PJRT_Error* (*PJRT_KeyValueGetCallback)(PJRT_KeyValueGetCallback_Args* args) noexcept nogil
    ctypedef PJRT_Error* (*PJRT_KeyValueTryGetCallback)(PJRT_KeyValueTryGetCallback_Args* args) noexcept nogil
    ctypedef PJRT_Error* (*PJRT_KeyValuePutCallback)(PJRT_KeyValuePutCallback_Args* args) noexcept nogil

    ctypedef struct PJRT_Client_Create_Args:
        size_t struct_size
        const PJRT_NamedValue* create_options
        size_t num_options
        PJRT_KeyValueGetCallback kv_get_callback
        void* kv_get_user_arg
        PJRT_KeyValuePutCallback kv_put_callback
        void* kv_put_user_arg
        PJRT_KeyValueTryGetCallback kv_try_get_callback
        void* kv_try_get_user_arg
        PJRT_Client* client
    enum: PJRT_Client_Create_Args_STRUCT_SIZE
    ctypedef struct PJRT_Client_Destroy_Args:
        size_t struct_size
        PJRT_Client* client
    enum: PJRT_Client_Destroy_Args_STRUCT_SIZE
    ctypedef struct PJRT_Client_PlatformName_Args:
        size_t struct_size
        PJRT_Client* client
        const char* platform_name
        size_t platform_name_size
    enum: PJRT_Client_PlatformName_Args_STRUCT_SIZE
    ctypedef struct PJRT_Client_ProcessIndex_Args:
        size_t struct_size
        PJRT_Client* client
        int process_index
    enum: PJRT_Client_ProcessIndex_Args_STRUCT_SIZE
    ctypedef struct PJRT_Client_PlatformVersion_Args:
        size_t struct_size
        PJRT_Client* client
        const char* platform_version
        size_t platform_version_size
    enum: PJRT_Client_PlatformVersion_Args_STRUCT_SIZE
    ctypedef struct PJRT_Client_Devices_Args:
        size_t struct_size
        PJRT_Client* client
        PJRT_Device* const* devices
        size_t num_devices
    enum: PJRT_Client_Devices_Args_STRUCT_SIZE
    ctypedef struct PJRT_Client_AddressableDevices_Args:
        size_t struct_size
        PJRT_Client* client
        PJRT_Device* const* addressable_devices
        size_t num_addressable_devices
    enum: PJRT_Client_AddressableDevices_Args_STRUCT_SIZE
    ctypedef struct PJRT_Client_LookupDevice_Args:
        size_t struct_size
        PJRT_Client* client
        int id
        PJRT_Device* device
    enum: PJRT_Client_LookupDevice_Args_STRUCT_SIZE
    ctypedef struct PJRT_Client_DefaultDeviceAssignment_Args:
        size_t struct_size
        PJRT_Client* client
        int num_replicas
        int num_partitions
        size_t default_assignment_size
        int* default_assignment
    enum: PJRT_Client_DefaultDeviceAssignment_Args_STRUCT_SIZE
    ctypedef struct PJRT_Program:
        size_t struct_size
        char* code
        size_t code_size
        const char* format
        size_t format_size
    enum: PJRT_Program_STRUCT_SIZE
    ctypedef struct PJRT_Client_Compile_Args:
        size_t struct_size
        PJRT_Client* client
        const PJRT_Program* program
        const char* compile_options
        size_t compile_options_size
        PJRT_LoadedExecutable* executable
    enum: PJRT_Client_Compile_Args_STRUCT_SIZE

    ctypedef struct PJRT_Buffer_MemoryLayout_Strides:
        size_t struct_size
        const int64_t* byte_strides
        size_t num_byte_strides
    ctypedef struct PJRT_Buffer_MemoryLayout_Tiled:
        size_t struct_size
        const int64_t* minor_to_major
        size_t minor_to_major_size
        const int64_t* tile_dims
        const size_t* tile_dim_sizes
        size_t num_tiles
    enum: PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_MemoryLayout:
        size_t struct_size
        PJRT_Buffer_MemoryLayout_Tiled tiled
        PJRT_Buffer_MemoryLayout_Strides strides
        PJRT_Buffer_MemoryLayout_Type type
    enum: PJRT_Buffer_MemoryLayout_STRUCT_SIZE
    enum: PJRT_Buffer_MemoryLayout_Strides_STRUCT_SIZE

    ctypedef struct PJRT_Client_BufferFromHostBuffer_Args:
        size_t struct_size
        PJRT_Client* client
        const void* data
        PJRT_Buffer_Type type
        const int64_t* dims
        size_t num_dims
        const int64_t* byte_strides
        size_t num_byte_strides
        PJRT_HostBufferSemantics host_buffer_semantics
        PJRT_Device* device
        PJRT_Memory* memory
        PJRT_Buffer_MemoryLayout* device_layout
        PJRT_Event* done_with_host_buffer
        PJRT_Buffer* buffer
    enum: PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE

    # --- devices and memories -----------------------------------------------------------
    ctypedef struct PJRT_DeviceDescription_Id_Args:
        size_t struct_size
        PJRT_DeviceDescription* device_description
        int id
    enum: PJRT_DeviceDescription_Id_Args_STRUCT_SIZE
    ctypedef struct PJRT_DeviceDescription_ProcessIndex_Args:
        size_t struct_size
        PJRT_DeviceDescription* device_description
        int process_index
    enum: PJRT_DeviceDescription_ProcessIndex_Args_STRUCT_SIZE
    ctypedef struct PJRT_DeviceDescription_Attributes_Args:
        size_t struct_size
        PJRT_DeviceDescription* device_description
        size_t num_attributes
        const PJRT_NamedValue* attributes
    enum: PJRT_DeviceDescription_Attributes_Args_STRUCT_SIZE
    ctypedef struct PJRT_DeviceDescription_Kind_Args:
        size_t struct_size
        PJRT_DeviceDescription* device_description
        const char* device_kind
        size_t device_kind_size
    enum: PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE
    ctypedef struct PJRT_DeviceDescription_DebugString_Args:
        size_t struct_size
        PJRT_DeviceDescription* device_description
        const char* debug_string
        size_t debug_string_size
    enum: PJRT_DeviceDescription_DebugString_Args_STRUCT_SIZE
    ctypedef struct PJRT_DeviceDescription_ToString_Args:
        size_t struct_size
        PJRT_DeviceDescription* device_description
        const char* to_string
        size_t to_string_size
    enum: PJRT_DeviceDescription_ToString_Args_STRUCT_SIZE
    ctypedef struct PJRT_Device_GetDescription_Args:
        size_t struct_size
        PJRT_Device* device
        PJRT_DeviceDescription* device_description
    enum: PJRT_Device_GetDescription_Args_STRUCT_SIZE
    ctypedef struct PJRT_Device_IsAddressable_Args:
        size_t struct_size
        PJRT_Device* device
        bint is_addressable
    enum: PJRT_Device_IsAddressable_Args_STRUCT_SIZE
    ctypedef struct PJRT_Device_LocalHardwareId_Args:
        size_t struct_size
        PJRT_Device* device
        int local_hardware_id
    enum: PJRT_Device_LocalHardwareId_Args_STRUCT_SIZE
    ctypedef struct PJRT_Device_AddressableMemories_Args:
        size_t struct_size
        PJRT_Device* device
        PJRT_Memory* const* memories
        size_t num_memories
    enum: PJRT_Device_AddressableMemories_Args_STRUCT_SIZE
    ctypedef struct PJRT_Device_DefaultMemory_Args:
        size_t struct_size
        PJRT_Device* device
        PJRT_Memory* memory
    enum: PJRT_Device_DefaultMemory_Args_STRUCT_SIZE
    ctypedef struct PJRT_Device_MemoryStats_Args:
        size_t struct_size
        PJRT_Device* device
        int64_t bytes_in_use
        int64_t peak_bytes_in_use
        bint peak_bytes_in_use_is_set
        int64_t num_allocs
        bint num_allocs_is_set
        int64_t largest_alloc_size
        bint largest_alloc_size_is_set
        int64_t bytes_limit
        bint bytes_limit_is_set
        int64_t bytes_reserved
        bint bytes_reserved_is_set
        int64_t peak_bytes_reserved
        bint peak_bytes_reserved_is_set
        int64_t bytes_reservable_limit
        bint bytes_reservable_limit_is_set
        int64_t largest_free_block_bytes
        bint largest_free_block_bytes_is_set
    enum: PJRT_Device_MemoryStats_Args_STRUCT_SIZE
    ctypedef struct PJRT_Memory_Id_Args:
        size_t struct_size
        PJRT_Memory* memory
        int id
    enum: PJRT_Memory_Id_Args_STRUCT_SIZE
    ctypedef struct PJRT_Memory_Kind_Args:
        size_t struct_size
        PJRT_Memory* memory
        const char* kind
        size_t kind_size
    enum: PJRT_Memory_Kind_Args_STRUCT_SIZE
    ctypedef struct PJRT_Memory_Kind_Id_Args:
        size_t struct_size
        PJRT_Memory* memory
        int kind_id
    enum: PJRT_Memory_Kind_Id_Args_STRUCT_SIZE
    ctypedef struct PJRT_Memory_DebugString_Args:
        size_t struct_size
        PJRT_Memory* memory
        const char* debug_string
        size_t debug_string_size
    enum: PJRT_Memory_DebugString_Args_STRUCT_SIZE
    ctypedef struct PJRT_Memory_ToString_Args:
        size_t struct_size
        PJRT_Memory* memory
        const char* to_string
        size_t to_string_size
    enum: PJRT_Memory_ToString_Args_STRUCT_SIZE
    ctypedef struct PJRT_Memory_AddressableByDevices_Args:
        size_t struct_size
        PJRT_Memory* memory
        PJRT_Device* const* devices
        size_t num_devices
    enum: PJRT_Memory_AddressableByDevices_Args_STRUCT_SIZE

    # --- executables --------------------------------------------------------------------
    ctypedef struct PJRT_Executable_Destroy_Args:
        size_t struct_size
        PJRT_Executable* executable
    enum: PJRT_Executable_Destroy_Args_STRUCT_SIZE
    ctypedef struct PJRT_LoadedExecutable_Destroy_Args:
        size_t struct_size
        PJRT_LoadedExecutable* executable
    enum: PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE
    ctypedef struct PJRT_LoadedExecutable_GetExecutable_Args:
        size_t struct_size
        PJRT_LoadedExecutable* loaded_executable
        PJRT_Executable* executable
    enum: PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_Name_Args:
        size_t struct_size
        PJRT_Executable* executable
        const char* executable_name
        size_t executable_name_size
    enum: PJRT_Executable_Name_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_NumReplicas_Args:
        size_t struct_size
        PJRT_Executable* executable
        size_t num_replicas
    enum: PJRT_Executable_NumReplicas_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_NumPartitions_Args:
        size_t struct_size
        PJRT_Executable* executable
        size_t num_partitions
    enum: PJRT_Executable_NumPartitions_Args_STRUCT_SIZE
    ctypedef struct PJRT_LoadedExecutable_AddressableDevices_Args:
        size_t struct_size
        PJRT_LoadedExecutable* executable
        PJRT_Device* const* addressable_devices
        size_t num_addressable_devices
    enum: PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_OptimizedProgram_Args:
        size_t struct_size
        PJRT_Executable* executable
        PJRT_Program* program
    enum: PJRT_Executable_OptimizedProgram_Args_STRUCT_SIZE
    ctypedef struct PJRT_LoadedExecutable_Delete_Args:
        size_t struct_size
        PJRT_LoadedExecutable* executable
    enum: PJRT_LoadedExecutable_Delete_Args_STRUCT_SIZE
    ctypedef struct PJRT_LoadedExecutable_IsDeleted_Args:
        size_t struct_size
        PJRT_LoadedExecutable* executable
        bint is_deleted
    enum: PJRT_LoadedExecutable_IsDeleted_Args_STRUCT_SIZE
    ctypedef struct PJRT_ExecuteOptions:
        size_t struct_size
        int launch_id
        const int64_t* non_donatable_input_indices
        size_t num_non_donatable_input_indices
        PJRT_ExecuteContext* context
    enum: PJRT_ExecuteOptions_STRUCT_SIZE
    ctypedef struct PJRT_LoadedExecutable_Execute_Args:
        size_t struct_size
        PJRT_LoadedExecutable* executable
        PJRT_ExecuteOptions* options
        PJRT_Buffer* const* const* argument_lists
        size_t num_devices
        size_t num_args
        PJRT_Buffer** const* output_lists
        PJRT_Event** device_complete_events
        PJRT_Device* execute_device
    enum: PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_NumOutputs_Args:
        size_t struct_size
        PJRT_Executable* executable
        size_t num_outputs
    enum: PJRT_Executable_NumOutputs_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_SizeOfGeneratedCodeInBytes_Args:
        size_t struct_size
        PJRT_Executable* executable
        int64_t size_in_bytes
    enum: PJRT_Executable_SizeOfGeneratedCodeInBytes_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_Fingerprint_Args:
        size_t struct_size
        PJRT_Executable* executable
        const char* executable_fingerprint
        size_t executable_fingerprint_size
    enum: PJRT_Executable_Fingerprint_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_GetCostAnalysis_Args:
        size_t struct_size
        PJRT_Executable* executable
        size_t num_properties
        const PJRT_NamedValue* properties
    enum: PJRT_Executable_GetCostAnalysis_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_GetCompiledMemoryStats_Args:
        size_t struct_size
        PJRT_Executable* executable
        int64_t generated_code_size_in_bytes
        int64_t argument_size_in_bytes
        int64_t output_size_in_bytes
        int64_t alias_size_in_bytes
        int64_t temp_size_in_bytes
        int64_t host_generated_code_size_in_bytes
        int64_t host_argument_size_in_bytes
        int64_t host_output_size_in_bytes
        int64_t host_alias_size_in_bytes
        int64_t host_temp_size_in_bytes
        int64_t peak_memory_in_bytes
    enum: PJRT_Executable_GetCompiledMemoryStats_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_OutputElementTypes_Args:
        size_t struct_size
        PJRT_Executable* executable
        PJRT_Buffer_Type* output_types
        size_t num_output_types
    enum: PJRT_Executable_OutputElementTypes_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_OutputDimensions_Args:
        size_t struct_size
        PJRT_Executable* executable
        size_t num_outputs
        const int64_t* dims
        const size_t* dim_sizes
    enum: PJRT_Executable_OutputDimensions_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_OutputMemoryKinds_Args:
        size_t struct_size
        PJRT_Executable* executable
        size_t num_outputs
        const char* const* memory_kinds
        const size_t* memory_kind_sizes
    enum: PJRT_Executable_OutputMemoryKinds_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_Serialize_Args:
        size_t struct_size
        const PJRT_Executable* executable
        const char* serialized_bytes
        size_t serialized_bytes_size
        PJRT_SerializedExecutable* serialized_executable
        void (*serialized_executable_deleter)(PJRT_SerializedExecutable* exec) noexcept nogil
    enum: PJRT_Executable_Serialize_Args_STRUCT_SIZE
    ctypedef struct PJRT_Executable_DeserializeAndLoad_Args:
        size_t struct_size
        PJRT_Client* client
        const char* serialized_executable
        size_t serialized_executable_size
        PJRT_LoadedExecutable* loaded_executable
    enum: PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE

    # --- buffers ------------------------------------------------------------------------
    ctypedef struct PJRT_Buffer_Destroy_Args:
        size_t struct_size
        PJRT_Buffer* buffer
    enum: PJRT_Buffer_Destroy_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_ElementType_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        PJRT_Buffer_Type type
    enum: PJRT_Buffer_ElementType_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_Dimensions_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        const int64_t* dims
        size_t num_dims
    enum: PJRT_Buffer_Dimensions_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_GetMemoryLayout_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        PJRT_Buffer_MemoryLayout layout
    enum: PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_ToHostBuffer_Args:
        size_t struct_size
        PJRT_Buffer* src
        PJRT_Buffer_MemoryLayout* host_layout
        void* dst
        size_t dst_size
        PJRT_Event* event
    enum: PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_OnDeviceSizeInBytes_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        size_t on_device_size_in_bytes
    enum: PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_Delete_Args:
        size_t struct_size
        PJRT_Buffer* buffer
    enum: PJRT_Buffer_Delete_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_IsDeleted_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        bint is_deleted
    enum: PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_CopyToDevice_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        PJRT_Device* dst_device
        PJRT_Buffer* dst_buffer
    enum: PJRT_Buffer_CopyToDevice_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_CopyToMemory_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        PJRT_Memory* dst_memory
        PJRT_Buffer* dst_buffer
    enum: PJRT_Buffer_CopyToMemory_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_Device_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        PJRT_Device* device
    enum: PJRT_Buffer_Device_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_Memory_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        PJRT_Memory* memory
    enum: PJRT_Buffer_Memory_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_ReadyEvent_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        PJRT_Event* event
    enum: PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_UnsafePointer_Args:
        size_t struct_size
        PJRT_Buffer* buffer
        uintptr_t buffer_pointer
    enum: PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE

    ctypedef struct PJRT_Buffer_IncreaseExternalReferenceCount_Args:
        size_t struct_size
        PJRT_Buffer* buffer
    enum: PJRT_Buffer_IncreaseExternalReferenceCount_Args_STRUCT_SIZE
    ctypedef struct PJRT_Buffer_DecreaseExternalReferenceCount_Args:
        size_t struct_size
        PJRT_Buffer* buffer
    enum: PJRT_Buffer_DecreaseExternalReferenceCount_Args_STRUCT_SIZE
    ctypedef struct PJRT_Client_CreateViewOfDeviceBuffer_Args:
        size_t struct_size
        PJRT_Client* client
        void* device_buffer_ptr
        const int64_t* dims
        size_t num_dims
        PJRT_Buffer_Type element_type
        PJRT_Buffer_MemoryLayout* layout
        PJRT_Device* device
        void (*on_delete_callback)(void* device_buffer_ptr, void* user_arg) noexcept nogil
        void* on_delete_callback_arg
        intptr_t stream
        PJRT_Buffer* buffer
        PJRT_Memory* memory
    enum: PJRT_Client_CreateViewOfDeviceBuffer_Args_STRUCT_SIZE
    ctypedef struct PJRT_ExecuteContext_Create_Args:
        size_t struct_size
        PJRT_ExecuteContext* context
    enum: PJRT_ExecuteContext_Create_Args_STRUCT_SIZE
    ctypedef struct PJRT_ExecuteContext_Destroy_Args:
        size_t struct_size
        PJRT_ExecuteContext* context
    enum: PJRT_ExecuteContext_Destroy_Args_STRUCT_SIZE


# The function table PJRT_Api: its slots are generated from api_functions.txt.
include "_api_table.pxi"

# The type of the one symbol a plugin exports.
ctypedef const PJRT_Api* (*GetPjrtApi_fn)() noexcept nogil
