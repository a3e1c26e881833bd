# cython: language_level=3, binding=True, embedsignature=True
"""The storage of the PjRt backend's arrays in C: ``ArrayCore``, the fields of every
PjrtArray (those of every array held in C, its buffers and its layout), with the reads
that need no Python attribute lookup (``is_deleted``, ``block_until_ready``), and the
lifecycle of the backend's array type (``free_directly``). Its outputs are made and given
their buffers by the execute's launch (``ifrtpy.backends.pjrt._execute_launch``)."""

cimport cython
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

from ifrtpy._pjrt._buffer cimport BufferHandle, destroy_buffer, ready_error, take_buffer
from ifrtpy._pjrt._client cimport ClientHandle
from ifrtpy.backends._array_fields cimport ArrayFields
from ifrtpy.array import deleted_error as _deleted_error


cdef extern from *:
    """
    /* A Python subclass of ArrayCore that adds nothing to its instances (no slots, no
       __dict__, no finalizer), freed without subtype_dealloc (its trashcan, GC untrack
       and re-track, the walk to the first base with a dealloc of its own): ArrayCore's
       dealloc, then the reference to the type each instance holds. Subclasses of it keep
       subtype_dealloc, which calls this as their base's dealloc and leaves their type to
       it (a heap type's dealloc releases the type). 140 instructions of every output
       array freed. Its instances keep a free list of their own, as Outputs do: a freed
       one (its fields cleared, untracked) waits here for the next tp_alloc of its type,
       instead of going back to the GC's allocator (170 instructions an array). */
    #define IFRTPY_ARRAYS_FREE 16
    static PyTypeObject* ifrtpy_direct_type = NULL;
    static destructor ifrtpy_core_dealloc = NULL;
    static PyObject* ifrtpy_arrays_free[IFRTPY_ARRAYS_FREE];
    static int ifrtpy_arrays_count = 0;

    static void ifrtpy_direct_dealloc(PyObject* o) {
        PyTypeObject* type = Py_TYPE(o);
        ifrtpy_core_dealloc(o);
        Py_DECREF(type);
    }

    static void ifrtpy_direct_free(void* p) {
        if (Py_TYPE((PyObject*)p) == ifrtpy_direct_type
                && ifrtpy_arrays_count < IFRTPY_ARRAYS_FREE) {
            ifrtpy_arrays_free[ifrtpy_arrays_count++] = (PyObject*)p;
            return;
        }
        PyObject_GC_Del(p);
    }

    static PyObject* ifrtpy_direct_alloc(PyTypeObject* type, Py_ssize_t nitems) {
        PyObject* o;
        if (type != ifrtpy_direct_type || nitems != 0 || ifrtpy_arrays_count == 0)
            return PyType_GenericAlloc(type, nitems);
        o = ifrtpy_arrays_free[--ifrtpy_arrays_count];
        memset(o, 0, type->tp_basicsize);
        (void)PyObject_Init(o, type);  /* takes a reference to the heap type */
        PyObject_GC_Track(o);
        return o;
    }

    static int ifrtpy_free_directly(PyTypeObject* type, PyTypeObject* core) {
        if (ifrtpy_direct_type != NULL)
            return ifrtpy_direct_type == type ? 0 : -1;
        if (!PyType_HasFeature(type, Py_TPFLAGS_HEAPTYPE) || type->tp_base != core
                || type->tp_basicsize != core->tp_basicsize || type->tp_itemsize != 0
                || type->tp_dictoffset != core->tp_dictoffset
                || type->tp_weaklistoffset != core->tp_weaklistoffset
                || type->tp_finalize != core->tp_finalize || type->tp_del != NULL
    #ifdef Py_TPFLAGS_MANAGED_DICT
                || PyType_HasFeature(type, Py_TPFLAGS_MANAGED_DICT)
    #endif
    #ifdef Py_TPFLAGS_MANAGED_WEAKREF
                || PyType_HasFeature(type, Py_TPFLAGS_MANAGED_WEAKREF)
    #endif
                )
            return -1;
        if (type->tp_alloc != PyType_GenericAlloc || type->tp_free != PyObject_GC_Del)
            return -1;
        ifrtpy_direct_type = type;
        ifrtpy_core_dealloc = core->tp_dealloc;
        type->tp_dealloc = ifrtpy_direct_dealloc;
        type->tp_alloc = ifrtpy_direct_alloc;
        type->tp_free = ifrtpy_direct_free;
        return 0;
    }
    """
    int ifrtpy_free_directly(PyTypeObject* type, PyTypeObject* core)


cdef extern from *:
    """
    /* ArrayCore's tp_traverse, which also visits the ClientHandle an output holding its
       buffer as the execute made it refers to (``_made_client``, a PyObject* at
       ifrtpy_made_client_offset): the collector sees the reference, so a cycle through
       the client and an output nobody read is collected; it is never cleared (the
       buffer's destroy needs the client), the cycle's other objects are. Installed before
       any subclass is made (a subclass adding nothing inherits the slot). */
    static traverseproc ifrtpy_core_traverse = NULL;
    static Py_ssize_t ifrtpy_made_client_offset = 0;

    static int ifrtpy_array_traverse(PyObject* o, visitproc visit, void* arg) {
        PyObject* client = *(PyObject**)((char*)o + ifrtpy_made_client_offset);
        Py_VISIT(client);
        return ifrtpy_core_traverse(o, visit, arg);
    }

    static void ifrtpy_traverse_made_client(PyTypeObject* core, Py_ssize_t offset) {
        ifrtpy_core_traverse = core->tp_traverse;
        ifrtpy_made_client_offset = offset;
        core->tp_traverse = ifrtpy_array_traverse;
    }
    """
    void ifrtpy_traverse_made_client(PyTypeObject* core, Py_ssize_t offset)


