"""Shardings as HLO sharding strings, for ``mhlo.sharding`` attributes.

Tile-assignment values in an HLO sharding are logical device ids: positions in the
executable's device list (``CompileOptions.devices``). The builder's ``devices`` (if
given) is that list; otherwise a sharding's own device list is taken to be it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ifrtpy import _jaxlib
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.sharding import (
    HloSharding, NamedSharding, ShardingParamSharding, SingleDeviceSharding,
)


def _positions(sharding_devices, devices) -> list[int]:
    """For each device of the sharding, its logical id in ``devices``."""
    if devices is None:
        return list(range(len(sharding_devices)))
    index = {d: i for i, d in enumerate(devices)}
    try:
        return [index[d] for d in sharding_devices]
    except KeyError as e:
        raise InvalidArgumentError(
            f"sharding uses device {e.args[0]}, which is not among the builder's devices") from None


def _tiled(dims: Sequence[int], assignment: Sequence[int], replicate_last: bool) -> str:
    if all(d == 1 for d in dims[:len(dims) - replicate_last]):
        return "{replicated}"
    if list(assignment) == list(range(len(assignment))):
        tiles = f"<=[{len(assignment)}]"
    else:
        tiles = ",".join(map(str, assignment))
    suffix = " last_tile_dim_replicate" if replicate_last else ""
    return f"{{devices=[{','.join(map(str, dims))}]{tiles}{suffix}}}"


def hlo_sharding_string(sharding: Any, rank: int, devices: Optional[Sequence] = None) -> str:
    """The HLO sharding text (``"{devices=[2,1]<=[2]}"``) of ``sharding`` for an array of
    ``rank``: a string (returned as is, after XLA parses it), an ifrtpy HloSharding,
    ShardingParamSharding, NamedSharding or SingleDeviceSharding."""
    if isinstance(sharding, str):
        try:
            _jaxlib.xla_client().HloSharding.from_string(sharding)
        except Exception as e:  # noqa: BLE001 - XLA's parser raises its own errors
            raise InvalidArgumentError(f"not an HLO sharding: {sharding!r} ({e})") from None
        return sharding
    if isinstance(sharding, NamedSharding):
        sharding = sharding.lower(rank)
    if isinstance(sharding, ShardingParamSharding):
        param = sharding.sharding_param
        if len(param.dim_shards) != rank:
            raise InvalidArgumentError(
                f"sharding {param.debug_string()} has rank {len(param.dim_shards)}, the value "
                f"rank {rank}")
        positions = _positions(sharding.devices, devices)
        replication = param.num_devices // param.num_shards
        dims = list(param.dim_shards) + ([replication] if replication > 1 else [])
        return _tiled(dims, [positions[p] for p in param.to_device_list()], replication > 1)
    if isinstance(sharding, SingleDeviceSharding):
        position = _positions([sharding.device], devices)[0]
        return f"{{maximal device={position}}}"
    if isinstance(sharding, HloSharding):
        xla = sharding.xla_hlo_sharding
        positions = _positions(sharding.devices, devices)
        if positions == list(range(len(positions))) or xla.is_replicated():
            return str(xla)
        if xla.is_maximal() or xla.tuple_elements() or xla.subgroup_types() or xla.is_manual():
            raise InvalidArgumentError(
                f"HloSharding {xla} over devices other than the builder's is not supported")
        dims = list(xla.tile_assignment_dimensions())
        assignment = [positions[i] for i in xla.tile_assignment_devices()]
        return _tiled(dims, assignment, xla.replicate_on_last_tile_dim())
    raise InvalidArgumentError(
        f"cannot annotate with {type(sharding).__name__}; give an HLO sharding string, an "
        f"HloSharding, ShardingParamSharding, NamedSharding or SingleDeviceSharding")
