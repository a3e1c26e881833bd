# cython: language_level=3, binding=True, embedsignature=True
"""Zero-copy exchange of PJRT buffers: DLPack capsules both ways, and NumPy views.

Differences from the C API (and what this module adds to it):

* ``export`` pins the buffer with ``PJRT_Buffer_IncreaseExternalReferenceCount`` and hands
  out ``PJRT_Buffer_UnsafePointer`` in a DLPack capsule (legacy ``dltensor`` or versioned
  ``dltensor_versioned``). The capsule's deleter may run on any thread, with or without
  the GIL: it drops the PJRT reference with no GIL at all, then the reference to the
  BufferHandle with the GIL, except once the interpreter is finalizing (then that Python
  reference is left to the process's end rather than blocking on the GIL).
* A buffer with live exports is never freed: ``BufferHandle.delete`` is deferred until the
  last export is released (see ``BufferHandle.exports``).
* ``host_view`` is a read-only NumPy array over a buffer in host-readable memory, holding
  the same kind of pin as a capsule.
* ``import_capsule`` consumes a producer's capsule: a ``PJRT_Client_CreateViewOfDeviceBuffer``
  view where the memory is dense, row-major and aligned (the producer's deleter runs from
  the plugin's on-delete callback), or else a NumPy view of host memory for the caller to
  copy from.
* Sub-byte element types are not exchanged (their packing is the plugin's own).
"""

import numpy as np
cimport numpy as cnp

from cpython.pycapsule cimport (PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer,
                                PyCapsule_SetName)
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t, intptr_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt.dlpack cimport *
from ifrtpy._pjrt._api cimport *
from ifrtpy._pjrt._base cimport callback_enter, callback_leave, raise_unimplemented
from ifrtpy._pjrt._client cimport ClientHandle, DeviceHandle, MemoryHandle
from ifrtpy._pjrt._buffer cimport (BufferHandle, atomic_add, atomic_cas, delete_now,
                                   ready_error, DELETE_DEFERRED, DELETE_DONE)
from ifrtpy import errors as _errors
from ifrtpy.dtypes import DLPACK_OF_PJRT_BUFFER_TYPE, NUMPY_OF_PJRT_BUFFER_TYPE

cnp.import_array()

cdef extern from *:
    """
    static PyObject* ifrtpy_array_over(PyObject* descr, int nd, npy_intp* dims,
                                       npy_intp* strides, void* data, int flags) {
        /* steals descr, as PyArray_NewFromDescr does */
        return PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr*)descr, nd, dims, strides,
                                    data, flags, NULL);
    }
    """
    object array_over "ifrtpy_array_over"(PyObject* descr, int nd, cnp.npy_intp* dims,
                                          cnp.npy_intp* strides, void* data, int flags)

DEF MAX_RANK = 64

cdef extern from *:
    """
    #if PY_VERSION_HEX >= 0x030D0000
    #define ifrtpy_dlpack_finalizing() Py_IsFinalizing()
    #else
    #define ifrtpy_dlpack_finalizing() _Py_IsFinalizing()
    #endif
    """
    int is_finalizing "ifrtpy_dlpack_finalizing"() nogil

cdef dict _dlpack_of_pjrt = DLPACK_OF_PJRT_BUFFER_TYPE
cdef dict _pjrt_of_dlpack = {v: k for k, v in DLPACK_OF_PJRT_BUFFER_TYPE.items()}
cdef dict _numpy_of_pjrt = NUMPY_OF_PJRT_BUFFER_TYPE

cdef const char* LEGACY = b"dltensor"
cdef const char* VERSIONED = b"dltensor_versioned"
cdef const char* USED_LEGACY = b"used_dltensor"
cdef const char* USED_VERSIONED = b"used_dltensor_versioned"


# -- export --------------------------------------------------------------------------------

ctypedef struct Export:
    # One allocation per capsule: both tensor forms (one is used), the pin, and the
    # shape and strides the tensor points to (after the struct).
    DLManagedTensorVersioned versioned
    DLManagedTensor legacy
    const PJRT_Api* api
    PJRT_Buffer* buffer
    PyObject* owner          # one reference to the BufferHandle
    int* exports             # &owner.exports
    int* delete_state        # &owner.delete_state


