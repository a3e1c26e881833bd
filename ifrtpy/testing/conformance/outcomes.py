"""How the outcome of a conformance case is judged against the skips its backend declares.

A backend declares what it does not do as a mapping from a case to a text its skip
message holds (:func:`~ifrtpy.testing.conformance.case_classes`'s ``expected_skips``).
A case name (``"test_bitcast_arrays"``) covers every parametrization of the case, a
pytest item name (``"test_copy_to_different_device[concrete]"``) one of them, and a name
two case modules share (``test_delete``) covers both. Then a case that

* passes, passes; declared, it fails: "declared as not supported, but passed";
* raises the backend's ``UnimplementedError`` in a core case
  (:data:`~ifrtpy.testing.conformance.CORE_CASES`) fails, declared or not;
* skips (an ``UnimplementedError`` in any other case, or the suite's own "needs 4
  addressable devices") is a skip when it is declared with a text its message holds, and
  fails otherwise, saying what to declare;
* fails, fails.

In a hypothesis law (:func:`reject_unimplemented`) a draw the backend raises
``UnimplementedError`` for fails a core law at once (hypothesis shrinks it to the
smallest such draw and the law fails as a core case that raised it). Any other law rejects
the draw only where the backend declares that reason for that law
(:class:`~ifrtpy.testing.conformance.declarations.Declaration`'s ``rejected_draws``),
and then says how many draws it rejected (a :class:`RejectedDraws` warning); an
undeclared one stands for the whole law, which skips with it (so is judged as above).
When hypothesis gives up because too few draws were left, the law counts as raising the
``UnimplementedError`` of its rejected draws.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import warnings
from typing import Any, Callable, Collection, Iterable, Mapping, Optional, Union

import pytest

from ifrtpy.errors import UnimplementedError
from ifrtpy.testing.conformance.declarations import Declaration


class RejectedDraws(UserWarning):
    """A law passed on the draws it kept and rejected the others, for the reason its
    backend declares (``rejected_draws``): how many, and the last draw's error."""


@dataclasses.dataclass
class _Law:
    """The running case, as its law's draws see it."""

    core: bool
    reason: Optional[str]  # the declared text of the draws it may reject
    declaration: Declaration
    draws: int = 0
    rejected: list = dataclasses.field(default_factory=list)


#: The running case (None outside :func:`judge`).
_running: contextvars.ContextVar[Optional[_Law]] = contextvars.ContextVar(
    "ifrtpy_conformance_running", default=None)


def declared() -> Declaration:
    """The declaration of the backend of the running case (an empty one outside
    :func:`judge`: every kind of array)."""
    law = _running.get()
    return Declaration() if law is None else law.declaration


def reject_unimplemented(test: Callable) -> Callable:
    """Decorate the inner test of a hypothesis law (below ``@given``). A draw for which
    the backend raises ``UnimplementedError`` is rejected (``hypothesis.reject()``) only
    where the backend declares that reason for this law and the law is not a core one;
    otherwise the error goes on, and fails the law (a core law) or stands for it (it
    skips, and is judged as a skip)."""

    @functools.wraps(test)
    def law(*args, **kwargs):
        running = _running.get()
        if running is not None:
            running.draws += 1
        try:
            return test(*args, **kwargs)
        except UnimplementedError as e:
            if running is None or running.core or running.reason is None \
                    or running.reason not in str(e):
                raise
            import hypothesis

            running.rejected.append(e)
            hypothesis.reject()

    return law


def as_declaration(declared: Union[Declaration, Mapping[str, str], None]) -> Declaration:
    """``declared`` as a Declaration: a mapping is its expected skips."""
    if isinstance(declared, Declaration):
        return declared
    return Declaration(expected_skips=declared or {})


def check_declared(expected_skips: Mapping[str, str], cases: Iterable[str]) -> dict[str, str]:
    """``expected_skips`` as a dict, once each key names one of ``cases`` (a case name,
    or a case name with a parametrization in brackets) and each reason is a non-empty
    text; ValueError otherwise."""
    declared = dict(expected_skips)
    names = set(cases)
    unknown = sorted(k for k in declared if not isinstance(k, str) or k.partition("[")[0] not in names)
    if unknown:
        raise ValueError(f"the expected skips name cases this run does not have: {unknown}")
    empty = sorted(k for k, reason in declared.items() if not isinstance(reason, str) or not reason)
    if empty:
        raise ValueError(f"the expected skips of {empty} give no reason: give a text the skip "
                         "message holds")
    return declared


