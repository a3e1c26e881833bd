"""The old path of :mod:`ifrtpy.sharding.hlo` (HloSharding), kept for one release."""

import warnings

from ifrtpy.sharding.hlo import HloSharding as HloSharding

__all__ = ["HloSharding"]

warnings.warn("ifrtpy.hlo_sharding is now ifrtpy.sharding (HloSharding)", DeprecationWarning,
              stacklevel=2)
