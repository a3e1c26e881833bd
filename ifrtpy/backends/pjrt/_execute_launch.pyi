from collections.abc import Iterable, Sequence
from typing import Any

from ifrtpy._pjrt._buffer import BufferHandle
from ifrtpy._pjrt._client import DeviceHandle
from ifrtpy._pjrt._event import EventHandle
from ifrtpy._pjrt._executable import ExecutableHandle
from ifrtpy.array import Array
from ifrtpy.backends._array_fields import CheckedKinds
from ifrtpy.backends.pjrt._array_storage import ArrayCore
from ifrtpy.device import Device, DeviceList
from ifrtpy.errors import IfrtError
from ifrtpy.execute_checks import CheckedExecute
from ifrtpy.executable import ExecuteOptions, ExecuteResult

class ExecutableCore:
    _client: Any
    _handle: ExecutableHandle
    _devices: Any
    _deleted: bool
    _plan: Any
    _array_type: type[ArrayCore]
    @property
    def _checked_kinds(self) -> CheckedKinds | None: ...
    @property
    def name(self) -> str: ...
    def devices(self) -> DeviceList | None: ...
    def is_deleted(self) -> bool: ...
    def execute(self, args: Sequence[Array], options: ExecuteOptions | None = None,
                devices: Iterable[Device] | None = None) -> ExecuteResult: ...
    def __call__(self, *args: Array, **keywords: Any) -> list[Array]: ...
    def _launch(self, call: CheckedExecute) -> ExecuteResult: ...
    def _launch_buffers(self, arguments: list[Sequence[BufferHandle]], launch_id: int,
                        non_donatable: Sequence[int], device: DeviceHandle | None,
                        donated: Iterable[int]) -> tuple[tuple[tuple[BufferHandle, ...], ...],
                                                         tuple[EventHandle, ...]]: ...

def donation_refusal(argument: int, donate: bool, pins: int, donating: bool, read_only: bool,
                     exports: int) -> IfrtError | None: ...
def nested_execute_refusal(name: str, device_id: int, running: int,
                           limit: int) -> IfrtError | None: ...
