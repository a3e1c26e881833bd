"""Per-device execution in the NumPy evaluator (:mod:`.numpy_eval`): manual SPMD regions
(``sdy.manual_computation``, what ``shard_map`` lowers to) and the collectives and ids
their bodies use.

Outside a manual computation a program computes on global values. A manual
computation's body runs once per device of its mesh, each run on that device's shard:
an operand sliced along the dimensions its ``in_shardings`` shard over manual axes (a
dimension over several axes is split over them major to minor). Each device's run is a
thread of its own with its own copy of the function's slots; the collectives of the body
are rendezvous of all of the mesh's devices (:class:`Rendezvous`), where the last device to
arrive computes every device's result in NumPy, as XLA defines them:

* the groups: ``replica_groups`` name partition ids where the op has a channel and
  ``use_global_device_ids`` (a program of one replica: device ids are partition ids) or,
  for ``all_to_all`` and ``collective_permute``, a channel alone; replica ids where it has
  none (one replica: each device alone) or a channel without ``use_global_device_ids``
  (replica 0's group: every partition). No groups: one group of everyone;
* ``all_reduce`` folds the members' values in group order with its computation,
  ``reduce_scatter`` then hands member j the j-th piece along ``scatter_dimension``,
  ``all_gather`` concatenates them along ``all_gather_dim``, ``all_to_all`` hands member j
  the j-th piece (``split_dimension``) of each member, concatenated in group order
  (``concat_dimension``), ``collective_permute`` gives each target its source's value and
  every other device zeros, ``collective_broadcast`` each member the group's first value;
* ``partition_id`` is the device's id in the mesh (``device_ids``, else its position),
  ``replica_id`` 0.

The body's results are assembled by ``out_shardings``: a dimension sharded over manual
axes is the concatenation of the devices' tiles; over a manual axis the result does not
name, the devices agree and the first is taken; over an unreduced axis the devices hold
partial values, and the global value is their sum. An operand unreduced over a manual
axis enters as partial values of the same sum: its value on the devices at the axis's
first coordinate, zeros on the others.

A manual computation met inside another's body (jax's nested ``shard_map``) runs on the
device whose thread reaches it: the operand tiled along its own manual axes, the body run
once, and its results gathered, at a rendezvous, from the devices that share the device's
place along every other axis.

Like :mod:`.numpy_eval`, it imports only the standard library, NumPy and jaxlib's MLIR
bindings.
"""

from __future__ import annotations

import itertools
import math
import re
import sys
import threading
from typing import Any, Callable, Sequence

import numpy as np

if __package__:  # imported from the package
    from ifrtpy.backends.reference import numpy_eval as core
else:  # a worker's copy, loaded beside its evaluator
    core = sys.modules["_ifrtpy_reference_numpy_eval"]

__all__ = ["COLLECTIVES", "IDS", "Rendezvous", "collective", "device_id", "manual_computation"]

#: Collectives computed across the devices of a manual computation.
COLLECTIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                         "collective_permute", "collective_broadcast"})
#: Ops that read the device's place.
IDS = frozenset({"partition_id", "replica_id"})
#: Collectives whose replica groups are of partition ids where they have a channel.
_PARTITIONS_WITH_CHANNEL = frozenset({"all_to_all", "collective_permute"})

#: The device a thread computes for: (its rendezvous, its position in the mesh).
_PLACE = threading.local()


class Diverged(core.ProgramError):
    """The devices of a manual computation did not meet at the same collective."""


