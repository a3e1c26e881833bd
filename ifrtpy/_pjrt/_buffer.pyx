# cython: language_level=3, binding=True, embedsignature=True
"""PJRT buffers (their events are :mod:`ifrtpy._pjrt._event`).

Differences from the C API:

* ``buffer_from_host_buffer`` takes a NumPy array: element type, dims and byte strides
  come from it (one byte per element for sub-byte types, as PJRT expects). Arrays with
  negative strides are first copied into a dense one. The array is kept alive until the
  plugin's done-with-host-buffer event fires, whatever the caller does with its handles.
* Awaiting the done-with-host-buffer event of a zero-copy buffer while that buffer still
  exists would hang forever (the event fires on destruction): it raises instead.
* kMutableZeroCopy refuses a read-only array.
* ``to_host_buffer`` writes into a C-contiguous NumPy array (a new one by default) and
  keeps it alive until the copy's event fires.
"""

import weakref

import numpy as np
cimport numpy as cnp

from libc.stdint cimport int64_t, uintptr_t
cimport cython

from ifrtpy._pjrt._api cimport *
from ifrtpy._pjrt._base cimport error_to_exception
from ifrtpy._pjrt._client cimport DeviceHandle, MemoryHandle, layout_text, need_layouts
from ifrtpy._pjrt._event cimport EventHandle, keep_alive_until
from ifrtpy import errors as _errors
from ifrtpy.dtypes import PJRT_BUFFER_TYPE_OF_NUMPY, NUMPY_OF_PJRT_BUFFER_TYPE

cnp.import_array()

cdef dict _pjrt_type_of_numpy = PJRT_BUFFER_TYPE_OF_NUMPY
cdef dict _numpy_of_pjrt_type = NUMPY_OF_PJRT_BUFFER_TYPE

DEF MAX_RANK = 64


def buffer_from_host_buffer(ClientHandle client not None, cnp.ndarray data not None,
                            DeviceHandle device=None,
                            MemoryHandle memory=None, semantics=0, layout=None):
    """Copy (or alias) ``data`` into a new buffer on ``device`` or in ``memory``.

    ``semantics`` is a PJRT_HostBufferSemantics value (0..3). ``layout`` is None (the
    plugin's default) or a device layout ``(minor_to_major, tiles)`` (a permutation of
    the dimensions, and a tuple of tile shapes), passed as ``device_layout``. Returns
    ``(buffer, event)``: the done-with-host-buffer event, or None for
    kImmutableOnlyDuringCall, where the call copies before returning.
    """
    cdef const PJRT_Api* api = client.api
    cdef int rank = cnp.PyArray_NDIM(data)
    cdef int64_t dims[MAX_RANK]
    cdef int64_t strides[MAX_RANK]
    cdef cnp.npy_intp* np_dims
    cdef cnp.npy_intp* np_strides
    cdef int i
    cdef bint dense = cnp.PyArray_IS_C_CONTIGUOUS(data)
    cdef PJRT_Client_BufferFromHostBuffer_Args args
    cdef int mode
    if isinstance(semantics, int) and not isinstance(semantics, bool) and 0 <= semantics <= 3:
        mode = semantics
    else:
        mode = _errors.check_int(semantics, "semantics", 0, 3)
    element_type = _pjrt_type_of_numpy.get(data.dtype)
    if element_type is None:
        raise _errors.InvalidArgumentError(
            f"NumPy dtype {data.dtype} has no PJRT buffer type (byte order {data.dtype.byteorder!r})"
        )
    if rank > MAX_RANK:
        raise _errors.InvalidArgumentError(f"rank {rank} exceeds the maximum of {MAX_RANK}")
    if mode == 3 and not cnp.PyArray_ISWRITEABLE(data):
        raise _errors.InvalidArgumentError(
            "kMutableZeroCopy lets the runtime write into the host array, which is read-only")
    if (device is None) == (memory is None):
        raise _errors.InvalidArgumentError("give exactly one of device and memory")
    cdef TiledLayout device_layout = None
    if layout is not None:
        device_layout = TiledLayout(layout[0], layout[1], rank)
    target_client = device.client if device is not None else memory.client
    if target_client is not client:
        raise _errors.InvalidArgumentError("the target device or memory belongs to another client")
    if not dense:
        np_strides = cnp.PyArray_STRIDES(data)
        for i in range(rank):
            if np_strides[i] < 0:
                data = np.ascontiguousarray(data)
                dense = True
                break
    np_dims = cnp.PyArray_DIMS(data)
    np_strides = cnp.PyArray_STRIDES(data)
    for i in range(rank):
        dims[i] = np_dims[i]
        strides[i] = np_strides[i]
    args = PJRT_Client_BufferFromHostBuffer_Args_new()
    args.client = client.ptr
    args.data = cnp.PyArray_DATA(data)
    args.type = <PJRT_Buffer_Type><int>element_type
    args.dims = dims
    args.num_dims = rank
    if not dense:
        args.byte_strides = strides
        args.num_byte_strides = rank
    args.host_buffer_semantics = <PJRT_HostBufferSemantics>mode
    if device_layout is not None:
        args.device_layout = &device_layout.c
    if device is not None:
        args.device = device.ptr
    else:
        args.memory = memory.ptr
    PJRT_Client_BufferFromHostBuffer(api, &args)
    buffer = BufferHandle.wrap(client, args.buffer)
    if args.done_with_host_buffer == NULL:
        return buffer, None
    done = EventHandle.wrap(client, api, args.done_with_host_buffer)
    if mode == 0:
        return buffer, None  # done is destroyed with its handle: the call already copied
    keep_alive_until(api, args.done_with_host_buffer, data)
    if mode >= 2:
        done._guard = weakref.ref(buffer)
    return buffer, done


