from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt._client cimport ClientHandle
from ifrtpy._pjrt._event cimport EventHandle


cdef extern from *:
    """
    #define ifrtpy_atomic_load(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
    #define ifrtpy_atomic_add(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
    static inline int ifrtpy_atomic_cas(int* p, int expected, int desired) {
        return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    """
    int atomic_load "ifrtpy_atomic_load"(int* p) nogil
    int atomic_add "ifrtpy_atomic_add"(int* p, int v) nogil
    bint atomic_cas "ifrtpy_atomic_cas"(int* p, int expected, int desired) nogil


# BufferHandle.delete_state
cdef enum:
    DELETE_NONE = 0       # not deleted
    DELETE_DEFERRED = 1   # delete() while exported: done when the last export is released
    DELETE_DONE = 2       # PJRT_Buffer_Delete was called


cdef class BufferHandle:
    cdef PJRT_Buffer* ptr
    cdef readonly ClientHandle client
    cdef int exports       # live DLPack exports and NumPy views (atomic)
    cdef int delete_state  # DELETE_* (atomic)
    cdef object view_form  # (NumPy dtype, dims, address) once the data was ready; see _dlpack
    cdef object order      # (minor_to_major, tiles) of the device layout once asked; False: unreadable
    cdef object __weakref__
    # Execute pins (read and written with the GIL held; see pin_for_execute):
    cdef Py_ssize_t _pins  # executes between pinning this buffer and the plugin's return
    cdef bint _delete_requested  # delete() was called; done once _pins is 0
    cdef bint _donating  # a pinning execute donates it
    cdef bint _executed  # given to an execute: destroying it may wait for that execute
    cdef bint _read_only  # a view of memory its DLPack producer marked read-only
    # The data is known defined without an error: by the execute that made it, which had
    # completed when the plugin returned, or by a wait; never true once deleted or donated.
    cdef bint _ready
    cdef bint _is_deleted(self) except -1
    cdef int _delete_now(self) except -1
    cdef object _wait_for_data(self)
    cdef object memory_order(self)
    cdef tuple element_strides(self)

    @staticmethod
    cdef BufferHandle wrap(ClientHandle client, PJRT_Buffer* ptr)


# A buffer an execute made that no BufferHandle owns yet: whoever holds the entry owns the
# buffer, until ``take_buffer`` (or ``destroy_new_buffers``) sets ``ptr`` to NULL.
cdef struct NewBuffer:
    PJRT_Buffer* ptr
    bint ready  # its data is known defined without an error (``BufferHandle._ready``)


cdef void destroy_buffer(const PJRT_Api* api, PJRT_Buffer* ptr) noexcept nogil
cdef BufferHandle take_buffer(ClientHandle client, NewBuffer* made)
cdef int delete_now(const PJRT_Api* api, PJRT_Buffer* buffer) noexcept nogil
cdef int refuse_deleted(Py_ssize_t argument) except -1
cdef void delete_after_execute(BufferHandle buffer) noexcept


# The calls every execute makes on each buffer, inline where they are made.

cdef inline object ready_error(BufferHandle buffer):
    """Wait until ``buffer``'s data is ready (the GIL released only while it is pending);
    return its error as an ifrtpy exception, or None. Makes no Python object when ready,
    and asks the plugin nothing once the data is known ready (``_ready``)."""
    if buffer._ready:
        return None
    return buffer._wait_for_data()


cdef inline int pin_for_execute(BufferHandle buffer, bint donate,
                                Py_ssize_t argument) except -1:
    """Pin ``buffer`` (argument ``argument``) for an execute about to call the plugin, which
    ``donate``\ s it or not: ``delete()`` of a pinned buffer waits for the last execute
    pinning it to return (``unpin_after_execute``), and ``pins``/``donating`` tell other
    executes that one holds it (which executes may share a buffer is the caller's rule:
    the PjRt backend's, ``ifrtpy.backends.pjrt._execute_launch``). A buffer whose delete was
    asked for is refused (InvalidArgumentError): there is nothing to pin.

    Multi-device executes hand the plugin one device after another: a buffer deleted while
    the plugin is taking them would fail some devices after others started, leaving their
    outputs waiting forever; hence the pin, from here (with the GIL held) to the return."""
    if buffer._delete_requested:
        return refuse_deleted(argument)
    buffer._pins += 1
    if donate:
        buffer._donating = True
        buffer._ready = False
    buffer._executed = True
    return 0


cdef inline void destroy_new_buffers(const PJRT_Api* api, NewBuffer* made,
                                     Py_ssize_t count) noexcept:
    """Destroy the buffers of ``made[0:count]`` that were not taken (``ptr`` not NULL)."""
    cdef Py_ssize_t i
    for i in range(count):
        if made[i].ptr != NULL:
            destroy_buffer(api, made[i].ptr)
            made[i].ptr = NULL


cdef inline NewBuffer release_buffer(BufferHandle buffer) noexcept:
    """The buffer of ``buffer``, a handle no one else holds (an execute's output, just
    made), handed to the caller: ``buffer`` owns nothing from then on."""
    cdef NewBuffer made
    made.ptr, made.ready = buffer.ptr, buffer._ready
    buffer.ptr = NULL
    return made


cdef inline void unpin_after_execute(BufferHandle buffer, bint donate) noexcept:
    """Undo ``pin_for_execute`` once the plugin returned; do a delete that waited for it."""
    buffer._pins -= 1
    if donate:
        buffer._donating = False
    if buffer._pins == 0 and buffer._delete_requested:
        delete_after_execute(buffer)

