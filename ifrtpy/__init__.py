"""ifrtpy: a Python runtime layer for XLA devices, mirroring XLA's IFRT interfaces.

The public names (``__all__``) are loaded on first use, each from the module that defines
it: ``import ifrtpy`` (and ``python -m ifrtpy --help``) costs little, ``ifrt.get_client``
imports the registry, ``get_client("pjrt")`` the Cython layer. Importing ifrtpy sets the
plugin's log threshold when the user has not (see :mod:`ifrtpy._log`), before any plugin or
jaxlib loads. ``dir(ifrtpy)`` lists the public names only.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING, Any as _Any

from ifrtpy import _log

_log._apply_environment()

if _TYPE_CHECKING:  # what mypy and IDEs read; at run time, __getattr__ below
    from ifrtpy import distributed as distributed
    from ifrtpy import errors as errors
    from ifrtpy import config as config
    from ifrtpy import ffi as ffi
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
    from ifrtpy._device_put import device_put as device_put
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
    from ifrtpy import builder as builder
    from ifrtpy import proxy as proxy
    from ifrtpy import testing as testing

__version__ = "0.1.0"

#: Each public name, by the module that defines it.
_HOMES: dict[str, str] = {
    "Array": "ifrtpy.array",
    "ArrayCopySemantics": "ifrtpy.array",
    "ArraySpec": "ifrtpy.array",
    "HostBufferSemantics": "ifrtpy.array",
    "Shard": "ifrtpy.array",
    "Tuple": "ifrtpy.array",
    "Value": "ifrtpy.array",
    "Client": "ifrtpy.client",
    "Compiler": "ifrtpy.client",
    "HostBufferShards": "ifrtpy.client",
    "devices": "ifrtpy.backends",
    "get_client": "ifrtpy.backends",
    "register_backend": "ifrtpy.backends",
    "registered_backends": "ifrtpy.backends",
    "Device": "ifrtpy.device",
    "DeviceList": "ifrtpy.device",
    "Memory": "ifrtpy.device",
    "MemoryKind": "ifrtpy.device",
    "device_put": "ifrtpy._device_put",
    "DType": "ifrtpy.dtypes",
    "InexactDType": "ifrtpy.dtypes",
    "CompiledMemoryStats": "ifrtpy.executable",
    "CompileOptions": "ifrtpy.executable",
    "ExecuteOptions": "ifrtpy.executable",
    "ExecuteResult": "ifrtpy.executable",
    "LoadedExecutable": "ifrtpy.executable",
    "Future": "ifrtpy.future",
    "Promise": "ifrtpy.future",
    "join_futures": "ifrtpy.future",
    "HloSharding": "ifrtpy.sharding",
    "Layout": "ifrtpy.layout",
    "Mesh": "ifrtpy.sharding",
    "NamedSharding": "ifrtpy.sharding",
    "PartitionSpec": "ifrtpy.sharding",
    "PluginInfo": "ifrtpy.plugins",
    "available_plugins": "ifrtpy.plugins",
    "HloProgram": "ifrtpy.program",
    "Program": "ifrtpy.program",
    "Interval": "ifrtpy.remap",
    "Mapping": "ifrtpy.remap",
    "RemapPlan": "ifrtpy.remap",
    "BoundedDynamicShapeTag": "ifrtpy.shape",
    "DynamicShape": "ifrtpy.shape",
    "Index": "ifrtpy.shape",
    "IndexDomain": "ifrtpy.shape",
    "Shape": "ifrtpy.shape",
    "ConcreteEvenSharding": "ifrtpy.sharding",
    "ConcreteSharding": "ifrtpy.sharding",
    "OpaqueSharding": "ifrtpy.sharding",
    "Sharding": "ifrtpy.sharding",
    "ShardingParam": "ifrtpy.sharding",
    "ShardingParamSharding": "ifrtpy.sharding",
    "SingleDeviceSharding": "ifrtpy.sharding",
    "SingleDeviceShardSemantics": "ifrtpy.sharding",
    "UserContext": "ifrtpy.user_context",
    "UserContextScope": "ifrtpy.user_context",
    "current_user_context": "ifrtpy.user_context",
    "set_log_level": "ifrtpy._log",
    "visualize_sharding": "ifrtpy.visualize",
    "from_dlpack": "ifrtpy.interop",
    "from_jax": "ifrtpy.interop.jax",
    "to_jax": "ifrtpy.interop.jax",
}

#: The public modules, imported on first use too: those of ``__all__`` and ``ifrt.builder``,
#: ``ifrt.testing``, ``ifrt.proxy`` (kept out of ``import *``: grpcio is an optional extra).
_MODULES = ("distributed", "errors", "config", "ffi", "builder", "testing", "proxy")

#: Every name ``_HOMES`` gives a home, and the modules of ``import *``.
__all__ = ["__version__", *_HOMES, "config", "distributed", "errors", "ffi"]


def __getattr__(name: str) -> _Any:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(_importlib.import_module(home), name)
    elif name in _MODULES or (not name.startswith("_") and _is_submodule(name)):
        value = _importlib.import_module(f"ifrtpy.{name}")  # ifrt.plugins.builds, ...
    else:
        raise AttributeError(f"module 'ifrtpy' has no attribute {name!r}")
    globals()[name] = value  # later uses are plain attribute reads
    return value


def _is_submodule(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(f"ifrtpy.{name}") is not None


def __dir__() -> list[str]:
    # Not "proxy": help(ifrtpy) reads every listed name, and ifrtpy.proxy needs grpcio.
    return sorted({*__all__, "builder", "testing"})