cdef void _release(Export* e) noexcept nogil:
    """Drop one export: the PJRT pin (no GIL), a deferred delete if this was the last
    export, then the BufferHandle reference (GIL; skipped once the interpreter is exiting,
    when taking the GIL from a plugin thread could block it for good)."""
    cdef PJRT_Buffer_DecreaseExternalReferenceCount_Args args
    cdef PyObject* owner = e.owner
    args = PJRT_Buffer_DecreaseExternalReferenceCount_Args_new()
    args.buffer = e.buffer
    PJRT_Buffer_DecreaseExternalReferenceCount_quiet(e.api, &args)
    if atomic_add(e.exports, -1) == 0 and atomic_cas(e.delete_state, DELETE_DEFERRED, DELETE_DONE):
        delete_now(e.api, e.buffer)
    free(e)
    if not callback_enter():  # exiting: the reference is left behind
        return
    with gil:
        Py_DECREF(<object>owner)
    callback_leave()


cdef void _delete_legacy(DLManagedTensor* tensor) noexcept nogil:
    _release(<Export*>tensor.manager_ctx)


cdef void _delete_versioned(DLManagedTensorVersioned* tensor) noexcept nogil:
    _release(<Export*>tensor.manager_ctx)


cdef void _capsule_destructor(object capsule) noexcept:
    # A capsule never consumed still owns its tensor.
    cdef DLManagedTensor* legacy
    cdef DLManagedTensorVersioned* versioned
    if PyCapsule_IsValid(capsule, VERSIONED):
        versioned = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, VERSIONED)
        versioned.deleter(versioned)
    elif PyCapsule_IsValid(capsule, LEGACY):
        legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, LEGACY)
        legacy.deleter(legacy)


cdef Export* _new_export(BufferHandle buffer, size_t extra) except NULL:
    """A new Export (with ``extra`` bytes after it) pinning ``buffer``: its PJRT external
    reference count increased, its export count too, and the BufferHandle referenced."""
    cdef const PJRT_Api* api = buffer.client.api
    cdef PJRT_Buffer_IncreaseExternalReferenceCount_Args increase
    cdef Export* e = <Export*>malloc(sizeof(Export) + extra)
    if e == NULL:
        raise MemoryError()
    memset(e, 0, sizeof(Export))
    increase = PJRT_Buffer_IncreaseExternalReferenceCount_Args_new()
    increase.buffer = buffer.ptr
    # Counted first: a concurrent delete() then either defers, or finished before the
    # count and is seen here.
    atomic_add(&buffer.exports, 1)
    try:
        if buffer._is_deleted():
            raise _errors.FailedPreconditionError("the buffer has been deleted")
        PJRT_Buffer_IncreaseExternalReferenceCount(api, &increase)
    except BaseException:
        if (atomic_add(&buffer.exports, -1) == 0
                and atomic_cas(&buffer.delete_state, DELETE_DEFERRED, DELETE_DONE)):
            delete_now(api, buffer.ptr)
        free(e)
        raise
    e.api = api
    e.buffer = buffer.ptr
    e.owner = <PyObject*>buffer
    e.exports = &buffer.exports
    e.delete_state = &buffer.delete_state
    Py_INCREF(buffer)
    return e


cdef Export* _pin(BufferHandle buffer, int device_type, int device_id) except NULL:
    """A new Export of ``buffer`` (pinned, counted, its owner referenced)."""
    cdef const PJRT_Api* api = buffer.client.api
    cdef PJRT_Buffer_UnsafePointer_Args pointer
    cdef Export* e
    cdef DLTensor* t
    cdef int i, ndim
    if buffer._is_deleted():
        raise _errors.FailedPreconditionError("the buffer has been deleted")
    if not has_PJRT_Buffer_IncreaseExternalReferenceCount(api):
        raise_unimplemented(api, b"PJRT_Buffer_IncreaseExternalReferenceCount")
    if not has_PJRT_Buffer_DecreaseExternalReferenceCount(api):  # a pin that could not go
        raise_unimplemented(api, b"PJRT_Buffer_DecreaseExternalReferenceCount")
    element_type = buffer.element_type
    code_bits = _dlpack_of_pjrt.get(element_type)
    if code_bits is None:
        raise _errors.UnimplementedError(
            f"{buffer.dtype} arrays have no DLPack form ifrtpy exchanges "
            "(sub-byte element types are packed by the plugin)")
    dims = buffer.dims
    ndim = len(dims)
    strides = buffer.element_strides()  # the device layout's order (row-major by default)
    error = ready_error(buffer)
    if error is not None:
        raise error
    pointer = PJRT_Buffer_UnsafePointer_Args_new()
    pointer.buffer = buffer.ptr
    PJRT_Buffer_UnsafePointer(api, &pointer)
    e = _new_export(buffer, 2 * max(ndim, 1) * sizeof(int64_t))
    t = &e.legacy.dl_tensor
    t.data = <void*>pointer.buffer_pointer
    t.device.device_type = device_type
    t.device.device_id = device_id
    t.ndim = ndim
    t.dtype.code = code_bits[0]
    t.dtype.bits = code_bits[1]
    t.dtype.lanes = 1
    t.shape = <int64_t*>(<char*>e + sizeof(Export))
    t.strides = t.shape + ndim
    t.byte_offset = 0
    for i in range(ndim):
        t.shape[i] = dims[i]
        t.strides[i] = strides[i]
    e.versioned.dl_tensor = e.legacy.dl_tensor
    return e


