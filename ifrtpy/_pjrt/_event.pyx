# cython: language_level=3, binding=True, embedsignature=True
"""PJRT events: completion of a transfer or an execution.

Differences from the C API:

* ``EventHandle.on_ready`` runs a Python callable, from whichever thread completes the
  event, with ``None`` or the ifrtpy exception of the event's error; once the
  interpreter is finalizing, callbacks are dropped instead of waiting for the GIL.
* ``error()`` of a pending event raises (the plugin aborts on it).
* ``keep_alive_until`` holds a Python object (memory the plugin uses) until an event fires.
"""

from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from libc.stdlib cimport free, malloc
from libc.string cimport memset
cimport cython

from ifrtpy._pjrt._api cimport *
from ifrtpy._pjrt._base cimport callback_enter, callback_leave, drop_error, error_to_exception
from ifrtpy import errors as _errors


cdef extern from *:
    """
    typedef struct { const void* api; PyObject* payload; } ifrtpy_callback;
    """
    ctypedef struct ifrtpy_callback:
        const void* api
        PyObject* payload


cdef void _on_ready(PJRT_Error* error, void* user_arg) noexcept nogil:
    # user_arg: an ifrtpy_callback owning one reference to a tuple
    # (callable or None, kept object). Once the interpreter is exiting, taking the GIL
    # could block this plugin thread for good, or end it (Python ends threads that take
    # the GIL while it finalizes), and the plugin's own shutdown with it: then the error
    # is dropped and the payload left to the process's end (see _base.callback_enter).
    cdef ifrtpy_callback* callback = <ifrtpy_callback*>user_arg
    cdef const PJRT_Api* api = <const PJRT_Api*>callback.api
    if not callback_enter():
        drop_error(api, error)
        free(callback)
        return
    with gil:
        _run_callback(api, error, callback.payload)
    callback_leave()
    free(callback)


cdef void _run_callback(const PJRT_Api* api, PJRT_Error* error, PyObject* payload) noexcept:
    # An exception from the callable goes to sys.unraisablehook.
    cdef tuple kept = <tuple>payload
    try:
        exc = error_to_exception(api, error) if error != NULL else None
        if kept[0] is not None:
            kept[0](exc)
    finally:
        Py_DECREF(kept)




cdef int _register(const PJRT_Api* api, PJRT_Event* event, tuple payload) except -1:
    cdef PJRT_Event_OnReady_Args args
    cdef ifrtpy_callback* callback = <ifrtpy_callback*>malloc(sizeof(ifrtpy_callback))
    if callback == NULL:
        raise MemoryError()
    callback.api = api
    callback.payload = <PyObject*>payload
    args = PJRT_Event_OnReady_Args_new()
    args.event = event
    args.callback = _on_ready
    args.user_arg = callback
    Py_INCREF(payload)
    try:
        PJRT_Event_OnReady(api, &args)
    except BaseException:
        Py_DECREF(payload)
        free(callback)
        raise
    return 0


cdef int keep_alive_until(const PJRT_Api* api, PJRT_Event* event, object obj) except -1:
    """Hold a reference to ``obj`` (memory the plugin reads or writes) until ``event``
    fires. Never fails: where the callback cannot be registered (no memory, a plugin
    error), ``obj`` is kept for the life of the process, a leak rather than a use after
    free."""
    try:
        _register(api, event, (None, obj))
    except Exception:
        Py_INCREF(obj)
    return 0


@cython.no_gc  # holds only its client and a weak reference: never part of a cycle
cdef class EventHandle:
    """Owns a ``PJRT_Event*``."""

    def __init__(self, *args, **kwargs):
        raise TypeError("events come from buffers and executions")

    @staticmethod
    cdef EventHandle wrap(ClientHandle owner, const PJRT_Api* api, PJRT_Event* ptr):
        cdef EventHandle self = EventHandle.__new__(EventHandle)
        self.ptr = ptr
        self.api = api
        self.owner = owner
        return self

    def __dealloc__(self):
        cdef PJRT_Event_Destroy_Args args
        if self.ptr != NULL:
            args = PJRT_Event_Destroy_Args_new()
            args.event = self.ptr
            self.ptr = NULL
            PJRT_Event_Destroy_quiet(self.api, &args)

    def is_ready(self):
        return self._is_ready()

    cdef bint _is_ready(self) except -1:
        cdef PJRT_Event_IsReady_Args args = PJRT_Event_IsReady_Args_new()
        args.event = self.ptr
        PJRT_Event_IsReady(self.api, &args)
        return args.is_ready

    def await_(self):
        """Block (GIL released) until the event fires; raise its error, if any."""
        self._await()

    cdef int _await(self) except -1:
        cdef PJRT_Event_Await_Args args
        cdef PJRT_Event_Error_Args ready
        if self._guard is not None and self._guard() is not None and not self._is_ready():
            raise _errors.FailedPreconditionError(
                "this done-with-host-buffer event of a zero-copy buffer fires only when the "
                "buffer is destroyed; awaiting it while the buffer exists would never return"
            )
        if self._is_ready():  # nothing to wait for: its error, the GIL kept
            ready = PJRT_Event_Error_Args_new()
            ready.event = self.ptr
            PJRT_Event_Error(self.api, &ready)
            return 0
        args = PJRT_Event_Await_Args_new()
        args.event = self.ptr
        PJRT_Event_Await(self.api, &args)
        # A signal that came during the wait (Ctrl-C) is raised here, in the main thread:
        # the caller may return to Python with no further check, and a signal still
        # pending when the interpreter exits is dropped.
        PyErr_CheckSignals()
        return 0

    def error(self):
        """The event's error as an ifrtpy exception, or None. FailedPreconditionError
        while the event is pending (the plugin aborts on that)."""
        cdef PJRT_Event_Error_Args args
        if not self.is_ready():
            raise _errors.FailedPreconditionError("error() of an event that has not fired yet")
        args = PJRT_Event_Error_Args_new()
        args.event = self.ptr
        cdef PJRT_Error* error = NULL
        PJRT_Event_Error_raw(self.api, &args, &error)
        return error_to_exception(self.api, error) if error != NULL else None

    def on_ready(self, callback):
        """Call ``callback(exception_or_None)`` once the event fires, from any thread
        (immediately, on this thread, if it already has)."""
        _register(self.api, self.ptr, (callback, None))
