"""RemapPlan: port of IFRT's remap_plan_test.cc (``mappings`` form) on 6 devices of the
example backend (the first 4 addressable), value-type checks, and hypothesis laws over
random valid plans."""

import pickle
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ifrtpy.array import ArrayCopySemantics, ArraySpec
from ifrtpy.device import DeviceList
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.remap import Interval, Mapping, RemapPlan, remap_arrays
from ifrtpy.shape import Shape
from ifrtpy.sharding import ConcreteEvenSharding, ConcreteSharding, SingleDeviceSharding
from ifrtpy.testing.example_backend import create_client

CLIENT = create_client(6, addressable_device_count=4,
                       memory_kinds=("device", "pinned_host", "unpinned_host"))
S32 = DType(DType.Kind.S32)
F32 = DType(DType.Kind.F32)
REUSE = ArrayCopySemantics.REUSE_INPUT
DONATE = ArrayCopySemantics.DONATE_INPUT
COPY = ArrayCopySemantics.ALWAYS_COPY


def devs(*ids):
    return DeviceList(CLIENT.lookup_device(i) for i in ids)


def spec(device_ids, shape=(2, 3), shard_shape=(2, 3), dtype=S32, memory_kind=None,
         layout=None):
    sharding = ConcreteEvenSharding(devs(*device_ids), shape, shard_shape,
                                    memory_kind=memory_kind)
    return ArraySpec(dtype, Shape(shape), sharding, layout)


def dummy_spec():
    """IFRT's GetDummySpec: s32[4,3] in two [2,3] shards on devices 0 and 1."""
    return spec([0, 1], (4, 3), (2, 3))


def m(in_array, out_array, from_, to):
    return Mapping(in_array, out_array, [Interval(*i) for i in from_],
                   [Interval(*i) for i in to])


def identity(in_array=0, out_array=0, n=1):
    return m(in_array, out_array, [(0, n, 1)], [(0, n, 1)])


def raises(plan, message):
    with pytest.raises(InvalidArgumentError) as info:
        plan.validate()
    assert message in str(info.value), str(info.value)
    return info.value


# -- Interval and Mapping ----------------------------------------------------------------------

def test_interval_is_a_slice():
    i = Interval(1, 6, 2)
    assert (i.start, i.end, i.step) == (1, 6, 2)
    assert list(i.indices()) == [1, 3, 5] == list(range(6))[i.to_slice()]
    assert i.num_steps() == len(i) == 3
    assert len(Interval(3, 1)) == 0
    assert Interval(0, 4) == Interval(0, 4, 1) == Interval.from_slice(slice(None, 4))
    assert Interval.from_slice(slice(1, 6, 2)) == i
    assert i.debug_string() == str(i) == "[1:6:2]"
    assert eval(repr(i)) == i
    assert hash(Interval(1, 6, 2)) == hash(i) and Interval(1, 6, 3) != i


@pytest.mark.parametrize("step", [0, -1])
def test_interval_step_must_be_positive(step):
    with pytest.raises(InvalidArgumentError, match=f"step must be positive, but is {step}"):
        Interval(0, 1, step)


def test_interval_rejects_non_ints():
    with pytest.raises(InvalidArgumentError):
        Interval(0.5, 1)
    with pytest.raises(InvalidArgumentError):
        Interval.from_slice(slice(0, None))


def test_mapping_value():
    a = Mapping(0, 1, [Interval(0, 2)], [Interval(2, 4)])
    assert a == Mapping(0, 1, [slice(0, 2)], [(2, 4)]) == Mapping(0, 1, Interval(0, 2), [(2, 4, 1)])
    assert a.from_ == (Interval(0, 2),) and a.to == (Interval(2, 4),)
    assert a.num_shards() == 2
    assert a.debug_string() == "Mapping(in_array=0,out_array=1,from=[[0:2:1]],to=[[2:4:1]])"
    assert eval(repr(a)) == a and hash(eval(repr(a))) == hash(a)
    assert a != Mapping(1, 1, [Interval(0, 2)], [Interval(2, 4)])
    assert pickle.loads(pickle.dumps(a)) == a


