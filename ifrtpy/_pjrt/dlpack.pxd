# The DLPack data structures (DLPack 1.x, https://dmlc.github.io/dlpack/latest/), declared
# here from the specification: no dlpack.h is needed or carried. The layouts below are
# the C ABI every producer and consumer shares; field order matters (Cython emits them).

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from *:
    """
    typedef struct { uint32_t major; uint32_t minor; } ifrtpy_DLPackVersion;
    typedef struct { int32_t device_type; int32_t device_id; } ifrtpy_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } ifrtpy_DLDataType;
    typedef struct {
        void* data;
        ifrtpy_DLDevice device;
        int32_t ndim;
        ifrtpy_DLDataType dtype;
        int64_t* shape;
        int64_t* strides;
        uint64_t byte_offset;
    } ifrtpy_DLTensor;
    typedef struct ifrtpy_DLManagedTensor {
        ifrtpy_DLTensor dl_tensor;
        void* manager_ctx;
        void (*deleter)(struct ifrtpy_DLManagedTensor* self);
    } ifrtpy_DLManagedTensor;
    typedef struct ifrtpy_DLManagedTensorVersioned {
        ifrtpy_DLPackVersion version;
        void* manager_ctx;
        void (*deleter)(struct ifrtpy_DLManagedTensorVersioned* self);
        uint64_t flags;
        ifrtpy_DLTensor dl_tensor;
    } ifrtpy_DLManagedTensorVersioned;
    """
    ctypedef struct DLPackVersion "ifrtpy_DLPackVersion":
        uint32_t major
        uint32_t minor

    ctypedef struct DLDevice "ifrtpy_DLDevice":
        int32_t device_type
        int32_t device_id

    ctypedef struct DLDataType "ifrtpy_DLDataType":
        uint8_t code
        uint8_t bits
        uint16_t lanes

    ctypedef struct DLTensor "ifrtpy_DLTensor":
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset

    ctypedef struct DLManagedTensor "ifrtpy_DLManagedTensor":
        DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(DLManagedTensor*) noexcept nogil

    ctypedef struct DLManagedTensorVersioned "ifrtpy_DLManagedTensorVersioned":
        DLPackVersion version
        void* manager_ctx
        void (*deleter)(DLManagedTensorVersioned*) noexcept nogil
        uint64_t flags
        DLTensor dl_tensor


# DLDeviceType values used by ifrtpy.
cdef enum:
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLROCM = 10
    kDLROCMHost = 11
    kDLCUDAManaged = 13

# DLManagedTensorVersioned.flags bits.
cdef enum:
    DLPACK_FLAG_BITMASK_READ_ONLY = 1
    DLPACK_FLAG_BITMASK_IS_COPIED = 2
    DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED = 4

# The DLPack version ifrtpy produces and the highest major version it consumes.
cdef enum:
    DLPACK_MAJOR_VERSION = 1
    DLPACK_MINOR_VERSION = 1
