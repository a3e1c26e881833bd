"""ifrtpy.errors: one class per status code, builtin bases, pickling, unknown codes."""

from __future__ import annotations

import pickle

import pytest

from ifrtpy import errors
from ifrtpy.errors import Code, IfrtError, error_from_code

# code -> (class, the builtin a caller would catch)
EXPECTED = {
    Code.CANCELLED: (errors.CancelledError, IfrtError),
    Code.UNKNOWN: (errors.UnknownError, RuntimeError),
    Code.INVALID_ARGUMENT: (errors.InvalidArgumentError, ValueError),
    Code.DEADLINE_EXCEEDED: (errors.DeadlineExceededError, TimeoutError),
    Code.NOT_FOUND: (errors.NotFoundError, LookupError),
    Code.ALREADY_EXISTS: (errors.AlreadyExistsError, ValueError),
    Code.PERMISSION_DENIED: (errors.PermissionDeniedError, PermissionError),
    Code.RESOURCE_EXHAUSTED: (errors.ResourceExhaustedError, MemoryError),
    Code.FAILED_PRECONDITION: (errors.FailedPreconditionError, RuntimeError),
    Code.ABORTED: (errors.AbortedError, RuntimeError),
    Code.OUT_OF_RANGE: (errors.OutOfRangeError, IndexError),
    Code.UNIMPLEMENTED: (errors.UnimplementedError, NotImplementedError),
    Code.INTERNAL: (errors.InternalError, RuntimeError),
    Code.UNAVAILABLE: (errors.UnavailableError, RuntimeError),
    Code.DATA_LOSS: (errors.DataLossError, RuntimeError),
    Code.UNAUTHENTICATED: (errors.UnauthenticatedError, PermissionError),
}

ERROR_CODES = [c for c in Code if c != Code.OK]


def test_every_error_code_has_an_expectation():
    assert set(EXPECTED) == set(ERROR_CODES)


def test_codes_match_absl_numbering():
    assert [int(c) for c in Code] == list(range(17))
    assert Code.INVALID_ARGUMENT == 3 and Code.UNIMPLEMENTED == 12 and Code.UNAUTHENTICATED == 16


@pytest.mark.parametrize("code", ERROR_CODES, ids=lambda c: c.name)
def test_code_maps_to_its_class(code):
    cls, builtin = EXPECTED[code]
    err = error_from_code(code, "boom")
    assert type(err) is cls
    assert err.code == code
    assert isinstance(err, IfrtError) and isinstance(err, builtin) and isinstance(err, Exception)
    assert str(err) == "boom" and err.message == "boom"


@pytest.mark.parametrize("code", ERROR_CODES, ids=lambda c: c.name)
def test_plain_int_code_is_accepted(code):
    assert type(error_from_code(int(code), "x")) is EXPECTED[code][0]


@pytest.mark.parametrize("code", ERROR_CODES, ids=lambda c: c.name)
def test_pickle_keeps_class_code_and_message(code):
    err = error_from_code(code, "message with 'quotes' and ünïcode")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert back.code == err.code and back.message == err.message and str(back) == str(err)


def test_classes_are_distinct():
    classes = [cls for cls, _ in EXPECTED.values()]
    assert len(set(classes)) == len(classes)


@pytest.mark.parametrize("code", [17, 99, -1, 1000])
def test_unknown_code_gives_unknown_error_naming_the_code(code):
    err = error_from_code(code, "strange")
    assert type(err) is errors.UnknownError
    assert err.code == Code.UNKNOWN
    assert f"status code {code}" in str(err) and "strange" in str(err)


def test_ok_code_is_not_an_error_class():
    # OK has no class of its own; mapping it is a caller bug and yields UnknownError.
    assert type(error_from_code(Code.OK, "ok?")) is errors.UnknownError


def test_raise_and_catch_by_builtin():
    with pytest.raises(ValueError, match="bad arg"):
        raise error_from_code(Code.INVALID_ARGUMENT, "bad arg")
    with pytest.raises(NotImplementedError):
        raise errors.UnimplementedError("nope")
    with pytest.raises(IfrtError):
        raise errors.NotFoundError("missing")


def test_default_message_is_empty():
    err = errors.InternalError()
    assert err.message == "" and str(err) == ""


def test_argument_checks_name_the_parameter_and_what_it_got():
    import enum

    class Color(enum.IntEnum):
        RED = 0
        BLUE = 1

    assert errors.check_type([1], (list, tuple), "dims") == [1]
    with pytest.raises(errors.InvalidArgumentError, match=r"^dims must be a list or tuple, got 'x' \(str\)$"):
        errors.check_type("x", (list, tuple), "dims")
    assert errors.check_int(5, "n", 0, 9) == 5 and errors.check_int(Color.BLUE, "n") == 1
    for bad, message in [(True, r"n must be an int, got True \(bool\)"),
                         (1.5, r"n must be an int, got 1.5 \(float\)"),
                         (10, r"n must be in \[0, 9\], got 10"),
                         (-1, r"n must be in \[0, 9\], got -1")]:
        with pytest.raises(errors.InvalidArgumentError, match=message):
            errors.check_int(bad, "n", 0, 9)
    with pytest.raises(errors.InvalidArgumentError, match=r"n must be >= 1, got 0"):
        errors.check_int(0, "n", 1)
    assert errors.check_enum(Color, 1, "color") is Color.BLUE
    with pytest.raises(errors.InvalidArgumentError, match=r"color must be a Color \(RED, BLUE\), got 7"):
        errors.check_enum(Color, 7, "color")
    long = "y" * 100
    assert errors.describe(long).endswith("... (str)") and len(errors.describe(long)) < 80