def test_plan_arguments_are_checked():
    with pytest.raises(InvalidArgumentError, match="input_specs\\[0\\] must be an ArraySpec"):
        RemapPlan([object()], [dummy_spec()], [])
    with pytest.raises(InvalidArgumentError, match="expected a Mapping"):
        RemapPlan([dummy_spec()], [dummy_spec()], [object()])
    plan = RemapPlan([dummy_spec()], [dummy_spec()], [(0, 0, [(0, 2)], [(0, 2)])])
    assert plan.mappings == (identity(n=2),)


# -- remap_plan_test.cc ------------------------------------------------------------------------

def test_empty_input_specs():
    raises(RemapPlan([], [spec([0])], []), "Must have at least one input")


def test_empty_output_specs():
    raises(RemapPlan([spec([0])], [], []), "Must have at least one output")


def test_null_input_sharding():
    plan = RemapPlan([spec([0]), ArraySpec(S32, Shape((2, 3)), None)], [spec([0])],
                     [identity()])
    raises(plan, "Input array 1 has null sharding")


def test_null_output_sharding():
    plan = RemapPlan([spec([0])], [spec([0]), ArraySpec(S32, Shape((2, 3)), None)],
                     [identity(), identity(0, 1)])
    raises(plan, "Output array 1 has null sharding")


def test_empty_mappings():
    plan = RemapPlan([spec([0]), spec([0], dtype=F32)], [spec([0])], [])
    raises(plan, "Must have at least one mapping")


def test_mixed_dtype():
    s32, f32 = spec([0]), spec([0], dtype=F32)
    plan = RemapPlan([s32, f32], [f32, s32], [identity(0, 1), identity(1, 0)])
    plan.validate()
    assert plan.shard_moves() == [[(1, 0)], [(0, 0)]]


def test_invalid_output_dtype():
    plan = RemapPlan([spec([0])], [spec([0], dtype=F32)], [identity()])
    err = raises(plan, "Input and output must have the same dtype")
    assert "s32" in str(err).lower() and "f32" in str(err).lower()


def test_invalid_output_dtype_from_mixed_input_dtypes():
    s32 = spec([0, 1], (4, 3), (2, 3))
    f32 = spec([0, 1], (4, 3), (2, 3), dtype=F32)
    plan = RemapPlan([s32, f32], [f32],
                     [m(0, 0, [(0, 1, 1)], [(0, 1, 1)]), m(1, 0, [(1, 2, 1)], [(1, 2, 1)])])
    raises(plan, "Input and output must have the same dtype")


def test_invalid_shard_shape():
    plan = RemapPlan([spec([0])], [spec([0], (3, 2), (3, 2))], [identity()])
    raises(plan, "Input and output must have the same shard shape")


def test_invalid_shard_shape_per_shard():
    """Uneven (ConcreteSharding) arrays are compared shard by shard."""
    uneven = ArraySpec(S32, Shape((5, 3)), ConcreteSharding(devs(0, 1), (5, 3), [(2, 3), (3, 3)]))
    even = spec([0, 1], (4, 3), (2, 3))
    RemapPlan([uneven], [uneven], [identity(n=2)]).validate()
    plan = RemapPlan([uneven], [even], [identity(n=2)])
    raises(plan, "Input and output must have the same shard shape: output array 0 shard 1 "
                 "is [2,3], but input array 0 shard 1 is [3,3]")


def test_invalid_memory_kind():
    plan = RemapPlan([spec([0], memory_kind="host")], [spec([0])], [identity()])
    raises(plan, "Input and output must have the same memory kind")
    # The default kind is canonicalized against the device: "device" == default.
    RemapPlan([spec([0], memory_kind="device")], [spec([0])], [identity()]).validate()


def test_invalid_layout():
    plan = RemapPlan([spec([0], layout="{1,0}")], [spec([0], layout="{0,1}")], [identity()])
    raises(plan, "Input and output must have the same layout")


