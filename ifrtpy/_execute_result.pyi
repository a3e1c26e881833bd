from typing import NoReturn, Sequence

from ifrtpy.array import Array
from ifrtpy.future import Future

class Outputs(list[Array]):
    def __array__(self, dtype: object = None, copy: object = None) -> NoReturn: ...

class ExecuteResult:
    status: Future[None] | None
    outputs: list[Array]
    def __init__(self, status: Future[None] | None, outputs: Sequence[Array]) -> None: ...
