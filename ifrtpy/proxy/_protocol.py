"""The IFRT Proxy messages, read from the descriptors compiled into the installed jaxlib.

jaxlib carries every protobuf file it was built with as a serialized
``FileDescriptorProto`` in ``libjax_common.so``. :func:`messages` finds the files the
protocol needs there (once, on first use), builds a private descriptor pool and returns
the message classes by their full names. No generated code and no copy of XLA's protos.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ifrtpy import _jaxlib
from ifrtpy._xla import varint
from ifrtpy.errors import NotFoundError

__all__ = ["messages", "message_class", "ROOT_FILES", "descriptor_files"]

#: The files whose messages the server speaks (their imports are pulled in too).
ROOT_FILES = (
    "xla/python/ifrt_proxy/common/grpc_ifrt_service.proto",
    "xla/python/ifrt_proxy/common/ifrt_service.proto",
    "xla/python/pjrt_ifrt/xla_sharding.proto",
    "xla/python/pjrt_ifrt/xla_compiler.proto",
    "xla/python/pjrt_ifrt/pjrt_layout_serdes.proto",
    "xla/python/ifrt/sharding_serdes.proto",
    "xla/python/ifrt_proxy/common/array_util.proto",
)

#: The shared objects of jaxlib searched, in order.
_LIBRARIES = ("libjax_common.so", "_jax.so", "_ifrt_proxy.so")

#: FileDescriptorProto's top-level fields and their wire types (descriptor.proto).
_FILE_FIELDS = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2, 9: 2, 10: 0, 11: 0, 12: 2,
                13: 2, 14: 0, 15: 2}


def _extent(data: bytes, start: int) -> int:
    """The end of the serialized FileDescriptorProto that begins at ``start``: its fields
    are read while they are fields of that message."""
    i = start
    while i < len(data):
        try:
            tag, j = varint(data, i)
            wire = _FILE_FIELDS.get(tag >> 3)
            if wire != tag & 7:
                break
            length, j = varint(data, j)
        except IndexError:
            break
        j += length if wire == 2 else 0
        if j > len(data):
            break
        i = j
    return i


def _parse_at(data: Any, start: int) -> Any:
    from google.protobuf import descriptor_pb2  # type: ignore[import-untyped]

    proto = descriptor_pb2.FileDescriptorProto()
    proto.ParseFromString(bytes(data[start:_extent(data, start)]))
    return proto


def _find(data: Any, name: str) -> Any:
    """The FileDescriptorProto of file ``name`` in ``data``, or None: its serialized form
    starts with field 1, the name."""
    encoded = name.encode()
    if len(encoded) > 127:  # the length would take two varint bytes; no such file here
        return None
    marker = b"\x0a" + bytes([len(encoded)]) + encoded + b"\x12"
    at = data.find(marker)
    while at >= 0:
        try:
            proto = _parse_at(data, at)
        except Exception:  # noqa: BLE001 - bytes that only look like a descriptor
            proto = None
        if proto is not None and proto.name == name:
            return proto
        at = data.find(marker, at + 1)
    return None


def _collect(data: Any, found: dict[str, Any]) -> None:
    """Add to ``found`` the root files and every file they import that ``data`` holds
    (the protobuf package's own files come from the protobuf package)."""
    todo = list(ROOT_FILES)
    while todo:
        name = todo.pop()
        if name in found or name.startswith("google/protobuf/"):
            continue
        proto = _find(data, name)
        if proto is not None:
            found[name] = proto
            todo.extend(proto.dependency)


@functools.lru_cache(maxsize=None)
def descriptor_files() -> dict[str, Any]:
    """The FileDescriptorProtos the protocol needs, found in jaxlib's shared objects (read
    through a memory map), by file name."""
    import mmap

    folder = _jaxlib.package_dir()
    found: dict[str, Any] = {}
    for library in _LIBRARIES:
        path = os.path.join(folder, library)
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _collect(data, found)
        if all(name in found for name in ROOT_FILES):
            break
    missing = [name for name in ROOT_FILES if name not in found]
    if missing:
        raise NotFoundError(f"the installed jaxlib ({folder}) carries no descriptors of {missing}")
    return found


def _well_known(name: str) -> Any:
    """The FileDescriptorProto of a protobuf well-known file, from the protobuf package."""
    import importlib

    from google.protobuf import descriptor_pb2  # type: ignore[import-untyped]

    module = importlib.import_module("google.protobuf." + name.rsplit("/", 1)[1][:-6] + "_pb2")
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


@functools.lru_cache(maxsize=None)
def _pool() -> Any:
    from google.protobuf import descriptor_pool  # type: ignore[import-untyped]

    files = descriptor_files()
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str) -> None:
        if name in added:
            return
        added.add(name)
        proto = files.get(name)
        if proto is None:
            if not name.startswith("google/protobuf/"):
                raise NotFoundError(f"the installed jaxlib carries no descriptor of {name}")
            proto = _well_known(name)
        for dependency in proto.dependency:
            add(dependency)
        pool.Add(proto)

    for name in ROOT_FILES:
        add(name)
    return pool


@functools.lru_cache(maxsize=None)
def message_class(full_name: str) -> Any:
    """The message class of ``full_name`` (e.g. ``"xla.ifrt.proxy.IfrtRequest"``)."""
    from google.protobuf import message_factory  # type: ignore[import-untyped]

    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))


class _Messages:
    """Message classes as attributes, by their short names in the packages the protocol
    uses (``m.IfrtRequest``, ``m.HloShardingProto``, ``m.OpSharding``, ``m.StatusProto``)."""

    _PACKAGES = ("xla.ifrt.proxy.", "xla.ifrt.", "xla.ifrt.proto.", "xla.", "tensorflow.")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        pool = _pool()
        for package in self._PACKAGES:
            try:
                pool.FindMessageTypeByName(package + name)
            except KeyError:
                continue
            cls = message_class(package + name)
            setattr(self, name, cls)
            return cls
        raise AttributeError(f"no IFRT Proxy message named {name}")


_MESSAGES = _Messages()


def messages() -> Any:
    """The protocol's message classes (see :class:`_Messages`)."""
    return _MESSAGES
