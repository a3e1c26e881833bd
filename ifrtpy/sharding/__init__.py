"""Shardings: how an array's elements are laid out over a list of devices.

Mirrors IFRT's ``sharding.h`` and ``ir/sharding_param.h``, with jax's ``Mesh`` /
``NamedSharding`` and XLA's ``HloSharding``. A :class:`Sharding` is an immutable value
holding a :class:`~ifrtpy.device.DeviceList` and a memory kind (always canonicalized
against the first device). Shard ``i`` lives on ``devices[i]``; every list returned by
:meth:`Sharding.disassemble` and :meth:`Sharding.index_domains` is in that device order,
restricted to addressable devices for ``ADDRESSABLE_SHARDS``.

All the math is pure Python + NumPy and backend-independent. Errors are
:class:`~ifrtpy.errors.InvalidArgumentError` with IFRT's messages.

* :mod:`.base`: the :class:`Sharding` interface, :class:`SingleDeviceSharding`,
  :class:`OpaqueSharding`;
* :mod:`.concrete`: :class:`ConcreteSharding`, :class:`ConcreteEvenSharding`;
* :mod:`.param`: :class:`ShardingParam`, :class:`ShardingParamSharding`;
* :mod:`.hlo`: :class:`HloSharding` (XLA's ``OpSharding``);
* :mod:`.mesh`: :class:`Mesh`, :class:`PartitionSpec`, :class:`NamedSharding`.
"""

from ifrtpy.sharding._common import ADDRESSABLE_SHARDS as ADDRESSABLE_SHARDS
from ifrtpy.sharding._common import ALL_SHARDS as ALL_SHARDS
from ifrtpy.sharding._common import SingleDeviceShardSemantics as SingleDeviceShardSemantics
from ifrtpy.sharding.base import OpaqueSharding as OpaqueSharding
from ifrtpy.sharding.base import Sharding as Sharding
from ifrtpy.sharding.base import SingleDeviceSharding as SingleDeviceSharding
from ifrtpy.sharding.concrete import ConcreteEvenSharding as ConcreteEvenSharding
from ifrtpy.sharding.concrete import ConcreteSharding as ConcreteSharding
from ifrtpy.sharding.hlo import HloSharding as HloSharding
from ifrtpy.sharding.hlo import check_reduced as check_reduced
from ifrtpy.sharding.hlo import same_unreduced as same_unreduced
from ifrtpy.sharding.mesh import Mesh as Mesh
from ifrtpy.sharding.mesh import NamedSharding as NamedSharding
from ifrtpy.sharding.mesh import PartitionSpec as PartitionSpec
from ifrtpy.sharding.param import MAX_MESH_DEVICES as MAX_MESH_DEVICES
from ifrtpy.sharding.param import ShardingParam as ShardingParam
from ifrtpy.sharding.param import ShardingParamSharding as ShardingParamSharding

__all__ = [
    "SingleDeviceShardSemantics", "Sharding", "SingleDeviceSharding", "OpaqueSharding",
    "ConcreteSharding", "ConcreteEvenSharding", "ShardingParam", "ShardingParamSharding",
    "HloSharding", "check_reduced", "same_unreduced", "Mesh", "PartitionSpec", "NamedSharding",
]
