"""One record per kind of session request (:class:`Kind`): what the server knows of it,
and :class:`Later`, what a handler returns whose answer waits on a future.

Each module of requests (:mod:`.topology`, :mod:`.arrays`, :mod:`.executables`) lists its
kinds in ``KINDS``; :func:`ifrtpy.proxy.session.kinds` joins them, the session dispatches
by them, and :mod:`ifrtpy.proxy.fields` checks their numbers against jaxlib's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

__all__ = ["Handler", "Kind", "Later"]

#: A request handler: (session, inner request) -> the inner response (a message or its
#: serialized bytes), or a :class:`Later` whose future the answer waits on. It runs on
#: the session's worker thread, never on the server's event loop.
Handler = Callable[[Any, Any], Any]


@dataclasses.dataclass(frozen=True)
class Later:
    """The answer of the request being handled once ``future`` completes: ``make()`` (a
    message or its serialized bytes) on success, the future's error otherwise. The
    session binds it to the request that returned it, whatever runs meanwhile."""

    future: Any
    make: Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of session request, all the server knows of it: its ``handler``, the
    ``number`` of its field in ``IfrtRequest``'s oneof (checked against jaxlib's by
    :mod:`ifrtpy.proxy.fields`), and ``results``: the fields of the request holding the
    result handles the client minted, to which a failure of the request is bound."""

    handler: Handler
    number: int
    results: tuple[str, ...] = ()
