"""One record per kind of session request (:class:`Kind`): what the server knows of it.

Each module of requests (:mod:`.topology`, :mod:`.arrays`, :mod:`.executables`) lists its
kinds in ``KINDS``; :func:`ifrtpy.proxy.session.kinds` joins them, the session dispatches
by them, and :mod:`ifrtpy.proxy.fields` checks their numbers against jaxlib's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

__all__ = ["Handler", "Kind"]

#: A request handler: (session, inner request) -> the inner response (a message or its
#: serialized bytes), or None when the handler answers later itself through
#: :meth:`Session.answer_later`.
Handler = Callable[[Any, Any], Any]


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of session request, all the server knows of it: its ``handler``, the
    ``number`` of its field in ``IfrtRequest``'s oneof (checked against jaxlib's by
    :mod:`ifrtpy.proxy.fields`), and ``results``: the fields of the request holding the
    result handles the client minted, to which a failure of the request is bound."""

    handler: Handler
    number: int
    results: tuple[str, ...] = ()
