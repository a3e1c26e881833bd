"""The seal on the PjRt backend's serialized executables: bytes are handed to a plugin's
deserializer only when ifrtpy wrote them, for this plugin, and they arrived intact.

A plugin deserializes executables without checking them (a flipped byte can abort the
process), and ``ifrtpy._pjrt`` hands it the bytes it is given, unchecked. So the backend
wraps the plugin's bytes (:func:`serialize`) as::

    MAGIC, u32 identity length, identity, u64 payload length, SHA-256(identity + payload), payload

and unwraps them before the plugin sees them (:func:`deserialize_and_load`), refusing
anything else with InvalidArgumentError. Every path that loads an executable goes through
here: ``PjrtLoadedExecutable.serialize`` and ``deserialize_executable``, and the persistent
compilation cache (``ifrtpy.compilation_cache``), whose entries hold sealed bytes. The
digest detects corruption and truncation; it does not prove who wrote the bytes (anyone
can compute it): load serialized executables only from sources you trust, as you would a
pickle, since they hold machine code.
"""

from __future__ import annotations

import hashlib
import os
import struct

from ifrtpy import _pjrt
from ifrtpy.errors import InvalidArgumentError

__all__ = ["MAGIC", "plugin_identity", "seal", "unseal", "serialize", "deserialize_and_load"]

MAGIC = b"IFRTPY-PJRT-SEALED-1\n"
_LENGTHS = struct.Struct("<I")
_PAYLOAD = struct.Struct("<Q")


_identities: dict[tuple[str, str, str], bytes] = {}


def plugin_identity(client: _pjrt.ClientHandle) -> bytes:
    """What distinguishes the plugin build of ``client`` from another: its file name and
    size, PJRT API version, attributes and platform (read once per loaded plugin)."""
    plugin = client.plugin
    key = (plugin.path, client.platform_name, client.platform_version)
    known = _identities.get(key)
    if known is not None:
        return known
    try:
        size = os.stat(plugin.path).st_size
    except OSError:
        size = -1
    attributes = sorted((k, str(v)) for k, v in plugin.attributes.items())
    identity = repr((os.path.basename(plugin.path), size, tuple(plugin.api_version), attributes,
                     client.platform_name, client.platform_version)).encode()
    _identities[key] = identity
    return identity


def _digest(identity: bytes, payload: bytes) -> bytes:
    h = hashlib.sha256(identity)
    h.update(payload)
    return h.digest()


def seal(identity: bytes, payload: bytes) -> bytes:
    return b"".join([MAGIC, _LENGTHS.pack(len(identity)), identity, _PAYLOAD.pack(len(payload)),
                     _digest(identity, payload), payload])


def unseal(identity: bytes, data: object) -> bytes:
    """The plugin's payload of what :func:`seal` wrote with ``identity``; InvalidArgumentError
    for bytes of another form, another plugin, or with any byte changed or missing."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"a serialized executable is bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data.startswith(MAGIC):
        raise InvalidArgumentError(
            f"not a serialized executable written by ifrtpy ({len(data)} bytes, starting "
            f"{data[:16]!r}); it is not handed to the plugin")
    at = len(MAGIC)
    try:
        (size,) = _LENGTHS.unpack_from(data, at)
        at += _LENGTHS.size
        theirs = data[at:at + size]
        at += size
        (length,) = _PAYLOAD.unpack_from(data, at)
        at += _PAYLOAD.size
    except struct.error:
        raise InvalidArgumentError(
            f"corrupt serialized executable: cut short at {len(data)} bytes") from None
    digest, payload = data[at:at + 32], data[at + 32:]
    if len(payload) != length or len(digest) != 32:
        raise InvalidArgumentError(
            f"corrupt serialized executable: the payload has {max(len(payload), 0)} bytes, "
            f"its header says {length}")
    if theirs != identity:
        raise InvalidArgumentError(
            "the serialized executable was written by another PJRT plugin (or another version "
            f"of it): {theirs.decode(errors='replace')}; this client's plugin is "
            f"{identity.decode(errors='replace')} (compile it again)")
    if _digest(identity, payload) != digest:
        raise InvalidArgumentError(
            "corrupt serialized executable: its SHA-256 checksum does not match; it is not "
            "handed to the plugin")
    return payload


def serialize(handle: _pjrt.ExecutableHandle) -> bytes:
    """The plugin's serialized ``handle``, sealed for its client's plugin."""
    return seal(plugin_identity(handle.client), handle.serialize())


def deserialize_and_load(client: _pjrt.ClientHandle, data: object) -> _pjrt.ExecutableHandle:
    """The executable of what :func:`serialize` wrote with ``client``'s plugin, loaded onto
    ``client``; InvalidArgumentError, and no plugin call, for any other bytes."""
    return _pjrt.deserialize_and_load(client, unseal(plugin_identity(client), data))
