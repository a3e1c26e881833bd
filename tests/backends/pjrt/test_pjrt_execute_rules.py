"""The PjRt backend's rules of a launch, each on its own and through execute.

The C layer counts (buffer pins, the executions of callback programs in flight per device)
and the backend decides: the donation rules (``_execute_launch.donation_refusal``), the limit of
executes made inside host callbacks (``_execute_launch.nested_execute_refusal``, with the limit of
each platform in ``execute_limits``), and the launch plan, worked out from one parse of the
optimized module.
"""

from __future__ import annotations

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy import _pjrt
from ifrtpy.backends.pjrt import execute_limits, launch_plan
from ifrtpy.backends.pjrt._execute_launch import donation_refusal, nested_execute_refusal
from ifrtpy.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError

from pjrt_helpers import assert_survives


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=2)


# -- the donation rules -------------------------------------------------------------------

FREE = dict(pins=0, donating=False, read_only=False, exports=0)


@pytest.mark.parametrize("donate", [False, True])
def test_a_buffer_nobody_holds_is_handed_over(donate):
    assert donation_refusal(3, donate, **FREE) is None


@pytest.mark.parametrize("donate", [False, True])
def test_a_buffer_another_execute_donates_is_refused(donate):
    error = donation_refusal(3, donate, **{**FREE, "pins": 1, "donating": True})
    assert isinstance(error, InvalidArgumentError)
    assert str(error).startswith("argument 3 is being donated")


def test_reads_share_a_buffer():
    assert donation_refusal(0, False, **{**FREE, "pins": 5}) is None
    assert donation_refusal(0, False, **{**FREE, "read_only": True, "exports": 2}) is None


@pytest.mark.parametrize("state, error_type, text", [
    (dict(pins=1), InvalidArgumentError, "argument 2 cannot be donated: an execute"),
    (dict(read_only=True), InvalidArgumentError, "argument 2 views memory its DLPack producer "
                                                 "marked read-only"),
    (dict(exports=1), FailedPreconditionError, "argument 2 is donated, but DLPack exports"),
])
def test_a_donation_needs_the_buffer_to_itself(state, error_type, text):
    error = donation_refusal(2, True, **{**FREE, **state})
    assert isinstance(error, error_type) and str(error).startswith(text)


DONATING_ADD = """
func.func public @main(%x: tensor<4xf32> {jax.buffer_donor = true}, %y: tensor<4xf32>)
    -> tensor<4xf32> {
  %z = stablehlo.add %x, %y : tensor<4xf32>
  return %z : tensor<4xf32>
}"""


def _donating_add(client):
    """``x + y`` on f32[4] (one device), donating parameter 0."""
    return client.compile(ifrt.HloProgram(DONATING_ADD), ifrt.CompileOptions(
        devices=client.make_device_list(client.devices()[:1])))


def test_an_argument_given_twice_once_donated_is_refused(client):
    exe = _donating_add(client)
    a = ifrt.device_put(np.ones(4, np.float32), client.devices()[0])
    with pytest.raises(InvalidArgumentError, match="argument 1 is being donated"):
        exe(a, a)
    assert not a.is_deleted()  # refused before the plugin had anything
    b = ifrt.device_put(np.ones(4, np.float32), client.devices()[0])
    out, = exe(b, a)
    np.testing.assert_array_equal(np.asarray(out), np.full(4, 2, np.float32))
    assert b.is_deleted() and not a.is_deleted()


def test_a_viewed_argument_is_not_donated_on_the_repeated_call_either(client):
    """The rules hold on the C path as on the checked one: they are applied as the buffers
    are pinned, whichever path launches."""
    exe = _donating_add(client)
    device = client.devices()[0]
    y = ifrt.device_put(np.ones(4, np.float32), device)
    exe(ifrt.device_put(np.ones(4, np.float32), device), y)  # checked: its kinds repeat
    assert exe._checked_kinds is not None
    x = ifrt.device_put(np.ones(4, np.float32), device)
    view = np.asarray(x)  # a NumPy view of x's buffer
    with pytest.raises(FailedPreconditionError, match="argument 0 is donated, but DLPack"):
        exe(x, y)
    assert not x.is_deleted()
    np.testing.assert_array_equal(view, np.ones(4, np.float32))


