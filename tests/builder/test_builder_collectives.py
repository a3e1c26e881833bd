"""shard_map and the collectives, run SPMD on 8 devices against NumPy: each device's
shard is a slice of the global array, and each collective's result per device is
computed from those slices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy.builder import Builder
from ifrtpy.errors import InvalidArgumentError, UnimplementedError

from builder_helpers import pjrt_client

P = ifrt.PartitionSpec
GROUPINGS = {
    "all": None,
    "halves": [[0, 1, 2, 3], [4, 5, 6, 7]],
    "pairs": [[0, 4], [1, 5], [2, 6], [3, 7]],
    "odd-even": [[1, 3, 5, 7], [0, 2, 4, 6]],
}
REDUCERS = {"sum": np.sum, "max": np.max, "min": np.min}


def _mesh():
    client = pjrt_client()
    mesh = ifrt.Mesh(np.array(client.devices()), ("x",))
    return client, mesh, ifrt.NamedSharding(mesh, P("x"))


def _groups_of(name):
    groups = GROUPINGS[name] or [list(range(8))]
    return {d: g for g in groups for d in g}


def _spmd(build, x):
    """Build ``build(b, shard)`` in a shard_map over 8 devices; return the per-device
    results (the global results split in 8)."""
    client, mesh, rows = _mesh()
    b = Builder("spmd", devices=mesh.device_list)
    px = b.parameter(x.shape, x.dtype, sharding=rows)
    outs = build(b, px, rows)
    outs = outs if isinstance(outs, tuple) else (outs,)
    program = b.build(*outs, shardings=[rows] * len(outs))
    exe = client.compile(program, ifrt.CompileOptions(devices=mesh.device_list, num_partitions=8))
    return [np.split(np.asarray(o), 8) for o in exe(ifrt.device_put(x, rows))]


@settings(max_examples=6, deadline=None)
@given(grouping=st.sampled_from(list(GROUPINGS)), reducer=st.sampled_from(list(REDUCERS)),
       seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from([np.float32, np.int32]))
def test_collectives(grouping, reducer, seed, dtype):
    rng = np.random.default_rng(seed)
    x = rng.integers(-9, 10, (8 * 4, 3)).astype(dtype)
    shards = np.split(x, 8)  # what each device holds: (4, 3)
    groups = GROUPINGS[grouping]
    group_of = _groups_of(grouping)
    n = len(next(iter(group_of.values())))

    def build(b, px, rows):
        def body(v):
            return (b.all_reduce(v, reducer, groups),
                    b.all_gather(v, 1, groups),
                    b.reduce_scatter(b.concatenate([v] * n, 0), 0, reducer, groups),
                    b.all_to_all(b.concatenate([v] * n, 0), 0, 1, groups),
                    b.all_reduce(v, lambda a, c: b.min(a, c), groups))  # a function body
        return b.shard_map(body, [px], [rows], [rows] * 5)

    reduced, gathered, scattered, exchanged, custom = _spmd(build, x)
    for d in range(8):
        members = group_of[d]
        mine = members.index(d)
        stack = np.stack([shards[m] for m in members])
        np.testing.assert_array_equal(reduced[d], REDUCERS[reducer](stack, 0), err_msg=f"all_reduce {d}")
        np.testing.assert_array_equal(gathered[d], np.concatenate([shards[m] for m in members], 1))
        whole = REDUCERS[reducer](np.stack([np.concatenate([shards[m]] * n) for m in members]), 0)
        np.testing.assert_array_equal(scattered[d], np.split(whole, n)[mine])
        # all_to_all: member j sends piece `mine` of its split (along 0) to me; I concat along 1
        pieces = [np.split(np.concatenate([shards[m]] * n), n)[mine] for m in members]
        np.testing.assert_array_equal(exchanged[d], np.concatenate(pieces, 1))
        np.testing.assert_array_equal(custom[d], np.min(stack, 0))


def test_collective_permute_and_partition_id():
    x = np.arange(16 * 2, dtype=np.float32).reshape(16, 2)
    shards = np.split(x, 8)
    pairs = [(i, (i + 3) % 8) for i in range(5)]  # devices 5, 6, 7 send nothing

    def build(b, px, rows):
        def body(v):
            ids = b.broadcast_to(b.convert(b.partition_id(), np.float32), v.shape)
            return b.collective_permute(v, pairs), ids
        return b.shard_map(body, [px], [rows], [rows, rows])

    moved, ids = _spmd(build, x)
    targets = {t: s for s, t in pairs}
    for d in range(8):
        want = shards[targets[d]] if d in targets else np.zeros_like(shards[d])
        np.testing.assert_array_equal(moved[d], want)
        np.testing.assert_array_equal(ids[d], np.full_like(shards[d], d))


def test_shard_map_results_and_channel_ids():
    _, mesh, rows = _mesh()
    b = Builder(devices=mesh.device_list)
    px = b.parameter((8, 2), np.float32, sharding=rows)
    total = b.shard_map(lambda v: b.all_reduce(b.all_reduce(v), channel_id=7), [px], [rows], [rows])
    assert total.shape == (8, 2)
    text = b.build(total).text
    assert "#stablehlo.channel_handle<handle = 1, type = 1>" in text
    assert "#stablehlo.channel_handle<handle = 7, type = 1>" in text
    assert "SPMDFullToShardShape" in text and "SPMDShardToFullShape" in text
    with pytest.raises(UnimplementedError, match="manual SPMD regions"):
        ifrt.get_client("reference", device_count=8).compile(
            b.build(total), ifrt.CompileOptions(devices=None, num_partitions=1))


@pytest.mark.parametrize("body,message", [
    (lambda b, v: b.all_reduce(v, replica_groups=[[0, 1], [1, 2]]), "must name distinct devices"),
    (lambda b, v: b.all_reduce(v, replica_groups=[[0, 1, 2], [3]]), "non-empty groups of one size"),
    (lambda b, v: b.all_gather(v, 0, [[0, 8]]), r"in \[0, 8\)"),
    (lambda b, v: b.reduce_scatter(v, 0, "sum", [[0, 1, 2]]), "must divide by the group size 3"),
    (lambda b, v: b.collective_permute(v, [(0, 1), (2, 1)]), "a target at most once"),
    (lambda b, v: b.all_reduce(v, channel_id=0), "channel_id must be a positive int"),
])
def test_collective_errors(body, message):
    _, mesh, rows = _mesh()
    b = Builder(devices=mesh.device_list)
    px = b.parameter((8, 2), np.float32, sharding=rows)
    with pytest.raises(InvalidArgumentError, match=message):
        b.shard_map(lambda v: body(b, v), [px], [rows], [rows])


def test_shard_map_and_collectives_over_replicas_are_not_mixed():
    """A program's collectives are all inside shard_map or all over replicas: the second
    kind is refused, naming the first."""
    _, mesh, rows = _mesh()
    b = Builder(devices=mesh.device_list)
    px = b.parameter((8, 2), np.float32, sharding=rows)
    b.all_reduce(px)  # outside shard_map: over replicas
    with pytest.raises(InvalidArgumentError, match=(
            r"shard_map: this program has all_reduce outside shard_map, a collective over "
            r"replicas \(num_replicas\), and shard_map cannot join it")):
        b.shard_map(lambda v: b.all_reduce(v), [px], [rows], [rows])
    b = Builder(devices=mesh.device_list)
    px = b.parameter((8, 2), np.float32, sharding=rows)
    b.shard_map(lambda v: v * 2, [px], [rows], [rows])
    for over_replicas in (lambda: b.all_gather(px, 0, shard_count=2),
                          lambda: b.collective_permute(px, [(0, 1)])):
        with pytest.raises(InvalidArgumentError, match=(
                r": this program has shard_map, whose collectives run on an SPMD program's "
                r"devices \(num_partitions\), and \w+ outside shard_map, a collective over "
                r"replicas \(num_replicas\), cannot join it")):
            over_replicas()


def test_shard_map_values_stay_inside():
    _, mesh, rows = _mesh()
    b = Builder(devices=mesh.device_list)
    px = b.parameter((8, 2), np.float32, sharding=rows)
    inner = []
    b.shard_map(lambda v: inner.append(v + 1) or v, [px], [rows], [rows])
    with pytest.raises(InvalidArgumentError, match="not visible here"):
        b.add(inner[0], inner[0])
    with pytest.raises(InvalidArgumentError, match="not visible here"):
        b.shard_map(lambda v: v + px, [px], [rows], [rows])
    with pytest.raises(InvalidArgumentError, match="does not divide the shape evenly"):
        b.shard_map(lambda v: v, [b.parameter((6, 2), np.float32)], [rows], [rows])