cdef int delete_now(const PJRT_Api* api, PJRT_Buffer* buffer) noexcept nogil:
    """PJRT_Buffer_Delete from any thread, without the GIL (an error is dropped)."""
    cdef PJRT_Buffer_Delete_Args args = PJRT_Buffer_Delete_Args_new()
    args.buffer = buffer
    PJRT_Buffer_Delete_quiet(api, &args)
    return 0


cdef class TiledLayout:
    """A ``PJRT_Buffer_MemoryLayout`` of type Tiled and the memory its arrays point to.

    ``minor_to_major`` must be a permutation of ``range(rank)``; ``tiles`` a sequence of
    tile shapes (sequences of positive int). InvalidArgumentError otherwise.
    """

    cdef PJRT_Buffer_MemoryLayout c
    cdef object _minor_to_major, _tile_dims, _tile_sizes

    def __cinit__(self, minor_to_major, tiles, int rank):
        minor_to_major = tuple(minor_to_major)
        if sorted(minor_to_major) != list(range(rank)):
            raise _errors.InvalidArgumentError(
                f"layout minor_to_major {minor_to_major} is not a permutation of the "
                f"{rank} dimensions")
        tiles = tuple(tuple(t) for t in tiles)
        if any(len(t) == 0 or any(d < 1 for d in t) for t in tiles):
            raise _errors.InvalidArgumentError(f"layout tiles {tiles} must be non-empty and positive")
        self._minor_to_major = np.ascontiguousarray(minor_to_major, dtype=np.int64).reshape(-1)
        self._tile_dims = np.ascontiguousarray([d for t in tiles for d in t], dtype=np.int64).reshape(-1)
        self._tile_sizes = np.ascontiguousarray([len(t) for t in tiles], dtype=np.uintp).reshape(-1)
        self.c = PJRT_Buffer_MemoryLayout_new()
        self.c.type = PJRT_Buffer_MemoryLayout_Type_Tiled
        self.c.tiled = PJRT_Buffer_MemoryLayout_Tiled_new()
        self.c.tiled.minor_to_major = <const int64_t*>cnp.PyArray_DATA(self._minor_to_major)
        self.c.tiled.minor_to_major_size = rank
        if tiles:
            self.c.tiled.tile_dims = <const int64_t*>cnp.PyArray_DATA(self._tile_dims)
            self.c.tiled.tile_dim_sizes = <const size_t*>cnp.PyArray_DATA(self._tile_sizes)
        self.c.tiled.num_tiles = len(tiles)