def test_valid_layout_from_different_layout_objects():
    plan = RemapPlan([spec([0], layout="".join(["{0", ",1}"]))], [spec([0], layout="{0,1}")],
                     [identity()])
    plan.validate()


def test_invalid_input_array_index():
    plan = RemapPlan([spec([0])], [spec([0])], [identity(1, 0)])
    err = raises(plan, "mappings[0].in_array must be in [0, 0], but is 1")
    assert "Input array index 1 is out of range" in str(err)


def test_invalid_output_array_index():
    plan = RemapPlan([spec([0])], [spec([0])], [identity(0, 1)])
    err = raises(plan, "mappings[0].out_array must be in [0, 0], but is 1")
    assert "Output array index 1 is out of range" in str(err)


def test_invalid_interval_count():
    plan = RemapPlan([spec([0])], [spec([0])], [m(0, 0, [(0, 1, 1), (0, 1, 1)], [(0, 1, 1)])])
    raises(plan, "mappings[0].from and mappings[0].to must have the same number of "
                 "intervals, but has 2 and 1 intervals")


def run_shard_index(from_, to, shape=(2, 3), shard_shape=(2, 3)):
    num_shards = 1
    for d, s in zip(shape, shard_shape):
        num_shards *= d // s
    ids = list(range(num_shards))
    plan = RemapPlan([spec(ids, shape, shard_shape)], [spec(ids, shape, shard_shape)],
                     [Mapping(0, 0, [Interval(*from_)], [Interval(*to)])])
    with pytest.raises(InvalidArgumentError) as info:
        plan.validate()
    return str(info.value)


@pytest.mark.parametrize("from_, to, shape, message", [
    ((-1, 1, 1), (0, 1, 1), (2, 3), "start must be in [0, 0], but is -1"),
    ((1, 1, 1), (0, 1, 1), (2, 3), "start must be in [0, 0], but is 1"),
    ((0, 1, 1), (-1, 1, 1), (2, 3), "start must be in [0, 0], but is -1"),
    ((0, 1, 1), (1, 1, 1), (2, 3), "start must be in [0, 0], but is 1"),
    ((0, -1, 1), (0, 1, 1), (2, 3), "end must be in [0, 1] if step is 1, but is -1"),
    ((0, 2, 1), (0, 1, 1), (2, 3), "end must be in [0, 1] if step is 1, but is 2"),
    ((0, 1, 1), (0, -1, 1), (2, 3), "end must be in [0, 1] if step is 1, but is -1"),
    ((0, 1, 1), (0, 2, 1), (2, 3), "end must be in [0, 1] if step is 1, but is 2"),
    ((0, 6, 2), (0, 2, 1), (4, 6), "end must be in [0, 5] if step is 2, but is 6"),
    ((0, 3, 2), (0, 2, 1), (4, 3), "interval addresses shard 2, which is out of range [0, 2)"),
    ((0, 2, 1), (0, 3, 2), (4, 3), "interval addresses shard 2, which is out of range [0, 2)"),
])
def test_invalid_shard_index(from_, to, shape, message):
    assert message in run_shard_index(from_, to, shape)


def test_invalid_shard_index_names_the_interval():
    assert run_shard_index((0, 2, 1), (0, 1, 1)).startswith("mappings[0].from[0]: ")
    assert run_shard_index((0, 1, 1), (0, 2, 1)).startswith("mappings[0].to[0]: ")


def test_step_count_mismatch():
    s = spec([0, 1], (4, 3), (2, 3))
    plan = RemapPlan([s], [s], [m(0, 0, [(0, 2, 1)], [(0, 1, 1)])])
    raises(plan, "mappings[0].from[0] and mappings[0].to[0] must have the same number of "
                 "steps, but were 2 and 1 ([0:2:1] vs. [0:1:1])")


