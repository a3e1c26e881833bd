"""The contract of host callbacks on the PjRt backend: jax's, for the custom calls jax
lowers ``pure_callback``, ``io_callback`` and ``jax.debug.print`` to.

The callable of host callback ``index`` gets one NumPy array per operand (a copy: it may
keep it; None for a token) and returns a sequence with one value per result (any value
for a token result, which is skipped; None where there are no results). Each value must
have the result's exact dtype and shape. Sub-byte element types (int4, ...) are refused.
Anything else, or an exception, fails the execution with an error naming the callback
(InternalError on the outputs' futures); Ctrl-C during a callback run inline stays a
KeyboardInterrupt.

:func:`serving` wraps a callable into what the C layer calls
(:mod:`ifrtpy._pjrt._host_callback`: ``serve(operands, results)`` with the buffers of
the call as ``(dtype, dims, view)``, the views valid during the call only).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ifrtpy.dtypes import DType
from ifrtpy.errors import InternalError

__all__ = ["serving", "failure_message"]

#: One buffer of a call, as the C layer hands it: dtype, dims, view (or None).
Buffer = tuple[DType, tuple[int, ...], "np.ndarray | None"]


def serving(index: int, callback: Callable[..., Any]) -> Callable[[list, list], None]:
    """What the C layer calls for host callback ``index`` served by ``callback``."""

    def serve(operands: list[Buffer], results: list[Buffer]) -> None:
        try:
            args = [_operand(i, buffer) for i, buffer in enumerate(operands)]
            _fill(results, callback(*args))
        except BaseException as e:  # every failure becomes the execution's error
            kind = KeyboardInterrupt if isinstance(e, KeyboardInterrupt) else InternalError
            raise kind(failure_message(index, e)) from e

    return serve


def failure_message(index: int, e: BaseException) -> str:
    """The execution's error text when host callback ``index`` failed with ``e``."""
    what = f"host callback {index} raised {type(e).__name__}"
    try:
        text = str(e)
    except BaseException:  # a __str__ that raises
        return f"{what} (whose message could not be formatted)"
    return f"{what}: {text}"


def _operand(i: int, buffer: Buffer) -> np.ndarray | None:
    dtype, _, view = buffer
    if dtype.kind == DType.Kind.TOKEN:
        return None
    return np.array(_viewed(f"operand {i}", dtype, view))  # a copy: the view dies with the call


def _fill(results: Sequence[Buffer], values: Any) -> None:
    if values is None and not results:
        return
    values = tuple(values)
    if len(values) != len(results):
        raise ValueError(f"it returned {len(values)} values for {len(results)} results")
    for i, ((dtype, _, view), value) in enumerate(zip(results, values)):
        if dtype.kind == DType.Kind.TOKEN:
            continue
        target = _viewed(f"result {i}", dtype, view)
        array = np.asarray(value, order="C")  # 0-d stays 0-d
        if array.dtype != target.dtype or array.shape != target.shape:
            raise TypeError(f"result {i} is {array.dtype}{list(array.shape)}, the program "
                            f"takes {target.dtype}{list(target.shape)}")
        np.copyto(target, array)


def _viewed(what: str, dtype: DType, view: np.ndarray | None) -> np.ndarray:
    if view is None:
        raise TypeError(f"{what} is {dtype}: host callbacks take no sub-byte element types")
    return view
