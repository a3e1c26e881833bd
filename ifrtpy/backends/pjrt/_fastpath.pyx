# cython: language_level=3, binding=True, embedsignature=True
"""The PjRt backend's hot paths in C: the fields of PjrtArray and PjrtLoadedExecutable,
repeated executes, and mapping the pages of fresh host memory while copies fill it.

``ArrayCore`` and ``ExecutableCore`` hold the fields of every PjrtArray and
PjrtLoadedExecutable, so that an execute can read its arguments and fill its outputs
without Python attribute lookups. All semantics stay in ``array.py`` and
``executable.py``: this module only repeats an execute whose arguments were already
checked (same dtype, shape and sharding objects as an accepted call), and hands every
other call to the checked path.

:func:`populate_while_pending` and :class:`PopulateBehind` take the page faults of a
fresh destination on a second core while a copy fills it (Linux's MADV_POPULATE_WRITE,
which maps pages without writing them); elsewhere they do nothing.
"""

cimport cython
cimport numpy as cnp
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.sequence cimport PySequence_Fast_GET_ITEM, PySequence_Fast_GET_SIZE
from cpython.contextvars cimport get_value
from libc.errno cimport EINVAL, ENOSYS
from libc.stdlib cimport free, malloc

from ifrtpy._pjrt._buffer cimport BufferHandle
from ifrtpy._pjrt._event cimport EventHandle
from ifrtpy._pjrt._executable cimport ExecutableHandle
from ifrtpy._execute_result cimport ExecuteResult
from ifrtpy.array import deleted_error as _deleted_error
from ifrtpy.executable import ExecuteOptions
from ifrtpy.executable import keyword_arguments_error as _keyword_arguments_error
from ifrtpy import errors as _errors
from ifrtpy.backends.pjrt.events import future_of_events
from ifrtpy.user_context import ACTIVE as _user_context

cnp.import_array()

DEF SMALL = 64  # arguments and outputs of an execute kept on the stack

cdef object _active_user_context = _user_context  # the ContextVar, read without a lookup

cdef extern from *:
    """
    #include <errno.h>
    #include <stdint.h>
    #if defined(__linux__)
    #include <sys/mman.h>
    #include <unistd.h>
    #ifndef MADV_POPULATE_WRITE
    #define MADV_POPULATE_WRITE 23
    #endif
    /* Map the pages of [start, start+size) writable without writing them; 0 or errno. */
    static int ifrtpy_populate_write(char* start, size_t size) {
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t lo = (uintptr_t)start & ~(page - 1);
        if (madvise((void*)lo, (uintptr_t)start + size - lo, MADV_POPULATE_WRITE) == 0) return 0;
        return errno;
    }
    #include <pthread.h>
    /* A thread mapping [base, base+size) 2 MiB at a time from the end, until stopped. */
    typedef struct {
        char* base;
        size_t size;
        int stop;
        int started;
        pthread_t thread;
    } ifrtpy_populator;
    static void* ifrtpy_populate_backwards(void* arg) {
        ifrtpy_populator* job = (ifrtpy_populator*)arg;
        size_t stop = job->size, chunk = (size_t)2 << 20, start;
        while (stop > 0 && !__atomic_load_n(&job->stop, __ATOMIC_RELAXED)) {
            start = stop > chunk ? stop - chunk : 0;
            if (ifrtpy_populate_write(job->base + start, stop - start) != 0) break;
            stop = start;
        }
        return NULL;
    }
    static void ifrtpy_populator_start(ifrtpy_populator* job, char* base, size_t size) {
        job->base = base;
        job->size = size;
        job->stop = 0;
        job->started = pthread_create(&job->thread, NULL, ifrtpy_populate_backwards, job) == 0;
    }
    static void ifrtpy_populator_join(ifrtpy_populator* job) {
        if (!job->started) return;
        __atomic_store_n(&job->stop, 1, __ATOMIC_RELAXED);
        pthread_join(job->thread, NULL);
        job->started = 0;
    }
    #else
    static int ifrtpy_populate_write(char* start, size_t size) { return ENOSYS; }
    typedef struct { int started; } ifrtpy_populator;
    static void ifrtpy_populator_start(ifrtpy_populator* job, char* base, size_t size) { job->started = 0; }
    static void ifrtpy_populator_join(ifrtpy_populator* job) {}
    #endif
    """
    int ifrtpy_populate_write(char* start, size_t size) nogil
    ctypedef struct ifrtpy_populator:
        int started
    void ifrtpy_populator_start(ifrtpy_populator* job, char* base, size_t size) nogil
    void ifrtpy_populator_join(ifrtpy_populator* job) nogil


cdef class ArrayCore:
    """The fields of a PjrtArray (see ``ifrtpy.backends.pjrt.array``)."""

    cdef public object _client
    cdef public object _dtype
    cdef public object _shape
    cdef public object _sharding
    cdef public tuple _buffers
    cdef public object _error
    cdef public bint _deleted
    cdef public object _user_context
    cdef public object _layout  # None: the default layout of its memory
    cdef object __weakref__

    def block_until_ready(self):
        """Wait for every shard (the GIL released while one is pending); raise the array's
        error, or FailedPreconditionError if it was deleted; return the array."""
        cdef BufferHandle buffer
        if self._error is not None:
            raise self._error
        for item in self._buffers:
            buffer = <BufferHandle?>item
            if not self._deleted:
                error = buffer.ready_error()  # that of a deleted (or donated) buffer fails
                if error is None:
                    continue
            if self._deleted or buffer._is_deleted():
                raise _deleted_error(self)
            raise error
        return self