class Rendezvous:
    """Where ``count`` devices' threads meet at each collective: :meth:`exchange` waits
    until every device has brought its value, and the last computes all the results."""

    def __init__(self, count: int, ids: Sequence[int]):
        self.count = count
        self.ids = list(ids)  # the device id at each position
        self._cond = threading.Condition()
        self._waiting: dict[int, tuple[object, Any]] = {}
        self._left: set[int] = set()
        self._results: list = []
        self._round = 0
        self._failure: BaseException | None = None

    def exchange(self, position: int, key: object, value: Any,
                 compute: Callable[[list], list]) -> Any:
        """This device's result of the collective ``key``, once every device has brought
        its ``value``: ``compute`` (of the values by position) gives each its result."""
        with self._cond:
            self._raise_failure()
            self._waiting[position] = (key, value)
            round_ = self._round
            if not self._resolve(compute):
                while self._round == round_ and self._failure is None:
                    self._cond.wait()
            self._raise_failure()
            return self._results[position]

    def leave(self, position: int, error: BaseException | None = None) -> None:
        """This device's run has ended (with ``error`` where it failed)."""
        with self._cond:
            self._left.add(position)
            if error is not None and self._failure is None:
                self._failure = error
            if self._waiting and len(self._waiting) + len(self._left) == self.count:
                self._fail(Diverged(f"device {self.ids[position]} finished its run of the "
                                    "manual computation while others wait at a collective"))
            self._cond.notify_all()

    def _resolve(self, compute: Callable[[list], list]) -> bool:
        if len(self._waiting) + len(self._left) < self.count:
            return False
        keys = {id(key) for key, _ in self._waiting.values()}
        if self._left or len(keys) > 1:
            self._fail(Diverged("the devices of a manual computation reached different "
                                "collectives (or some none): XLA would wait forever"))
            return True
        try:
            self._results = compute([self._waiting[p][1] for p in range(self.count)])
        except BaseException as e:  # noqa: BLE001 - every device fails with it
            self._fail(e)
            return True
        self._waiting.clear()
        self._round += 1
        self._cond.notify_all()
        return True

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._cond.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure


def _place() -> tuple[Rendezvous, int]:
    place = getattr(_PLACE, "value", None)
    if place is None:
        raise core.ProgramError("a collective or device id outside a manual computation "
                                "(of a program over partitions)")
    return place


def device_id(name: str) -> Callable[[], np.ndarray]:
    """The kernel of ``partition_id`` (the device's id) or ``replica_id`` (0)."""
    def read() -> np.ndarray:
        rendezvous, position = _place()
        return np.asarray(rendezvous.ids[position] if name == "partition_id" else 0, np.uint32)
    return read


# -- manual computations ------------------------------------------------------------------

def _mesh(compiler, sharding) -> tuple[list[str], list[int], list[int]]:
    """(axis names, sizes, device id per position) of a ``sdy.sharding``'s mesh."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy

    mesh_or_ref = sharding.mesh_or_ref
    if sdy.MeshAttr.isinstance(mesh_or_ref):
        mesh = sdy.MeshAttr(mesh_or_ref)
    else:
        name = ir.FlatSymbolRefAttr(mesh_or_ref).value
        if name not in compiler.meshes:
            raise core.Unsupported(f"a sharding over an unknown mesh @{name}")
        mesh = compiler.meshes[name]
    return _mesh_layout(mesh)


def _mesh_layout(mesh) -> tuple[list[str], list[int], list[int]]:
    """(axis names, sizes, device id per position) of an ``sdy.MeshAttr``."""
    from jaxlib.mlir.dialects import sdy

    axes = [sdy.MeshAxisAttr(a) for a in mesh.axes]
    names, sizes = [a.name for a in axes], [a.size for a in axes]
    ids = list(mesh.device_ids) or list(range(math.prod(sizes)))
    return names, sizes, ids


def _dim_axes(sharding, names: list[str], manual: set[str]) -> list[list[int]]:
    """For each dimension, the manual axes (indices into ``names``) it is sharded over,
    major to minor."""
    from jaxlib.mlir.dialects import sdy

    dims = []
    for dim in sharding.dimension_shardings:
        axes = []
        for axis in sdy.DimensionShardingAttr(dim).axes:
            ref = sdy.AxisRefAttr(axis)
            if ref.name not in manual:
                continue
            if ref.sub_axis_info is not None:
                raise core.Unsupported(f"a manual computation over sub-axes ({ref})")
            axes.append(names.index(ref.name))
        dims.append(axes)
    return dims


def _tile(dims: list[list[int]], sizes: list[int], coords: tuple[int, ...]
          ) -> list[tuple[int, int]]:
    """For each dimension, (tile index, tile count) of the device at ``coords``."""
    tiles = []
    for axes in dims:
        index, count = 0, 1
        for a in axes:
            index, count = index * sizes[a] + coords[a], count * sizes[a]
        tiles.append((index, count))
    return tiles


def _unreduced(sharding, names: list[str], manual: set[str]) -> list[int]:
    """The manual axes (indices into ``names``) a sharding leaves unreduced."""
    from jaxlib.mlir.dialects import sdy

    refs = [sdy.AxisRefAttr(a) for a in sharding.unreduced_axes]
    return [names.index(ref.name) for ref in refs if ref.name in manual]


def _local(value: np.ndarray, tiles: list[tuple[int, int]], zero: bool = False) -> np.ndarray:
    """A device's tile of ``value`` (zeros of its shape where ``zero``)."""
    index = []
    for (i, n), size in zip(tiles, np.shape(value)):
        step = size // n
        index.append(slice(i * step, (i + 1) * step))
    local = np.asarray(value)[tuple(index)]
    return np.zeros_like(local) if zero else local


