# cython: language_level=3
"""Floor loops: the same PJRT calls as ifrtpy._pjrt makes, from a Cython loop with no
Python in between. Built on the fly by benchmarks/_build.py."""

cnp.import_array()

cimport cython
from libc.stdint cimport int64_t
from libc.string cimport memset
cimport numpy as cnp
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt._buffer cimport BufferHandle
from ifrtpy._pjrt._client cimport ClientHandle, DeviceHandle
from ifrtpy._pjrt._executable cimport ExecutableHandle


cdef double _now() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9


def execute_loop(ExecutableHandle exe, BufferHandle arg, int n, bint ifrtpy_calls=False):
    """Seconds for ``n`` executes of a 1-argument, 1-output program on one device, each
    followed by awaiting its completion event and destroying output and event. With
    ``ifrtpy_calls``, the PJRT calls of ifrtpy's ``exe(x)[0].block_until_ready()``
    instead: no completion event asked for; the output's ready event taken, asked whether
    it is ready (until it is) and for its error, and destroyed; then the output destroyed."""
    cdef const PJRT_Api* api = exe.client.api
    cdef PJRT_Buffer* arg_list[1]
    cdef PJRT_Buffer* const* arg_lists[1]
    cdef PJRT_Buffer* out_list[1]
    cdef PJRT_Buffer** out_lists[1]
    cdef PJRT_Event* events[1]
    cdef PJRT_Event* event
    cdef PJRT_ExecuteOptions options
    cdef PJRT_LoadedExecutable_Execute_Args args
    cdef PJRT_Event_Await_Args await_args
    cdef PJRT_Buffer_ReadyEvent_Args ready
    cdef PJRT_Event_IsReady_Args is_ready
    cdef PJRT_Event_Error_Args error
    cdef PJRT_Event_Destroy_Args event_destroy
    cdef PJRT_Buffer_Destroy_Args buffer_destroy
    cdef int i
    cdef double start, elapsed = -1.0
    cdef bint failed = False
    arg_list[0] = arg.ptr
    arg_lists[0] = arg_list
    out_lists[0] = out_list
    memset(&options, 0, sizeof(options))
    options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE
    with nogil:
        start = _now()
        for i in range(n):
            memset(&args, 0, sizeof(args))
            args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE
            args.executable = exe.ptr
            args.options = &options
            args.argument_lists = <PJRT_Buffer* const* const*>arg_lists
            args.num_devices = 1
            args.num_args = 1
            args.output_lists = <PJRT_Buffer** const*>out_lists
            args.device_complete_events = NULL if ifrtpy_calls else events
            if api.PJRT_LoadedExecutable_Execute(&args) != NULL:
                failed = True
                break
            if ifrtpy_calls:
                memset(&ready, 0, sizeof(ready))
                ready.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE
                ready.buffer = out_list[0]
                if api.PJRT_Buffer_ReadyEvent(&ready) != NULL:
                    failed = True
                    break
                event = ready.event
                while True:
                    memset(&is_ready, 0, sizeof(is_ready))
                    is_ready.struct_size = PJRT_Event_IsReady_Args_STRUCT_SIZE
                    is_ready.event = event
                    api.PJRT_Event_IsReady(&is_ready)
                    if is_ready.is_ready:
                        break
                memset(&error, 0, sizeof(error))
                error.struct_size = PJRT_Event_Error_Args_STRUCT_SIZE
                error.event = event
                if api.PJRT_Event_Error(&error) != NULL:
                    failed = True
                    break
            else:
                event = events[0]
                memset(&await_args, 0, sizeof(await_args))
                await_args.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE
                await_args.event = event
                api.PJRT_Event_Await(&await_args)
            memset(&event_destroy, 0, sizeof(event_destroy))
            event_destroy.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE
            event_destroy.event = event
            api.PJRT_Event_Destroy(&event_destroy)
            memset(&buffer_destroy, 0, sizeof(buffer_destroy))
            buffer_destroy.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE
            buffer_destroy.buffer = out_list[0]
            api.PJRT_Buffer_Destroy(&buffer_destroy)
        elapsed = _now() - start
    if failed:
        raise RuntimeError("execute failed in the floor loop")
    return elapsed


def put_loop(ClientHandle client, cnp.ndarray data, DeviceHandle device, int n):
    """Seconds for ``n`` BufferFromHostBuffer calls (kImmutableOnlyDuringCall) of a dense
    f32 array, each followed by destroying the buffer and its done event."""
    cdef const PJRT_Api* api = client.api
    cdef PJRT_Client_BufferFromHostBuffer_Args args
    cdef PJRT_Buffer_Destroy_Args buffer_destroy
    cdef PJRT_Event_Destroy_Args event_destroy
    cdef int64_t dims[1]
    cdef int i
    cdef double start, elapsed = -1.0
    cdef bint failed = False
    dims[0] = data.shape[0]
    cdef const void* ptr = cnp.PyArray_DATA(data)
    with nogil:
        start = _now()
        for i in range(n):
            memset(&args, 0, sizeof(args))
            args.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE
            args.client = client.ptr
            args.data = ptr
            args.type = <PJRT_Buffer_Type>11  # F32
            args.dims = dims
            args.num_dims = 1
            args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
            args.device = device.ptr
            if api.PJRT_Client_BufferFromHostBuffer(&args) != NULL:
                failed = True
                break
            if args.done_with_host_buffer != NULL:
                memset(&event_destroy, 0, sizeof(event_destroy))
                event_destroy.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE
                event_destroy.event = args.done_with_host_buffer
                api.PJRT_Event_Destroy(&event_destroy)
            memset(&buffer_destroy, 0, sizeof(buffer_destroy))
            buffer_destroy.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE
            buffer_destroy.buffer = args.buffer
            api.PJRT_Buffer_Destroy(&buffer_destroy)
        elapsed = _now() - start
    if failed:
        raise RuntimeError("BufferFromHostBuffer failed in the floor loop")
    return elapsed


@cython.freelist(8)
cdef class _Output:
    cdef object client, dtype, shape, sharding, buffers

    def block_until_ready(self):
        return self


cdef class EmptyCall:
    """``EmptyCall()(x)[0].block_until_ready()`` has the shape of ``exe(x)[0].block_until_ready()``
    with nothing behind it: a call from Python into C that releases the GIL once and
    returns a new object in a new list. What any Python API of that shape costs."""

    def __call__(self, *args):
        with nogil:
            pass
        return [_Output()]