cdef class ExecutableCore:
    """The fields of a PjrtLoadedExecutable and the C half of its ``execute``.

    ``execute`` repeats, in C, a call whose arguments are of the kinds a checked call
    accepted: each an ``_array_type`` with the ``(dtype, shape, sharding)`` of
    ``_accepted`` (sharding and dtype by identity, shape by equality), live and not an
    error array. Every other call goes to ``_execute_checked``, the interface's execute
    (``ifrtpy.executable``), which checks the whole contract; the backend's ``_launch``
    (in ``executable.py``) then sets ``_accepted``.
    """

    cdef public object _client
    cdef public ExecutableHandle _handle
    cdef public object _devices
    cdef public bint _deleted
    cdef public list _accepted  # None until a checked call: no call may skip the checks
    cdef public tuple _outputs_spec  # (dtype, shape, sharding) of each output
    cdef public frozenset _donated  # the parameters the program donates
    cdef object array_type
    cdef object __weakref__

    @property
    def _array_type(self):
        """The type of the arguments and outputs: ArrayCore or a subclass."""
        return self.array_type

    @_array_type.setter
    def _array_type(self, value):
        if not (isinstance(value, type) and issubclass(value, ArrayCore)):
            raise TypeError(f"_array_type must be a subclass of ArrayCore, got {value!r}")
        self.array_type = value

    def execute(self, args, options=None, devices=None):
        """See :meth:`ifrtpy.LoadedExecutable.execute`."""
        if (devices is None and not self._deleted and self._accepted is not None
                and (options is None or type(options) is ExecuteOptions)
                and (type(args) is list or type(args) is tuple)):
            result = self._execute_accepted(args, options, True)
            if result is not None:
                return result
        return self._execute_checked(args, options, devices)

    def __call__(self, *args, **keywords):
        """``execute(list(args)).outputs``: run with default options."""
        if keywords:
            raise _keyword_arguments_error(self, keywords)
        if not self._deleted and self._accepted is not None:
            outputs = self._execute_accepted(args, None, False)
            if outputs is not None:
                return outputs
        return self._execute_checked(list(args), None, None).outputs

    cdef object _execute_accepted(self, object args, options, bint as_result):
        """An ExecuteResult (``as_result``) or the outputs; None unless ``args`` (a list or
        a tuple) are of the accepted kinds. The launch is ``_pjrt``'s, as for every execute."""
        cdef list accepted = self._accepted
        cdef tuple outputs_spec = self._outputs_spec  # read with accepted: set as a pair
        cdef ExecutableHandle handle = self._handle
        cdef Py_ssize_t num_args = len(args), num_outputs = handle.num_outputs
        cdef Py_ssize_t num_devices = len(handle.addressable_devices), d, k
        cdef object array_type = self.array_type
        cdef ArrayCore array
        cdef tuple spec, buffers
        cdef ExecuteResult result
        if (array_type is None or accepted is None or num_args != len(accepted)
                or num_outputs != len(outputs_spec)):
            return None
        # Options first: from the argument checks to the launch no Python code runs, so
        # no other thread can change what was checked.
        cdef int launch_id = 0
        cdef object non_donatable = ()
        cdef bint fill_status = False
        if options is not None:
            launch_id = options.launch_id
            if options.non_donatable_input_indices:
                non_donatable = sorted(options.non_donatable_input_indices)
            fill_status = options.fill_status
        cdef frozenset donated = self._donated
        cdef list donated_args = None  # the arrays whose buffers the launch takes
        # The buffer tuple of each argument and the outputs' buffer tuples (one per
        # output), each referenced until handed on; on the stack unless there are many.
        cdef PyObject* small_groups[SMALL]
        cdef PyObject* small_results[SMALL]
        cdef PyObject** groups = small_groups
        cdef PyObject** results = small_results
        cdef Py_ssize_t num_groups = 0, num_results = 0
        cdef PyObject* done = NULL
        try:
            if num_args > SMALL:
                groups = <PyObject**>malloc(num_args * sizeof(PyObject*))
            if num_outputs > SMALL:
                results = <PyObject**>malloc(num_outputs * sizeof(PyObject*))
            if groups == NULL or results == NULL:
                raise MemoryError()
            for k in range(num_args):
                if k >= PySequence_Fast_GET_SIZE(args):  # a list another thread shortened
                    return None  # (comparing shapes runs Python code)
                item = <object>PySequence_Fast_GET_ITEM(args, k)
                if type(item) is not array_type:
                    return None
                array = <ArrayCore>item
                spec = <tuple?>accepted[k]
                buffers = array._buffers
                if (array._sharding is not spec[2] or array._dtype is not spec[0]
                        or array._deleted or array._error is not None or array._layout is not None
                        or (array._shape is not spec[1] and array._shape != spec[1])
                        or len(buffers) != num_devices):
                    return None
                for d in range(num_devices):
                    if (<BufferHandle?>buffers[d]).exports:  # exported: donation is checked there
                        return None
                Py_INCREF(buffers)
                groups[k] = <PyObject*>buffers
                num_groups += 1
                if donated and k in donated and k not in non_donatable:
                    if donated_args is None:
                        donated_args = []
                    donated_args.append(array)
            handle._run(groups, num_args, False, num_devices, launch_id, non_donatable, None,
                        donated, results, &done if fill_status else NULL)
            num_results = num_outputs
            if donated_args is not None:  # they read as deleted, as after delete()
                for item in donated_args:
                    (<ArrayCore>item)._deleted = True
            outputs = PyList_New(num_outputs)
            context = get_value(_active_user_context)
            for k in range(num_outputs):
                spec = <tuple?>outputs_spec[k]
                array = <ArrayCore>(<PyTypeObject*>array_type).tp_new(array_type, <PyObject*>(), NULL)
                array._client = self._client
                array._dtype = spec[0]
                array._shape = spec[1]
                array._sharding = spec[2]
                array._buffers = <tuple>results[k]
                Py_XDECREF(results[k])  # the array holds the tuple
                results[k] = NULL
                array._user_context = context
                Py_INCREF(array)
                PyList_SET_ITEM(outputs, k, array)
            if not as_result:
                return outputs
            result = ExecuteResult.__new__(ExecuteResult)
            result.status = future_of_events(<tuple>done) if fill_status else None
            result.outputs = outputs
            return result
        finally:
            for k in range(num_groups):
                Py_XDECREF(groups[k])
            for k in range(num_results):
                Py_XDECREF(results[k])
            Py_XDECREF(done)
            if groups != small_groups:
                free(groups)
            if results != small_results:
                free(results)


