from cpython.object cimport PyObject, PyTypeObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE


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


# The uses of CheckedKinds, inline in each backend's C path (written here, once).

cdef inline tuple call_arguments(CheckedKinds kinds, object args):
    """The arguments of a call (``args``: a list or a tuple) as a tuple, when there are as
    many as ``kinds`` has (else None): a list is copied first, for comparing shapes
    (``admits``) may run Python code, which may change it; the call is what it held."""
    if kinds is None:
        return None
    cdef tuple held = args if type(args) is tuple else tuple(args)
    if PyTuple_GET_SIZE(held) != PyTuple_GET_SIZE(kinds.arguments):
        return None
    return held


cdef inline bint admits(CheckedKinds kinds, ArrayFields array, Py_ssize_t k) noexcept:
    """Whether ``array`` passes as argument ``k`` (< ``len(kinds.arguments)``) of a call of
    ``kinds``: live, not an error array, its dtype and sharding the checked ones (the same
    objects), its shape the same or equal. Python code may run (comparing shapes): the
    caller holds what it read before."""
    cdef tuple kind = <tuple>PyTuple_GET_ITEM(kinds.arguments, k)
    if (array._sharding is not <object>PyTuple_GET_ITEM(kind, 2)
            or array._dtype is not <object>PyTuple_GET_ITEM(kind, 0)
            or array._deleted or array._error is not None):
        return False
    shape = <object>PyTuple_GET_ITEM(kind, 1)
    if array._shape is shape:
        return True
    try:
        return not (array._shape != shape)
    except BaseException:
        return False


cdef inline ArrayFields new_output(CheckedKinds kinds, PyObject* array_type, Py_ssize_t k,
                                   PyObject* client, PyObject* context):
    """A new ``array_type`` (an ArrayFields) for output ``k`` (< ``len(kinds.outputs)``) of
    a call of ``kinds``, of ``client``, made under the user context ``context`` (the three
    held by the caller): its dtype, shape and sharding those of ``kinds.outputs[k]``, its
    backend fields left to the caller. The one way every execute of a backend with a C
    path makes its outputs."""
    cdef PyObject* spec = PyTuple_GET_ITEM(kinds.outputs, k)
    cdef ArrayFields array = <ArrayFields>(<PyTypeObject*>array_type).tp_new(
        <type>array_type, <PyObject*>(), NULL)
    array._client = <object>client
    array._dtype = <object>PyTuple_GET_ITEM(<tuple>spec, 0)
    array._shape = <object>PyTuple_GET_ITEM(<tuple>spec, 1)
    array._sharding = <object>PyTuple_GET_ITEM(<tuple>spec, 2)
    array._user_context = <object>context
    return array
