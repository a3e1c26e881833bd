# cython: language_level=3, binding=True, embedsignature=True
"""ifrtpy's XLA FFI handler of host callbacks: the custom calls jax lowers
``pure_callback``, ``io_callback`` and ``jax.debug.print`` to on CPU
(``xla_ffi_python_cpu_callback``, attribute ``index``: a u64), served by Python
callables of the running executable (IFRT's LoadedHostCallbacks).

The mechanism only; what a callback receives and must return (jax's contract: operand
copies, result checks, error texts) is the PjRt backend's
(``ifrtpy.backends.pjrt.host_callbacks``, which makes the callables).

How a call finds its callable: :func:`install` registers the handler and a user data
type with the plugin; an execute passes an :class:`~ifrtpy._pjrt._ffi.ExecuteContext`
whose user data of that type is the executable's tuple of callables; the handler calls
``table[index](operands, results)`` with the GIL held, from the plugin's thread. Never
execute such a program without that context: the plugin's lookup of user data in a
missing context crashes the process.

``operands`` and ``results`` are lists with one ``(dtype, dims, array)`` per buffer of
the call: its :class:`ifrtpy.dtypes.DType`, its dims, and a NumPy array over its memory
(read-only for an operand, writeable for a result) that is valid only until the callable
returns, or None where NumPy has no view of it (a token, a sub-byte element type, whose
packing is the plugin's). A callable that returns fills the results; one that raises fails
the execution with ``str()`` of its exception as the error (the outputs' futures fail).
An exception of a KeyboardInterrupt class (Ctrl-C while a callback runs inline) is also
recorded for its thread: the execute that ran it raises KeyboardInterrupt
(:func:`take_interrupt`). Once the interpreter is exiting, calls are refused with an error
instead of taking the GIL. :func:`in_host_callback` tells whether the calling thread runs
a callback.
"""

cimport numpy as cnp
from cpython.ref cimport PyObject, Py_INCREF
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.string cimport memcmp

import numpy as np

from ifrtpy._pjrt.xla_ffi cimport *
from ifrtpy._pjrt._api cimport XLA_FFI_ExecutionContext_Get_Args_new
from ifrtpy._pjrt._base cimport PluginHandle, callback_enter, callback_leave
from ifrtpy._pjrt._ffi cimport (
    answer_metadata, capsule, framework_api, is_metadata_call, make_error)
from ifrtpy._pjrt import _ffi
from ifrtpy import errors as _errors
from ifrtpy.dtypes import DType

cdef extern from *:
    """
    static int ifrtpy_load_acquire(const int* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static void ifrtpy_store_release(int* p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    /* Per thread: how many callbacks it is running (nested), and whether one of them
       ended in KeyboardInterrupt since the thread's last launch. */
    static __thread int ifrtpy_callback_depth = 0;
    static __thread int ifrtpy_callback_interrupted = 0;
    """
    int ifrtpy_load_acquire(const int* p) nogil
    void ifrtpy_store_release(int* p, int v) nogil
    int ifrtpy_callback_depth
    int ifrtpy_callback_interrupted

cdef extern from *:
    """
    static PyObject* ifrtpy_callback_view(PyObject* descr, int nd, npy_intp* dims, void* data,
                                          int flags) {
        /* steals descr, as PyArray_NewFromDescr does */
        return PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr*)descr, nd, dims, NULL,
                                    data, flags, NULL);
    }
    """
    object view_over "ifrtpy_callback_view"(PyObject* descr, int nd, cnp.npy_intp* dims,
                                            void* data, int flags)

cnp.import_array()

DEF MAX_RANK = 64

#: The user data type of an executable's callables, as registered with each plugin.
TYPE_NAME = "ifrtpy.HostCallbacks"

DEF MAX_PLUGINS = 64

# The type id of TYPE_NAME for each plugin's XLA FFI table: written under the GIL by
# install() before any program of that plugin can call the handler, read by plugin threads.
cdef const XLA_FFI_Api* _apis[MAX_PLUGINS]
cdef int64_t _type_ids[MAX_PLUGINS]
cdef int _num_bound = 0

