# cython: language_level=3, binding=True, embedsignature=True
"""The jax backend's execute fast path in C: the fields of JaxArray and
JaxLoadedExecutable, and repeated executes.

``JaxArrayCore`` and ``JaxExecutableCore`` hold the fields of every JaxArray and
JaxLoadedExecutable, so that an execute reads its arguments and fills its outputs without
Python attribute lookups. All semantics stay in ``array.py`` and ``executable.py``: this
module only repeats an execute whose arguments are of the kinds a checked call accepted
(same dtype, shape and sharding objects, live, of this client) with default options and no
donation, and hands every other call to ``_execute_checked``. Importing it does not
import jax.
"""

from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.contextvars cimport get_value

from ifrtpy._execute_result cimport ExecuteResult
from ifrtpy.user_context import ACTIVE as _user_context


cdef class JaxArrayCore:
    """The fields of a JaxArray (see ``ifrtpy.backends.jax.array``): ``_value`` is the
    ``jax.Array`` (None once deleted or donated, and for an error array)."""

    cdef public object _client
    cdef public object _dtype
    cdef public object _shape
    cdef public object _sharding
    cdef public object _value
    cdef public object _error
    cdef public bint _deleted
    cdef public object _reads  # host copies not finished yet: a sequence of futures
    cdef public object _user_context
    cdef object __weakref__

    def block_until_ready(self):
        """Wait (jax releases the GIL) until the data is ready; raise the array's error,
        FailedPreconditionError once deleted; return the array."""
        if self._error is not None:
            raise self._error
        value = self._value
        if value is not None:
            try:
                value.block_until_ready()
                return self
            except Exception as e:
                error = e
        else:
            error = None
        self._wait_failed(error)  # a Python method of JaxArray: raises
        return self


cdef class JaxExecutableCore:
    """The fields of a JaxLoadedExecutable and the C half of its ``execute``.

    ``execute`` runs here a call with default options whose arguments are each an
    ``_array_type`` of ``_client`` with a value and the ``(dtype, shape, sharding)``
    objects of ``_accepted`` for its parameter, when the program donates nothing. Every
    other call goes to ``_execute_checked``, the interface's execute (``ifrtpy.executable``),
    which checks the whole contract; the backend's ``_launch`` then sets ``_accepted``.
    """

    cdef public object _client
    cdef public object _execute_sharded  # jaxlib's bound execute_sharded; None once deleted
    cdef public list _handlers  # jax's result handler of each output
    cdef public list _accepted  # per parameter: the (dtype, shape, sharding) last checked
    cdef public tuple _outputs_spec  # (dtype, shape, sharding) of each output
    cdef public frozenset _donated
    cdef public object _array_type
    cdef object __weakref__

    def execute(self, args, options=None, devices=None):
        """See :meth:`ifrtpy.LoadedExecutable.execute`."""
        if (options is None and devices is None and self._execute_sharded is not None
                and not self._donated and (type(args) is list or type(args) is tuple)):
            result = self._execute_accepted(args)
            if result is not None:
                return result
        return self._execute_checked(args, options, devices)

    cdef object _execute_accepted(self, args):
        """An ExecuteResult; None unless ``args`` are of the accepted kinds."""
        cdef list accepted = self._accepted
        cdef tuple spec = self._outputs_spec
        cdef Py_ssize_t num_args = len(args), num_outputs = len(spec), k
        cdef object array_type = self._array_type
        cdef JaxArrayCore array
        cdef tuple seen
        if accepted is None or num_args != len(accepted):
            return None
        values = PyList_New(num_args)
        for k in range(num_args):
            item = args[k]
            if type(item) is not array_type:
                return None
            array = <JaxArrayCore>item
            seen = <tuple?>accepted[k]
            value = array._value
            if (value is None or array._sharding is not seen[2] or array._dtype is not seen[0]
                    or array._shape is not seen[1] or array._client is not self._client):
                return None
            Py_INCREF(value)
            PyList_SET_ITEM(values, k, value)
        try:
            outputs = self._execute_sharded(values).consume_with_handlers(self._handlers)
        except Exception as e:
            self._launch_failed(args, values, e)  # a Python method: raises
            raise
        if len(outputs) != num_outputs:
            raise AssertionError(f"jax returned {len(outputs)} outputs, expected {num_outputs}")
        arrays = PyList_New(num_outputs)
        context = get_value(_user_context)
        for k in range(num_outputs):
            seen = <tuple>spec[k]
            array = <JaxArrayCore>(<PyTypeObject*>array_type).tp_new(array_type, <PyObject*>(), NULL)
            array._client = self._client
            array._dtype = seen[0]
            array._shape = seen[1]
            array._sharding = seen[2]
            array._value = outputs[k]
            array._reads = ()
            array._user_context = context
            Py_INCREF(array)
            PyList_SET_ITEM(arrays, k, array)
        cdef ExecuteResult result = ExecuteResult.__new__(ExecuteResult)
        result.status = None
        result.outputs = arrays
        return result
