# cython: language_level=3, binding=True, embedsignature=True
"""The key-value callbacks of ``PJRT_Client_Create``, over a Python store.

A multi-process plugin (CUDA) exchanges topology between processes through three
callbacks the caller provides: get (blocking, with a timeout), try-get and put. Here they
call a Python ``store`` object with ``get(key, timeout_ms) -> bytes``,
``try_get(key) -> bytes`` and ``put(key, value)``; an exception becomes the PJRT_Error the
plugin's ``callback_error`` makes, with the exception's ``ifrtpy.errors`` code (UNKNOWN for
other exceptions). ``KeyValueCallbacks`` is the callbacks' ``user_arg``: the client handle
keeps it alive as long as the client. The callbacks take the GIL (the plugin calls them
from its own threads, and ``PJRT_Client_Create`` runs without the GIL), except once the
interpreter is exiting: then they return UNAVAILABLE without calling the store.

``call_get``, ``call_try_get`` and ``call_put`` call the callbacks through their C function
pointers exactly as a plugin does (with a callback_error of their own), for tests.
"""

from cpython.ref cimport PyObject
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset, strlen

from ifrtpy._pjrt._api cimport (
    PJRT_Client_Create_Args_new, PJRT_KeyValueGetCallback_Args_new,
    PJRT_KeyValuePutCallback_Args_new, PJRT_KeyValueTryGetCallback_Args_new)
from ifrtpy._pjrt._base cimport callback_enter, callback_leave
from ifrtpy import errors as _errors


cdef void _free_value(char* value) noexcept nogil:
    free(value)


cdef PJRT_Error* _error(PJRT_CallbackError* make_error, object exc) noexcept:
    """The plugin's PJRT_Error for a Python exception: its ``code`` where that is a PJRT
    error code (1..16), else UNKNOWN; never a success, whatever the exception does."""
    cdef int code = 2  # UNKNOWN
    try:
        value = getattr(exc, "code", None)
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 16:
            code = int(value)  # an ifrtpy error's code is an IntEnum member
        message = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
    except BaseException:
        message = b"the key-value store raised an exception that cannot be shown"
    cdef const char* text = message
    return make_error[0](<PJRT_Error_Code>code, text, len(message))


cdef PJRT_Error* _return_value(object value, char** out, size_t* out_size,
                               PJRT_CallbackError* make_error) noexcept:
    try:
        data = bytes(value)
    except BaseException as e:
        return _error(make_error, e)
    cdef size_t n = len(data)
    cdef char* copy = <char*>malloc(n if n else 1)
    if copy == NULL:
        return _error(make_error, MemoryError("no memory for a key-value store value"))
    if n:
        memcpy(copy, <const char*>data, n)
    out[0] = copy
    out_size[0] = n
    return NULL


cdef PJRT_Error* _exiting(PJRT_CallbackError* make_error) noexcept nogil:
    """The error a callback returns once the interpreter is exiting (it must not take the
    GIL then: see ``_base.callback_enter``)."""
    cdef const char* text = b"the key-value store is gone: the Python interpreter is exiting"
    return make_error[0](<PJRT_Error_Code>14, text, strlen(text))  # 14: UNAVAILABLE


ctypedef PJRT_Error* (*_Body)(void* args) noexcept


cdef PJRT_Error* _with_gil(_Body body, void* args, PJRT_CallbackError* make_error) noexcept nogil:
    """``body(args)`` with the GIL, unless the interpreter is exiting."""
    if not callback_enter():
        return _exiting(make_error)
    cdef PJRT_Error* error
    with gil:
        error = body(args)
    callback_leave()
    return error


cdef PJRT_Error* _get(PJRT_KeyValueGetCallback_Args* args) noexcept nogil:
    # the outputs are defined on every path: the plugin may read them after an error
    args.value = NULL
    args.value_size = 0
    args.value_deleter_callback = _free_value
    return _with_gil(<_Body>_get_with_gil, args, args.callback_error)


cdef PJRT_Error* _get_with_gil(PJRT_KeyValueGetCallback_Args* args) noexcept:
    store = (<KeyValueCallbacks><PyObject*>args.user_arg).store
    try:
        value = store.get(args.key[:args.key_size].decode(), args.timeout_in_ms)
    except BaseException as e:
        return _error(args.callback_error, e)
    return _return_value(value, &args.value, &args.value_size, args.callback_error)


cdef PJRT_Error* _try_get(PJRT_KeyValueTryGetCallback_Args* args) noexcept nogil:
    # the outputs are defined on every path: the plugin may read them after an error
    args.value = NULL
    args.value_size = 0
    args.value_deleter_callback = _free_value
    return _with_gil(<_Body>_try_get_with_gil, args, args.callback_error)


cdef PJRT_Error* _try_get_with_gil(PJRT_KeyValueTryGetCallback_Args* args) noexcept:
    store = (<KeyValueCallbacks><PyObject*>args.user_arg).store
    try:
        value = store.try_get(args.key[:args.key_size].decode())
    except BaseException as e:
        return _error(args.callback_error, e)
    return _return_value(value, &args.value, &args.value_size, args.callback_error)


