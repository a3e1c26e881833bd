"""Collectives over replicas (outside shard_map): a program compiled with ``num_replicas``
runs on every replica, each on its own values, and each collective's result on each
replica is computed here from those values with NumPy; on the PjRt and reference
backends."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.builder import Builder
from ifrtpy.errors import IfrtError, InvalidArgumentError, UnimplementedError

from builder_helpers import BF16, FEW, client, is_reference, pjrt_client  # noqa: F401  (client is a fixture)

R = 4
GROUPINGS = {"all": None, "halves": [[0, 1], [2, 3]], "pairs": [[0, 2], [1, 3]],
             "reversed": [[3, 2, 1, 0]], "singletons": [[0], [1], [2], [3]]}
REDUCERS = {"sum": np.sum, "max": np.max, "min": np.min}


def _run(client, program, *per_replica, replicas=R):
    """Compile ``program`` over ``replicas`` replicas and run it, argument i holding
    ``per_replica[i][r]`` on replica r; returns each result's value on each replica."""
    exe = client.compile(program, ifrt.CompileOptions(num_replicas=replicas))
    devices = list(exe.devices())
    args = [client.assemble_array_from_single_device_arrays(
        values[0].shape, sharding, [ifrt.device_put(v, d) for v, d in zip(values, devices)])
        for values, sharding in zip(per_replica, exe.parameter_shardings())]
    return [[np.asarray(piece) for piece in out.disassemble_into_single_device_arrays()]
            for out in exe(*args)]


