"""The conformance suite can fail: a backend missing a core operation, a skip it does not
declare, a declared skip that passes and a law every draw of which the backend refuses
each fail the run, naming the case and saying what to do. Each run is a pytest run of its
own (pytester, in this process) over the example backend, some of its operations
switched off."""

import pytest

pytest_plugins = ["pytester"]

MODULE = '''
import pytest
from ifrtpy.errors import UnimplementedError
from ifrtpy.testing.conformance import Declaration, case_classes
from ifrtpy.testing.example_backend import create_client

globals().update(case_classes({modules}, core_only={core_only}, expected_skips={declared}))


def switched_off(name, when=lambda *args, **kwargs: True, then=None):
    def operation(*args, **kwargs):
        if when(*args, **kwargs):
            raise UnimplementedError(f"{{name}} is switched off")
        return then(*args, **kwargs)
    return operation


@pytest.fixture(scope="module")
def client():
    client = create_client(2)
    {switch}
    return client
'''

#: Switches off copy_arrays.
NO_COPY = 'client.copy_arrays = switched_off("copy_arrays")'


def _run(pytester, *args, modules=("arrays",), core_only=False, declared=None, switch="pass"):
    """The outcome of the cases of ``modules`` (``-k`` etc. in ``args``) on the example
    backend with ``switch`` applied to its client, ``declared`` its expected skips (or the
    code of a ``Declaration``)."""
    declared = declared if isinstance(declared, str) else repr(declared or {})
    pytester.makepyfile(MODULE.format(modules=", ".join(map(repr, modules)), core_only=core_only,
                                      declared=declared, switch=switch))
    return pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", "-rfs", *args)


def _says(result, *texts):
    """Each of ``texts`` is in the run's output."""
    out = result.stdout.str() + result.stderr.str()
    for text in texts:
        assert text in out, text


def test_the_example_backend_passes_its_core_cases(pytester):
    """The baseline of the runs below: every core case of the arrays module passes."""
    result = _run(pytester, core_only=True)
    result.assert_outcomes(passed=24)


@pytest.mark.parametrize("declared", [{}, {"test_copy_arrays_exhaustive": "switched off"}],
                         ids=["undeclared", "declared"])
def test_a_core_case_raising_unimplemented_error_fails(pytester, declared):
    result = _run(pytester, core_only=True, declared=declared, switch=NO_COPY)
    outcomes = result.parseoutcomes()
    assert outcomes == {"failed": 5, "passed": 19}, outcomes
    _says(result, "test_copy_arrays_exhaustive[f32] is a core case (ifrtpy.testing.conformance."
                  "CORE_CASES), and the backend raised UnimplementedError: copy_arrays is "
                  "switched off", "Every backend implements the core cases: implement this operation",
          *(f"FAILED test_a_core_case_raising_unimplemented_error_fails.py::TestArrays::{name}"
            for name in ["test_copy_arrays_exhaustive[s4]", "test_copy_mixed_source_devices",
                         "test_make_and_copy_zero_sized_buffers",
                         "test_poisoned_zero_sized_buffers"]))


def test_a_core_law_whose_every_draw_is_refused_fails(pytester):
    result = _run(pytester, "-k", "test_copy_arrays_to_other_devices_keeps_every_value",
                  modules=("laws",), core_only=True, switch=NO_COPY)
    result.assert_outcomes(failed=1)
    _says(result, "test_copy_arrays_to_other_devices_keeps_every_value is a core case",
          "and the backend raised UnimplementedError: copy_arrays is switched off")


#: Switches off copy_arrays for arrays over two devices (a backend that implements part of
#: an operation).
NO_MULTI_DEVICE_COPY = ('client.copy_arrays = switched_off("copy_arrays of two devices", '
                        'lambda arrays, *a, **k: len(arrays[0].sharding.devices) > 1, '
                        'client.copy_arrays)')
#: Switches off assemble for arrays over two devices.
NO_MULTI_DEVICE_ASSEMBLE = (
    'client.assemble_array_from_single_device_arrays = switched_off("assemble of two devices", '
    'lambda shape, sharding, *a, **k: len(sharding.devices) > 1, '
    'client.assemble_array_from_single_device_arrays)')
COPY_LAW = "test_copy_arrays_to_other_devices_keeps_every_value"
ASSEMBLE_LAW = "test_assemble_of_disassemble_is_identity"


