from cpython.object cimport PyObject
from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt._buffer cimport BufferHandle
from ifrtpy._pjrt._client cimport ClientHandle, DeviceHandle
from ifrtpy._pjrt._ffi cimport ExecuteContext


#: The caller's rule for each buffer an execute hands the plugin (``_execute``): raise to
#: refuse ``buffer`` as argument ``argument``, which the execute donates or not.
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

    cdef int _execute_flat(self, PJRT_Buffer** args_flat, Py_ssize_t num_devices,
                           Py_ssize_t num_args, PJRT_Buffer** out_flat, PJRT_Event** events,
                           int launch_id, tuple non_donatable_input_indices,
                           DeviceHandle execute_device) except -1
    cdef tuple _execute_tuples(self, list groups, bint by_device, Py_ssize_t num_devices,
                               int launch_id, tuple non_donatable_input_indices,
                               DeviceHandle execute_device, frozenset donated,
                               admit_buffer admit)
    cdef int _execute(self, PyObject** arguments, Py_ssize_t num_args, Py_ssize_t num_devices,
                      int launch_id, tuple non_donatable_input_indices,
                      DeviceHandle execute_device, frozenset donated, admit_buffer admit,
                      PyObject** results, PyObject** done) except -1

    @staticmethod
    cdef ExecutableHandle _wrap(ClientHandle client, PJRT_LoadedExecutable* ptr)


cpdef Py_ssize_t callback_executions(DeviceHandle device) except -1
cdef void destroy_events(const PJRT_Api* api, PJRT_Event** events, Py_ssize_t count) noexcept
cdef tuple new_event_handles(ClientHandle client, Py_ssize_t count)
cdef tuple new_buffer_handles(ClientHandle client, Py_ssize_t count)
