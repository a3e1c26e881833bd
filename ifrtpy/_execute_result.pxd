cdef class ExecuteResult:
    cdef public object status
    cdef public list outputs
