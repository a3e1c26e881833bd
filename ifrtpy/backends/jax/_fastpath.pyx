# cython: language_level=3, binding=True, embedsignature=True
"""The jax backend's execute fast path in C: the fields of JaxArray and
JaxLoadedExecutable, repeated executes, and the outputs of every execute.

``JaxArrayCore`` and ``JaxExecutableCore`` hold the fields of every JaxArray and
JaxLoadedExecutable, so that an execute reads its arguments and fills its outputs without
Python attribute lookups. All semantics stay in ``array.py`` and ``executable.py``: this
module only repeats an execute whose arguments are of the kinds of a checked call
(``ifrtpy.backends._array_fields``; live, of this client) with default options and no donation,
and hands every other call to the checked path. Importing it does not import jax.
"""

from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.contextvars cimport get_value

from ifrtpy._execute_result cimport ExecuteResult, Outputs, new_outputs
from ifrtpy.backends._array_fields cimport (
    ArrayFields, CheckedKinds, admits, call_arguments, new_output)
from ifrtpy.user_context import ACTIVE as _user_context


cdef class JaxArrayCore(ArrayFields):
    """The fields of a JaxArray (see ``ifrtpy.backends.jax.array``): those of every array
    held in C, and ``_value``, the ``jax.Array`` (None once deleted or donated, and for an
    error array)."""

    cdef public object _value
    cdef public object _reads  # host copies not finished yet: a sequence of futures

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

    ``execute`` runs here, without checks, a call with default options whose arguments
    are each an ``_array_type`` of ``_client`` with a value, of the kinds of a checked call
    (``_checked_kinds``, ``ifrtpy.backends._array_fields``), when the program donates nothing.
    Every other call is checked (the interface's contract) and launched by the backend's
    ``_launch``, which keeps its kinds. Both make their outputs with ``_outputs``.
    """

    cdef public object _client
    cdef public object _execute_sharded  # jaxlib's bound execute_sharded; None once deleted
    cdef public list _handlers  # jax's result handler of each output
    cdef public frozenset _donated
    cdef public object _array_type
    cdef CheckedKinds kinds  # those of the last checked call; None: none yet
    cdef object __weakref__

    @property
    def _checked_kinds(self):
        """The CheckedKinds whose calls are repeated without checks; None until a call is
        checked."""
        return self.kinds

    @_checked_kinds.setter
    def _checked_kinds(self, CheckedKinds kinds):
        self.kinds = kinds

    def execute(self, args, options=None, devices=None):
        """See :meth:`ifrtpy.LoadedExecutable.execute`."""
        if (options is None and devices is None and self._execute_sharded is not None
                and not self._donated and (type(args) is list or type(args) is tuple)):
            result = self._repeat(args)
            if result is not None:
                return result
        return self._launch(self._execute_contract.check(self, args, options, devices))

    cdef object _repeat(self, args):
        """An ExecuteResult; None unless ``args`` are of the checked kinds."""
        cdef CheckedKinds kinds = self.kinds
        cdef tuple held = call_arguments(kinds, args)
        cdef Py_ssize_t num_args, k
        cdef object array_type = self._array_type
        cdef JaxArrayCore array
        if held is None:
            return None
        num_args = len(held)
        values = PyList_New(num_args)
        for k in range(num_args):
            item = held[k]
            if type(item) is not array_type:
                return None
            array = <JaxArrayCore>item
            value = array._value
            if (value is None or array._client is not self._client
                    or not admits(kinds, array, k)):
                return None
            Py_INCREF(value)
            PyList_SET_ITEM(values, k, value)
        try:
            outputs = self._execute_sharded(values).consume_with_handlers(self._handlers)
        except Exception as e:
            self._launch_failed(held, values, e)  # a Python method: raises
            raise
        cdef ExecuteResult result = ExecuteResult.__new__(ExecuteResult)
        result.status = None
        result.outputs = self._outputs(kinds, outputs)
        return result

    def _outputs(self, CheckedKinds kinds not None, values):
        """The output arrays of a launch, output ``k`` holding the ``jax.Array``
        ``values[k]``, made as ``kinds.outputs`` say: the one way every execute makes them."""
        cdef Py_ssize_t num_outputs = len(kinds.outputs), k
        if len(values) != num_outputs:
            raise AssertionError(f"jax returned {len(values)} outputs, expected {num_outputs}")
        cdef Outputs arrays = new_outputs()
        cdef JaxArrayCore array
        array_type, client, context = self._array_type, self._client, get_value(_user_context)
        for k in range(num_outputs):
            array = <JaxArrayCore>new_output(kinds, <PyObject*>array_type, k, <PyObject*>client,
                                             <PyObject*>context)
            array._value = values[k]
            array._reads = ()
            arrays.append(array)
        return arrays
