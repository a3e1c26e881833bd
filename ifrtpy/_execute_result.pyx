# cython: language_level=3, binding=True, embedsignature=True
""":class:`ExecuteResult` and :class:`Outputs`, C types because every execute makes one:
as a Python class ExecuteResult cost a tenth of a microsecond per call, 5% of the whole
execute of a small program. Re-exported by ``ifrtpy.executable``."""

from cpython.object cimport PyTypeObject

#: What NumPy is told when asked to read an execute's outputs as one array.
_NOT_ONE_ARRAY = (
    "an execute returns a list of output arrays, one per result of the program (IFRT's "
    "execute), not an array: take the output first, e.g. `out, = exe(a)` then "
    "`np.asarray(out)` (or `np.asarray(exe(a)[0])`)")


cdef extern from *:
    """
    /* Outputs keep a free list of their own, as list does: a subclass of list is otherwise
       allocated and freed through the GC's allocator on each execute (0.1 us a call). A
       freed Outputs (of exactly that type, its item array small) drops its items and waits
       here, untracked, its item array kept, for the next new_outputs. */
    #define IFRTPY_OUTPUTS_FREE 16
    static PyTypeObject* ifrtpy_outputs_type = NULL;
    static destructor ifrtpy_outputs_base_dealloc = NULL;
    static PyObject* ifrtpy_outputs_free[IFRTPY_OUTPUTS_FREE];
    static int ifrtpy_outputs_count = 0;

    static void ifrtpy_outputs_dealloc(PyObject* o) {
        PyListObject* list = (PyListObject*)o;
        Py_ssize_t i;
        if (Py_TYPE(o) != ifrtpy_outputs_type || ifrtpy_outputs_count >= IFRTPY_OUTPUTS_FREE
                || list->allocated > 16) {
            ifrtpy_outputs_base_dealloc(o);
            return;
        }
        PyObject_GC_UnTrack(o);
        i = Py_SIZE(o);
        Py_SET_SIZE(o, 0);
        while (--i >= 0)  /* may run any code: o is out of reach already */
            Py_CLEAR(list->ob_item[i]);
        if (ifrtpy_outputs_count >= IFRTPY_OUTPUTS_FREE) {
            ifrtpy_outputs_base_dealloc(o);
            return;
        }
        ifrtpy_outputs_free[ifrtpy_outputs_count++] = o;
        if (PyType_HasFeature(ifrtpy_outputs_type, Py_TPFLAGS_HEAPTYPE))
            Py_DECREF(ifrtpy_outputs_type);  /* PyObject_Init takes it again */
    }

    /* outputs[index]: an exact int in range read in place, as Python's own fast path for
       list[i] does (which takes no subclass of list); any other index as list reads it. */
    static PyObject* ifrtpy_outputs_subscript(PyObject* o, PyObject* index) {
        Py_ssize_t i, size = PyList_GET_SIZE(o);
        PyObject* item;
        if (PyLong_CheckExact(index)) {
            i = PyLong_AsSsize_t(index);
            if (i == -1 && PyErr_Occurred()) {
                PyErr_Clear();  /* out of range: list's own error below */
            } else {
                if (i < 0)
                    i += size;
                if (i >= 0 && i < size) {
                    item = PyList_GET_ITEM(o, i);
                    Py_INCREF(item);
                    return item;
                }
            }
        }
        return PyList_Type.tp_as_mapping->mp_subscript(o, index);
    }

    static void ifrtpy_outputs_install(PyTypeObject* type) {
        ifrtpy_outputs_type = type;
        ifrtpy_outputs_base_dealloc = type->tp_dealloc;
        type->tp_dealloc = ifrtpy_outputs_dealloc;
    }

    /* A new, empty Outputs: from the free list, else made by its type. */
    static PyObject* ifrtpy_outputs_new(PyObject* empty) {
        PyObject* o;
        if (ifrtpy_outputs_count > 0) {
            o = ifrtpy_outputs_free[--ifrtpy_outputs_count];
            (void)PyObject_Init(o, ifrtpy_outputs_type);
            PyObject_GC_Track(o);
            return o;
        }
        return ifrtpy_outputs_type->tp_new(ifrtpy_outputs_type, empty, NULL);
    }
    """
    void ifrtpy_outputs_install(PyTypeObject* type)
    object ifrtpy_outputs_new(object empty)
    object ifrtpy_outputs_subscript(object outputs, object index)


cdef class Outputs(list):
    """The output arrays of an execute, in the program's result order: a list, which NumPy
    refuses to read as one array (``np.asarray(exe(a))`` would stack the outputs, a mistake
    for ``out, = exe(a)``; say ``np.stack(exe(a))`` to stack them). Made and freed as
    cheaply as a list: a free list of its own, and ``outputs[i]`` read in place (above)."""

    def __array__(self, dtype=None, copy=None):
        raise TypeError(_NOT_ONE_ARRAY)

    def __getitem__(self, index):
        return ifrtpy_outputs_subscript(self, index)

    def __reduce__(self):
        return Outputs, (list(self),)


ifrtpy_outputs_install(<PyTypeObject*>Outputs)


cdef Outputs new_outputs():
    return <Outputs>ifrtpy_outputs_new(())


cdef class ExecuteResult:
    """What :meth:`LoadedExecutable.execute` returns.

    ``status`` is a future for the whole execution when ``fill_status`` was set, else
    None. ``outputs`` is the list of output arrays (:class:`Outputs`), available at once
    (their data may not be). Equal when both fields are equal; unhashable, like a list.
    """

    __match_args__ = ("status", "outputs")

    def __init__(self, status, outputs):
        self.status = status
        self.outputs = outputs if type(outputs) is Outputs else Outputs(outputs)

    def __repr__(self):
        return f"ExecuteResult(status={self.status!r}, outputs={self.outputs!r})"

    def __eq__(self, other):
        if not isinstance(other, ExecuteResult):
            return NotImplemented
        return self.status == (<ExecuteResult>other).status and self.outputs == (<ExecuteResult>other).outputs

    __hash__ = None

    def __reduce__(self):
        return type(self), (self.status, self.outputs)
