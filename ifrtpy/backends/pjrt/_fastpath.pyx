# cython: language_level=3, binding=True, embedsignature=True
"""The PjRt backend's hot paths in C: the fields of PjrtArray, repeated executes, and
mapping the pages of fresh host memory while copies fill it.

``ArrayCore`` holds the fields of every PjrtArray, so that :func:`execute_arrays` can
read its arguments and fill its outputs without Python attribute lookups. All semantics
stay in ``array.py`` and ``executable.py``: this module only repeats an execute whose
arguments were already checked (same dtype, shape and sharding objects as an accepted
call), and returns None otherwise so that the caller takes the checked path.

:func:`populate_while_pending` and :class:`PopulateBehind` take the page faults of a
fresh destination on a second core while a copy fills it (Linux's MADV_POPULATE_WRITE,
which maps pages without writing them); elsewhere they do nothing.
"""

cimport cython
cimport numpy as cnp
from libc.errno cimport EINVAL, ENOSYS
from libc.string cimport memset

from ifrtpy._pjrt.pjrt_c_api cimport *
from ifrtpy._pjrt._base cimport check
from ifrtpy._pjrt._buffer cimport EventHandle
from ifrtpy._pjrt._executable cimport ExecutableHandle
from ifrtpy import errors as _errors

cnp.import_array()

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
    cdef object __weakref__

    def block_until_ready(self):
        """Wait for every shard (the GIL released while one is pending); raise the array's
        error, or FailedPreconditionError if it was deleted; return the array."""
        if self._error is not None:
            raise self._error
        for buffer in self._buffers:
            if self._deleted or buffer.is_deleted():
                raise _errors.FailedPreconditionError(f"Array has been deleted: {self!r}")
            buffer.ready_event().await_()
        return self


def execute_arrays(ExecutableHandle handle, list args, list accepted, tuple outputs_spec,
                   object client, object array_type, int launch_id, non_donatable):
    """Execute ``handle`` on ``args`` if each is an ``array_type`` matching the
    ``(dtype, shape, sharding)`` of ``accepted`` by identity (shape by equality), not
    deleted and not an error array; return ``(outputs, events)``, else None.

    ``outputs_spec`` holds ``(dtype, shape, sharding)`` of each output.
    """
    cdef Py_ssize_t n = len(args), k
    cdef ArrayCore arg, out
    cdef tuple spec
    if n != len(accepted):
        return None
    cdef list buffers = []
    for k in range(n):
        if type(args[k]) is not array_type:
            return None
        arg = <ArrayCore>args[k]
        spec = <tuple>accepted[k]
        if (arg._sharding is not spec[2] or arg._dtype is not spec[0] or arg._deleted
                or arg._error is not None or arg._shape != spec[1]):
            return None
        buffers.append(arg._buffers)
    by_output, events = handle._run(buffers, False, len(handle.addressable_devices), launch_id,
                                    non_donatable, None)
    cdef list arrays = []
    for k in range(len(outputs_spec)):
        spec = <tuple>outputs_spec[k]
        out = <ArrayCore>ArrayCore.__new__(array_type)
        out._client = client
        out._dtype = spec[0]
        out._shape = spec[1]
        out._sharding = spec[2]
        out._buffers = by_output[k]
        arrays.append(out)
    return arrays, events


cdef bint _populate_supported = True


cdef bint _all_ready(list events) except -1:
    cdef EventHandle event
    cdef PJRT_Event_IsReady_Args args
    for e in events:
        event = <EventHandle?>e
        memset(&args, 0, sizeof(args))
        args.struct_size = PJRT_Event_IsReady_Args_STRUCT_SIZE
        args.event = event.ptr
        check(event.api, event.api.PJRT_Event_IsReady(&args))
        if not args.is_ready:
            return False
    return True


def populate_while_pending(cnp.ndarray out, events, Py_ssize_t chunk=2 << 20):
    """Map the pages of ``out`` (C-contiguous), ``chunk`` bytes at a time from its end
    backwards, until all of it is mapped or every event in ``events`` has fired.

    For a fresh destination that the plugin's copies (``to_host_buffer``, issued first)
    fill on its own threads from the front: this thread takes the page faults those
    copies would take. Safe while they run: it writes nothing (Linux's
    ``MADV_POPULATE_WRITE``). Does no more work than mapping ``out`` once, and never
    waits. Returns False where the kernel lacks it (Linux < 5.14, other systems).
    """
    global _populate_supported
    if not cnp.PyArray_IS_C_CONTIGUOUS(out):
        raise _errors.InvalidArgumentError("populate_while_pending needs a C-contiguous array")
    if chunk <= 0:
        raise _errors.InvalidArgumentError(f"chunk must be positive, got {chunk}")
    if not _populate_supported:
        return False
    cdef list pending = list(events)
    cdef char* base = <char*>cnp.PyArray_DATA(out)
    cdef Py_ssize_t stop = cnp.PyArray_NBYTES(out)
    cdef Py_ssize_t start
    cdef int err
    while stop > 0 and not _all_ready(pending):
        start = stop - chunk if stop > chunk else 0
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

    def __cinit__(self, cnp.ndarray array):
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
