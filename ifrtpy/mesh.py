"""The old path of :mod:`ifrtpy.sharding.mesh` (Mesh, PartitionSpec, NamedSharding), kept
for one release."""

import warnings

from ifrtpy.sharding.mesh import Mesh as Mesh
from ifrtpy.sharding.mesh import NamedSharding as NamedSharding
from ifrtpy.sharding.mesh import PartitionSpec as PartitionSpec

__all__ = ["Mesh", "PartitionSpec", "NamedSharding"]

warnings.warn("ifrtpy.mesh is now ifrtpy.sharding (Mesh, PartitionSpec, NamedSharding)",
              DeprecationWarning, stacklevel=2)