def export(BufferHandle buffer not None, int device_type, int device_id, bint versioned,
           bint read_only=True, bint copied=False):
    """A DLPack capsule of ``buffer`` on (``device_type``, ``device_id``): versioned
    (DLPack 1.1, flags READ_ONLY and IS_COPIED as given) or legacy. Waits for the data."""
    cdef Export* e = _pin(buffer, device_type, device_id)
    e.versioned.version.major = DLPACK_MAJOR_VERSION
    e.versioned.version.minor = DLPACK_MINOR_VERSION
    e.versioned.manager_ctx = e
    e.versioned.deleter = _delete_versioned
    e.versioned.flags = ((DLPACK_FLAG_BITMASK_READ_ONLY if read_only else 0)
                         | (DLPACK_FLAG_BITMASK_IS_COPIED if copied else 0))
    e.legacy.manager_ctx = e
    e.legacy.deleter = _delete_legacy
    try:
        if versioned:
            return PyCapsule_New(&e.versioned, VERSIONED, _capsule_destructor)
        return PyCapsule_New(&e.legacy, LEGACY, _capsule_destructor)
    except BaseException:
        _release(e)
        raise


cdef class _HostPin:
    """The base object of a NumPy view: releases its export when the view is gone."""
    cdef Export* export

    def __dealloc__(self):
        if self.export != NULL:
            _release(self.export)
            self.export = NULL


cdef bint _is_row_major(BufferHandle buffer) except -1:
    """Whether the buffer's memory is dense row-major (its device layout's order)."""
    cdef Py_ssize_t step = 1, axis
    try:
        strides = buffer.element_strides()
    except _errors.UnimplementedError:  # a tiled layout
        return False
    dims = buffer.dims
    for axis in range(len(dims) - 1, -1, -1):
        if dims[axis] != 1 and strides[axis] != step:
            return False
        step *= max(<Py_ssize_t>dims[axis], 1)
    return True


def host_view(BufferHandle buffer not None):
    """A read-only NumPy array over ``buffer``'s memory, which the host must be able to
    read; it pins the buffer until the array (and every view of it) is gone. None for
    element types NumPy cannot view (sub-byte) and memory that is not dense row-major
    (a buffer placed in another device layout)."""
    cdef cnp.npy_intp dims[MAX_RANK]
    cdef int i, ndim
    cdef Export* e
    cdef _HostPin pin
    form = buffer.view_form
    if form is None:  # first view: check and wait once; the form never changes after
        element_type = buffer.element_type
        if element_type not in _dlpack_of_pjrt or not _is_row_major(buffer):
            return None
        descr, shape = _numpy_of_pjrt[element_type], buffer.dims
        e = _pin(buffer, kDLCPU, 0)
        form = (descr, shape, <uintptr_t>e.legacy.dl_tensor.data)
        buffer.view_form = form
    else:
        if buffer._is_deleted():
            raise _errors.FailedPreconditionError("the buffer has been deleted")
        e = _new_export(buffer, 0)
    try:
        pin = _HostPin.__new__(_HostPin)
    except BaseException:
        _release(e)
        raise
    pin.export = e  # from here the pin owns the export
    descr, shape, address = form
    ndim = len(shape)
    for i in range(ndim):
        dims[i] = shape[i]
    Py_INCREF(descr)  # stolen by the array
    cdef cnp.ndarray out = array_over(<PyObject*>descr, ndim, dims, NULL, <void*><uintptr_t>address,
                                      cnp.NPY_ARRAY_CARRAY_RO)
    Py_INCREF(pin)  # stolen by PyArray_SetBaseObject
    cnp.PyArray_SetBaseObject(out, pin)
    return out


# -- import --------------------------------------------------------------------------------

