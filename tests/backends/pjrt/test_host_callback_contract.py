"""The PjRt backend's contract of host callbacks (ifrtpy.backends.pjrt.host_callbacks), in
Python: the buffers of a call as the C layer hands them, ``(dtype, dims, view)``, NumPy
arrays standing for the plugin's memory."""

import numpy as np
import pytest

from ifrtpy.backends.pjrt.host_callbacks import failure_message, serving
from ifrtpy.dtypes import DType
from ifrtpy.errors import InternalError

F32 = DType.from_numpy(np.float32)
TOKEN = DType(DType.Kind.TOKEN)
S4 = DType(DType.Kind.S4)


def _operand(values):
    view = np.array(values, np.float32)
    view.flags.writeable = False  # the C layer's operand views are read-only
    return F32, view.shape, view


def _result(shape):
    view = np.zeros(shape, np.float32)
    return F32, view.shape, view


def test_operands_are_copies_the_callable_may_keep():
    kept = []
    operand = _operand([1, 2, 3])
    serving(0, lambda x: kept.append(x))([operand], [])
    memory = operand[2]
    memory.flags.writeable = True
    memory[:] = 0  # the plugin reuses the memory once the call returns
    np.testing.assert_array_equal(kept[0], [1, 2, 3])
    assert kept[0].flags.writeable


def test_results_are_written_into_the_programs_buffers():
    out = [_result((3,)), _result(())]
    serving(0, lambda x: (x * 2, np.float32(7)))([_operand([1, 2, 3])], out)
    np.testing.assert_array_equal(out[0][2], [2, 4, 6])
    assert out[1][2] == 7


def test_a_token_operand_is_none_and_a_token_result_is_skipped():
    seen = []
    out = [(TOKEN, (), None), _result((1,))]
    serving(0, lambda t, x: (seen.append(t), x))([(TOKEN, (), None), _operand([5])], out)
    assert seen == [None]
    np.testing.assert_array_equal(out[1][2], [5])


def test_no_results_take_none():
    serving(0, lambda: None)([], [])


@pytest.mark.parametrize("returned, message", [
    ((np.zeros(3, np.float64),), r"result 0 is float64\[3\], the program takes float32\[3\]"),
    ((np.zeros(2, np.float32),), r"result 0 is float32\[2\], the program takes float32\[3\]"),
    ((np.zeros(3, np.float32), 1), "it returned 2 values for 1 results"),
    (None, "NoneType"),  # not a sequence
])
def test_a_result_of_another_count_dtype_or_shape_fails_naming_the_callback(returned, message):
    with pytest.raises(InternalError, match=f"host callback 4 raised .*{message}"):
        serving(4, lambda: returned)([], [_result((3,))])


def test_sub_byte_element_types_are_refused():
    with pytest.raises(InternalError, match="operand 0 is s4: host callbacks take no sub-byte"):
        serving(0, lambda x: None)([(S4, (2,), None)], [])
    with pytest.raises(InternalError, match="result 0 is s4: host callbacks take no sub-byte"):
        serving(0, lambda: (0,))([], [(S4, (2,), None)])


def test_an_exception_becomes_the_executions_error_naming_the_callback():
    def fail():
        raise ValueError("no such value")

    with pytest.raises(InternalError, match="^host callback 2 raised ValueError: no such value$"):
        serving(2, fail)([], [])


def test_ctrl_c_stays_a_keyboard_interrupt():
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt, match="host callback 1 raised KeyboardInterrupt"):
        serving(1, interrupted)([], [])


def test_a_message_that_cannot_be_formatted():
    class Odd(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert failure_message(3, Odd()) == "host callback 3 raised Odd (whose message could not be formatted)"
