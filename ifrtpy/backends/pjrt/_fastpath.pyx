# cython: language_level=3, binding=True, embedsignature=True
"""The PjRt backend's hot paths in C: the fields of PjrtArray and repeated executes.

``ArrayCore`` holds the fields of every PjrtArray, so that :func:`execute_arrays` can
read its arguments and fill its outputs without Python attribute lookups. All semantics
stay in ``array.py`` and ``executable.py``: this module only repeats an execute whose
arguments were already checked (same dtype, shape and sharding objects as an accepted
call), and returns None otherwise so that the caller takes the checked path.
"""

cimport cython

from ifrtpy._pjrt._executable cimport ExecutableHandle


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
