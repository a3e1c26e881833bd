"""Devices and memories: the abstract Device and Memory, MemoryKind, DeviceList.

Mirrors IFRT's ``device.h``, ``memory.h`` and ``device_list.h``. Backends subclass
:class:`Device` and :class:`Memory`; :class:`MemoryKind` and :class:`DeviceList` are
concrete, immutable values shared by every backend.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional, Union, overload

from ifrtpy.errors import InvalidArgumentError, invalid_argument

if TYPE_CHECKING:
    from ifrtpy.client import Client  # noqa: F401  (annotation only)

__all__ = ["MemoryKind", "canonicalize_memory_kind", "Memory", "Device", "DeviceList"]


class MemoryKind:
    """The kind of a memory space, e.g. ``"device"``, ``"pinned_host"``, ``"unpinned_host"``.

    An optional string: ``MemoryKind()`` (or ``MemoryKind(None)``) means "the platform's
    default". Compare kinds only after :meth:`canonicalize`-ing both against a device.
    """

    __slots__ = ("_value",)

    def __init__(self, value: Union[str, MemoryKind, None] = None):
        if isinstance(value, MemoryKind):
            value = value._value
        elif value is not None:
            if not isinstance(value, str):
                raise invalid_argument("memory kind", "a str or None", value)
            value = sys.intern(value)
        self._value: Optional[str] = value

    @property
    def value(self) -> Optional[str]:
        """The kind string, or None for the platform default."""
        return self._value

    def canonicalize(self, device: Device) -> MemoryKind:
        """This kind, or ``device``'s default memory kind when this one is the default."""
        if self._value is not None:
            return self
        return device.default_memory().kind

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemoryKind):
            return NotImplemented
        return self._value == other._value

    def __hash__(self) -> int:
        return hash((MemoryKind, self._value))

    def __bool__(self) -> bool:
        return self._value is not None

    def __str__(self) -> str:
        return "(default)" if self._value is None else self._value

    def __repr__(self) -> str:
        return "MemoryKind()" if self._value is None else f"MemoryKind({self._value!r})"

    def __reduce__(self):
        return (MemoryKind, (self._value,))


def canonicalize_memory_kind(memory_kind: Union[str, MemoryKind, None],
                             device: Device) -> MemoryKind:
    """IFRT's ``CanonicalizeMemoryKind``: a MemoryKind, defaulted from ``device``."""
    if not isinstance(memory_kind, MemoryKind):
        memory_kind = MemoryKind(memory_kind)
    return memory_kind.canonicalize(device)


class Memory(abc.ABC):
    """A memory space attached to one or more devices.

    Contract: ``id`` is unique within the client, ``kind`` is a non-default MemoryKind,
    ``devices()`` lists the devices that can address this memory. Objects are owned by
    their client and live as long as it; equality is identity.
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def id(self) -> int:
        """The memory id, unique within the client."""

    @property
    @abc.abstractmethod
    def kind(self) -> MemoryKind:
        """The kind of this memory (never the default MemoryKind())."""

    @abc.abstractmethod
    def devices(self) -> Sequence[Device]:
        """The devices attached to this memory."""

    @abc.abstractmethod
    def to_string(self) -> str:
        """A short, human-readable name."""

    def debug_string(self) -> str:
        """A verbose description; defaults to :meth:`to_string`."""
        return self.to_string()

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return self.debug_string()


class Device(abc.ABC):
    """A compute device of a client.

    Contract: ``id`` is globally unique in the client; ``kind`` is the vendor's device kind
    ("cpu", "NVIDIA H200"); ``memories()`` may be unordered; ``default_memory()`` raises
    (e.g. NotFoundError/UnimplementedError) when the device has none; ``is_addressable``
    says whether this process can place data on it; ``process_index`` is the owning
    process. Devices are owned by their client, live as long as it, and compare by
    identity. All members are cheap and thread-safe.
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def client(self) -> "Client":
        """The client that owns this device."""

    @property
    @abc.abstractmethod
    def id(self) -> int:
        """The device id, unique among the client's devices."""

    @property
    @abc.abstractmethod
    def kind(self) -> str:
        """The vendor's device kind string."""

    @property
    def attributes(self) -> Mapping[str, Any]:
        """Backend-specific attributes (str -> str/bool/int/list[int]/float)."""
        return {}

    @property
    @abc.abstractmethod
    def is_addressable(self) -> bool:
        """Whether this process can address the device."""

    @property
    @abc.abstractmethod
    def process_index(self) -> int:
        """The index of the process that owns the device."""

    @abc.abstractmethod
    def memories(self) -> Sequence[Memory]:
        """The memories this device can address."""

    @abc.abstractmethod
    def default_memory(self) -> Memory:
        """The memory used when none is named; raises if the device has none."""

    def memory(self, kind: Union[MemoryKind, str, None] = None) -> Memory:
        """The memory of ``kind`` (the default memory for the default kind);
        InvalidArgumentError naming the kinds the device has when none is of ``kind``."""
        kind = kind if isinstance(kind, MemoryKind) else MemoryKind(kind)
        if not kind:
            return self.default_memory()
        memories = self.memories()
        for memory in memories:
            if memory.kind == kind:
                return memory
        available = ", ".join(str(m.kind) for m in memories)
        raise InvalidArgumentError(
            f"Invalid memory kind {kind} for device {self.to_string()}; "
            f"available memory kinds: {available}")

    @abc.abstractmethod
    def to_string(self) -> str:
        """A short, human-readable name."""

    def debug_string(self) -> str:
        """A verbose description; defaults to :meth:`to_string`."""
        return self.to_string()

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return self.debug_string()

    if not TYPE_CHECKING:  # typed code reads ``attributes[name]``; mypy keeps checking names
        def __getattr__(self, name: str) -> Any:
            """Each of :attr:`attributes` as an attribute (``d.coords``), as jax's devices.

            AttributeError naming the device and the attributes it has for any other name.
            Private names and the class's own members (a property that raised
            AttributeError) are never looked up there: a half-built device, or a copy or
            pickle probe, gets the plain AttributeError.
            """
            if name.startswith("_") or hasattr(type(self), name):
                raise AttributeError(
                    f"{type(self).__name__!r} object has no attribute {name!r}",
                    name=name, obj=self)
            attributes = self.attributes
            if name in attributes:
                return attributes[name]
            raise AttributeError(
                f"device {self.to_string()} has no attribute {name!r}; its attributes: "
                f"{', '.join(sorted(attributes)) or 'none'}", name=name, obj=self)


