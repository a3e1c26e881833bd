cimport cython
from cpython.object cimport PyObject
from ifrtpy._pjrt._buffer cimport BufferHandle, NewBuffer
from ifrtpy.backends._array_fields cimport ArrayFields


cdef class ArrayCore(ArrayFields):
    cdef BufferHandle _buffer  # the only buffer, where there is one; else None
    cdef tuple _shards  # the buffers, where not one BufferHandle; else None
    # An output's only buffer, before its handle was asked for (else NULL): owned here,
    # with a reference to its ClientHandle (which keeps the plugin alive) of its own,
    # which the collector sees (ifrtpy_traverse_made_client) but never clears.
    cdef NewBuffer _made
    cdef PyObject* _made_client
    cdef public object _layout  # None: the default layout of its memory

    @cython.final
    cdef void _drop_made(self) noexcept
    @cython.final
    cdef BufferHandle _only_buffer(self)
    @cython.final
    cdef int _wait(self, object item) except -1
