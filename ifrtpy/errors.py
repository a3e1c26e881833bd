"""Exceptions raised by ifrtpy.

Every error is an :class:`IfrtError` carrying the absl/PJRT status ``code`` it stands for
and a message. Each code has one class, which also inherits the Python builtin a caller
would naturally catch (``InvalidArgumentError`` is a ``ValueError``, ``NotFoundError`` a
``LookupError``, ...). :func:`error_from_code` maps a code to its class, and
:func:`error_from_status_text` a status in jaxlib's text form: they are the only places
where codes become exceptions, for the Cython layer, the backends and the distributed
runtime alike.
"""

from __future__ import annotations

import enum
from typing import Any, Sequence


class Code(enum.IntEnum):
    """absl::StatusCode values, which PJRT_Error_Code mirrors one to one."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class IfrtError(Exception):
    """Base of every ifrtpy error: ``code`` (a :class:`Code`) and ``message``."""

    code: Code = Code.UNKNOWN

    def __init__(self, message: str = ""):
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[type[IfrtError], tuple[str]]:
        return (type(self), (self.message,))

    def __str__(self) -> str:
        return self.message


class CancelledError(IfrtError):
    code = Code.CANCELLED


class UnknownError(IfrtError, RuntimeError):
    code = Code.UNKNOWN


class InvalidArgumentError(IfrtError, ValueError):
    code = Code.INVALID_ARGUMENT


class DeadlineExceededError(IfrtError, TimeoutError):
    code = Code.DEADLINE_EXCEEDED


class NotFoundError(IfrtError, LookupError):
    code = Code.NOT_FOUND


class AlreadyExistsError(IfrtError, ValueError):
    code = Code.ALREADY_EXISTS


class PermissionDeniedError(IfrtError, PermissionError):
    code = Code.PERMISSION_DENIED


class ResourceExhaustedError(IfrtError, MemoryError):
    code = Code.RESOURCE_EXHAUSTED


class FailedPreconditionError(IfrtError, RuntimeError):
    code = Code.FAILED_PRECONDITION


class AbortedError(IfrtError, RuntimeError):
    code = Code.ABORTED


class OutOfRangeError(IfrtError, IndexError):
    code = Code.OUT_OF_RANGE


class UnimplementedError(IfrtError, NotImplementedError):
    code = Code.UNIMPLEMENTED


class InternalError(IfrtError, RuntimeError):
    code = Code.INTERNAL


class UnavailableError(IfrtError, RuntimeError):
    code = Code.UNAVAILABLE


class DataLossError(IfrtError, RuntimeError):
    code = Code.DATA_LOSS


class UnauthenticatedError(IfrtError, PermissionError):
    code = Code.UNAUTHENTICATED


_CLASS_OF_CODE: dict[int, type[IfrtError]] = {
    cls.code: cls
    for cls in (
        CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError,
        NotFoundError, AlreadyExistsError, PermissionDeniedError, ResourceExhaustedError,
        FailedPreconditionError, AbortedError, OutOfRangeError, UnimplementedError,
        InternalError, UnavailableError, DataLossError, UnauthenticatedError,
    )
}


def error_from_code(code: int, message: str) -> IfrtError:
    """The exception for an absl/PJRT status code; an unknown code gives UnknownError."""
    cls = _CLASS_OF_CODE.get(int(code))
    if cls is None:
        return UnknownError(f"(status code {int(code)}) {message}")
    return cls(message)


def error_from_status_text(text: str) -> IfrtError:
    """The exception for a status in text form, ``"CODE: message"`` (as jaxlib's runtime
    errors read): the code's class with the message after the code, or UnknownError with
    the whole text when it starts with no code name."""
    name, sep, message = text.partition(": ")
    if sep and name in Code.__members__:
        return error_from_code(Code[name], message)
    return UnknownError(text)


def combined(errors: Sequence[IfrtError]) -> IfrtError:
    """One error for several (at least one): the first one's class, each distinct message
    once, joined by "; "."""
    return type(errors[0])("; ".join(dict.fromkeys(str(e) for e in errors)))


def describe(value: object) -> str:
    """``value`` for an error message: its repr (cut to 60 characters) and its type. A
    value with a ``debug_string()`` (an ifrtpy Array, whose repr reads its data) gives that."""
    debug_string = getattr(type(value), "debug_string", None)
    text = value.debug_string() if callable(debug_string) else repr(value)  # type: ignore[attr-defined]
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def invalid_argument(parameter: str, expected: str, got: object) -> InvalidArgumentError:
    """``InvalidArgumentError("<parameter> must be <expected>, got <repr> (<type>)")``."""
    return InvalidArgumentError(f"{parameter} must be {expected}, got {describe(got)}")


def check_type(value: object, types: type | tuple[type, ...], parameter: str,
               expected: str | None = None) -> Any:
    """Return ``value`` if it is an instance of ``types``, else raise
    :func:`invalid_argument` naming ``parameter`` (``expected`` defaults to the type names)."""
    if isinstance(value, types):
        return value
    if expected is None:
        names = [t.__name__ for t in (types if isinstance(types, tuple) else (types,))]
        expected = "a " + " or ".join(names)
    raise invalid_argument(parameter, expected, value)


def check_int(value: object, parameter: str, low: int | None = None,
              high: int | None = None) -> int:
    """``value`` as an int (anything with ``__index__``, not a bool) within
    ``[low, high]``; else InvalidArgumentError naming ``parameter`` and the bounds."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise invalid_argument(parameter, "an int", value)
    number: int = value.__index__()  # type: ignore[attr-defined]
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = (f"in [{low}, {high}]" if low is not None and high is not None
                  else f">= {low}" if low is not None else f"<= {high}")
        raise InvalidArgumentError(f"{parameter} must be {bounds}, got {number}")
    return number


def check_enum(enum_type: type, value: object, parameter: str) -> Any:
    """``enum_type(value)``, or InvalidArgumentError naming ``parameter`` and the members."""
    try:
        return enum_type(value)
    except (TypeError, ValueError):
        names = ", ".join(m.name for m in enum_type)  # type: ignore[attr-defined]
        raise invalid_argument(parameter, f"a {enum_type.__name__} ({names})", value) from None
