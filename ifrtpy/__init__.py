"""ifrtpy: a Python runtime layer for XLA devices, mirroring XLA's IFRT interfaces.

The public names are re-exported here; backends are imported on first use
(``get_client("pjrt")`` loads the Cython layer). Importing ifrtpy sets the plugin's log
threshold when the user has not (see :mod:`ifrtpy._log`), before any plugin or jaxlib loads.
"""

from ifrtpy import _log

_log._apply_environment()

from ifrtpy import distributed as distributed  # noqa: E402
from ifrtpy import errors as errors  # noqa: E402  (after the log threshold is set)
from ifrtpy import config as config  # noqa: E402
from ifrtpy import ffi as ffi  # noqa: E402
from ifrtpy.array import Array as Array
from ifrtpy.array import ArrayCopySemantics as ArrayCopySemantics
from ifrtpy.array import ArraySpec as ArraySpec
from ifrtpy.array import HostBufferSemantics as HostBufferSemantics
from ifrtpy.array import Shard as Shard
from ifrtpy.array import Tuple as Tuple
from ifrtpy.array import Value as Value
from ifrtpy.client import Client as Client
from ifrtpy.client import Compiler as Compiler
from ifrtpy.client import HostBufferShards as HostBufferShards
from ifrtpy.backends import devices as devices
from ifrtpy.backends import get_client as get_client
from ifrtpy.backends import register_backend as register_backend
from ifrtpy.backends import registered_backends as registered_backends
from ifrtpy.device import Device as Device
from ifrtpy.device import DeviceList as DeviceList
from ifrtpy.device import Memory as Memory
from ifrtpy.device import MemoryKind as MemoryKind
from ifrtpy.device_put import device_put as device_put
from ifrtpy.dtypes import DType as DType
from ifrtpy.dtypes import InexactDType as InexactDType
from ifrtpy.executable import CompiledMemoryStats as CompiledMemoryStats
from ifrtpy.executable import CompileOptions as CompileOptions
from ifrtpy.executable import ExecuteOptions as ExecuteOptions
from ifrtpy.executable import ExecuteResult as ExecuteResult
from ifrtpy.executable import LoadedExecutable as LoadedExecutable
from ifrtpy.future import Future as Future
from ifrtpy.future import Promise as Promise
from ifrtpy.future import join_futures as join_futures
from ifrtpy.sharding import HloSharding as HloSharding
from ifrtpy.layout import Layout as Layout
from ifrtpy.sharding import Mesh as Mesh
from ifrtpy.sharding import NamedSharding as NamedSharding
from ifrtpy.sharding import PartitionSpec as PartitionSpec
from ifrtpy.plugins import PluginInfo as PluginInfo
from ifrtpy.plugins import available_plugins as available_plugins
from ifrtpy.program import HloProgram as HloProgram
from ifrtpy.program import Program as Program
from ifrtpy.remap import Interval as Interval
from ifrtpy.remap import Mapping as Mapping
from ifrtpy.remap import RemapPlan as RemapPlan
from ifrtpy.shape import BoundedDynamicShapeTag as BoundedDynamicShapeTag
from ifrtpy.shape import DynamicShape as DynamicShape
from ifrtpy.shape import Index as Index
from ifrtpy.shape import IndexDomain as IndexDomain
from ifrtpy.shape import Shape as Shape
from ifrtpy.sharding import ConcreteEvenSharding as ConcreteEvenSharding
from ifrtpy.sharding import ConcreteSharding as ConcreteSharding
from ifrtpy.sharding import OpaqueSharding as OpaqueSharding
from ifrtpy.sharding import Sharding as Sharding
from ifrtpy.sharding import ShardingParam as ShardingParam
from ifrtpy.sharding import ShardingParamSharding as ShardingParamSharding
from ifrtpy.sharding import SingleDeviceSharding as SingleDeviceSharding
from ifrtpy.sharding import SingleDeviceShardSemantics as SingleDeviceShardSemantics
from ifrtpy.user_context import UserContext as UserContext
from ifrtpy.user_context import UserContextScope as UserContextScope
from ifrtpy.user_context import current_user_context as current_user_context
from ifrtpy._log import set_log_level as set_log_level
from ifrtpy.visualize import visualize_sharding as visualize_sharding
from ifrtpy.interop import from_dlpack as from_dlpack
from ifrtpy.interop.jax import from_jax as from_jax
from ifrtpy.interop.jax import to_jax as to_jax

from typing import Any as _Any  # noqa: E402

__version__ = "0.1.0"


def __getattr__(name: str) -> _Any:
    # ifrtpy.proxy (the IFRT Proxy server; grpcio is optional) is imported on first use.
    if name == "proxy":
        import importlib

        return importlib.import_module("ifrtpy.proxy")
    raise AttributeError(f"module 'ifrtpy' has no attribute {name!r}")
