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


cdef int _execute_once(const PJRT_Api* api, PJRT_LoadedExecutable* exe, PJRT_Buffer* arg,
                       bint probe, PJRT_Buffer** out) noexcept nogil:
    """One execute of a 1-argument, 1-output program on one device, its completion event
    awaited (``probe``: asked whether it fired, and for its error, as ifrtpy does) and
    destroyed; the output left in ``out``. 1 when the plugin fails."""
    cdef PJRT_Buffer* arg_list[1]
    cdef PJRT_Buffer* const* arg_lists[1]
    cdef PJRT_Buffer** out_lists[1]
    cdef PJRT_Event* events[1]
    cdef PJRT_ExecuteOptions options
    cdef PJRT_LoadedExecutable_Execute_Args args
    cdef PJRT_Event_Await_Args await_args
    cdef PJRT_Event_IsReady_Args is_ready
    cdef PJRT_Event_Error_Args error
    cdef PJRT_Event_Destroy_Args event_destroy
    arg_list[0] = arg
    arg_lists[0] = arg_list
    out_lists[0] = out
    memset(&options, 0, sizeof(options))
    options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE
    memset(&args, 0, sizeof(args))
    args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE
    args.executable = exe
    args.options = &options
    args.argument_lists = <PJRT_Buffer* const* const*>arg_lists
    args.num_devices = 1
    args.num_args = 1
    args.output_lists = <PJRT_Buffer** const*>out_lists
    args.device_complete_events = events
    if api.PJRT_LoadedExecutable_Execute(&args) != NULL:
        return 1
    if probe:
        memset(&is_ready, 0, sizeof(is_ready))
        is_ready.struct_size = PJRT_Event_IsReady_Args_STRUCT_SIZE
        is_ready.event = events[0]
        api.PJRT_Event_IsReady(&is_ready)
        if is_ready.is_ready:
            memset(&error, 0, sizeof(error))
            error.struct_size = PJRT_Event_Error_Args_STRUCT_SIZE
            error.event = events[0]
            if api.PJRT_Event_Error(&error) != NULL:
                return 1
    else:
        memset(&await_args, 0, sizeof(await_args))
        await_args.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE
        await_args.event = events[0]
        api.PJRT_Event_Await(&await_args)
    memset(&event_destroy, 0, sizeof(event_destroy))
    event_destroy.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE
    event_destroy.event = events[0]
    api.PJRT_Event_Destroy(&event_destroy)
    return 0


cdef void _destroy(const PJRT_Api* api, PJRT_Buffer* buffer) noexcept nogil:
    cdef PJRT_Buffer_Destroy_Args buffer_destroy
    memset(&buffer_destroy, 0, sizeof(buffer_destroy))
    buffer_destroy.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE
    buffer_destroy.buffer = buffer
    api.PJRT_Buffer_Destroy(&buffer_destroy)


def execute_loop(ExecutableHandle exe, BufferHandle arg, int n, bint ifrtpy_calls=False):
    """Seconds for ``n`` executes of a 1-argument, 1-output program on one device, each
    followed by awaiting its completion event and destroying output and event. With
    ``ifrtpy_calls``, the PJRT calls of ifrtpy's ``exe(x)[0].block_until_ready()``
    instead: the completion event asked whether it fired and for its error (the output
    is then known ready: waiting for it asks the plugin nothing), not awaited."""
    cdef const PJRT_Api* api = exe.client.api
    cdef PJRT_Buffer* out
    cdef int i
    cdef double start, elapsed = -1.0
    cdef bint failed = False
    with nogil:
        start = _now()
        for i in range(n):
            if _execute_once(api, exe.ptr, arg.ptr, ifrtpy_calls, &out):
                failed = True
                break
            _destroy(api, out)
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


@cython.freelist(8)
cdef class _OwnedOutput:
    cdef const PJRT_Api* api
    cdef PJRT_Buffer* buffer

    def block_until_ready(self):
        return self

    def __dealloc__(self):
        if self.buffer != NULL:
            _destroy(self.api, self.buffer)


cdef class EmptyCall:
    """``EmptyCall()(x)[0].block_until_ready()`` has the shape of ``exe(x)[0].block_until_ready()``
    with nothing behind it: a call from Python into C that releases the GIL once and
    returns a new object in a new list. What any Python API of that shape costs."""

    def __call__(self, *args):
        with nogil:
            pass
        return [_Output()]


cdef class FloorCall:
    """``FloorCall(exe)(x)[0].block_until_ready()``: the floor's PJRT calls (ifrtpy's:
    completion event asked, not awaited) made by one call from Python, the GIL released
    around the execute, the output returned in a new list as an object that destroys it
    when freed. The least a Python ``exe(x)`` can cost where the plugin runs between its
    calls, and leaves the caches of the Python around it cold."""

    cdef ExecutableHandle exe

    def __init__(self, ExecutableHandle exe):
        self.exe = exe

    def __call__(self, BufferHandle arg):
        cdef const PJRT_Api* api = self.exe.client.api
        cdef PJRT_LoadedExecutable* ptr = self.exe.ptr
        cdef PJRT_Buffer* buffer = arg.ptr
        cdef PJRT_Buffer* out
        cdef int failed
        with nogil:
            failed = _execute_once(api, ptr, buffer, True, &out)
        if failed:
            raise RuntimeError("execute failed in the floor call")
        output = _OwnedOutput()
        output.api = api
        output.buffer = out
        return [output]