#: Per plugin path: the type id, once installed.
cdef dict _installed = {}


cdef int64_t _type_id(const XLA_FFI_Api* api) noexcept nogil:
    cdef int i, n = ifrtpy_load_acquire(&_num_bound)
    for i in range(n):
        if _apis[i] == api:
            return _type_ids[i]
    return 0


cdef bint _index(XLA_FFI_CallFrame* frame, uint64_t* index) noexcept nogil:
    cdef int64_t i
    cdef XLA_FFI_ByteSpan* name
    cdef XLA_FFI_Scalar* scalar
    for i in range(frame.attrs.size):
        name = frame.attrs.names[i]
        if name.len != 5 or memcmp(name.ptr, b"index", 5) != 0:
            continue
        if frame.attrs.types[i] != XLA_FFI_AttrType_SCALAR:
            return False
        scalar = <XLA_FFI_Scalar*>frame.attrs.attrs[i]
        if scalar.dtype != XLA_FFI_DataType_U64 and scalar.dtype != XLA_FFI_DataType_S64:
            return False
        index[0] = (<uint64_t*>scalar.value)[0]
        return True
    return False


cdef XLA_FFI_Error* _handler(XLA_FFI_CallFrame* frame) noexcept nogil:
    global ifrtpy_callback_depth
    cdef const XLA_FFI_Api* api = frame.api
    cdef uint64_t index = 0
    cdef int64_t type_id
    cdef XLA_FFI_TypeId type_arg
    cdef XLA_FFI_ExecutionContext_Get_Args get
    cdef XLA_FFI_Error* error
    if is_metadata_call(frame):
        return answer_metadata(frame)
    if frame.stage != XLA_FFI_ExecutionStage_EXECUTE:
        return NULL
    if not _index(frame, &index):
        return make_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                          b"host callback: the custom call has no integer attribute `index`")
    type_id = _type_id(api)
    if type_id == 0 or frame.ctx == NULL:
        return make_error(api, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                          b"host callback: ifrtpy's callback table is not known to this plugin")
    type_arg.type_id = type_id
    get = XLA_FFI_ExecutionContext_Get_Args_new()
    get.ctx = frame.ctx
    get.type_id = &type_arg
    get.data = NULL
    error = api.XLA_FFI_ExecutionContext_Get(&get)
    if error != NULL:
        return error
    if get.data == NULL:
        return make_error(api, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                          b"host callback: the execution carries no callables")
    if not callback_enter():
        return make_error(api, XLA_FFI_Error_Code_UNAVAILABLE,
                          b"host callback refused: the Python interpreter is exiting")
    ifrtpy_callback_depth += 1
    error = _dispatch(frame, get.data, index)
    ifrtpy_callback_depth -= 1
    callback_leave()
    return error


cdef bint in_host_callback() noexcept nogil:
    """Whether the calling thread is running a host callback (an execute it makes now is
    nested in an execution that cannot complete before it)."""
    return ifrtpy_callback_depth > 0


cdef void forget_interrupt() noexcept nogil:
    """Clear the calling thread's record of an interrupted callback (before a launch)."""
    global ifrtpy_callback_interrupted
    ifrtpy_callback_interrupted = 0


cdef bint take_interrupt() noexcept nogil:
    """Whether a callback run by the calling thread since ``forget_interrupt`` ended in
    KeyboardInterrupt (Ctrl-C during a callback run inline by an execute); clears it."""
    global ifrtpy_callback_interrupted
    cdef bint interrupted = ifrtpy_callback_interrupted
    ifrtpy_callback_interrupted = 0
    return interrupted


