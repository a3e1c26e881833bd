# cython: language_level=3, binding=True, embedsignature=True
""":class:`ExecuteResult`, a C type because every execute makes one: as a Python class
it cost a tenth of a microsecond per call, 5% of the whole execute of a small program.
Re-exported by ``ifrtpy.executable``."""

cdef class ExecuteResult:
    """What :meth:`LoadedExecutable.execute` returns.

    ``status`` is a future for the whole execution when ``fill_status`` was set, else
    None. ``outputs`` is the list of output arrays, available at once (their data may not
    be). Equal when both fields are equal; unhashable, like a list.
    """

    __match_args__ = ("status", "outputs")

    def __init__(self, status, outputs):
        self.status = status
        self.outputs = outputs

    def __repr__(self):
        return f"ExecuteResult(status={self.status!r}, outputs={self.outputs!r})"

    def __eq__(self, other):
        if not isinstance(other, ExecuteResult):
            return NotImplemented
        return self.status == (<ExecuteResult>other).status and self.outputs == (<ExecuteResult>other).outputs

    __hash__ = None

    def __reduce__(self):
        return type(self), (self.status, self.outputs)