# -- the limit of executes made inside host callbacks ---------------------------------------

def test_below_the_limit_an_execute_inside_a_callback_runs():
    assert nested_execute_refusal("f", 0, 31, 32) is None


def test_at_the_limit_an_execute_inside_a_callback_is_refused():
    error = nested_execute_refusal("f", 5, 32, 32)
    assert isinstance(error, ResourceExhaustedError)
    assert "'f' inside a host callback refused: 32 executions" in str(error)
    assert "in flight on device 5" in str(error) and "at most 32 executions" in str(error)


def test_the_limit_is_the_platforms():
    assert execute_limits.max_executions_per_device("cpu") == 32
    # not measured (libtpu, CUDA): no execute is refused there
    assert execute_limits.max_executions_per_device("tpu") is None
    assert execute_limits.max_executions_per_device("cuda") is None


def test_the_launch_plan_takes_its_platforms_limit(client):
    exe = _donating_add(client)
    assert exe._plan.max_executions == 32


def test_the_table_sets_the_limit_of_executes_nested_through_callbacks():
    """A platform limited to 2 executions per device: an execute nested 2 deep is refused,
    1 deep runs, and the count of executions in flight comes back to 0."""
    assert_survives("""
        import numpy as np, ifrtpy as ifrt
        from ifrtpy import _pjrt
        from ifrtpy.backends.pjrt import execute_limits
        execute_limits.MAX_EXECUTIONS_PER_DEVICE = {"cpu": 2}
        c = ifrt.get_client("pjrt", device_count=1)
        d = c.devices()[0]
        def run(depth):
            def host(t):
                return np.asarray(exe(ifrt.device_put(t + 1, d))[0]) if t[0] < depth else t
            global exe
            b = ifrt.builder.Builder("p"); v = b.parameter((4,), np.float32)
            exe = c.compile(b.build(b.host_callback(host, [v], ((4,), np.float32))))
            return np.asarray(exe(ifrt.device_put(np.zeros(4, np.float32), d))[0])
        print(run(1)[0])
        try:
            run(2)
        except ifrt.errors.IfrtError as e:
            print("refused", "2 executions of programs with host callbacks" in str(e))
        print("in flight", _pjrt._executable.callback_executions(d._handle))
        print("alive")
    """, "1.0", "refused True", "in flight 0", timeout=60)


# -- the C layer's counts ---------------------------------------------------------------------

def test_a_buffer_reports_its_pins_only_while_an_execute_holds_it(client):
    exe = _donating_add(client)
    a = ifrt.device_put(np.ones(4, np.float32), client.devices()[0])
    buffer = a.buffers[0]
    assert (buffer.pins, buffer.donating, buffer.read_only) == (0, False, False)
    exe(ifrt.device_put(np.ones(4, np.float32), client.devices()[0]), a)
    assert (buffer.pins, buffer.donating) == (0, False)


# -- the launch plan --------------------------------------------------------------------------

def test_the_optimized_module_is_parsed_once_per_executable(client, monkeypatch):
    """The shardings, the layouts of the plan and the layout queries come from one parse."""
    parsed = []
    read = launch_plan.optimized_module

    def counting(handle):
        parsed.append(handle)
        return read(handle)

    monkeypatch.setattr(launch_plan, "optimized_module", counting)
    b = ifrt.builder.Builder("parsed_once")  # a program of its own: not in the compile memo
    x = b.parameter((8, 2), np.float32, sharding="{devices=[2,1]0,1}")
    exe = client.compile(b.build(b.add(x, x)), ifrt.CompileOptions(
        devices=client.make_device_list(client.devices()), num_partitions=2,
        compilation_cache_dir=False))
    sharding = exe.parameter_shardings()[0]
    a = client.make_array_from_host_buffer(np.ones((8, 2), np.float32), sharding)
    for _ in range(3):
        out, = exe(a)
    exe.parameter_layouts(), exe.output_layouts(), exe.output_shardings()
    np.testing.assert_array_equal(np.asarray(out), np.full((8, 2), 2, np.float32))
    assert exe.parameter_shardings()[0].shard_shape(ifrt.Shape([8, 2])) == ifrt.Shape([4, 2])
    assert len(parsed) == 1