cdef void destroy_buffer(const PJRT_Api* api, PJRT_Buffer* ptr) noexcept nogil:
    """PJRT_Buffer_Destroy of ``ptr``, which no handle owns. A buffer never given to an
    execute is destroyed without waiting (PJRT defers the release to its last use): the
    GIL may be kept, releasing it costs more."""
    cdef PJRT_Buffer_Destroy_Args args = PJRT_Buffer_Destroy_Args_new()
    args.buffer = ptr
    PJRT_Buffer_Destroy_quiet(api, &args)


cdef BufferHandle take_buffer(ClientHandle client, NewBuffer* made):
    """A BufferHandle of ``client`` owning ``made``'s buffer (``made.ptr`` set to NULL),
    known ready where ``made`` is; ``made`` is left as it was where this fails."""
    cdef BufferHandle buffer = BufferHandle.wrap(client, made.ptr)
    buffer._ready = made.ready
    made.ptr = NULL
    return buffer


cdef int refuse_deleted(Py_ssize_t argument) except -1:
    """``pin_for_execute``'s refusal of a buffer whose delete was asked for."""
    raise _errors.InvalidArgumentError(f"argument {argument} has been deleted")


cdef void delete_after_execute(BufferHandle buffer) noexcept:
    """``unpin_after_execute``'s delete that waited for the last execute to return."""
    try:
        buffer._delete_now()
    except _errors.IfrtError:
        pass  # deleting a buffer the execute donated: nothing is left to free