def test_a_core_law_fails_at_a_draw_the_backend_refuses(pytester):
    """copy_arrays refused for arrays over two devices only: the core law fails (it
    rejected those draws and passed before)."""
    result = _run(pytester, "-k", COPY_LAW, modules=("laws",), switch=NO_MULTI_DEVICE_COPY)
    result.assert_outcomes(failed=1)
    _says(result, f"{COPY_LAW} is a core case (ifrtpy.testing.conformance.CORE_CASES), and the "
                  "backend raised UnimplementedError: copy_arrays of two devices is switched off",
          "Draw 1: ")  # hypothesis shows the draw, shrunk


def test_a_law_rejects_no_draw_without_a_declared_reason(pytester):
    """assemble refused for arrays over two devices, undeclared: the law is a skip the
    backend does not declare (it rejected those draws and passed before), and the
    failure says how to declare either."""
    result = _run(pytester, "-k", ASSEMBLE_LAW, modules=("laws",),
                  switch=NO_MULTI_DEVICE_ASSEMBLE)
    result.assert_outcomes(failed=1)
    _says(result, f"{ASSEMBLE_LAW} skipped, and the backend does not declare it: "
                  "UNIMPLEMENTED: assemble of two devices is switched off",
          "declare the draws it rejects (rejected_draws, REJECTED_DRAWS):\n"
          f"    {ASSEMBLE_LAW!r}: 'assemble of two devices is switched off',")


def test_a_law_rejects_the_draws_of_a_declared_reason_and_says_how_many(pytester):
    declared = f"Declaration(rejected_draws={{{ASSEMBLE_LAW!r}: 'assemble of two devices'}})"
    result = _run(pytester, "-k", ASSEMBLE_LAW, "-W", "always", modules=("laws",),
                  declared=declared, switch=NO_MULTI_DEVICE_ASSEMBLE)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.re_match_lines([
        rf".*RejectedDraws: {ASSEMBLE_LAW} rejected [1-9]\d* of [1-9]\d* draws, for the "
        r"reason the backend declares \('assemble of two devices'\); the last: assemble of "
        r"two devices is switched off"])
    # Every draw rejected: hypothesis gives up, and the law is a skip of that error.
    switch = NO_MULTI_DEVICE_ASSEMBLE.replace("len(sharding.devices) > 1", "True")
    result = _run(pytester, "-k", ASSEMBLE_LAW, modules=("laws",), declared=declared,
                  switch=switch)
    result.assert_outcomes(failed=1)
    _says(result, f"{ASSEMBLE_LAW} skipped, and the backend does not declare it: UNIMPLEMENTED: "
                  "hypothesis gave up on the law: it rejected ")
    # Another reason than the declared one is no rejection.
    declared = f"Declaration(rejected_draws={{{ASSEMBLE_LAW!r}: 'another reason'}})"
    result = _run(pytester, "-k", ASSEMBLE_LAW, modules=("laws",), declared=declared,
                  switch=NO_MULTI_DEVICE_ASSEMBLE)
    result.assert_outcomes(failed=1)


def test_a_core_law_rejects_no_draw_whatever_is_declared(pytester):
    declared = f"Declaration(rejected_draws={{{COPY_LAW!r}: 'copy_arrays'}})"
    result = _run(pytester, modules=("laws",), declared=declared)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    _says(result, f"ValueError: the rejected draws name core laws ['{COPY_LAW}']")


#: Switches off arrays over two devices altogether.
NO_MULTI_DEVICE_ARRAYS = (
    'client.make_array_from_host_buffer = switched_off("arrays of two devices", '
    'lambda data, sharding, *a, **k: len(sharding.devices) > 1, '
    'client.make_array_from_host_buffer)')
PUT_LAW = "test_host_array_host_is_identity"


def test_single_device_arrays_are_declared_not_probed(pytester):
    """A backend without arrays over several devices fails the core law of puts unless it
    declares so (the laws probed a 2-device put and narrowed themselves before); declared,
    the laws draw single-device shardings and the law that needs two devices skips."""
    result = _run(pytester, "-k", PUT_LAW, modules=("laws",), switch=NO_MULTI_DEVICE_ARRAYS)
    result.assert_outcomes(failed=1)
    _says(result, "raised UnimplementedError: arrays of two devices is switched off")
    declared = ("Declaration(multi_device_arrays=False, expected_skips={"
                "'test_bad_assemble_raises_and_leaves_inputs_intact': 'declares none'})")
    result = _run(pytester, "-k", f"{PUT_LAW} or test_bad_assemble", modules=("laws",),
                  declared=declared, switch=NO_MULTI_DEVICE_ARRAYS)
    result.assert_outcomes(passed=1, skipped=1)
    _says(result, "declared: cannot hold arrays over several devices: ExampleClient's backend "
                  "declares none (MULTI_DEVICE_ARRAYS = False)")