def check_declaration(declared: Union[Declaration, Mapping[str, str], None],
                      cases: Iterable[str], core: Collection[str] = ()) -> Declaration:
    """``declared`` as a :class:`Declaration`, once its expected skips name cases of
    ``cases`` (:func:`check_declared`) and its rejected draws name laws among them that
    are not ``core``, each with a reason; ValueError otherwise."""
    declaration = as_declaration(declared)
    names = list(cases)
    check_declared(declaration.expected_skips, names)
    try:
        check_declared(declaration.rejected_draws, names)
    except ValueError as e:
        raise ValueError(str(e).replace("expected skips", "rejected draws")) from None
    cored = sorted(set(declaration.rejected_draws) & set(core))
    if cored:
        raise ValueError(f"the rejected draws name core laws {cored}: a core law rejects no "
                         "draw, implement what it draws")
    return declaration


def judge(run: Callable[[], object], name: str, case: str, core: bool,
          declared: Union[Declaration, Mapping[str, str], None], client: Any = None) -> None:
    """Run one case (``run()``; ``name`` is its pytest item name, ``case`` its function's
    name, ``core`` whether it is a core case, ``client`` the client it runs on) and turn
    its outcome into the verdict the module docstring gives, against ``declared`` (a
    :class:`Declaration`, or a mapping of expected skips): return for a pass, raise
    pytest's skip or failure."""
    declaration = as_declaration(declared)
    expected_skips = declaration.skips_for(client)
    key = name if name in expected_skips else case if case in expected_skips else None
    declared_skip = expected_skips.get(key) if key is not None else None
    reason = declaration.rejected_draws.get(name, declaration.rejected_draws.get(case))
    law = _Law(core, None if core else reason, declaration)
    token = _running.set(law)
    try:
        run()
    except pytest.skip.Exception as e:
        message = str(e.msg)
    except UnimplementedError as e:
        message = _unimplemented(name, core, e)
    except Exception as e:
        if not law.rejected or not _gave_up(e):
            raise
        message = _unimplemented(name, core, UnimplementedError(
            f"hypothesis gave up on the law: it rejected {len(law.rejected)} of {law.draws} "
            f"draws, for which the backend raised UnimplementedError; the last: "
            f"{law.rejected[-1]}"), cause=e)
    else:
        if key is not None:
            pytest.fail(f"{name} is declared as not supported ({declared_skip!r}), but passed: "
                        f"remove {key!r} from the declared skips", pytrace=False)
        if law.rejected:
            warnings.warn(RejectedDraws(
                f"{name} rejected {len(law.rejected)} of {law.draws} draws, for the reason "
                f"the backend declares ({reason!r}); the last: {law.rejected[-1]}"))
        return
    finally:
        _running.reset(token)
    if declared_skip is None:
        every = f" (or {case!r} for every parametrization)" if name != case else ""
        draws = ""
        if law.draws and message.startswith("UNIMPLEMENTED: ") and not law.rejected:
            draws = (f"\nOr, where the law holds for the draws the backend does implement, "
                     f"declare the draws it rejects (rejected_draws, REJECTED_DRAWS):\n"
                     f"    {case!r}: {message[len('UNIMPLEMENTED: '):]!r},")
        pytest.fail(f"{name} skipped, and the backend does not declare it: {message}\n"
                    f"If the backend does not support this, declare it in the expected skips "
                    f"handed to the suite{every}:\n    {name!r}: {message!r},{draws}\n"
                    f"else make it pass.", pytrace=False)
    if declared_skip not in message:
        pytest.fail(f"{name} is declared as not supported ({declared_skip!r}), but skipped for "
                    f"another reason: {message}\nMake it pass, or declare the reason it "
                    f"skips for now.", pytrace=False)
    pytest.skip(f"declared: {message}")


def _unimplemented(name: str, core: bool, error: UnimplementedError, cause=None) -> str:
    """The skip message of a case that raised ``error``; a failure for a core case."""
    if core:
        raise pytest.fail.Exception(
            f"{name} is a core case (ifrtpy.testing.conformance.CORE_CASES), and the backend "
            f"raised UnimplementedError: {error}\nEvery backend implements the core cases: "
            f"implement this operation (declaring the case does not excuse it)",
            pytrace=True) from (cause or error)
    return f"UNIMPLEMENTED: {error}"


def _gave_up(error: BaseException) -> bool:
    """Whether ``error`` is hypothesis giving up on a law whose draws were rejected."""
    from hypothesis.errors import FailedHealthCheck, Unsatisfiable

    return isinstance(error, (FailedHealthCheck, Unsatisfiable))
