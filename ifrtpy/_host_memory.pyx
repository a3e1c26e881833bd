# cython: language_level=3, binding=True, embedsignature=True
"""Host memory: taking the page faults of fresh memory before or while a copy fills it.

Below every backend and the proxy server (both read large data into fresh memory): a
fresh destination's page faults cost about as much as the copy itself. Where the kernel
maps pages without writing them (Linux's ``MADV_POPULATE_WRITE``),
:func:`populate_while_pending` and :class:`PopulateBehind` map them on a second core
while the copy fills the memory from the front; where it cannot (Linux < 5.14, gVisor,
where a TPU machine runs), :func:`prefault_fresh` takes them on several threads before
the copy.
"""

cimport cython
cimport numpy as cnp
import os
from libc.errno cimport EINVAL, ENOSYS

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
    /* Whether this kernel maps pages with MADV_POPULATE_WRITE (not Linux < 5.14, gVisor). */
    static int ifrtpy_populate_probe(void) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        void* p = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return 0;
        int ok = madvise(p, page, MADV_POPULATE_WRITE) == 0;
        munmap(p, page);
        return ok;
    }
    /* Zero the first byte of [start, stop) and the first of each page after it: the
       page faults of that range. */
    typedef struct { char* start; char* stop; pthread_t thread; int started; } ifrtpy_toucher;
    static void* ifrtpy_touch_pages(void* arg) {
        ifrtpy_toucher* job = (ifrtpy_toucher*)arg;
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        if (job->start >= job->stop) return NULL;
        *(volatile char*)job->start = 0;
        for (uintptr_t p = ((uintptr_t)job->start + page) & ~(page - 1); p < (uintptr_t)job->stop; p += page)
            *(volatile char*)p = 0;
        return NULL;
    }
    /* The page faults of [base, base+size) taken by up to 16 threads at once, each on a
       slice; the slices no thread could be started for on this one. */
    static void ifrtpy_prefault(char* base, size_t size, int threads) {
        ifrtpy_toucher jobs[16];
        if (threads < 1) threads = 1;
        if (threads > 16) threads = 16;
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t slice = ((size / threads) + page - 1) & ~(page - 1);
        int i;
        for (i = 0; i < threads; i++) {
            size_t lo = (size_t)i * slice, hi = lo + slice < size ? lo + slice : size;
            jobs[i].start = base + (lo < size ? lo : size);
            jobs[i].stop = base + hi;
            jobs[i].started = i > 0 && pthread_create(&jobs[i].thread, NULL, ifrtpy_touch_pages, &jobs[i]) == 0;
        }
        for (i = 0; i < threads; i++)
            if (!jobs[i].started) ifrtpy_touch_pages(&jobs[i]);
        for (i = 0; i < threads; i++)
            if (jobs[i].started) pthread_join(jobs[i].thread, NULL);
    }
    #else
    static int ifrtpy_populate_probe(void) { return 0; }
    static void ifrtpy_prefault(char* base, size_t size, int threads) {
        for (size_t i = 0; i < size; i += 4096) ((volatile char*)base)[i] = 0;  /* any page size */
    }
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
    int ifrtpy_populate_probe() nogil
    void ifrtpy_prefault(char* base, size_t size, int threads) nogil


cdef bint _populate_supported = ifrtpy_populate_probe()


def prefault_threads():
    """How many threads :func:`prefault` should use for a fresh destination here: none
    where the kernel maps pages without writing them (a second core does it while a copy
    runs: :func:`populate_while_pending`), else up to eight, one per CPU."""
    if _populate_supported:
        return 0
    return min(8, os.cpu_count() or 1)


def prefault(cnp.ndarray out not None, threads):
    """Take the page faults of fresh ``out`` (C-contiguous) on ``threads`` threads (1 to
    16) at once, each zeroing the first byte of its slice and of each page after it: for
    a destination no copy writes yet, where the kernel cannot map pages otherwise and
    faults are dear (a sandbox: 64 MiB took 70 ms on one thread, 31 ms on eight). Blocks until done, the GIL
    released; a thread that cannot be started leaves its slice to this one."""
    cdef int count = _errors.check_int(threads, "threads", 1, 16)
    if not cnp.PyArray_IS_C_CONTIGUOUS(out):
        raise _errors.InvalidArgumentError("prefault needs a C-contiguous array")
    cdef char* base = <char*>cnp.PyArray_DATA(out)
    cdef size_t size = <size_t>cnp.PyArray_NBYTES(out)
    with nogil:
        ifrtpy_prefault(base, size, count)


cdef bint _all_ready(list events) except -1:  # events: anything with is_ready()
    for e in events:
        if not e.is_ready():
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


#: A destination this large is fresh memory: glibc serves allocations from 32 MiB on with
#: new mappings (its largest mmap threshold), whose pages all fault. Smaller ones often
#: reuse memory that is mapped already, where taking page faults ahead only costs.
FRESH_BYTES = 32 << 20
#: Threads that take a fresh destination's page faults before a copy (``prefault_fresh``);
#: 0 where the kernel maps them without writing them. 64 MiB took 70 ms on one thread in
#: the TPU machine's sandbox, 31 ms on eight, and the copy itself 11 ms.
PREFAULT_THREADS = prefault_threads()


def prefault_fresh(out):
    """Take the page faults of ``out``, fresh memory that nothing writes yet, on
    ``PREFAULT_THREADS`` threads where that pays (``FRESH_BYTES`` or more, on a kernel that
    cannot map pages without writing them); elsewhere do nothing."""
    if out.nbytes >= FRESH_BYTES and PREFAULT_THREADS > 1:
        prefault(out, PREFAULT_THREADS)