@FEW
@given(grouping=st.sampled_from(list(GROUPINGS)), reducer=st.sampled_from(list(REDUCERS)),
       dtype=st.sampled_from([np.dtype(np.float32), np.dtype(np.int32), BF16]),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_collectives_over_replicas(client, grouping, reducer, dtype, seed, data):
    rng = np.random.default_rng(seed)
    values = [rng.integers(-9, 10, (4, 3)).astype(dtype) for _ in range(R)]
    groups = GROUPINGS[grouping]
    members = {r: g for g in (groups or [list(range(R))]) for r in g}
    n = len(members[0])
    targets = data.draw(st.permutations(range(R)))
    pairs = [(s, t) for s, t in enumerate(targets) if data.draw(st.booleans())]
    b = Builder("replicas")
    x = b.parameter((4, 3), dtype)
    program = b.build(
        b.all_reduce(x, reducer, groups),
        b.all_reduce(x, lambda u, v: b.max(u, v), groups),
        b.cross_replica_sum(x, groups),
        b.all_gather(x, 1, groups, shard_count=n),
        b.reduce_scatter(b.concatenate([x] * n, 0), 0, reducer, groups, shard_count=n),
        b.all_to_all(b.concatenate([x] * n, 0), 0, 1, groups, split_count=n),
        b.collective_permute(x, pairs),
        b.replica_id())
    reduced, largest, summed, gathered, scattered, exchanged, moved, ids = _run(client, program, values)
    sources = {t: s for s, t in pairs}
    for r in range(R):
        group = members[r]
        mine = group.index(r)
        stack = np.stack([values[m].astype(np.float64) for m in group])
        np.testing.assert_array_equal(reduced[r], REDUCERS[reducer](stack, 0).astype(dtype))
        np.testing.assert_array_equal(largest[r], stack.max(0).astype(dtype))
        np.testing.assert_array_equal(summed[r], stack.sum(0).astype(dtype))
        np.testing.assert_array_equal(gathered[r], np.concatenate([values[m] for m in group], 1))
        whole = REDUCERS[reducer](np.stack([np.concatenate([values[m]] * n) for m in group]).astype(np.float64), 0)
        np.testing.assert_array_equal(scattered[r], np.split(whole, n)[mine].astype(dtype))
        pieces = [np.split(np.concatenate([values[m]] * n), n)[mine] for m in group]
        np.testing.assert_array_equal(exchanged[r], np.concatenate(pieces, 1))
        np.testing.assert_array_equal(moved[r], values[sources[r]] if r in sources else 0 * values[r])
        assert ids[r] == r and ids[r].dtype == np.uint32


def test_channel_ids_as_xla_writes_them(client):
    """A channel id is written only where given, use_global_device_ids only where set;
    with a channel all_reduce and all_gather stay over replica ids (as global ids do: with
    one partition they are the replica ids), while all_to_all and collective_permute are over
    partition ids: each replica alone. Over all replicas all_to_all names replicas 0
    to split_count - 1, as XLA's builder does."""
    values = [np.arange(4, dtype=np.float32) + 10 * r for r in range(R)]
    b = Builder("channels")
    x = b.parameter((4,), np.float32)
    plain = b.all_reduce(x)
    program = b.build(plain, b.all_reduce(x, channel_id=5),
                      b.all_reduce(x, "sum", [[0, 1], [2, 3]], 6, use_global_device_ids=True),
                      b.all_gather(x, 0, [[0, 1, 2, 3]], 7),
                      b.all_to_all(x, 0, 0, [[0]], channel_id=8),
                      b.collective_permute(x, [(0, 0)], channel_id=9),
                      b.all_to_all(x, 0, 0, split_count=4))
    text = program.text
    assert text.count("#stablehlo.channel_handle<") == 5 and text.count("use_global_device_ids") == 1
    assert "replica_groups = dense<> : tensor<0x0xi64>" in text
    assert "replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, split_count = 4" in text
    one, two, halves, gathered, kept, also_kept, exchanged = _run(client, program, values)
    total = np.sum(values, 0)
    for r in range(R):
        np.testing.assert_array_equal(one[r], total)
        np.testing.assert_array_equal(two[r], total)
        np.testing.assert_array_equal(halves[r], values[r] + values[r ^ 1])
        np.testing.assert_array_equal(gathered[r], np.concatenate(values))
        np.testing.assert_array_equal(kept[r], values[r])
        np.testing.assert_array_equal(also_kept[r], values[r])
        np.testing.assert_array_equal(exchanged[r], [values[m][r] for m in range(R)])


def test_one_replica(client):
    """One replica: every collective is over a group of one, replica_id is 0; on one
    device, without any sharding."""
    x_host = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = Builder("one")
    x = b.parameter((2, 3), np.float32)
    program = b.build(b.all_reduce(x), b.all_gather(x, 0, [[0]]), b.all_to_all(x, 1, 0, split_count=1),
                      b.reduce_scatter(x, 1, "max", shard_count=1), b.collective_permute(x, [(0, 0)]),
                      b.replica_id())
    outs = _run(client, program, [x_host], replicas=1)
    for got in outs[:5]:
        np.testing.assert_array_equal(got[0], x_host)
    assert outs[5][0] == 0


def test_replica_id_inside_regions(client):
    """replica_id read inside a while loop and a cond, as each replica's own id."""
    b = Builder("regions")
    x = b.parameter((), np.uint32)
    _, counted = b.while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, acc + b.replica_id()),
                              (b.constant(np.int32(0)), x))
    chosen = b.cond(b.replica_id() < 2, lambda: b.replica_id() * 10, lambda: x)
    counted, chosen = _run(client, b.build(counted, chosen), [np.uint32(1)] * R)
    assert [int(v) for v in counted] == [1 + 3 * r for r in range(R)]
    assert [int(v) for v in chosen] == [0, 10, 1, 1]


def test_collectives_in_a_loop(client):
    """A collective inside a while loop runs on the PjRt backend; the reference backend
    runs collectives only as ops of main itself, and refuses this one when compiling."""
    b = Builder("loop")
    x = b.parameter((2,), np.float32)
    _, total = b.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, b.all_reduce(v)),
                            (b.constant(np.int32(0)), x))
    values = [np.full(2, r + 1, np.float32) for r in range(R)]
    if is_reference(client):
        with pytest.raises(UnimplementedError, match="only as ops of main itself; this "
                                                     "stablehlo.all_reduce is inside stablehlo.while"):
            _run(client, b.build(total), values)
        return
    total, = _run(client, b.build(total), values)
    for r in range(R):
        np.testing.assert_array_equal(total[r], np.full(2, 10.0 * R))