def test_already_used_input_shard():
    plan = RemapPlan([spec([0])], [spec([0, 1], (4, 3), (2, 3))],
                     [m(0, 0, [(0, 1, 1), (0, 1, 1)], [(0, 1, 1), (1, 2, 1)])])
    raises(plan, "Input array 0 shard 0 is already used")


def test_already_used_input_shard_across_mappings():
    s = dummy_spec()
    plan = RemapPlan([s], [s, s], [identity(0, 0, 2), identity(0, 1, 2)])
    raises(plan, "Input array 0 shard 0 is already used")


def test_unassigned_output_shard():
    plan = RemapPlan([spec([0])], [spec([0, 1], (4, 3), (2, 3))], [identity()])
    raises(plan, "Output array 0 shard 1 is unassigned")


def test_unassigned_output():
    s = dummy_spec()
    plan = RemapPlan([s], [s, s], [identity(0, 0, 2)])
    raises(plan, "Output array 1 shard 0 is unassigned")


def test_already_assigned_output_shard():
    plan = RemapPlan([spec([0, 1], (4, 3), (2, 3))], [spec([0])],
                     [m(0, 0, [(0, 1, 1), (1, 2, 1)], [(0, 1, 1), (0, 1, 1)])])
    raises(plan, "Output array 0 shard 0 is already assigned")


def test_invalid_output_devices():
    plan = RemapPlan([spec([0, 1], (4, 3), (2, 3))], [spec([1, 0], (4, 3), (2, 3))],
                     [identity(n=2)])
    err = raises(plan, "Output array 0 devices and sharding devices do not match: Expected "
                       "[example_device_1,example_device_0], but got "
                       "[example_device_0,example_device_1]")
    assert ("output shard 0 is on example_device_1, but input array 0 shard 0 is on "
            "example_device_0") in str(err)


def test_input_shard_device_must_match_output_shard_device():
    """Even when the output's device list is otherwise a valid target, a shard may not move."""
    plan = RemapPlan([spec([0]), spec([1])], [spec([0, 1], (4, 3), (2, 3))],
                     [m(0, 0, [(0, 1, 1)], [(1, 2, 1)]), m(1, 0, [(0, 1, 1)], [(0, 1, 1)])])
    raises(plan, "Output array 0 devices and sharding devices do not match")


def test_check_one_input_to_one_output():
    s = dummy_spec()
    plan = RemapPlan([s], [s], [identity(n=2)])
    plan.check_array_copy_semantics(REUSE)
    plan.check_array_copy_semantics(DONATE)


def test_check_one_input_to_multiple_outputs():
    s = dummy_spec()
    plan = RemapPlan([s], [s, s], [identity(0, 0, 2), identity(0, 1, 2)])
    plan.check_array_copy_semantics(REUSE)
    plan.check_array_copy_semantics(DONATE)


def test_check_multiple_inputs_to_one_output():
    s = dummy_spec()
    plan = RemapPlan([s, s], [s], [identity(0, 0, 2), identity(1, 0, 2)])
    with pytest.raises(InvalidArgumentError,
                       match="kDonateInput is required if multiple inputs are mapped to one "
                             "output"):
        plan.check_array_copy_semantics(REUSE)
    plan.check_array_copy_semantics(DONATE)


def test_always_copy_is_refused():
    s = dummy_spec()
    plan = RemapPlan([s], [s], [identity(n=2)])
    with pytest.raises(InvalidArgumentError, match="ALWAYS_COPY"):
        plan.check_array_copy_semantics(COPY)
    with pytest.raises(InvalidArgumentError, match="Invalid ArrayCopySemantics"):
        plan.check_array_copy_semantics(7)
    plan.check_array_copy_semantics(int(REUSE))