cdef XLA_FFI_Error* _dispatch(XLA_FFI_CallFrame* frame, void* table, uint64_t index) noexcept with gil:
    # Returns an error for every failure, its own included: NULL is success to XLA.
    global ifrtpy_callback_interrupted
    cdef bytes message = b"host callback failed (and so did the report of its exception)"
    try:
        _call(frame, <tuple>table, index)
        return NULL
    except BaseException as e:  # every error becomes the execution's
        if isinstance(e, KeyboardInterrupt):
            ifrtpy_callback_interrupted = 1
        try:
            message = _text(e).encode("utf-8", "replace")
        except BaseException:
            pass
    return make_error(frame.api, XLA_FFI_Error_Code_INTERNAL, message)


cdef str _text(BaseException e):
    """``str(e)``, or its class's name where that fails (a ``__str__`` that raises)."""
    try:
        text = str(e)
    except BaseException:
        return f"{type(e).__name__} (whose message could not be formatted)"
    return text if type(text) is str else type(e).__name__


cdef tuple _buffer(XLA_FFI_Buffer* buffer, bint writeable):
    """``(dtype, dims, array)`` of ``buffer``: array a NumPy view of its memory, valid
    during the call; None where NumPy has no view of it (a token, sub-byte elements)."""
    cdef cnp.npy_intp dims[MAX_RANK]
    cdef int64_t d
    if buffer.rank < 0 or buffer.rank > MAX_RANK:
        raise ValueError(f"a buffer of rank {buffer.rank}; at most {MAX_RANK}")
    kind = DType(buffer.dtype)
    shape = tuple([buffer.dims[d] for d in range(buffer.rank)])
    if kind.kind == DType.Kind.TOKEN or (kind.bit_size is not None and kind.bit_size < 8):
        return kind, shape, None
    cdef cnp.dtype descr = np.dtype(kind.to_numpy())
    for d in range(buffer.rank):
        dims[d] = buffer.dims[d]
    Py_INCREF(descr)  # stolen by the array
    view = view_over(<PyObject*>descr, buffer.rank, dims, buffer.data,
                     cnp.NPY_ARRAY_CARRAY if writeable else cnp.NPY_ARRAY_CARRAY_RO)
    return kind, shape, view


cdef int _call(XLA_FFI_CallFrame* frame, tuple table, uint64_t index) except -1:
    cdef Py_ssize_t i
    if index >= <uint64_t>len(table):
        raise IndexError(f"host callback {index}: the executable carries {len(table)}")
    operands = []
    for i in range(frame.args.size):
        if frame.args.types[i] != XLA_FFI_ArgType_BUFFER:
            raise TypeError(f"host callback {index}: operand {i} is not a buffer")
        operands.append(_buffer(<XLA_FFI_Buffer*>frame.args.args[i], False))
    results = []
    for i in range(frame.rets.size):
        if frame.rets.types[i] != XLA_FFI_RetType_BUFFER:
            raise TypeError(f"host callback {index}: result {i} is not a buffer")
        results.append(_buffer(<XLA_FFI_Buffer*>frame.rets.rets[i], True))
    table[index](operands, results)
    return 0


def install(PluginHandle plugin not None, targets):
    """Register the handler under each custom call target name in ``targets`` and the
    callables' user data type with the plugin (once); returns that type's id, for an
    ExecuteContext."""
    global _num_bound
    type_id = _installed.get(plugin.path)
    if type_id is not None:
        return type_id
    cdef const XLA_FFI_Api* api = framework_api(plugin)
    if api.struct_size < XLA_FFI_Api_USED_SIZE:
        raise _errors.UnimplementedError(
            f"the plugin {plugin.path} has an XLA FFI table of {api.struct_size} bytes, "
            "without the functions host callbacks use")
    type_id = _ffi.register_type(plugin, TYPE_NAME)
    if _num_bound == MAX_PLUGINS:
        raise _errors.ResourceExhaustedError(f"host callbacks are limited to {MAX_PLUGINS} plugins per process")
    _apis[_num_bound] = api
    _type_ids[_num_bound] = type_id
    ifrtpy_store_release(&_num_bound, _num_bound + 1)
    handler = capsule(<void*>_handler)
    for target in targets:
        _ffi.register_handler(plugin, target, handler, _ffi.HOST_PLATFORM)
    _installed[plugin.path] = type_id
    return type_id