def test_a_skip_the_backend_does_not_declare_fails(pytester):
    result = _run(pytester, "-k", "test_bitcast_arrays_refuses")
    result.assert_outcomes(failed=1)
    _says(result, "test_bitcast_arrays_refuses_a_different_byte_count skipped, and the backend "
                  "does not declare it: UNIMPLEMENTED: ExampleClient does not implement "
                  "bitcast_arrays\nIf the backend does not support this, declare it in the "
                  "expected skips handed to the suite:\n    'test_bitcast_arrays_refuses_a_"
                  "different_byte_count': 'UNIMPLEMENTED: ExampleClient does not implement "
                  "bitcast_arrays',\nelse make it pass.")


def test_a_declared_skip_is_a_skip_with_its_message(pytester):
    result = _run(pytester, "-k", "test_bitcast_arrays",
                  declared={"test_bitcast_arrays": "does not implement bitcast_arrays",
                            "test_bitcast_arrays_refuses_a_different_byte_count": "bitcast"})
    result.assert_outcomes(skipped=2)
    _says(result, "declared: UNIMPLEMENTED: ExampleClient does not implement bitcast_arrays")


def test_a_skip_for_another_reason_than_declared_fails(pytester):
    result = _run(pytester, "-k", "test_bitcast_arrays_refuses",
                  declared={"test_bitcast_arrays_refuses_a_different_byte_count": "no devices"})
    result.assert_outcomes(failed=1)
    _says(result, "test_bitcast_arrays_refuses_a_different_byte_count is declared as not "
                  "supported ('no devices'), but skipped for another reason: UNIMPLEMENTED: "
                  "ExampleClient does not implement bitcast_arrays")


@pytest.mark.parametrize("key", ["test_copy_to_same_devices", "test_copy_to_different_device[concrete]"])
def test_a_declared_skip_that_passes_fails(pytester, key):
    result = _run(pytester, "-k", key.partition("[")[0], declared={key: "not supported"})
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 1, outcomes
    _says(result, "is declared as not supported ('not supported'), but passed: remove "
                  f"{key!r} from the declared skips")


def test_declaring_a_case_there_is_not_is_an_error(pytester):
    result = _run(pytester, declared={"test_no_such_case": "gone"})
    assert result.ret == pytest.ExitCode.INTERRUPTED
    _says(result, "ValueError: the expected skips name cases this run does not have: "
                  "['test_no_such_case']")


def test_the_plugin_reads_the_declared_skips_from_the_command_line(pytester):
    pytester.makepyfile(declared='SKIPS = {"test_bitcast_arrays": "bitcast_arrays"}')
    pytester.syspathinsert()
    args = ["-q", "-p", "no:cacheprovider", "-p", "ifrtpy.testing.conformance.plugin", "--pyargs",
            "ifrtpy.testing.conformance", "-k", "test_bitcast_arrays",
            "--ifrtpy-backend=ifrtpy.testing.example_backend:create_client"]
    result = pytester.runpytest_inprocess(*args, "--ifrtpy-expected-skips=declared:SKIPS")
    result.assert_outcomes(skipped=1, failed=1)
    _says(result, "FAILED arrays.py::test_bitcast_arrays_refuses_a_different_byte_count")
    result = pytester.runpytest_inprocess(*args, "--ifrtpy-expected-skips=declared:NOTHING")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    _says(result, "--ifrtpy-expected-skips=declared:NOTHING: module 'declared' has no attribute")


def test_the_plugin_uses_the_declaration_the_backend_ships_unless_one_is_given(pytester):
    """The example backend ships its declaration in its module (both bitcast cases); a
    declaration on the command line (a whole module, --ifrtpy-declaration) replaces it."""
    pytester.makepyfile(decl='EXPECTED_SKIPS = {"test_bitcast_arrays": "bitcast_arrays"}')
    pytester.syspathinsert()
    args = ["-q", "-p", "no:cacheprovider", "-p", "ifrtpy.testing.conformance.plugin", "--pyargs",
            "ifrtpy.testing.conformance", "-k", "test_bitcast_arrays",
            "--ifrtpy-backend=ifrtpy.testing.example_backend:create_client"]
    result = pytester.runpytest_inprocess(*args)
    result.assert_outcomes(skipped=2)
    result = pytester.runpytest_inprocess(*args, "--ifrtpy-declaration=decl")
    result.assert_outcomes(skipped=1, failed=1)
    result = pytester.runpytest_inprocess(*args, "--ifrtpy-declaration=decl",
                                          "--ifrtpy-expected-skips=decl:EXPECTED_SKIPS")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
