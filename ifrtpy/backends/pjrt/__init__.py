"""The PjRt backend: IFRT's interfaces over a PJRT plugin, through ``ifrtpy._pjrt``.

An array is one PJRT buffer per addressable device of its sharding, in the sharding's
device order (as in XLA's PjRt-IFRT).
"""

from ifrtpy.backends.pjrt.array import PjrtArray
from ifrtpy.backends.pjrt.client import PjrtClient, PjrtDevice, PjrtMemory, create_client

__all__ = ["PjrtArray", "PjrtClient", "PjrtDevice", "PjrtMemory", "create_client"]