cdef bint _populate_supported = True


cdef bint _all_ready(list events) except -1:
    for e in events:
        if not (<EventHandle?>e)._is_ready():
            return False
    return True


def populate_while_pending(cnp.ndarray out not None, events, chunk=2 << 20):
    """Map the pages of ``out`` (C-contiguous), ``chunk`` bytes at a time from its end
    backwards, until all of it is mapped or every event in ``events`` has fired.

    For a fresh destination that the plugin's copies (``to_host_buffer``, issued first)
    fill on its own threads from the front: this thread takes the page faults those
    copies would take. Safe while they run: it writes nothing (Linux's
    ``MADV_POPULATE_WRITE``). Does no more work than mapping ``out`` once, and never
    waits. Returns False where the kernel lacks it (Linux < 5.14, other systems).
    """
    global _populate_supported
    cdef Py_ssize_t chunk_bytes = _errors.check_int(chunk, "chunk", 1, 2**62)
    if not cnp.PyArray_IS_C_CONTIGUOUS(out):
        raise _errors.InvalidArgumentError("populate_while_pending needs a C-contiguous array")
    if not _populate_supported:
        return False
    cdef list pending = list(events)
    cdef char* base = <char*>cnp.PyArray_DATA(out)
    cdef Py_ssize_t stop = cnp.PyArray_NBYTES(out)
    cdef Py_ssize_t start
    cdef int err
    while stop > 0 and not _all_ready(pending):
        start = stop - chunk_bytes if stop > chunk_bytes else 0
        with nogil:
            err = ifrtpy_populate_write(base + start, <size_t>(stop - start))
        if err == EINVAL or err == ENOSYS:
            _populate_supported = False
            return False
        if err != 0:
            break  # e.g. ENOMEM: leave the rest to the copies' own page faults
        stop = start
    return True


@cython.final
@cython.no_gc_clear
cdef class PopulateBehind:
    """``with PopulateBehind(array): <copy into array>``: a helper thread maps the pages
    of ``array`` (C-contiguous), 2 MiB at a time from its end backwards, while the body
    fills it from the front (holding the GIL or not), so that the page faults of fresh
    memory are taken on a second core. Safe whatever the body has reached: mapping writes
    nothing (Linux's ``MADV_POPULATE_WRITE``). The thread stops and is joined when the
    block ends. Does nothing where the kernel lacks it or no thread can be started.
    """
    cdef ifrtpy_populator job
    cdef object array

    def __cinit__(self, cnp.ndarray array not None):
        if not cnp.PyArray_IS_C_CONTIGUOUS(array):
            raise _errors.InvalidArgumentError("PopulateBehind needs a C-contiguous array")
        self.array = array
        self.job.started = 0

    def __enter__(self):
        if _populate_supported and not self.job.started:
            ifrtpy_populator_start(&self.job, <char*>cnp.PyArray_DATA(<cnp.ndarray>self.array),
                                   <size_t>cnp.PyArray_NBYTES(<cnp.ndarray>self.array))
        return self

    def __exit__(self, *exc_info):
        with nogil:
            ifrtpy_populator_join(&self.job)
        return False

    def __dealloc__(self):
        with nogil:
            ifrtpy_populator_join(&self.job)