class DeviceList(Sequence):
    """An immutable, ordered list of devices, which may repeat a device (as IFRT's);
    what needs distinct devices (shardings, meshes, compilation) checks
    :attr:`has_repeats`.

    Equality compares the devices in order; the hash is stable within the process.
    :meth:`addressable_device_list` is cached and returns ``self`` when every device is
    addressable (then :attr:`is_fully_addressable` is true). Anything but an iterable of
    :class:`Device` raises InvalidArgumentError naming what it got.
    """

    __slots__ = ("_devices", "_hash", "_addressable", "_mask", "_repeats", "__weakref__")

    def __init__(self, devices: Iterable[Device] = ()):
        if isinstance(devices, DeviceList):
            self._devices: tuple[Device, ...] = devices._devices
        else:
            self._devices = device_tuple(devices)
        self._repeats: Optional[bool] = None
        self._hash: Optional[int] = None
        self._addressable: Optional[DeviceList] = None
        self._mask: Optional[tuple[bool, ...]] = None

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._devices

    def __len__(self) -> int:
        return len(self._devices)

    def __iter__(self) -> Iterator[Device]:
        return iter(self._devices)

    @overload
    def __getitem__(self, index: int) -> Device: ...
    @overload
    def __getitem__(self, index: slice) -> DeviceList: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return DeviceList(self._devices[index])
        return self._devices[index]

    def addressable_mask(self) -> tuple[bool, ...]:
        """``is_addressable`` of each device, in order (cached)."""
        if self._mask is None:
            self._mask = tuple(d.is_addressable for d in self._devices)
        return self._mask

    def addressable_device_list(self) -> DeviceList:
        """The addressable devices in order; ``self`` if all of them are."""
        if self._addressable is None:
            mask = self.addressable_mask()
            if all(mask):
                self._addressable = self
            else:
                self._addressable = DeviceList(d for d, a in zip(self._devices, mask) if a)
        return self._addressable

    @property
    def is_fully_addressable(self) -> bool:
        return self.addressable_device_list() is self

    @property
    def has_repeats(self) -> bool:
        """Whether some device appears more than once (cached)."""
        if self._repeats is None:
            self._repeats = len(set(map(id, self._devices))) != len(self._devices)
        return self._repeats

    def check_distinct(self, parameter: str) -> DeviceList:
        """``self``; InvalidArgumentError naming ``parameter`` and the first repeated
        device if a device appears twice."""
        if self.has_repeats:
            seen: set[int] = set()
            for i, device in enumerate(self._devices):
                if id(device) in seen:
                    raise InvalidArgumentError(
                        f"{parameter} must not repeat a device: entry {i} repeats "
                        f"{device.to_string()} in {self.to_string()}")
                seen.add(id(device))
        return self

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, DeviceList):
            return NotImplemented
        return self._devices == other._devices

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((DeviceList, self._devices))
        return self._hash

    def to_string(self) -> str:
        return "[" + ",".join(d.to_string() for d in self._devices) + "]"

    def __repr__(self) -> str:
        return f"DeviceList({list(self._devices)!r})"

    def __reduce__(self):
        return (DeviceList, (self._devices,))


_DEVICE_TYPES: set[type] = set()  # Device subclasses seen: checked once per type


def device_tuple(devices: object, parameter: str = "devices") -> tuple[Device, ...]:
    """``devices`` as a tuple, each entry checked to be a Device (InvalidArgumentError
    naming ``parameter`` and the entry otherwise)."""
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Iterable):
        raise invalid_argument(parameter, "an iterable of Devices", devices)
    items = tuple(devices)
    for i, device in enumerate(items):
        kind = type(device)
        if kind not in _DEVICE_TYPES:
            if not isinstance(device, Device):
                raise invalid_argument(f"{parameter}[{i}]", "a Device", device)
            _DEVICE_TYPES.add(kind)
    return items
