"""One record per kind of session request (:class:`Kind`): what the server knows of it.

Each module of requests (:mod:`.topology`, :mod:`.arrays`, :mod:`.executables`) lists its
kinds in ``KINDS``; :func:`ifrtpy.proxy.session.kinds` joins them, the session dispatches
by them, and :mod:`ifrtpy.proxy.fields` checks their numbers against jaxlib's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

__all__ = ["Handler", "Kind", "never_blocks"]

#: A request handler: (session, inner request) -> the inner response (a message or its
#: serialized bytes), or None when the handler answers later itself through
#: :meth:`Session.answer_later`.
Handler = Callable[[Any, Any], Any]


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of session request, all the server knows of it: its ``handler``, the
    ``number`` of its field in ``IfrtRequest``'s oneof (checked against jaxlib's by
    :mod:`ifrtpy.proxy.fields`), and ``results``: the fields of the request holding the
    result handles the client minted, to which a failure of the request is bound;
    ``cannot_block``: None (the default) where a request of the kind may block, so it is
    always handled by the session's worker; else a test, (session, inner request) -> bool,
    True where this request cannot block (nor raise from the test itself): it may then be
    handled on the server's event loop while the session's worker is idle (DESIGN 20)."""

    handler: Handler
    number: int
    results: tuple[str, ...] = ()
    cannot_block: Callable[[Any, Any], bool] | None = None


def never_blocks(session: Any, request: Any) -> bool:
    """``cannot_block`` of a kind whose handler never blocks (it answers at once, or
    later through :meth:`Session.answer_later`)."""
    return True