def test_hash_and_equality():
    s32, f32 = spec([0]), spec([0], dtype=F32)
    plans = [
        RemapPlan([], [], []),
        RemapPlan([s32, f32], [], []),
        RemapPlan([s32, f32], [f32, s32], [identity(1, 0), identity(0, 1)]),
        RemapPlan([s32, f32], [f32, s32], [identity(0, 1), identity(1, 0)]),
        RemapPlan([s32, f32], [s32, f32], [identity(0, 0), identity(1, 1)]),
    ]
    for a in plans:
        for b in plans:
            assert (a == b) == (a is b)
    copies = [RemapPlan(p.input_specs, p.output_specs, list(p.mappings)) for p in plans]
    for a, b in zip(plans, copies):
        assert a == b and hash(a) == hash(b)
    assert len(set(plans + copies)) == len(plans)


def test_pickle_round_trip():
    """The Python counterpart of ToFromProto."""
    sharding = ConcreteEvenSharding(devs(0, 1, 2, 3), (20, 20), (5, 20))
    s = ArraySpec(F32, Shape((20, 20)), sharding)
    plan = RemapPlan([s, s], [s, s], [
        m(0, 1, [(0, 2, 1), (2, 4, 1)], [(0, 2, 1), (2, 4, 1)]),
        m(1, 0, [(0, 4, 2), (1, 4, 2)], [(0, 4, 2), (1, 4, 2)]),
    ])
    plan.validate()
    copy = pickle.loads(pickle.dumps(plan))
    assert copy == plan and hash(copy) == hash(plan)
    assert copy.output_specs[0].sharding.devices == devs(0, 1, 2, 3)
    assert copy.shard_moves() == plan.shard_moves() == [
        [(1, 0), (1, 1), (1, 2), (1, 3)], [(0, 0), (0, 1), (0, 2), (0, 3)]]
    assert "RemapPlan(input_specs=" in plan.debug_string()
    assert "Mapping(in_array=1,out_array=0,from=[[0:4:2],[1:4:2]],to=[[0:4:2],[1:4:2]])" \
        in plan.debug_string()


def test_strided_mapping_with_end_past_the_shard_count():
    """FromProtoWithMappings: [1:5:2] on 4 shards picks shards 1 and 3."""
    sharding = ConcreteEvenSharding(devs(0, 1, 2, 3), (20, 20), (5, 20))
    s = ArraySpec(F32, Shape((20, 20)), sharding)
    swapped = ArraySpec(F32, Shape((20, 20)), sharding.with_device_assignment(devs(1, 0, 3, 2)))
    swap = RemapPlan([s], [swapped], [m(0, 0, [(1, 5, 2), (0, 4, 2)], [(0, 4, 2), (1, 5, 2)])])
    swap.validate()
    assert swap.shard_moves() == [[(0, 1), (0, 0), (0, 3), (0, 2)]]


def test_interleave_and_deinterleave_shard_moves():
    """The plans of remap_impl_test_lib's InterleaveArrays / DeinterleaveArrays."""
    a, b = spec([0, 1], (4, 3)), spec([2, 3], (4, 3))
    out = spec([0, 2, 1, 3], (8, 3))
    interleave = RemapPlan([a, b], [out], [m(0, 0, [(0, 2, 1)], [(0, 4, 2)]),
                                           m(1, 0, [(0, 2, 1)], [(1, 4, 2)])])
    assert interleave.shard_moves() == [[(0, 0), (1, 0), (0, 1), (1, 1)]]
    with pytest.raises(InvalidArgumentError, match="kDonateInput is required"):
        interleave.check_array_copy_semantics(REUSE)
    deinterleave = RemapPlan([out], [a, b], [m(0, 0, [(0, 4, 2)], [(0, 2, 1)]),
                                             m(0, 1, [(1, 4, 2)], [(0, 2, 1)])])
    assert deinterleave.shard_moves() == [[(0, 0), (0, 2)], [(0, 1), (0, 3)]]
    deinterleave.check_array_copy_semantics(REUSE)


def test_non_addressable_shards_are_planned_like_the_others():
    """Shard indices count every device (4 and 5 are not addressable here)."""
    plan = RemapPlan([spec([3, 4, 5], (6, 3))], [spec([5, 4, 3], (6, 3))],
                     [Mapping(0, 0, [Interval(2, 3), Interval(1, 2), Interval(0, 1)],
                              [Interval(0, 1), Interval(1, 2), Interval(2, 3)])])
    assert plan.shard_moves() == [[(0, 2), (0, 1), (0, 0)]]


