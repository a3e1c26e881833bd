cdef bint in_host_callback() noexcept nogil
cdef void forget_interrupt() noexcept nogil
cdef bint take_interrupt() noexcept nogil
