# cython: language_level=3, binding=True, embedsignature=True
# distutils: define_macros=CYTHON_VECTORCALL_TPNEW=0
"""The fields of every array held in C (``ArrayFields``, the base of the arrays of the
backends whose execute has a C path), and the kinds of the arguments of a checked call
with the outputs they give (``CheckedKinds``), by which those C paths repeat checked calls.

An execute checks its call (``ifrtpy.execute_checks``) and launches it. Whether a later
call passes the same checks depends only on each argument's dtype, shape and sharding and
on its being live: a backend keeps the ``CheckedKinds`` of a checked call, and launches a
call whose arguments (``call_arguments``) it ``admits`` without the checks, its outputs
made by ``new_output`` (as the checked call's are) in the output shardings the checked
call worked out. Those three are inline functions of ``_array_fields.pxd``, compiled into
each backend's C path.

The module is compiled without vectorcall ``tp_new`` (``CYTHON_VECTORCALL_TPNEW=0``): the
arrays of the backends are subclasses of ``ArrayFields`` in other modules, whose
``tp_new`` calls this one's, and its vectorcall form would be reached through a shim
that packs the arguments again, 40-odd instructions of every output array made.
"""


cdef class ArrayFields:
    """The fields of an array held in C (``StoredArray``'s ``_client``, ``_dtype``,
    ``_shape``, ``_sharding``, ``_error``, ``_user_context``, and ``_deleted``)."""


cdef class CheckedKinds:
    """``arguments``: the ``(dtype, shape, sharding)`` of each argument of a checked call;
    ``outputs``: the ``(dtype, shape, sharding, ...)`` each output of such a call is made
    with (what follows the sharding is the backend's own). TypeError for an argument that
    is no ArrayFields, or an output spec that is no tuple of at least three."""

    def __init__(self, args, tuple outputs not None):
        cdef ArrayFields array
        kinds = []
        for item in args:
            array = <ArrayFields?>item
            kinds.append((array._dtype, array._shape, array._sharding))
        for spec in outputs:
            if type(spec) is not tuple or len(spec) < 3:
                raise TypeError(f"an output spec is a (dtype, shape, sharding, ...) tuple, "
                                f"got {spec!r}")
        self.arguments = tuple(kinds)
        self.outputs = outputs