@cython.no_gc  # holds only its client: never part of a cycle
@cython.freelist(32)  # an execute makes one per output
cdef class BufferHandle:
    """Owns a ``PJRT_Buffer*``; keeps its client alive."""

    def __init__(self, *args, **kwargs):
        raise TypeError("use ifrtpy._pjrt.buffer_from_host_buffer")

    @staticmethod
    cdef BufferHandle wrap(ClientHandle client, PJRT_Buffer* ptr):
        cdef BufferHandle self = BufferHandle.__new__(BufferHandle)
        self.client = client
        self.ptr = ptr
        return self

    def __dealloc__(self):
        cdef const PJRT_Api* api
        cdef PJRT_Buffer* ptr = self.ptr
        if ptr != NULL:
            self.ptr = NULL
            api = self.client.api
            if self._executed:
                # The 0.81 build waits here until an execute this buffer was donated to
                # finishes (newer builds return at once; the C layer may not know which
                # arguments a program donates): other threads must run meanwhile.
                with nogil:
                    destroy_buffer(api, ptr)
            else:
                destroy_buffer(api, ptr)

    @property
    def element_type(self):
        """The PJRT_Buffer_Type value."""
        cdef PJRT_Buffer_ElementType_Args args = PJRT_Buffer_ElementType_Args_new()
        args.buffer = self.ptr
        PJRT_Buffer_ElementType(self.client.api, &args)
        return <int>args.type

    @property
    def dtype(self):
        """The NumPy dtype of the elements on the host."""
        return _numpy_of_pjrt_type[self.element_type]

    @property
    def dims(self):
        cdef PJRT_Buffer_Dimensions_Args args
        cdef size_t i
        args = PJRT_Buffer_Dimensions_Args_new()
        args.buffer = self.ptr
        PJRT_Buffer_Dimensions(self.client.api, &args)
        return tuple([args.dims[i] for i in range(args.num_dims)])

    @property
    def on_device_size_in_bytes(self):
        cdef PJRT_Buffer_OnDeviceSizeInBytes_Args args = PJRT_Buffer_OnDeviceSizeInBytes_Args_new()
        args.buffer = self.ptr
        PJRT_Buffer_OnDeviceSizeInBytes(self.client.api, &args)
        return args.on_device_size_in_bytes

    @property
    def device(self):
        cdef PJRT_Buffer_Device_Args args = PJRT_Buffer_Device_Args_new()
        args.buffer = self.ptr
        PJRT_Buffer_Device(self.client.api, &args)
        return self.client.device_of(args.device)

    @property
    def memory(self):
        cdef PJRT_Buffer_Memory_Args args = PJRT_Buffer_Memory_Args_new()
        args.buffer = self.ptr
        PJRT_Buffer_Memory(self.client.api, &args)
        return self.client.memory_of(args.memory)

    def is_deleted(self):
        return self._is_deleted()

    cdef object memory_order(self):
        """``(minor_to_major, tiles)`` of the buffer's device layout, asked once (a layout
        never changes); the row-major default where the plugin lacks
        PJRT_Buffer_GetMemoryLayout; None where it reports a layout ifrtpy cannot read."""
        cdef const PJRT_Api* api = self.client.api
        if self.order is None:
            rank = len(self.dims)
            order = (tuple(range(rank - 1, -1, -1)), ())
            if has_PJRT_Buffer_GetMemoryLayout(api):
                try:
                    order = self.memory_layout
                except _errors.IfrtError:
                    order = False  # cached as "unreadable"
            self.order = order
        return self.order or None

    cdef tuple element_strides(self):
        """The element strides of the buffer's memory: from the device layout's
        minor-to-major order (row-major by default). UnimplementedError for a tiled or
        unreadable layout, which has no strided form."""
        layout = self.memory_order()
        if layout is None or layout[1]:
            raise _errors.UnimplementedError(
                f"the buffer's device layout {layout if layout else '(unreadable)'} has no "
                "strided form (tiled memory)")
        dims = self.dims
        strides = [0] * len(dims)
        step = 1
        for axis in layout[0]:
            strides[axis] = step
            step *= max(dims[axis], 1)
        return tuple(strides)

    cdef bint _is_deleted(self) except -1:
        cdef PJRT_Buffer_IsDeleted_Args args
        if self._delete_requested or self._donating or atomic_load(&self.delete_state) != DELETE_NONE:
            return True
        args = PJRT_Buffer_IsDeleted_Args_new()
        args.buffer = self.ptr
        PJRT_Buffer_IsDeleted(self.client.api, &args)
        return args.is_deleted

    @property
    def exports(self):
        """The number of live DLPack exports and NumPy views of this buffer."""
        return atomic_load(&self.exports)

    @property
    def pins(self):
        """The number of executes handing this buffer to the plugin right now."""
        return self._pins

    @property
    def donating(self):
        """Whether an execute handing this buffer to the plugin right now donates it."""
        return self._donating

    @property
    def read_only(self):
        """Whether the buffer views memory its DLPack producer marked read-only."""
        return self._read_only

    def delete(self):
        """Free the device memory; the handle stays, reporting is_deleted() from now on.
        While an execute is handing this buffer to the plugin the free waits for it to
        return (then the plugin holds the buffer for the running program); while DLPack
        exports or NumPy views of the buffer are alive, the memory is freed only when the
        last of them is released (never under a live view)."""
        self._delete_requested = True
        self._ready = False
        if self._pins == 0:
            self._delete_now()

    cdef int _delete_now(self) except -1:
        cdef PJRT_Buffer_Delete_Args args
        if atomic_load(&self.exports) > 0:
            atomic_cas(&self.delete_state, DELETE_NONE, DELETE_DEFERRED)
            # the last export may have gone meanwhile: then delete here (once)
            if atomic_load(&self.exports) > 0 or not atomic_cas(
                    &self.delete_state, DELETE_DEFERRED, DELETE_DONE):
                return 0
        else:
            atomic_cas(&self.delete_state, DELETE_NONE, DELETE_DONE)
        args = PJRT_Buffer_Delete_Args_new()
        args.buffer = self.ptr
        PJRT_Buffer_Delete(self.client.api, &args)
        return 0

    def ready_event(self):
        """An EventHandle that fires when the buffer's data is ready (or failed)."""
        cdef PJRT_Buffer_ReadyEvent_Args args = PJRT_Buffer_ReadyEvent_Args_new()
        args.buffer = self.ptr
        PJRT_Buffer_ReadyEvent(self.client.api, &args)
        return EventHandle.wrap(self.client, self.client.api, args.event)

    cdef object _wait_for_data(self):
        """``ready_error`` where the data is not known ready: wait through the buffer's
        ready event."""
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Buffer_ReadyEvent_Args ready
        cdef PJRT_Event_IsReady_Args is_ready
        cdef PJRT_Event_Error_Args error
        cdef PJRT_Event_Destroy_Args destroy
        cdef PJRT_Error* failure = NULL
        if self._ready:
            return None
        ready = PJRT_Buffer_ReadyEvent_Args_new()
        ready.buffer = self.ptr
        PJRT_Buffer_ReadyEvent_raw(api, &ready, &failure)
        if failure != NULL:
            return error_to_exception(api, failure)
        if has_PJRT_Event_IsReady(api) and has_PJRT_Event_Error(api):  # else: the slow path
            is_ready = PJRT_Event_IsReady_Args_new()
            is_ready.event = ready.event
            PJRT_Event_IsReady_raw(api, &is_ready, &failure)
            if failure == NULL and is_ready.is_ready:
                error = PJRT_Event_Error_Args_new()
                error.event = ready.event
                PJRT_Event_Error_raw(api, &error, &failure)
                destroy = PJRT_Event_Destroy_Args_new()
                destroy.event = ready.event
                PJRT_Event_Destroy_quiet(api, &destroy)
                if failure != NULL:
                    return error_to_exception(api, failure)
                self._ready = True
                return None
        event = EventHandle.wrap(self.client, api, ready.event)  # owns it from here
        try:
            check(api, failure)
            event._await()
        except _errors.IfrtError as e:
            return e
        self._ready = True
        return None

    @property
    def unsafe_pointer(self):
        """The device address of the data (an int); for debugging and aliasing checks."""
        cdef PJRT_Buffer_UnsafePointer_Args args = PJRT_Buffer_UnsafePointer_Args_new()
        args.buffer = self.ptr
        PJRT_Buffer_UnsafePointer(self.client.api, &args)
        return <uintptr_t>args.buffer_pointer

    @property
    def memory_layout(self):
        """The device layout as ``(minor_to_major, tiles)``, from PJRT_Buffer_GetMemoryLayout.

        UnimplementedError where the plugin lacks the call or reports a strided layout.
        """
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Buffer_GetMemoryLayout_Args args
        cdef size_t i, j, k = 0
        cdef PJRT_Buffer_MemoryLayout_Tiled* tiled
        args = PJRT_Buffer_GetMemoryLayout_Args_new()
        args.buffer = self.ptr
        PJRT_Buffer_GetMemoryLayout(api, &args)
        if args.layout.type != PJRT_Buffer_MemoryLayout_Type_Tiled:
            raise _errors.UnimplementedError(
                "the plugin reports a strided device layout; ifrtpy reads tiled layouts only")
        tiled = &args.layout.tiled
        minor_to_major = tuple(tiled.minor_to_major[i] for i in range(tiled.minor_to_major_size))
        tiles = []
        for i in range(tiled.num_tiles):
            tiles.append(tuple(tiled.tile_dims[k + j] for j in range(tiled.tile_dim_sizes[i])))
            k += tiled.tile_dim_sizes[i]
        return minor_to_major, tuple(tiles)

    def layout_text(self):
        """The plugin's serialized device layout of the buffer (XLA's layout text, e.g.
        ``b"{0:T(1024)(128)(8,1)E(4)}"``: everything the plugin holds, the packed element
        size included), from the layouts extension. UnimplementedError where the plugin has
        no layouts extension."""
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args args = (
            PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args_new())
        need_layouts(api)
        args.buffer = self.ptr
        PJRT_Layouts_PJRT_Buffer_MemoryLayout(api, &args)
        return layout_text(api, args.layout)

    def to_host_buffer(self, out=None):
        """Start copying the buffer into ``out`` (a new array if None).

        ``out`` must be C-contiguous and writeable with the buffer's dtype and dims.
        Returns ``(out, event)``; ``out`` holds the data once the event fires.
        """
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Buffer_ToHostBuffer_Args args
        dtype = self.dtype
        dims = self.dims
        if out is None:
            out = np.empty(dims, dtype)
        elif not isinstance(out, np.ndarray):
            raise _errors.InvalidArgumentError(f"destination must be a NumPy array, got {type(out).__name__}")
        elif out.dtype != dtype or out.shape != dims:
            raise _errors.InvalidArgumentError(
                f"destination is {out.dtype}{list(out.shape)}, the buffer is {dtype}{list(dims)}"
            )
        elif not (out.flags.c_contiguous and out.flags.writeable):
            raise _errors.InvalidArgumentError("destination must be a writeable C-contiguous array")
        args = PJRT_Buffer_ToHostBuffer_Args_new()
        args.src = self.ptr
        args.dst = cnp.PyArray_DATA(<cnp.ndarray>out)
        args.dst_size = out.nbytes
        # Without a host layout the plugin copies in the device layout's order: a buffer
        # placed in another order is read back into row-major explicitly.
        cdef TiledLayout row_major = None
        if len(dims) > 1:
            layout = self.memory_order()
            descending = tuple(range(len(dims) - 1, -1, -1))
            if layout is None or layout[0] != descending:
                row_major = TiledLayout(descending, (), len(dims))
                args.host_layout = &row_major.c
        PJRT_Buffer_ToHostBuffer(api, &args)
        event = EventHandle.wrap(self.client, api, args.event)
        keep_alive_until(api, args.event, out)
        return out, event

    def to_numpy(self):
        """The buffer's data as a new NumPy array (blocking, GIL released while waiting)."""
        out, event = self.to_host_buffer()
        event.await_()
        return out

    def copy_to_device(self, DeviceHandle device not None):
        """A new buffer with the same data on ``device``."""
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Buffer_CopyToDevice_Args args
        if device.client is not self.client:
            raise _errors.InvalidArgumentError("the target device belongs to another client")
        args = PJRT_Buffer_CopyToDevice_Args_new()
        args.buffer = self.ptr
        args.dst_device = device.ptr
        PJRT_Buffer_CopyToDevice(api, &args)
        return BufferHandle.wrap(self.client, args.dst_buffer)

    def copy_to_memory(self, MemoryHandle memory not None):
        """A new buffer with the same data in ``memory``."""
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Buffer_CopyToMemory_Args args
        if memory.client is not self.client:
            raise _errors.InvalidArgumentError("the target memory belongs to another client")
        args = PJRT_Buffer_CopyToMemory_Args_new()
        args.buffer = self.ptr
        args.dst_memory = memory.ptr
        PJRT_Buffer_CopyToMemory(api, &args)
        return BufferHandle.wrap(self.client, args.dst_buffer)

    def __repr__(self):
        if self.is_deleted():
            return "<BufferHandle deleted>"
        return f"<BufferHandle {self.dtype}{list(self.dims)} on device {self.device.id}>"