def manual_computation(compiler, op, ins: list[int]) -> Callable[[list], None]:
    """The step of an ``sdy.manual_computation``: its body run on each device's shard
    of the operands, its results assembled from the devices' (see the module)."""
    from jaxlib.mlir.dialects import sdy

    in_shardings = [sdy.TensorShardingAttr(s) for s in
                    sdy.TensorShardingPerValueAttr(op.attributes["in_shardings"]).shardings]
    out_shardings = [sdy.TensorShardingAttr(s) for s in
                     sdy.TensorShardingPerValueAttr(op.attributes["out_shardings"]).shardings]
    manual_axes: Any = sdy.ManualAxesAttr(op.attributes["manual_axes"])
    manual = {str(a) for a in manual_axes}
    shardings = in_shardings + out_shardings
    names, sizes, ids = _mesh(compiler, shardings[0]) if shardings else ([], [], [0])
    if any(_mesh(compiler, s) != (names, sizes, ids) for s in shardings):
        raise core.Unsupported("a manual computation over several meshes")
    if not manual <= set(names):
        raise core.Unsupported(f"manual axes {sorted(manual)} not all of the mesh's {names}")
    positions = list(itertools.product(*(range(s) for s in sizes)))
    inner = {names.index(a) for a in manual}
    ins_tiles = [[_tile(_dim_axes(s, names, manual), sizes, c) for c in positions]
                 for s in in_shardings]
    # an operand unreduced over manual axes: its value on the first device of each group
    # along them, zeros (partial values of the same sum) on the others
    ins_zero = [[any(c[a] for a in _unreduced(s, names, manual)) for c in positions]
                for s in in_shardings]
    for value, sharding, arg in zip(op.operands, in_shardings, op.regions[0].blocks[0].arguments):
        _check_local(value, arg, _dim_axes(sharding, names, manual), sizes)
    specs: list = []
    plans: list[list[list[tuple[int, list[tuple[int, int]]]]]] = [[] for _ in positions]
    for result, sharding, local in zip(op.results, out_shardings,
                                       list(op.regions[0].blocks[0].operations)[-1].operands):
        dims = _dim_axes(sharding, names, manual)
        _check_local(result, local, dims, sizes)
        specs.append(core._tensor(result.type))
        named = {a for axes in dims for a in axes} | set(_unreduced(sharding, names, manual))
        for p, c in enumerate(positions):
            # the devices whose values make device p's result: those at p's place along
            # every axis but the manual ones, at 0 along the manual ones it does not name
            chosen = [q for q, d in enumerate(positions)
                      if all(d[a] == c[a] for a in range(len(names)) if a not in inner)
                      and all(d[a] == 0 for a in inner - named)]
            plans[p].append([(q, _tile(dims, sizes, positions[q])) for q in chosen])
    body = compiler.region(op.regions[0])
    outs = [compiler.define(r) for r in op.results]
    count = len(positions)
    key = object()

    def assembled(p: int, results: list[list]) -> list[np.ndarray]:
        """Device p's results of the region from every device's body results."""
        return [_assemble(spec, [(tiles, results[q][k]) for q, tiles in pieces])
                for k, (spec, pieces) in enumerate(zip(specs, plans[p]))]

    def tiles_of(values: list, p: int) -> list:
        return [_local(v, tiles[p], zero[p]) for v, tiles, zero in zip(values, ins_tiles, ins_zero)]

    def run_manual(env):
        values = [env[i] for i in ins]
        place = getattr(_PLACE, "value", None)
        if place is None:  # from global values: a thread per device
            results = _run_devices(body, env, [tiles_of(values, p) for p in range(count)], ids)
            outcome = assembled(0, results)
        else:  # inside another's body, on this device: the results meet the others'
            rendezvous, p = place
            if rendezvous.ids != ids:
                raise core.ProgramError("a manual computation inside one over another mesh")
            mine = body.run(env, tiles_of(values, p))
            outcome = rendezvous.exchange(p, key, mine, lambda results: [
                assembled(q, results) for q in range(count)])
        for slot, value in zip(outs, outcome):
            env[slot] = value
    return run_manual


