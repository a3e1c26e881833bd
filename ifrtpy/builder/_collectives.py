"""Collectives, over replicas or inside shard_map.

Outside ``shard_map`` a collective is XLA's over replicas (a program compiled with
``num_replicas``, each replica running the whole program on its own values): the builder
writes it as XLA's XlaBuilder does, with the ``replica_groups`` given (none: every replica
in one group), a channel id only where one is given, and ``use_global_device_ids`` only
where set.

Inside ``shard_map`` (a function run on each device's shard, XLA's manual sharding, as
jax's shard_map lowers to) a collective exchanges data between the devices of an SPMD
program: ids in ``replica_groups`` and ``source_target_pairs`` are positions in the
program's device list (the executable's ``CompileOptions.devices``), global device ids
over partitions, each collective with its own channel id.

A program has collectives of one kind: one over replicas and a shard_map are refused
together.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np

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
#: How a refusal to mix collectives names each kind.
_KINDS = {"replicas": "{op} outside shard_map, a collective over replicas (num_replicas)",
          "shard_map": "shard_map, whose collectives run on an SPMD program's devices "
                       "(num_partitions)"}


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

    def _collective_kind(self, op: str) -> Optional[int]:
        """The device count inside shard_map, or None for a collective over replicas;
        refuses mixing the two kinds in one program."""
        kind = "shard_map" if op == "shard_map" or self._manual_devices is not None else "replicas"
        first = self._collectives
        if first is not None and first[0] != kind:
            joining = _KINDS[kind].format(op=op) + "," if kind == "replicas" else "shard_map"
            raise InvalidArgumentError(
                f"{op}: this program has {_KINDS[first[0]].format(op=first[1])}, and "
                f"{joining} cannot join it: a program's collectives are all over replicas "
                f"(outside shard_map) or all inside shard_map")
        return self._manual_devices

    def _made(self, op: str, value):
        """``value``, the result of ``op``: the first collective (or shard_map) made fixes
        the program's kind."""
        if self._collectives is None:
            inside = op == "shard_map" or self._manual_devices is not None
            self._collectives = ("shard_map", "shard_map") if inside else ("replicas", op)
        return value

    def _channel_attr(self, channel_id: Optional[int], replicas: bool) -> dict:
        """The channel handle: ``channel_id``, or (inside shard_map) the next one; none
        over replicas unless given."""
        from jaxlib.mlir.dialects import stablehlo
        if channel_id is None:
            if replicas:
                return {}
            self._last_channel += 1
            channel_id = self._last_channel
        elif isinstance(channel_id, bool) or not isinstance(channel_id, int) or channel_id < 1:
            raise InvalidArgumentError(f"channel_id must be a positive int, got {channel_id!r}")
        with self._ctx:
            return {"channel_handle": stablehlo.ChannelHandle.get(int(channel_id), 1)}

    def _collective(self, op: str, x: Value, replica_groups, channel_id,
                    use_global_device_ids: Optional[bool]) -> tuple[Optional[list], dict]:
        """``(groups, attributes)``: the groups (None: every replica, over replicas),
        with the channel and ``use_global_device_ids`` attributes."""
        count = self._collective_kind(op)
        if use_global_device_ids not in (None, True, False):
            raise _infer.fail(op, [x], f"use_global_device_ids must be a bool or None, got "
                                       f"{use_global_device_ids!r}")
        if count is None:  # over replicas
            global_ids = bool(use_global_device_ids)
            if global_ids and (channel_id is None or replica_groups is None):
                raise _infer.fail(op, [x], "use_global_device_ids needs a channel_id and "
                                           "replica_groups (StableHLO's rule)")
            groups = None if replica_groups is None else _infer.replica_groups(
                op, [x], replica_groups, None)
        else:
            if use_global_device_ids is False:
                raise _infer.fail(op, [x], "inside shard_map collectives use global device ids")
            global_ids = True
            groups = _infer.replica_groups(
                op, [x], [list(range(count))] if replica_groups is None else replica_groups, count)
        attrs = self._channel_attr(channel_id, count is None)
        with self._ctx:
            attrs["replica_groups"] = self._ir.DenseIntElementsAttr.get(
                np.asarray(groups if groups is not None else np.zeros((0, 0)), np.int64))
            if global_ids:
                attrs["use_global_device_ids"] = self._ir.UnitAttr.get()
        return groups, attrs

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
        self._collective_kind(op)
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
        return self._made(op, tuple(results) if many else results[0])

    # -- collectives -----------------------------------------------------------------------

    def all_reduce(self, x: Any, computation: Union[str, Callable] = "sum",
                   replica_groups: Optional[Sequence[Sequence[int]]] = None,
                   channel_id: Optional[int] = None, *,
                   use_global_device_ids: Optional[bool] = None) -> Value:
        """Each member of a group (a replica, or a device inside shard_map) gets the
        reduction ("sum", "prod", "max", "min", or a function of two scalars) of the
        group's values of x (one group of all by default). ``channel_id`` and
        ``use_global_device_ids`` are XLA's (see the module's docstring)."""
        op = "all_reduce"
        x = self._operand(x, op)
        _, attrs = self._collective(op, x, replica_groups, channel_id, use_global_device_ids)
        fn = self._computation(op, computation, 1)
        operation = self._emit("stablehlo.all_reduce", [x], [(x.shape, x.dtype)], attrs, regions=1)
        got = self._fill_computation(op, operation, 0, [x.dtype], fn, "computation")
        _infer.region_results(op, "the computation", got, [(Shape(()), x.dtype)])
        return self._made(op, self._wrap(operation, [(x.shape, x.dtype)])[0])

    def cross_replica_sum(self, x: Any,
                          replica_groups: Optional[Sequence[Sequence[int]]] = None) -> Value:
        """XLA's CrossReplicaSum: ``all_reduce(x, "sum", replica_groups)``."""
        return self.all_reduce(x, "sum", replica_groups)

    def all_gather(self, x: Any, dimension: int,
                   replica_groups: Optional[Sequence[Sequence[int]]] = None,
                   channel_id: Optional[int] = None, *, shard_count: Optional[int] = None,
                   use_global_device_ids: Optional[bool] = None) -> Value:
        """The group's values of x concatenated along ``dimension``, in group order
        (``shard_count``, the group size, is needed over all replicas)."""
        op = "all_gather"
        x = self._operand(x, op)
        groups, attrs = self._collective(op, x, replica_groups, channel_id, use_global_device_ids)
        size = _infer.group_size(op, [x], groups, shard_count, "shard_count")
        shape, dtype = _infer.all_gather(op, x, int(dimension), size)
        with self._ctx:
            attrs["all_gather_dim"] = self._i64(dimension)
        return self._made(op, self._op1("stablehlo.all_gather", [x], shape, dtype, attrs))

    def reduce_scatter(self, x: Any, dimension: int, computation: Union[str, Callable] = "sum",
                       replica_groups: Optional[Sequence[Sequence[int]]] = None,
                       channel_id: Optional[int] = None, *, shard_count: Optional[int] = None,
                       use_global_device_ids: Optional[bool] = None) -> Value:
        """The group's reduction of x, split along ``dimension``: the i-th device of a
        group gets the i-th piece (``shard_count``, the group size, is needed over all
        replicas)."""
        op = "reduce_scatter"
        x = self._operand(x, op)
        groups, attrs = self._collective(op, x, replica_groups, channel_id, use_global_device_ids)
        size = _infer.group_size(op, [x], groups, shard_count, "shard_count")
        shape, dtype = _infer.reduce_scatter(op, x, int(dimension), size)
        fn = self._computation(op, computation, 1)
        with self._ctx:
            attrs["scatter_dimension"] = self._i64(dimension)
        operation = self._emit("stablehlo.reduce_scatter", [x], [(shape, dtype)], attrs, regions=1)
        got = self._fill_computation(op, operation, 0, [dtype], fn, "computation")
        _infer.region_results(op, "the computation", got, [(Shape(()), dtype)])
        return self._made(op, self._wrap(operation, [(shape, dtype)])[0])

    def all_to_all(self, x: Any, split_dimension: int, concat_dimension: int,
                   replica_groups: Optional[Sequence[Sequence[int]]] = None,
                   channel_id: Optional[int] = None, *,
                   split_count: Optional[int] = None) -> Value:
        """x split along ``split_dimension`` into one piece per group member; piece j goes
        to member j, which concatenates what it receives along ``concat_dimension`` in
        group order. Over all replicas ``split_count`` gives the group size, and the
        group is replicas 0 to split_count - 1 (as XLA's builder writes it)."""
        op = "all_to_all"
        x = self._operand(x, op)
        groups, attrs = self._collective(op, x, replica_groups, channel_id, None)
        n = _infer.group_size(op, [x], groups, split_count, "split_count")
        if groups is None:
            with self._ctx:
                attrs["replica_groups"] = self._ir.DenseIntElementsAttr.get(
                    np.arange(n, dtype=np.int64).reshape(1, n))
        shape, dtype = _infer.all_to_all(op, x, int(split_dimension), int(concat_dimension), n)
        attrs.pop("use_global_device_ids", None)  # all_to_all takes none
        with self._ctx:
            attrs.update({"split_dimension": self._i64(split_dimension),
                          "concat_dimension": self._i64(concat_dimension),
                          "split_count": self._i64(n)})
        return self._made(op, self._op1("stablehlo.all_to_all", [x], shape, dtype, attrs))

    def collective_permute(self, x: Any, source_target_pairs: Sequence[Sequence[int]],
                           channel_id: Optional[int] = None) -> Value:
        """Each source device sends x to its target; a device that is no target gets zeros."""
        op = "collective_permute"
        x = self._operand(x, op)
        count = self._collective_kind(op)
        pairs = _infer.source_target_pairs(op, x, source_target_pairs, count)
        attrs = self._channel_attr(channel_id, count is None)
        with self._ctx:
            attrs["source_target_pairs"] = self._pairs(pairs)
        return self._made(op, self._op1("stablehlo.collective_permute", [x], x.shape, x.dtype, attrs))


def xla_count(text: str) -> Optional[int]:
    """The number of devices an HLO sharding tiles over (None for replicated/maximal)."""
    sharding = as_xla_hlo_sharding(text)
    if sharding.is_replicated() or sharding.is_maximal():
        return None
    return math.prod(sharding.tile_assignment_dimensions())
