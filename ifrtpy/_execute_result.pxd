cdef class Outputs(list):
    pass


cdef Outputs new_outputs()


cdef class ExecuteResult:
    cdef public object status
    cdef public object outputs
    cdef object __weakref__
