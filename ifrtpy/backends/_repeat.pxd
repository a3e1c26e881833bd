cdef class ArrayFields:
    cdef public object _client
    cdef public object _dtype
    cdef public object _shape
    cdef public object _sharding
    cdef public object _error
    cdef public bint _deleted
    cdef public object _user_context
    cdef object __weakref__


cdef class CheckedKinds:
    cdef readonly tuple arguments
    cdef readonly tuple outputs

    cdef bint admits(self, ArrayFields array, Py_ssize_t k) noexcept
    cdef ArrayFields new_output(self, object array_type, Py_ssize_t k, object client,
                                object context)
