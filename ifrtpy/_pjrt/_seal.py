"""The seal on serialized PJRT executables: bytes are handed to a plugin's deserializer
only when ifrtpy wrote them, for this plugin, and they arrived intact.

A plugin deserializes executables without checking them (a flipped byte can abort the
process), so ``ExecutableHandle.serialize`` wraps the plugin's bytes as::

    MAGIC, u32 identity length, identity, u64 payload length, SHA-256(identity + payload), payload

and ``deserialize_and_load`` unwraps them, refusing anything else with
InvalidArgumentError. The digest detects corruption and truncation; it does not prove
who wrote the bytes (anyone can compute it): load serialized executables only from
sources you trust, as you would a pickle, since they hold machine code.
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Any

from ifrtpy.errors import InvalidArgumentError

MAGIC = b"IFRTPY-PJRT-SEALED-1\n"
_LENGTHS = struct.Struct("<I")
_PAYLOAD = struct.Struct("<Q")


_identities: dict[tuple[str, str, str], bytes] = {}


def plugin_identity(plugin: Any, platform_name: str, platform_version: str) -> bytes:
    """What distinguishes one plugin build from another: its file name and size, PJRT API
    version, attributes and platform (read once per loaded plugin)."""
    known = _identities.get((plugin.path, platform_name, platform_version))
    if known is not None:
        return known
    try:
        size = os.stat(plugin.path).st_size
    except OSError:
        size = -1
    attributes = sorted((k, str(v)) for k, v in plugin.attributes.items())
    identity = repr((os.path.basename(plugin.path), size, tuple(plugin.api_version), attributes,
                     platform_name, platform_version)).encode()
    _identities[(plugin.path, platform_name, platform_version)] = identity
    return identity


def _digest(identity: bytes, payload: bytes) -> bytes:
    h = hashlib.sha256(identity)
    h.update(payload)
    return h.digest()


def seal(identity: bytes, payload: bytes) -> bytes:
    return b"".join([MAGIC, _LENGTHS.pack(len(identity)), identity, _PAYLOAD.pack(len(payload)),
                     _digest(identity, payload), payload])


def unseal(identity: bytes, data: bytes | bytearray | memoryview) -> bytes:
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
