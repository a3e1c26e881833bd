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

In a hypothesis law a draw the backend raises ``UnimplementedError`` for is rejected
(:func:`reject_unimplemented`); when hypothesis gives up because too few draws were left,
the law counts as raising that ``UnimplementedError``.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Callable, Iterable, Mapping, Optional

import pytest

from ifrtpy.errors import UnimplementedError

#: The UnimplementedErrors of the draws the running law rejected (None outside a law).
_rejected: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar(
    "ifrtpy_conformance_rejected", default=None)


def reject_unimplemented(test: Callable) -> Callable:
    """Decorate the inner test of a hypothesis law (below ``@given``): a draw for which
    the backend raises ``UnimplementedError`` is rejected (``hypothesis.reject()``), so
    the law goes on with the other draws."""

    @functools.wraps(test)
    def law(*args, **kwargs):
        try:
            return test(*args, **kwargs)
        except UnimplementedError as e:
            import hypothesis

            rejected = _rejected.get()
            if rejected is not None:
                rejected.append(e)
            hypothesis.reject()

    return law


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


def judge(run: Callable[[], object], name: str, case: str, core: bool,
          expected_skips: Mapping[str, str]) -> None:
    """Run one case (``run()``; ``name`` is its pytest item name, ``case`` its function's
    name, ``core`` whether it is a core case) and turn its outcome into the verdict the
    module docstring gives: return for a pass, raise pytest's skip or failure."""
    key = name if name in expected_skips else case if case in expected_skips else None
    declared = expected_skips.get(key) if key is not None else None
    rejected: list = []
    token = _rejected.set(rejected)
    try:
        run()
    except pytest.skip.Exception as e:
        message = str(e.msg)
    except UnimplementedError as e:
        message = _unimplemented(name, core, e)
    except Exception as e:
        if not rejected or not _gave_up(e):
            raise
        message = _unimplemented(name, core, UnimplementedError(
            f"hypothesis gave up on the law: the backend raised UnimplementedError for "
            f"{len(rejected)} draws; the last: {rejected[-1]}"), cause=e)
    else:
        if key is not None:
            pytest.fail(f"{name} is declared as not supported ({declared!r}), but passed: "
                        f"remove {key!r} from the declared skips", pytrace=False)
        return
    finally:
        _rejected.reset(token)
    if declared is None:
        every = f" (or {case!r} for every parametrization)" if name != case else ""
        pytest.fail(f"{name} skipped, and the backend does not declare it: {message}\n"
                    f"If the backend does not support this, declare it in the expected skips "
                    f"handed to the suite{every}:\n    {name!r}: {message!r},\n"
                    f"else make it pass.", pytrace=False)
    if declared not in message:
        pytest.fail(f"{name} is declared as not supported ({declared!r}), but skipped for "
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
