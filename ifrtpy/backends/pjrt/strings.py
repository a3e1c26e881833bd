"""STRING arrays of the PjRt backend, held on the host as IFRT's ``BasicStringArray`` is.

PJRT buffers cannot hold strings, so a STRING array keeps one read-only NumPy object
array (of ``str``/``bytes``) per addressable shard, in its sharding's device order: a
host-held array of :mod:`ifrtpy.backends.host_arrays`, whose operations the PjRt client
calls when strings are involved. XLA programs take no
strings, and there is no device memory to export: execute, DLPack and buffer pointers
refuse STRING arrays with UnimplementedError. Numeric puts never reach this module (the
put path checks for object/StringDType data only where a dtype is seen the first time).
"""

from __future__ import annotations

from typing import Any, NoReturn, Sequence

from ifrtpy.backends.host_arrays import HostArray
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError, UnimplementedError

STRING = DType(DType.Kind.STRING)


class BasicStringArray(HostArray):
    """A STRING array of a PjrtClient: ``shards[i]`` is the object array of the i-th
    addressable shard. Made by the client's operations, not by users."""

    __slots__ = ()

    def _no_device_memory(self, what: str) -> NoReturn:
        raise UnimplementedError(
            f"{what}: a STRING array is held on the host as NumPy object arrays and has no "
            f"PJRT buffer; read it with copy_to_host_buffer or numpy.asarray")

    @property
    def buffers(self) -> NoReturn:
        self._no_device_memory("buffers")

    def unsafe_buffer_pointer(self) -> NoReturn:
        self._no_device_memory("unsafe_buffer_pointer")

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> NoReturn:
        self._no_device_memory("__dlpack__ (DLPack has no string type)")

    def __dlpack_device__(self) -> NoReturn:
        self._no_device_memory("__dlpack_device__")


def is_string_call(arrays: Sequence[Any], what: str) -> bool:
    """Whether a call on ``arrays`` is a STRING one (every array a BasicStringArray);
    False when none is; InvalidArgumentError when they are mixed."""
    strings = [isinstance(a, BasicStringArray) for a in arrays]
    if not any(strings):
        return False
    if not all(strings):
        i = strings.index(False)
        raise InvalidArgumentError(
            f"{what}: array {i} is not a STRING array, array {strings.index(True)} is; STRING "
            f"arrays are held on the host and cannot be mixed with others in one call")
    return True
