from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Literal, final

import numpy as np
from typing_extensions import Self

from ifrtpy._pjrt._buffer import BufferHandle
from ifrtpy._pjrt._event import EventHandle
from ifrtpy._pjrt._executable import ExecutableHandle
from ifrtpy.array import Array
from ifrtpy.device import Device
from ifrtpy.dtypes import DType
from ifrtpy.executable import ExecuteOptions, ExecuteResult
from ifrtpy.shape import Shape
from ifrtpy.sharding import Sharding
from ifrtpy.user_context import UserContext

class ArrayCore:
    _client: Any
    _dtype: DType
    _shape: Shape
    _sharding: Sharding
    _buffers: tuple[BufferHandle, ...]
    _error: BaseException | None
    _deleted: bool
    _user_context: UserContext | None
    def block_until_ready(self) -> Self: ...

class ExecutableCore:
    _client: Any
    _handle: ExecutableHandle
    _devices: Any
    _deleted: bool
    _accepted: list[Any] | None
    _outputs_spec: tuple[tuple[DType, Shape, Sharding], ...]
    _donated: frozenset[int]
    _array_type: type[ArrayCore]
    def execute(self, args: Sequence[Array], options: ExecuteOptions | None = None,
                devices: Iterable[Device] | None = None) -> ExecuteResult: ...
    def __call__(self, *args: Array, **keywords: Any) -> list[Array]: ...

def populate_while_pending(out: np.ndarray, events: Iterable[EventHandle],
                           chunk: int = ...) -> bool: ...

@final
class PopulateBehind:
    def __new__(cls, array: np.ndarray) -> Self: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]: ...
