from cpython.object cimport PyObject
from libc.stdlib cimport malloc
from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt._buffer cimport BufferHandle, NewBuffer
from ifrtpy._pjrt._client cimport ClientHandle, DeviceHandle
from ifrtpy._pjrt._ffi cimport ExecuteContext


#: The caller's rule for the buffers an execute hands the plugin that are donated, by it or
#: by an execute in flight (``_execute``; any other buffer may be shared): raise to refuse
#: ``buffer`` as argument ``argument``, which the execute donates or not.
ctypedef int (*admit_buffer)(BufferHandle buffer, bint donate, Py_ssize_t argument) except -1


cdef class ExecutableHandle:
    cdef PJRT_LoadedExecutable* ptr
    cdef PJRT_Executable* executable
    cdef readonly ClientHandle client
    cdef readonly str name
    cdef readonly Py_ssize_t num_outputs
    cdef readonly tuple addressable_devices
    cdef public bint needs_context
    cdef public bint reads_completion
    cdef ExecuteContext _execute_context

    cdef tuple _execute_tuples(self, list groups, bint by_device, Py_ssize_t num_devices,
                               int launch_id, tuple non_donatable_input_indices,
                               DeviceHandle execute_device, frozenset donated,
                               admit_buffer admit)
    cdef int _execute(self, PyObject** buffers, Py_ssize_t num_args, Py_ssize_t num_devices,
                      int launch_id, tuple non_donatable_input_indices,
                      DeviceHandle execute_device, frozenset donated, admit_buffer admit,
                      NewBuffer* outputs, PyObject** done) except -1

    @staticmethod
    cdef ExecutableHandle _wrap(ClientHandle client, PJRT_LoadedExecutable* ptr)


cpdef Py_ssize_t callback_executions(DeviceHandle device) except -1
cdef int hold_buffers(object group, Py_ssize_t k, Py_ssize_t num_devices,
                      PyObject** held) except -1
cdef tuple handles_taking(ClientHandle client, NewBuffer* made, Py_ssize_t start,
                          Py_ssize_t step, Py_ssize_t count)


cdef inline void* stack_or_malloc(void* small, size_t small_size, size_t size) except NULL:
    """``size`` bytes of room: ``small`` (``small_size`` bytes on the caller's stack) where
    they fit, else new memory, which the caller frees (where it is not ``small``)."""
    if size <= small_size:
        return small
    cdef void* out = malloc(size)
    if out == NULL:
        raise MemoryError()
    return out