def test_single_device_sharding_specs():
    s0 = ArraySpec(S32, Shape((2, 3)), SingleDeviceSharding(CLIENT.lookup_device(0)))
    s1 = ArraySpec(S32, Shape((2, 3)), SingleDeviceSharding(CLIENT.lookup_device(1)))
    pair = spec([0, 1], (4, 3))
    RemapPlan([s0, s1], [pair], [m(0, 0, [(0, 1, 1)], [(0, 1, 1)]),
                                 m(1, 0, [(0, 1, 1)], [(1, 2, 1)])]).validate()


def test_validate_is_cached_and_errors_are_not():
    s = dummy_spec()
    bad = RemapPlan([s], [s], [identity(n=1)])
    for _ in range(2):
        raises(bad, "Output array 0 shard 1 is unassigned")
    good = RemapPlan([s], [s], [identity(n=2)])
    good.validate()
    moves = good.shard_moves()
    moves[0].append("mutated")
    assert good.shard_moves() == [[(0, 0), (0, 1)]]


# -- remap_arrays: the argument checks that need no backend --------------------------------------

def test_remap_arrays_refuses_bad_semantics_and_counts_before_touching_arrays():
    s = dummy_spec()
    plan = RemapPlan([s, s], [s], [identity(0, 0, 2), identity(1, 0, 2)])
    with pytest.raises(InvalidArgumentError, match="kDonateInput is required"):
        remap_arrays(None, plan, [], REUSE)
    with pytest.raises(InvalidArgumentError, match="ALWAYS_COPY"):
        remap_arrays(None, plan, [], COPY)
    with pytest.raises(InvalidArgumentError, match="RemapArrays expects 2 input arrays, but got 1"):
        remap_arrays(None, plan, [object()], DONATE)
    with pytest.raises(InvalidArgumentError, match="RemapArrays expects input #0 to be an Array"):
        remap_arrays(None, plan, [object(), object()], DONATE)
    with pytest.raises(InvalidArgumentError, match="expects a RemapPlan"):
        remap_arrays(None, "plan", [], DONATE)


# -- laws over random valid plans ---------------------------------------------------------------

