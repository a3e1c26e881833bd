# cython: language_level=3, binding=True, embedsignature=True
"""Repeating checked calls in C, for the backends whose execute has a C path: the fields
every array of such a backend has (``ArrayFields``), and the kinds of the arguments of a
checked call with the outputs they give (``CheckedKinds``).

An execute checks its call (``ifrtpy.execute_checks``) and launches it. Whether a later
call passes the same checks depends only on each argument's dtype, shape and sharding and
on its being live: a backend keeps the ``CheckedKinds`` of a checked call, and launches a
call whose arguments it ``admits`` without the checks, its outputs made by ``new_output``
(as the checked call's are) in the output shardings the checked call worked out.
"""

from cpython.object cimport PyObject, PyTypeObject


cdef class ArrayFields:
    """The fields of an array held in C (``StoredArray``'s ``_client``, ``_dtype``,
    ``_shape``, ``_sharding``, ``_error``, ``_user_context``, and ``_deleted``)."""


cdef class CheckedKinds:
    """``arguments``: the ``(dtype, shape, sharding)`` of each argument of a checked call;
    ``outputs``: the ``(dtype, shape, sharding, ...)`` each output of such a call is made
    with (what follows the sharding is the backend's own)."""

    def __init__(self, args, tuple outputs not None):
        cdef ArrayFields array
        kinds = []
        for item in args:
            array = <ArrayFields?>item
            kinds.append((array._dtype, array._shape, array._sharding))
        self.arguments = tuple(kinds)
        self.outputs = outputs

    cdef bint admits(self, ArrayFields array, Py_ssize_t k) noexcept:
        """Whether ``array`` passes as argument ``k``: live, not an error array, its dtype
        and sharding the checked ones (the same objects), its shape the same or equal.
        Python code may run (comparing shapes): the caller holds what it read before."""
        cdef tuple kind = <tuple>self.arguments[k]
        if (array._sharding is not kind[2] or array._dtype is not kind[0] or array._deleted
                or array._error is not None):
            return False
        if array._shape is kind[1]:
            return True
        try:
            return not (array._shape != kind[1])
        except BaseException:
            return False

    cdef ArrayFields new_output(self, object array_type, Py_ssize_t k, object client,
                                object context):
        """A new ``array_type`` (an ArrayFields) for output ``k`` of ``client``, made
        under the user context ``context``, its backend fields left to the caller."""
        cdef tuple spec = <tuple>self.outputs[k]
        cdef ArrayFields array = <ArrayFields>(<PyTypeObject*>array_type).tp_new(
            array_type, <PyObject*>(), NULL)
        array._client = client
        array._dtype = spec[0]
        array._shape = spec[1]
        array._sharding = spec[2]
        array._user_context = context
        return array
