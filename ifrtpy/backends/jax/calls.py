"""Calls into jax's runtime: 64-bit dtypes kept whatever ``jax_enable_x64`` says, and
jaxlib's runtime errors as the ifrtpy errors of their status codes."""

from __future__ import annotations

from typing import Any, Callable

from ifrtpy import _jaxlib
from ifrtpy.errors import Code, error_from_code, error_from_status_text

__all__ = ["translate", "call_jax"]

#: jaxlib reports a failed gloo collective (CPU, several processes) with status UNKNOWN;
#: what failed is in its text: another process gone, or not there in time.
_GLOO_CAUSES = (("Connection closed by peer", Code.UNAVAILABLE),
                ("Connection reset by peer", Code.UNAVAILABLE),
                ("Connection refused", Code.UNAVAILABLE),
                ("pair closure", Code.UNAVAILABLE),  # a connection closed by an earlier failure
                ("Timed out", Code.DEADLINE_EXCEEDED))


def translate(error: BaseException) -> BaseException:
    """jax's runtime error as the ifrtpy error of its status code (others unchanged); a
    failed gloo collective as UnavailableError (a process gone) or DeadlineExceededError
    (a process late past the collective timeout)."""
    if not isinstance(error, _jaxlib.runtime_error_type()):
        return error
    translated = error_from_status_text(str(error))
    if translated.code == Code.UNKNOWN and "Gloo" in translated.message:
        code = next((c for needle, c in _GLOO_CAUSES if needle in translated.message), None)
        if code is not None:
            return error_from_code(code, translated.message)
    return translated


def call_jax(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with 64-bit dtypes kept and jax's errors made ifrtpy's."""
    import jax

    try:
        with jax.enable_x64(True):
            return fn(*args, **kwargs)
    except Exception as e:
        translated = translate(e)
        if translated is e:
            raise
        raise translated from None