cdef PJRT_Error* _put(PJRT_KeyValuePutCallback_Args* args) noexcept nogil:
    return _with_gil(<_Body>_put_with_gil, args, args.callback_error)


cdef PJRT_Error* _put_with_gil(PJRT_KeyValuePutCallback_Args* args) noexcept:
    store = (<KeyValueCallbacks><PyObject*>args.user_arg).store
    try:
        store.put(args.key[:args.key_size].decode(), args.value[:args.value_size])
    except BaseException as e:
        return _error(args.callback_error, e)
    return NULL


cdef class KeyValueCallbacks:
    """The three callbacks over ``store`` (see the module docstring)."""

    def __init__(self, store):
        for method in ("get", "try_get", "put"):
            if not callable(getattr(store, method, None)):
                raise _errors.InvalidArgumentError(
                    f"a key-value store needs get(key, timeout_ms), try_get(key) and "
                    f"put(key, value); {store!r} has no {method}")
        self.store = store

    cdef void fill(self, PJRT_Client_Create_Args* args) noexcept:
        args.kv_get_callback = _get
        args.kv_get_user_arg = <void*>self
        args.kv_try_get_callback = _try_get
        args.kv_try_get_user_arg = <void*>self
        args.kv_put_callback = _put
        args.kv_put_user_arg = <void*>self


# -- calling the callbacks as a plugin does (tests) ------------------------------------------

ctypedef struct _CallError:  # what our callback_error makes: never reaches a plugin
    int code
    size_t size
    char message[1024]


cdef PJRT_Error* _make_call_error(PJRT_Error_Code code, const char* message,
                                  size_t size) noexcept nogil:
    cdef _CallError* e = <_CallError*>malloc(sizeof(_CallError))
    if e == NULL:
        return NULL
    e.code = <int>code
    e.size = size if size < sizeof(e.message) else sizeof(e.message)
    memcpy(e.message, message, e.size)
    return <PJRT_Error*>e


cdef PJRT_CallbackError _call_error = _make_call_error


cdef object _raise_call_error(PJRT_Error* error):
    cdef _CallError* e = <_CallError*>error
    code, message = e.code, e.message[:e.size].decode("utf-8", "replace")
    free(e)
    raise _errors.error_from_code(code, message)


ctypedef void (*_Deleter)(char* value) noexcept nogil


cdef bytes _take_value(PJRT_Error* error, char* value, size_t size, _Deleter deleter):
    """The value a get returned (freed with its deleter), or the error it made, raised."""
    if error != NULL:
        _raise_call_error(error)
    out = value[:size]
    deleter(value)
    return out


cdef PJRT_Client_Create_Args _filled(KeyValueCallbacks callbacks):
    cdef PJRT_Client_Create_Args create = PJRT_Client_Create_Args_new()
    callbacks.fill(&create)
    return create


def call_get(KeyValueCallbacks callbacks, str key, int timeout_ms):
    """Call the get callback through its function pointer; the value, or the error raised."""
    cdef PJRT_Client_Create_Args create = _filled(callbacks)
    cdef PJRT_KeyValueGetCallback_Args args
    cdef PJRT_Error* error
    cdef bytes k = key.encode()
    args = PJRT_KeyValueGetCallback_Args_new()
    args.key, args.key_size, args.timeout_in_ms = k, len(k), timeout_ms
    args.callback_error = &_call_error
    args.user_arg = create.kv_get_user_arg
    with nogil:
        error = create.kv_get_callback(&args)
    return _take_value(error, args.value, args.value_size, <_Deleter>args.value_deleter_callback)


def call_try_get(KeyValueCallbacks callbacks, str key):
    """Call the try-get callback through its function pointer."""
    cdef PJRT_Client_Create_Args create = _filled(callbacks)
    cdef PJRT_KeyValueTryGetCallback_Args args
    cdef PJRT_Error* error
    cdef bytes k = key.encode()
    args = PJRT_KeyValueTryGetCallback_Args_new()
    args.key, args.key_size = k, len(k)
    args.callback_error = &_call_error
    args.user_arg = create.kv_try_get_user_arg
    with nogil:
        error = create.kv_try_get_callback(&args)
    return _take_value(error, args.value, args.value_size, <_Deleter>args.value_deleter_callback)


def call_put(KeyValueCallbacks callbacks, str key, bytes value):
    """Call the put callback through its function pointer."""
    cdef PJRT_Client_Create_Args create = _filled(callbacks)
    cdef PJRT_KeyValuePutCallback_Args args
    cdef PJRT_Error* error
    cdef bytes k = key.encode()
    args = PJRT_KeyValuePutCallback_Args_new()
    args.key, args.key_size = k, len(k)
    args.value, args.value_size = value, len(value)
    args.callback_error = &_call_error
    args.user_arg = create.kv_put_user_arg
    with nogil:
        error = create.kv_put_callback(&args)
    if error != NULL:
        _raise_call_error(error)
