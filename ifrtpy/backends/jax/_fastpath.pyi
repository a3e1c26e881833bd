from collections.abc import Iterable, Sequence
from typing import Any

from typing_extensions import Self

from ifrtpy.array import Array
from ifrtpy.device import Device
from ifrtpy.dtypes import DType
from ifrtpy.executable import ExecuteOptions, ExecuteResult
from ifrtpy.future import Future
from ifrtpy.shape import Shape
from ifrtpy.sharding import Sharding

class JaxArrayCore:
    _client: Any
    _dtype: DType
    _shape: Shape
    _sharding: Sharding
    _value: Any
    _error: BaseException | None
    _deleted: bool
    _reads: Sequence[Future[Any]]
    def block_until_ready(self) -> Self: ...

class JaxExecutableCore:
    _client: Any
    _execute_sharded: Any
    _handlers: list[Any]
    _accepted: list[tuple[Any, ...]] | None
    _outputs_spec: tuple[tuple[DType, Shape, Sharding], ...]
    _donated: frozenset[int]
    _array_type: type[JaxArrayCore]
    def execute(self, args: Sequence[Array], options: ExecuteOptions | None = None,
                devices: Iterable[Device] | None = None) -> ExecuteResult: ...
