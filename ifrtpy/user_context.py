"""User contexts: what a user ties to the runtime work of an IFRT call (IFRT's
``user_context.h``), e.g. a request id or the stack that made the call.

While a :class:`UserContextScope` is open, every array and executable made on that thread
(or asyncio task) records its context: ``value.user_context`` is the context that was
active at the call that made it (a put, an assemble, a copy, a reshard, an execute for
its outputs; a compile or deserialize for an executable), None outside any scope.
"""

from __future__ import annotations

import contextvars
from typing import Any

from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError, check_type

__all__ = ["UserContext", "UserContextScope", "current_user_context", "ACTIVE"]


class UserContext:
    """A context to tie to runtime work: a non-zero 64-bit ``fingerprint`` identifying it
    and a human-readable ``debug_string``. Subclass it to carry more (override the two
    methods to compute them)."""

    __slots__ = ("_fingerprint", "_description")

    def __init__(self, fingerprint: int, description: str = ""):
        if not isinstance(fingerprint, int) or isinstance(fingerprint, bool) or not (
                0 < fingerprint < 2**64):
            raise InvalidArgumentError(
                f"a UserContext fingerprint is a non-zero uint64 (0 is reserved for the "
                f"runtime), got {fingerprint!r}")
        check_type(description, str, "UserContext description", "a str")
        self._fingerprint = fingerprint
        self._description = description

    def fingerprint(self) -> int:
        """A non-zero uint64 identifying the context."""
        return self._fingerprint

    def debug_string(self) -> str:
        """A description, for logs and error messages."""
        return self._description or f"UserContext({self._fingerprint})"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.fingerprint()}: {self.debug_string()}>"


#: The context of the current thread or task (for code that reads it on a hot path; open
#: a :class:`UserContextScope` to set it).
ACTIVE: contextvars.ContextVar[UserContext | None] = contextvars.ContextVar(
    "ifrtpy_user_context", default=None)


def current_user_context() -> UserContext | None:
    """The context of the innermost open :class:`UserContextScope` of this thread or
    task; None outside any scope."""
    return ACTIVE.get()


class UserContextScope:
    """``with UserContextScope(context):`` makes ``context`` the active one for the block
    on this thread (or task); leaving the block makes the innermost scope still open there
    the active one again. Scopes nest, and one scope object may be open in several threads
    and tasks at once (each enter pairs with an exit on the same thread or task). Leaving a
    scope out of order closes it where it sits; leaving one that is not open on this thread
    or task is a FailedPreconditionError that changes nothing."""

    __slots__ = ("_context",)

    def __init__(self, context: UserContext):
        check_type(context, UserContext, "UserContextScope context", "a UserContext")
        self._context = context

    @staticmethod
    def current() -> UserContext | None:
        """Same as :func:`current_user_context`."""
        return ACTIVE.get()

    def __enter__(self) -> UserContext:
        _set_open(_OPEN.get() + (self,))
        return self._context

    def __exit__(self, *exc_info: Any) -> None:
        open_scopes = _OPEN.get()
        for i in range(len(open_scopes) - 1, -1, -1):
            if open_scopes[i] is self:
                _set_open(open_scopes[:i] + open_scopes[i + 1:])
                return
        raise FailedPreconditionError(
            f"UserContextScope of {self._context!r} is not open on this thread or task: "
            "leave a scope on the thread or task that entered it")


#: The scopes open on this thread or task, innermost last.
_OPEN: contextvars.ContextVar[tuple[UserContextScope, ...]] = contextvars.ContextVar(
    "ifrtpy_user_context_scopes", default=())


def _set_open(open_scopes: tuple[UserContextScope, ...]) -> None:
    _OPEN.set(open_scopes)
    ACTIVE.set(open_scopes[-1]._context if open_scopes else None)
