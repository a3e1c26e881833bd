from collections.abc import Iterable, Sequence
from typing import Any

from typing_extensions import Self

from ifrtpy.array import Array
from ifrtpy.backends._array_fields import ArrayFields, CheckedKinds
from ifrtpy.device import Device
from ifrtpy.executable import ExecuteOptions, ExecuteResult
from ifrtpy.future import Future

class JaxArrayCore(ArrayFields):
    _value: Any
    _reads: Sequence[Future[Any]]
    def block_until_ready(self) -> Self: ...

class JaxExecutableCore:
    _client: Any
    _execute_sharded: Any
    _handlers: list[Any]
    _donated: frozenset[int]
    _array_type: type[JaxArrayCore]
    _checked_kinds: CheckedKinds | None
    def execute(self, args: Sequence[Array], options: ExecuteOptions | None = None,
                devices: Iterable[Device] | None = None) -> ExecuteResult: ...
    def _outputs(self, kinds: CheckedKinds, values: Sequence[Any]) -> list[Any]: ...