def _check_local(global_value, local_value, dims: list[list[int]], sizes: list[int]) -> None:
    """Unsupported unless the body's type of a value is its global type's tile."""
    shape, _ = core._tensor(global_value.type)
    local, _ = core._tensor(local_value.type)
    expected = []
    for n, axes in zip(shape, dims):
        count = math.prod(sizes[a] for a in axes)
        if n % count:
            raise core.Unsupported(f"a dimension of {n} split over {count} devices")
        expected.append(n // count)
    if tuple(expected) != local:
        raise core.Unsupported(f"a manual computation's local type {list(local)} for "
                               f"{list(shape)} (expected {expected})")


def _assemble(spec, pieces: list[tuple[list[tuple[int, int]], np.ndarray]]) -> np.ndarray:
    """The global value of a result from its devices' ``pieces``: tiles placed, the
    pieces of one tile (over unreduced axes) summed."""
    shape, dtype = spec
    out = np.zeros(shape, dtype)
    written: set[tuple] = set()
    for tiles, value in pieces:
        key = tuple(tiles)
        index = tuple(slice(i * (n // c), (i + 1) * (n // c)) for (i, c), n in zip(tiles, shape))
        if key in written:
            out[index] = (out[index] + value).astype(dtype)
        else:
            out[index] = value
            written.add(key)
    return out


def _run_devices(body, env: list, args: list[list], ids: list[int]) -> list[list]:
    """``body``'s results on each device (a thread each), from each device's ``args``."""
    count = len(args)
    rendezvous = Rendezvous(count, ids)
    results: list[Any] = [None] * count
    errors: list[BaseException | None] = [None] * count

    def run(position: int) -> None:
        _PLACE.value = (rendezvous, position)
        try:
            with np.errstate(all="ignore"):
                results[position] = body.run(list(env), args[position])
        except BaseException as e:  # noqa: BLE001 - reported below, and to the others
            errors[position] = e
            rendezvous.leave(position, e)
        else:
            rendezvous.leave(position)
        finally:
            _PLACE.value = None

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [e for e in errors if e is not None]
    if failed:
        raise next((e for e in failed if not isinstance(e, Diverged)), failed[0])
    return results


# -- collectives ----------------------------------------------------------------------------

def _mesh_axes_groups(text: str, meshes: dict) -> list[list[int]]:
    """The groups of device ids of ``#stablehlo.replica_group_mesh_axes<mesh = @M, axes =
    [...]>`` (jax 0.12.1's form): the devices of mesh M that differ only along the axes
    named, in the order named."""
    found = re.fullmatch(r'#stablehlo\.replica_group_mesh_axes<mesh = @([\w.$-]+), '
                         r'axes = \[(.*)\]>', text.strip(), re.S)
    names = re.findall(r'#stablehlo\.axis_ref<name = "([^"]+)">', found.group(2)) if found else []
    if found is None or found.group(1) not in meshes or len(names) != found.group(2).count("<"):
        raise core.Unsupported(f"replica groups {text}")
    mesh_names, sizes, ids = _mesh_layout(meshes[found.group(1)])
    if not set(names) <= set(mesh_names):
        raise core.ProgramError(f"replica groups over axes {names} of a mesh of {mesh_names}")
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    inside = [mesh_names.index(n) for n in names]
    outside = [i for i in range(len(sizes)) if i not in inside]
    return [[ids[sum(c * strides[i] for i, c in zip(outside + inside, at + along))]
             for along in itertools.product(*(range(sizes[i]) for i in inside))]
            for at in itertools.product(*(range(sizes[i]) for i in outside))]


def _groups(op, kind: str, count: int, meshes: dict) -> list[list[int]]:
    """The groups of device ids of a collective over ``count`` devices (one replica)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    attrs = op.attributes
    channel = ("channel_handle" in attrs
               and stablehlo.ChannelHandle(attrs["channel_handle"]).handle > 0)
    global_ids = "use_global_device_ids" in attrs
    rows: np.ndarray | None = np.zeros((0, 0), np.int64)
    if "replica_groups" in attrs:
        try:
            rows = np.asarray(ir.DenseIntElementsAttr(attrs["replica_groups"]), np.int64)
        except ValueError:  # not a table of ids
            rows = None
    if rows is None:
        groups = _mesh_axes_groups(str(attrs["replica_groups"]), meshes)
    else:
        groups = [[i for i in row if i >= 0] for row in rows.reshape(len(rows), -1).tolist()]
        groups = [g for g in groups if g]
    if channel and (global_ids or kind in _PARTITIONS_WITH_CHANNEL):  # of partitions
        groups = groups or [list(range(count))]
        flat = sorted(i for g in groups for i in g)
        if flat != list(range(count)):
            raise core.ProgramError(f"{kind} groups {groups} that do not name each of "
                                    f"the {count} devices once")
        return groups
    # of replica ids: one replica, 0
    if any(g != [0] for g in groups):
        raise core.ProgramError(f"{kind} replica groups {groups} in a program of one replica")
    return [list(range(count))] if channel else [[d] for d in range(count)]


def collective(compiler, op, ins: list[int]) -> Callable[[list], None]:
    """The step of a collective (see the module), run by each device's thread."""
    from jaxlib.mlir import ir

    kind = op.operation.name[len("stablehlo."):]
    attrs = op.attributes
    dims = {key: int(ir.IntegerAttr(attrs[key]).value) for key in
            ("all_gather_dim", "scatter_dimension", "split_dimension", "concat_dimension")
            if key in attrs}
    specs = [core._tensor(r.type) for r in op.results]
    combine = None
    if kind in ("all_reduce", "reduce_scatter"):
        combine = compiler.elementwise_region(op.regions[0])
    pairs = None
    if kind == "collective_permute":
        pairs = np.asarray(ir.DenseIntElementsAttr(attrs["source_target_pairs"]),
                           np.int64).reshape(-1, 2).tolist()
    outs = [compiler.define(r) for r in op.results]
    key = object()

    def compute(env: list, rendezvous: Rendezvous, values: list[list[np.ndarray]]) -> list:
        count = rendezvous.count
        by_id = {rendezvous.ids[p]: values[p] for p in range(count)}
        out: dict[int, list[np.ndarray]] = {}
        if pairs is not None:
            with_channel = "channel_handle" in attrs
            sources = {t: s for s, t in pairs} if with_channel else {
                d: d for s, t in pairs if (s, t) == (0, 0) for d in by_id}
            for d, mine in by_id.items():
                if d in sources and sources[d] not in by_id:
                    raise core.ProgramError(f"collective_permute from device {sources[d]}, "
                                            f"not one of {sorted(by_id)}")
                out[d] = ([by_id[sources[d]][i] for i in range(len(mine))] if d in sources
                          else [np.zeros_like(v) for v in mine])
        else:
            for group in _groups(op, kind, count, compiler.meshes):
                if any(d not in by_id for d in group):
                    raise core.ProgramError(f"{kind} group {group} over devices {sorted(by_id)}")
                for d, result in zip(group, _one_group(kind, [by_id[d] for d in group],
                                                        dims, combine, env, specs)):
                    out[d] = result
        return [out[rendezvous.ids[p]] for p in range(count)]

    def run_collective(env):
        rendezvous, position = _place()
        values = [np.asarray(env[i]) for i in ins]
        results = rendezvous.exchange(position, key, values,
                                      lambda all_values: compute(env, rendezvous, all_values))
        for slot, value, (shape, dtype) in zip(outs, results, specs):
            env[slot] = np.asarray(value, dtype).reshape(shape)
    return run_collective


def _one_group(kind: str, members: list[list[np.ndarray]], dims: dict, combine, env: list,
               specs) -> list[list[np.ndarray]]:
    """Each member's results from the members' operands (lists of arrays), in group order."""
    n = len(members)
    operands = len(members[0])
    if kind in ("all_reduce", "reduce_scatter"):
        totals = list(members[0])
        for values in members[1:]:
            totals = [np.asarray(t) for t in combine.run(env, [*totals, *values])]
        totals = [np.broadcast_to(t, np.shape(v)) for t, v in zip(totals, members[0])]
        if kind == "all_reduce":
            return [list(totals) for _ in range(n)]
        axis = dims["scatter_dimension"]
        return [[np.split(t, n, axis)[j] for t in totals] for j in range(n)]
    if kind == "all_gather":
        axis = dims["all_gather_dim"]
        gathered = [np.concatenate([m[i] for m in members], axis) for i in range(operands)]
        return [list(gathered) for _ in range(n)]
    if kind == "all_to_all":
        split, concat = dims["split_dimension"], dims["concat_dimension"]
        parts = [[np.split(m[i], n, split) for i in range(operands)] for m in members]
        return [[np.concatenate([parts[s][i][j] for s in range(n)], concat)
                 for i in range(operands)] for j in range(n)]
    assert kind == "collective_broadcast", kind
    return [list(members[0]) for _ in range(n)]


core.per_device = sys.modules[__name__]  # the evaluator runs manual computations here
