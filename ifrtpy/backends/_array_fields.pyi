from collections.abc import Iterable
from typing import Any

from ifrtpy.dtypes import DType
from ifrtpy.shape import Shape
from ifrtpy.sharding import Sharding
from ifrtpy.user_context import UserContext

class ArrayFields:
    _client: Any
    _dtype: DType
    _shape: Shape
    _sharding: Sharding
    _error: BaseException | None
    _deleted: bool
    _user_context: UserContext | None

class CheckedKinds:
    @property
    def arguments(self) -> tuple[tuple[DType, Shape, Sharding], ...]: ...
    @property
    def outputs(self) -> tuple[tuple[Any, ...], ...]: ...
    def __init__(self, args: Iterable[ArrayFields], outputs: tuple[tuple[Any, ...], ...]) -> None: ...
