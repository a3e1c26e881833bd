"""SPMD programs with manual regions and collectives: ``shard_map`` runs a function on
each device's shard (XLA's manual sharding, as jax's shard_map lowers to), inside which
``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all`` and
``collective_permute`` exchange data between the program's devices.

Device ids in ``replica_groups`` and ``source_target_pairs`` are positions in the
program's device list (the executable's ``CompileOptions.devices``): the collectives use
global device ids over partitions, each with its own channel id.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import Shape
from ifrtpy.sharding.hlo import as_xla_hlo_sharding

from ifrtpy.builder import _infer
from ifrtpy.builder._core import _Scope
from ifrtpy.builder._shardings import hlo_sharding_string
from ifrtpy.builder._value import Value

if TYPE_CHECKING:  # the mixins see the whole builder when type-checked
    from ifrtpy.builder._regions import RegionOpsMixin as _Base
else:
    _Base = object

_MANUAL = "{manual}"


def _tiles(text: str, rank: int) -> list[int]:
    """The number of shards along each of ``rank`` dimensions of an HLO sharding."""
    sharding = as_xla_hlo_sharding(text)
    if sharding.is_replicated():
        return [1] * rank
    if sharding.is_maximal() or sharding.tuple_elements() or sharding.subgroup_types():
        raise InvalidArgumentError(f"shard_map: sharding {text} is not a tiling of the array")
    return list(sharding.tile_assignment_dimensions())[:rank]


class CollectiveOpsMixin(_Base):
    """shard_map and the collectives of :class:`~ifrtpy.builder.Builder`."""

    def _spmd_count(self, op: str) -> int:
        count = self._manual_devices
        if count is None:
            raise InvalidArgumentError(f"{op}: collectives run on each device's shard: call it "
                                       f"inside shard_map")
        return count

    def _channel(self, channel_id: Optional[int]):
        from jaxlib.mlir.dialects import stablehlo
        if channel_id is None:
            self._last_channel += 1
            channel_id = self._last_channel
        elif isinstance(channel_id, bool) or not isinstance(channel_id, int) or channel_id < 1:
            raise InvalidArgumentError(f"channel_id must be a positive int, got {channel_id!r}")
        with self._ctx:
            return stablehlo.ChannelHandle.get(int(channel_id), 1)

    def _groups(self, op: str, x: Value, replica_groups) -> list[list[int]]:
        count = self._spmd_count(op)
        groups = [list(range(count))] if replica_groups is None else replica_groups
        return _infer.replica_groups(op, [x], groups, count)

    def _collective_attrs(self, groups, channel_id) -> dict:
        import numpy as np
        with self._ctx:
            return {"replica_groups": self._ir.DenseIntElementsAttr.get(np.asarray(groups, np.int64)),
                    "channel_handle": self._channel(channel_id),
                    "use_global_device_ids": self._ir.UnitAttr.get()}

    def _annotated(self, target: str, x: Value, text: str, shape) -> Value:
        """A custom call ``target`` of x annotated with sharding ``text`` (x need not be
        visible in the current scope: this crosses into and out of shard_map bodies)."""
        ir = self._ir
        with self._ctx:
            attrs = {"call_target_name": ir.StringAttr.get(target),
                     "mhlo.sharding": ir.StringAttr.get(text)}
        return self._op1("stablehlo.custom_call", [x], Shape(shape), x.dtype, attrs)

    # -- shard_map -------------------------------------------------------------------------

    def shard_map(self, fn: Callable, args: Sequence[Any], in_shardings: Sequence[Any],
                  out_shardings: Sequence[Any]):
        """``fn`` on each device's shard of ``args`` (split by ``in_shardings``); its
        results, one per ``out_shardings``, are each device's shard of the global
        results. Inside, the collectives exchange data between devices; ``fn`` sees only
        its arguments. Returns a Value, or a tuple where ``fn`` returns one."""
        op = "shard_map"
        xs = [self._operand(a, op) for a in args]
        if len(in_shardings) != len(xs):
            raise InvalidArgumentError(f"{op}: {len(in_shardings)} in_shardings for {len(xs)} args")
        if self._manual_devices is not None:
            raise InvalidArgumentError(f"{op}: shard_map cannot nest")
        texts = [hlo_sharding_string(s, x.rank, self._devices) for x, s in zip(xs, in_shardings)]
        counts = {xla_count(t) for t in texts} - {None}
        if self._devices is not None:
            counts.add(len(self._devices))
        if len(counts) != 1:
            raise InvalidArgumentError(
                f"{op}: cannot tell the number of devices from shardings {texts}: give "
                f"Builder(devices=...) and shardings over those devices")
        count = counts.pop()
        shards = []
        for x, text in zip(xs, texts):
            tiles = _tiles(text, x.rank)
            if any(d % t for d, t in zip(x.shape, tiles)):
                raise _infer.fail(op, [x], f"sharding {text} does not divide the shape evenly")
            shards.append((self.with_sharding(x, text), [d // t for d, t in zip(x.shape, tiles)]))
        # The body is built in an isolated scope over the same block: it sees only its
        # arguments, and what it makes is not visible after (ops made while a scope is
        # current belong to it).
        saved = self._scope
        self._scope = _Scope(saved.block, saved, True, "the body of shard_map")
        self._manual_devices = count
        try:
            local = [self._annotated("SPMDFullToShardShape", x, _MANUAL, shape) for x, shape in shards]
            out = fn(*local)
            many = isinstance(out, (tuple, list))
            outs = [self._operand(o, op) for o in (out if many else [out])]
            if len(out_shardings) != len(outs):
                raise InvalidArgumentError(f"{op}: {len(out_shardings)} out_shardings for {len(outs)} results")
            texts = [hlo_sharding_string(s, o.rank, self._devices) for o, s in zip(outs, out_shardings)]
            manual = [self._annotated("Sharding", o, _MANUAL, o.shape) for o in outs]
        finally:
            self._scope, self._manual_devices = saved, None
        results = [self._annotated("SPMDShardToFullShape", m, text,
                                   [d * t for d, t in zip(m.shape, _tiles(text, m.rank))])
                   for m, text in zip(manual, texts)]
        return tuple(results) if many else results[0]

    # -- collectives -----------------------------------------------------------------------

    def all_reduce(self, x: Any, computation: Union[str, Callable] = "sum",
                   replica_groups: Optional[Sequence[Sequence[int]]] = None,
                   channel_id: Optional[int] = None) -> Value:
        """Each device of a group gets the reduction ("sum", "prod", "max", "min", or a
        function of two scalars) of the group's values of x (all devices by default)."""
        op = "all_reduce"
        x = self._operand(x, op)
        groups = self._groups(op, x, replica_groups)
        fn = self._computation(op, computation, 1)
        operation = self._emit("stablehlo.all_reduce", [x], [(x.shape, x.dtype)],
                               self._collective_attrs(groups, channel_id), regions=1)
        got = self._fill_computation(op, operation, 0, [x.dtype], fn, "computation")
        _infer.region_results(op, "the computation", got, [(Shape(()), x.dtype)])
        return self._wrap(operation, [(x.shape, x.dtype)])[0]

    def all_gather(self, x: Any, dimension: int,
                   replica_groups: Optional[Sequence[Sequence[int]]] = None,
                   channel_id: Optional[int] = None) -> Value:
        """The group's values of x concatenated along ``dimension``, in group order."""
        op = "all_gather"
        x = self._operand(x, op)
        groups = self._groups(op, x, replica_groups)
        shape, dtype = _infer.all_gather(op, x, int(dimension), len(groups[0]))
        attrs = self._collective_attrs(groups, channel_id)
        with self._ctx:
            attrs["all_gather_dim"] = self._i64(dimension)
        return self._op1("stablehlo.all_gather", [x], shape, dtype, attrs)

    def reduce_scatter(self, x: Any, dimension: int, computation: Union[str, Callable] = "sum",
                       replica_groups: Optional[Sequence[Sequence[int]]] = None,
                       channel_id: Optional[int] = None) -> Value:
        """The group's reduction of x, split along ``dimension``: the i-th device of a
        group gets the i-th piece."""
        op = "reduce_scatter"
        x = self._operand(x, op)
        groups = self._groups(op, x, replica_groups)
        shape, dtype = _infer.reduce_scatter(op, x, int(dimension), len(groups[0]))
        fn = self._computation(op, computation, 1)
        attrs = self._collective_attrs(groups, channel_id)
        with self._ctx:
            attrs["scatter_dimension"] = self._i64(dimension)
        operation = self._emit("stablehlo.reduce_scatter", [x], [(shape, dtype)], attrs, regions=1)
        got = self._fill_computation(op, operation, 0, [dtype], fn, "computation")
        _infer.region_results(op, "the computation", got, [(Shape(()), dtype)])
        return self._wrap(operation, [(shape, dtype)])[0]

    def all_to_all(self, x: Any, split_dimension: int, concat_dimension: int,
                   replica_groups: Optional[Sequence[Sequence[int]]] = None,
                   channel_id: Optional[int] = None) -> Value:
        """x split along ``split_dimension`` into one piece per group member; piece j goes
        to member j, which concatenates what it receives along ``concat_dimension`` in
        group order."""
        op = "all_to_all"
        x = self._operand(x, op)
        groups = self._groups(op, x, replica_groups)
        n = len(groups[0])
        shape, dtype = _infer.all_to_all(op, x, int(split_dimension), int(concat_dimension), n)
        attrs = self._collective_attrs(groups, channel_id)
        del attrs["use_global_device_ids"]  # all_to_all takes none: its groups are device ids here
        with self._ctx:
            attrs.update({"split_dimension": self._i64(split_dimension),
                          "concat_dimension": self._i64(concat_dimension),
                          "split_count": self._i64(n)})
        return self._op1("stablehlo.all_to_all", [x], shape, dtype, attrs)

    def collective_permute(self, x: Any, source_target_pairs: Sequence[Sequence[int]],
                           channel_id: Optional[int] = None) -> Value:
        """Each source device sends x to its target; a device that is no target gets zeros."""
        op = "collective_permute"
        x = self._operand(x, op)
        pairs = _infer.source_target_pairs(op, x, source_target_pairs, self._spmd_count(op))
        with self._ctx:
            attrs = {"source_target_pairs": self._pairs(pairs), "channel_handle": self._channel(channel_id)}
        return self._op1("stablehlo.collective_permute", [x], x.shape, x.dtype, attrs)


def xla_count(text: str) -> Optional[int]:
    """The number of devices an HLO sharding tiles over (None for replicated/maximal)."""
    sharding = as_xla_hlo_sharding(text)
    if sharding.is_replicated() or sharding.is_maximal():
        return None
    return math.prod(sharding.tile_assignment_dimensions())
