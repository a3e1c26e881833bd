"""visualize_sharding draws what the index domains say, for random NamedShardings."""

import io
import random

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.errors import InvalidArgumentError

MESH_SHAPES = [(8,), (4,), (2,), (1,), (4, 2), (2, 4), (2, 2), (8, 1), (2, 2, 2)]


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("reference", device_count=8)


@pytest.fixture(scope="module")
def devices(client):
    return client.devices()


def random_case(rng, devices):
    """A random NamedSharding over some of the 8 devices and an array shape it divides."""
    mesh_shape = rng.choice(MESH_SHAPES)
    names = ("a", "b", "c")[:len(mesh_shape)]
    chosen = rng.sample(list(devices), int(np.prod(mesh_shape)))
    mesh = ifrt.Mesh(np.array(chosen, dtype=object).reshape(mesh_shape), names)
    rank = rng.choice([1, 2])
    axes = list(names)
    rng.shuffle(axes)
    spec = [[] for _ in range(rank)]
    for axis in axes:                                # each mesh axis: a dimension or replicated
        slot = rng.randrange(rank + 1)
        if slot < rank:
            spec[slot].append(axis)
    entries = [None if not s else s[0] if len(s) == 1 else tuple(s) for s in spec]
    sizes = dict(zip(names, mesh_shape))
    shape = tuple(int(np.prod([sizes[a] for a in s])) * rng.randint(1, 3) for s in spec)
    return ifrt.NamedSharding(mesh, ifrt.PartitionSpec(*entries)), shape


def parse(text, rank):
    """``{(row range, column range): device ids}`` read back from the drawing."""
    lines = text.rstrip("\n").split("\n")
    columns = [tuple(map(int, t.split(":"))) for t in lines[0].split()]
    cells = {}
    for line in (l for l in lines if "│" in l):
        head, *labels, _ = line.split("│")
        rows = (0, 1) if rank == 1 else tuple(map(int, head.strip().split(":")))
        assert len(labels) == len(columns)
        for cols, label in zip(columns, labels):
            cells[rows, cols] = set() if label.strip() == "-" else set(map(int, label.split(",")))
    return cells


@pytest.mark.parametrize("seed", range(60))
def test_grid_matches_index_domains(seed, devices):
    rng = random.Random(seed)
    sharding, shape = random_case(rng, devices)
    out = io.StringIO()
    ifrt.visualize_sharding(sharding, shape, file=out)
    cells = parse(out.getvalue(), len(shape))

    domains = sharding.index_domains(shape)
    boxes = [(((0, 1),) if len(shape) == 1 else ()) +
             tuple((o, o + s) for o, s in zip(origin, size)) for origin, size in domains]
    covered = np.zeros((1,) * (2 - len(shape)) + shape, dtype=int)
    for (r, c), ids in cells.items():
        covered[r[0]:r[1], c[0]:c[1]] += 1
        expected = {d.id for d, box in zip(sharding.devices, boxes)
                    if box[0][0] <= r[0] and r[1] <= box[0][1] and box[1][0] <= c[0] and c[1] <= box[1][1]}
        assert ids == expected, (sharding, shape, r, c)
    assert (covered == 1).all()                      # the cells tile the array exactly once
    # every edge of a domain is a cut of the grid, and no other cut is drawn
    assert sorted({e for _, c in cells for e in c}) == sorted(
            {0, shape[-1]} | {e for box in boxes for e in box[-1]})
    assert sorted({e for r, _ in cells for e in r}) == sorted(
        {0, covered.shape[0]} | {e for box in boxes for e in box[0]})


def test_array_and_replicated_holders(client, devices):
    mesh = ifrt.Mesh(np.array(devices).reshape(4, 2), ("x", "y"))
    a = client.make_array_from_host_buffer(
        np.zeros((8, 4), np.float32), ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x")))
    out = io.StringIO()
    ifrt.visualize_sharding(a, file=out)
    assert parse(out.getvalue(), 2) == {((2 * i, 2 * i + 2), (0, 4)): {2 * i, 2 * i + 1}
                                        for i in range(4)}


def test_refuses_what_it_cannot_draw(devices):
    sharding = ifrt.SingleDeviceSharding(devices[0])
    with pytest.raises(InvalidArgumentError, match="3 dimensions"):
        ifrt.visualize_sharding(sharding, (2, 2, 2))
    with pytest.raises(InvalidArgumentError, match="shape"):
        ifrt.visualize_sharding(sharding)
    with pytest.raises(InvalidArgumentError, match="Sharding"):
        ifrt.visualize_sharding("x", (2,))
