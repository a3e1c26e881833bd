cdef class ExecuteResult:
    cdef public object status
    cdef public object outputs
    cdef object __weakref__
