from typing import Sequence

from ifrtpy.array import Array
from ifrtpy.future import Future

class ExecuteResult:
    status: Future[None] | None
    outputs: list[Array]
    def __init__(self, status: Future[None] | None, outputs: Sequence[Array]) -> None: ...