@pytest.mark.parametrize("groups", [[[0, 1]], [[0], [1]]])
def test_groups_must_name_every_replica(client, groups):
    """Groups that leave replicas out are refused when compiling, as XLA's verifier does."""
    b = Builder("partial")
    x = b.parameter((2,), np.float32)
    program = b.build(b.all_reduce(x, "sum", groups))
    with pytest.raises(IfrtError) as refused:
        client.compile(program, ifrt.CompileOptions(num_replicas=R))
    if is_reference(client):
        assert isinstance(refused.value, InvalidArgumentError)
        assert "must name each of the 4 replicas once" in str(refused.value)


@pytest.mark.parametrize("call,message", [
    (lambda b, x: b.all_gather(x, 0), r"give shard_count \(a positive int\), got None"),
    (lambda b, x: b.reduce_scatter(x, 0, shard_count=0), r"give shard_count \(a positive int\), got 0"),
    (lambda b, x: b.all_to_all(x, 0, 0), r"give split_count"),
    (lambda b, x: b.all_gather(x, 0, [[0, 1]], shard_count=4), r"shard_count \(4\) must be the group size 2"),
    (lambda b, x: b.all_reduce(x, replica_groups=[[0, 2]]), r"must name each replica of 0 to 1 once"),
    (lambda b, x: b.all_reduce(x, replica_groups=[[0, 1], [2]]), "non-empty groups of one size"),
    (lambda b, x: b.all_reduce(x, use_global_device_ids=True), "use_global_device_ids needs a channel_id"),
    (lambda b, x: b.all_reduce(x, channel_id=1, use_global_device_ids=True), "and replica_groups"),
    (lambda b, x: b.all_reduce(x, channel_id=-1), "channel_id must be a positive int"),
    (lambda b, x: b.collective_permute(x, [(0, -1)]), r"must name replicas \(ids >= 0\)"),
])
def test_builder_errors_over_replicas(call, message):
    """Each refused; a refused collective leaves the program as it was: a shard_map may
    still follow."""
    b = Builder(devices=pjrt_client().devices()[:2])
    x = b.parameter((4,), np.float32)
    with pytest.raises(InvalidArgumentError, match=message):
        call(b, x)
    halves = "{devices=[2]0,1}"
    assert b.shard_map(lambda v: v * 2, [x], [halves], [halves]).shape == (4,)


def test_a_serialized_executable_keeps_its_replicas(client):
    """Deserialized, a program over replicas still runs over them."""
    b = Builder("kept")
    x = b.parameter((2,), np.float32)
    exe = client.compile(b.build(b.all_reduce(x)), ifrt.CompileOptions(num_replicas=R))
    again = client.default_compiler().deserialize_loaded_executable(exe.serialize())
    devices = list(again.devices())
    assert devices == list(exe.devices())
    values = [np.full(2, r, np.float32) for r in range(R)]
    arg = client.assemble_array_from_single_device_arrays(
        (2,), again.parameter_shardings()[0], [ifrt.device_put(v, d) for v, d in zip(values, devices)])
    out, = again(arg)
    for piece in out.disassemble_into_single_device_arrays():
        np.testing.assert_array_equal(np.asarray(piece), np.full(2, sum(range(R))))


def test_a_reduction_using_an_outside_value_is_refused_whole():
    """A reduction computation that uses a value from outside it (XLA refuses it too) is
    refused by the reference backend when compiling; the process lives on (checked in a
    child process: moving such a region would corrupt the heap)."""
    code = """if True:
        import ifrtpy as ifrt
        from ifrtpy.errors import InvalidArgumentError
        text = '''func.func public @main(%x: tensor<4xf32>, %w: tensor<f32>) -> tensor<4xf32> {
          %0 = "stablehlo.all_reduce"(%x) ({
          ^bb0(%a: tensor<f32>, %b: tensor<f32>):
            %s = stablehlo.multiply %a, %w : tensor<f32>
            stablehlo.return %s : tensor<f32>
          }) {replica_groups = dense<> : tensor<0x0xi64>} : (tensor<4xf32>) -> tensor<4xf32>
          return %0 : tensor<4xf32> }'''
        try:
            ifrt.get_client("reference", device_count=2).compile(
                ifrt.HloProgram(text), ifrt.CompileOptions(num_replicas=2))
        except InvalidArgumentError as e:
            print("refused:", e)
        """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: main: the computation of stablehlo.all_reduce uses a value from outside it" in done.stdout