cdef class ArrayCore(ArrayFields):
    """The fields of a PjrtArray (see ``ifrtpy.backends.pjrt.array``): those of every
    array held in C, its buffers and its layout.

    ``_buffers``, the BufferHandle of each addressable shard in device order (a tuple),
    is held as the one BufferHandle itself where there is one (``_buffer``; a
    single-device array, as every output of a single-device execute is: no tuple to
    make and free), else as the tuple (``_shards``); it reads back as it was set. The
    only buffer of an execute's output is held as the execute made it (``_made``, no
    handle to make and free), until its handle is first asked for (``_only_buffer``)."""

    def __dealloc__(self):
        self._drop_made()

    @cython.final
    cdef void _drop_made(self) noexcept:
        """Destroy the output's buffer it holds as the execute made it, if any."""
        cdef ClientHandle client
        if self._made.ptr != NULL:
            client = <ClientHandle>self._made_client
            destroy_buffer(client.api, self._made.ptr)
            self._made.ptr = NULL
        Py_XDECREF(self._made_client)
        self._made_client = NULL

    @cython.final
    cdef BufferHandle _only_buffer(self):
        """The BufferHandle of its only buffer (None where it has several), made for an
        output's buffer (``_made``) the first time it is asked for."""
        if self._made.ptr != NULL:
            self._buffer = take_buffer(<ClientHandle>self._made_client, &self._made)
            Py_XDECREF(self._made_client)  # the handle holds the client now
            self._made_client = NULL
        return self._buffer

    @property
    def _buffers(self):
        """The BufferHandle of each addressable shard, in device order (a tuple)."""
        buffer = self._only_buffer()
        return (buffer,) if buffer is not None else self._shards

    @_buffers.setter
    def _buffers(self, tuple buffers):
        self._drop_made()
        if (buffers is not None and PyTuple_GET_SIZE(buffers) == 1
                and isinstance(<object>PyTuple_GET_ITEM(buffers, 0), BufferHandle)):
            self._buffer, self._shards = <BufferHandle>PyTuple_GET_ITEM(buffers, 0), None
        else:  # any other tuple as it is (an execute refuses what is not BufferHandles)
            self._buffer, self._shards = None, buffers

    def is_deleted(self):
        """Whether the array was deleted or donated, or any of its buffers deleted (through
        another array sharing it): reading it then fails."""
        if self._deleted:
            return True
        if self._made.ptr != NULL:
            return False  # an output's own buffer, which nothing else holds
        if self._buffer is not None:
            return self._buffer._is_deleted()
        for buffer in self._shards or ():
            if (<BufferHandle?>buffer)._is_deleted():
                return True
        return False

    def block_until_ready(self):
        """Wait for every shard (the GIL released while one is pending); raise the array's
        error, or FailedPreconditionError if it was deleted; return the array."""
        if self._error is not None:
            raise self._error
        if self._made.ptr != NULL and self._made.ready and not self._deleted:
            return self  # an output known ready: nothing to ask
        buffer = self._only_buffer()
        if buffer is not None:
            if not buffer._ready or self._deleted:  # else known ready: nothing to ask
                self._wait(buffer)
        else:
            for item in self._shards:
                self._wait(item)
        return self

    @cython.final
    cdef int _wait(self, object item) except -1:
        """``block_until_ready`` of one of its buffers, ``item``."""
        cdef BufferHandle buffer = <BufferHandle?>item
        if not self._deleted:
            error = ready_error(buffer)  # that of a deleted (or donated) buffer fails
            if error is None:
                return 0
        if self._deleted or buffer._is_deleted():
            raise _deleted_error(self)
        raise error


cdef int _init_traverse() except -1:
    """Let the collector see ArrayCore's ``_made_client``."""
    cdef ArrayCore probe = ArrayCore.__new__(ArrayCore)
    ifrtpy_traverse_made_client(<PyTypeObject*>ArrayCore,
                                <char*>&probe._made_client - <char*><PyObject*>probe)
    return 0


_init_traverse()


def free_directly(cls):
    """Free the instances of ``cls``, a Python subclass of ArrayCore (directly, as its
    first base) that adds nothing to them (``__slots__ = ()``, no ``__del__``), without
    ``subtype_dealloc``: ArrayCore's dealloc, then the type released; their memory kept
    on a free list of their own for the next ones made. One such class a process (the
    backend's array type); TypeError for any other."""
    if not isinstance(cls, type) or ifrtpy_free_directly(<PyTypeObject*>cls,
                                                         <PyTypeObject*>ArrayCore) < 0:
        raise TypeError(f"{cls!r} cannot be freed directly: not a subclass of ArrayCore "
                        "adding nothing to its instances, or another class is")
