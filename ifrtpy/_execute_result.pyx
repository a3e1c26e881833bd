# cython: language_level=3, binding=True, embedsignature=True
""":class:`ExecuteResult` and :class:`Outputs`, C types because every execute makes one:
as a Python class ExecuteResult cost a tenth of a microsecond per call, 5% of the whole
execute of a small program. Re-exported by ``ifrtpy.executable``."""

#: What NumPy is told when asked to read an execute's outputs as one array.
_NOT_ONE_ARRAY = (
    "an execute returns a list of output arrays, one per result of the program (IFRT's "
    "execute), not an array: take the output first, e.g. `out, = exe(a)` then "
    "`np.asarray(out)` (or `np.asarray(exe(a)[0])`)")


cdef class Outputs(list):
    """The output arrays of an execute, in the program's result order: a list, which NumPy
    refuses to read as one array (``np.asarray(exe(a))`` would stack the outputs, a mistake
    for ``out, = exe(a)``; say ``np.stack(exe(a))`` to stack them)."""

    def __array__(self, dtype=None, copy=None):
        raise TypeError(_NOT_ONE_ARRAY)

    def __reduce__(self):
        return Outputs, (list(self),)


cdef Outputs new_outputs():
    return Outputs.__new__(Outputs)


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