@st.composite
def valid_plans(draw, make_spec=None, num_devices=6):
    """A random valid plan and the (in_array, in_shard) each output shard should take.

    ``make_spec(device_ids, shape, shard_shape, dtype)`` builds the specs (default: on the
    fake devices); arrays are [2n, 3] in n shards of [2, 3] on distinct devices."""
    make_spec = spec if make_spec is None else make_spec
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    dtypes = [S32, F32]
    num_inputs = draw(st.integers(1, 3))
    inputs = []  # (device ids, dtype)
    for _ in range(num_inputs):
        ids = draw(st.lists(st.integers(0, num_devices - 1), min_size=1, max_size=4,
                            unique=True))
        inputs.append((ids, draw(st.sampled_from(dtypes))))
    shards = [(a, k) for a, (ids, _) in enumerate(inputs) for k in range(len(ids))]
    used = [s for s in shards if draw(st.booleans()) or s == shards[0]]
    rng.shuffle(used)
    # Each output holds shards of one dtype on distinct devices.
    outputs: list[list[tuple[int, int]]] = []
    for a, k in used:
        dev, dtype = inputs[a][0][k], inputs[a][1]
        fits = [o for o in outputs if inputs[o[0][0]][1] == dtype
                and dev not in {inputs[x][0][y] for x, y in o}]
        if fits and rng.random() < 0.7:
            rng.choice(fits).append((a, k))
        else:
            outputs.append([(a, k)])
    # Mappings: per (output, input), runs of arithmetic progressions, split at random.
    mappings = []
    for b, out in enumerate(outputs):
        by_input: dict[int, list[tuple[int, int]]] = {}
        for j, (a, k) in enumerate(out):
            by_input.setdefault(a, []).append((k, j))
        for a, pairs in by_input.items():
            if rng.random() < 0.5:
                pairs.sort()
            froms, tos = [], []
            i = 0
            while i < len(pairs):
                n = 1
                if i + 1 < len(pairs) and pairs[i + 1][0] > pairs[i][0] \
                        and pairs[i + 1][1] > pairs[i][1]:
                    ds, dt = pairs[i + 1][0] - pairs[i][0], pairs[i + 1][1] - pairs[i][1]
                    while (i + n < len(pairs) and pairs[i + n][0] - pairs[i + n - 1][0] == ds
                           and pairs[i + n][1] - pairs[i + n - 1][1] == dt
                           and rng.random() < 0.8):
                        n += 1
                else:
                    ds = dt = rng.randint(1, 3)
                k0, j0 = pairs[i]
                froms.append(Interval(k0, k0 + (n - 1) * ds + rng.randint(1, ds), ds))
                tos.append(Interval(j0, j0 + (n - 1) * dt + rng.randint(1, dt), dt))
                i += n
            cut = rng.randint(0, len(froms))
            if 0 < cut < len(froms):
                mappings.append(Mapping(a, b, froms[:cut], tos[:cut]))
                mappings.append(Mapping(a, b, froms[cut:], tos[cut:]))
            else:
                mappings.append(Mapping(a, b, froms, tos))
    rng.shuffle(mappings)

    def make(ids, dtype):
        return make_spec(ids, (2 * len(ids), 3), (2, 3), dtype)

    in_specs = [make(ids, dtype) for ids, dtype in inputs]
    out_specs = [make([inputs[a][0][k] for a, k in out], inputs[out[0][0]][1])
                 for out in outputs]
    return RemapPlan(in_specs, out_specs, mappings), outputs


@given(valid_plans())
def test_random_valid_plans_validate_and_move_shards_bijectively(case):
    plan, expected = case
    plan.validate()
    moves = plan.shard_moves()
    assert moves == expected
    # A bijection between the mapped input shards and all output shards ...
    flat = [src for out in moves for src in out]
    assert len(flat) == len(set(flat))
    assert sum(len(o.sharding.devices) for o in plan.output_specs) == len(flat)
    for b, out in enumerate(moves):
        assert len(out) == len(plan.output_specs[b].sharding.devices)
        for j, (a, k) in enumerate(out):
            # ... that never moves data: each output shard is on its input shard's device.
            assert plan.output_specs[b].sharding.devices[j] is \
                plan.input_specs[a].sharding.devices[k]
            assert plan.input_specs[a].dtype == plan.output_specs[b].dtype
    # REUSE_INPUT is allowed exactly when each output has one source array.
    one_source = all(len({a for a, _ in out}) == 1 for out in moves)
    if one_source:
        plan.check_array_copy_semantics(REUSE)
    else:
        with pytest.raises(InvalidArgumentError, match="kDonateInput is required"):
            plan.check_array_copy_semantics(REUSE)
    plan.check_array_copy_semantics(DONATE)
    copy = pickle.loads(pickle.dumps(plan))
    assert copy == plan and hash(copy) == hash(plan) and copy.shard_moves() == moves


@given(valid_plans(), st.data())
def test_random_broken_plans_are_refused(case, data):
    """Dropping, duplicating or redirecting a mapping's shard breaks a valid plan."""
    plan, _ = case
    mappings = list(plan.mappings)
    i = data.draw(st.integers(0, len(mappings) - 1))
    how = data.draw(st.sampled_from(["drop", "duplicate", "out_of_range"]))
    if how == "drop":
        del mappings[i]
    elif how == "duplicate":
        mappings.append(mappings[i])
    else:
        mp = mappings[i]
        mappings[i] = Mapping(mp.in_array, len(plan.output_specs), mp.from_, mp.to)
    broken = RemapPlan(plan.input_specs, plan.output_specs, mappings)
    with pytest.raises(InvalidArgumentError):
        broken.validate()