def external_ready_stream(ClientHandle client not None, DeviceHandle device not None):
    """The platform stream on which ``device`` tracks external buffers' readiness (the
    stream to hand a DLPack producer and ``import_capsule``), from the plugin's stream
    extension (a view of foreign device memory is ordered after the producer's work
    through it), or 0 where the plugin has none."""
    cdef PJRT_Get_Stream_For_External_Ready_Events_Args args = (
        PJRT_Get_Stream_For_External_Ready_Events_Args_new())
    if not has_PJRT_Get_Stream_For_External_Ready_Events(client.api):
        return 0
    args.device = device.ptr
    PJRT_Get_Stream_For_External_Ready_Events(client.api, &args)
    return args.stream


ctypedef struct Imported:
    DLManagedTensor* legacy
    DLManagedTensorVersioned* versioned
    int state  # CREATING until the view exists; FIRED_EARLY if the plugin let go before


DEF CREATING = 0
DEF CREATED = 1
DEF FIRED_EARLY = 2


cdef void _on_view_deleted(void* device_buffer_ptr, void* user_arg) noexcept nogil:
    # The plugin is done with the producer's memory: give the tensor back to its producer
    # (its deleter may run on any thread and takes the GIL itself where it needs it).
    # While finalizing, the producer may no longer be able to run: its memory is left.
    # A plugin that fails to create the view may let go of the memory inside the failing
    # call: the tensor is given back then too, and import_capsule frees the record.
    cdef Imported* imported = <Imported*>user_arg
    if not is_finalizing():
        if imported.versioned != NULL:
            if imported.versioned.deleter != NULL:
                imported.versioned.deleter(imported.versioned)
        elif imported.legacy.deleter != NULL:
            imported.legacy.deleter(imported.legacy)
    if not atomic_cas(&imported.state, CREATING, FIRED_EARLY):
        free(imported)


def capsule_info(capsule):
    """``(device_type, device_id, pjrt_type, dims, read_only)`` of an unconsumed capsule;
    InvalidArgumentError for anything else."""
    cdef DLTensor* t
    cdef int i
    address, read_only = _tensor_of(capsule)
    t = <DLTensor*><uintptr_t>address
    dims = tuple([t.shape[i] for i in range(t.ndim)])
    return t.device.device_type, t.device.device_id, _pjrt_type_of(t), dims, read_only


cdef tuple _tensor_of(capsule):
    cdef DLManagedTensorVersioned* versioned
    cdef DLManagedTensor* legacy
    if PyCapsule_IsValid(capsule, VERSIONED):
        versioned = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, VERSIONED)
        if versioned.version.major > DLPACK_MAJOR_VERSION:
            raise _errors.InvalidArgumentError(
                f"DLPack capsule of version {versioned.version.major}.{versioned.version.minor}; "
                f"ifrtpy reads major version {DLPACK_MAJOR_VERSION}")
        if versioned.flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED:
            raise _errors.UnimplementedError("DLPack tensors of padded sub-byte elements are not supported")
        return <uintptr_t>&versioned.dl_tensor, bool(versioned.flags & DLPACK_FLAG_BITMASK_READ_ONLY)
    if PyCapsule_IsValid(capsule, LEGACY):
        legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, LEGACY)
        return <uintptr_t>&legacy.dl_tensor, False
    if PyCapsule_IsValid(capsule, USED_LEGACY) or PyCapsule_IsValid(capsule, USED_VERSIONED):
        raise _errors.InvalidArgumentError("this DLPack capsule was consumed already (a capsule is read once)")
    raise _errors.InvalidArgumentError(
        f"expected a DLPack capsule ('dltensor' or 'dltensor_versioned'), got {type(capsule).__name__}")


cdef int _pjrt_type_of(DLTensor* t) except -1:
    if t.dtype.lanes != 1:
        raise _errors.UnimplementedError(f"DLPack tensors with {t.dtype.lanes} lanes are not supported")
    pjrt_type = _pjrt_of_dlpack.get((t.dtype.code, t.dtype.bits))
    if pjrt_type is None:
        raise _errors.UnimplementedError(
            f"DLPack type code {t.dtype.code} with {t.dtype.bits} bits has no ifrtpy element type")
    if t.ndim < 0 or t.ndim > MAX_RANK:
        raise _errors.InvalidArgumentError(f"DLPack tensor of rank {t.ndim}; at most {MAX_RANK}")
    return pjrt_type


cdef bint _is_dense(DLTensor* t):
    cdef int64_t expected = 1
    cdef int i
    if t.strides == NULL:
        return True
    for i in range(t.ndim - 1, -1, -1):
        if t.shape[i] == 0:
            return True
        if t.shape[i] != 1 and t.strides[i] != expected:
            return False
        expected *= t.shape[i]
    return True


def import_capsule(ClientHandle client not None, capsule, MemoryHandle memory not None,
                   DeviceHandle device not None,
                   bint view, int alignment, intptr_t stream=0, int element_type=-1):
    """Consume a DLPack ``capsule`` (see :func:`capsule_info`).

    Where ``view`` is true and the tensor is dense, row-major and at an address that is a
    multiple of ``alignment``, returns ``(buffer, None)``: a buffer aliasing the memory in
    ``memory`` of ``device``, which gives the tensor back to its producer when the plugin
    is done with it (``stream``: the platform stream the producer synchronized with, 0
    for none). ``element_type`` (a PJRT_Buffer_Type of the same size) overrides the
    tensor's own, for producers that export extension types as unsigned integers. Otherwise ``(None, array)``: a NumPy view of the tensor (host memory
    only) that keeps the capsule alive, for the caller to copy; where the plugin refused
    the view, the plugin's error is raised.
    """
    cdef const PJRT_Api* api = client.api
    cdef uintptr_t address
    cdef DLTensor* t
    cdef bint read_only, versioned = PyCapsule_IsValid(capsule, VERSIONED)
    cdef PJRT_Client_CreateViewOfDeviceBuffer_Args args
    cdef Imported* imported
    cdef int i
    cdef int pjrt_type
    address, read_only = _tensor_of(capsule)
    t = <DLTensor*>address
    pjrt_type = _pjrt_type_of(t)
    if element_type >= 0:
        if _dlpack_of_pjrt.get(element_type, (0, 0))[1] != t.dtype.bits:
            raise _errors.InvalidArgumentError(
                f"element type {element_type} does not have the tensor's {t.dtype.bits} bits")
        pjrt_type = element_type
    cdef uintptr_t data = <uintptr_t>t.data + t.byte_offset
    cdef bint host = t.device.device_type in (kDLCPU, kDLCUDAHost, kDLCUDAManaged, kDLROCMHost)
    if view and _is_dense(t) and alignment > 0 and data % alignment == 0:
        imported = <Imported*>malloc(sizeof(Imported))
        if imported == NULL:
            raise MemoryError()
        imported.versioned = NULL
        imported.legacy = NULL
        if versioned:
            imported.versioned = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, VERSIONED)
        else:
            imported.legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, LEGACY)
        args = PJRT_Client_CreateViewOfDeviceBuffer_Args_new()
        args.client = client.ptr
        args.device_buffer_ptr = <void*>data
        args.dims = t.shape
        args.num_dims = t.ndim
        args.element_type = <PJRT_Buffer_Type>pjrt_type
        args.device = device.ptr
        args.memory = memory.ptr
        args.on_delete_callback = _on_view_deleted
        args.on_delete_callback_arg = imported
        args.stream = stream
        imported.state = CREATING
        try:
            PJRT_Client_CreateViewOfDeviceBuffer(api, &args)
        except BaseException:
            if imported.state == FIRED_EARLY:  # the tensor went back to its producer
                PyCapsule_SetName(capsule, USED_VERSIONED if versioned else USED_LEGACY)
            free(imported)
            raise
        if not atomic_cas(&imported.state, CREATING, CREATED):
            free(imported)  # the plugin let go already (it copied): the record is ours
        # the plugin owns the tensor now: the capsule must not delete it
        PyCapsule_SetName(capsule, USED_VERSIONED if versioned else USED_LEGACY)
        buffer = BufferHandle.wrap(client, args.buffer)
        buffer._read_only = read_only  # a view of memory that must not be written
        return buffer, None
    if not host:
        raise _errors.UnimplementedError(
            f"a DLPack tensor on device type {t.device.device_type} can only be aliased "
            "(dense, row-major, aligned), not copied through the host")
    cdef cnp.npy_intp dims[MAX_RANK]
    cdef cnp.npy_intp strides[MAX_RANK]
    cdef bint empty = False
    cdef cnp.dtype descr = _numpy_of_pjrt[pjrt_type]
    for i in range(t.ndim):
        dims[i] = t.shape[i]
        empty = empty or t.shape[i] == 0
    if empty:
        return None, np.empty(tuple([t.shape[i] for i in range(t.ndim)]), descr)
    for i in range(t.ndim):
        strides[i] = (t.strides[i] if t.strides != NULL else 0) * descr.itemsize
    Py_INCREF(descr)
    cdef cnp.ndarray out = array_over(
        <PyObject*>descr, t.ndim, dims, strides if t.strides != NULL else NULL,
        <void*>data, cnp.NPY_ARRAY_ALIGNED if t.strides != NULL else cnp.NPY_ARRAY_CARRAY_RO)
    Py_INCREF(capsule)
    cnp.PyArray_SetBaseObject(out, capsule)
    return None, out
