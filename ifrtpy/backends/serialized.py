"""The form in which ifrtpy's backends serialize executables: a magic line naming the
backend, the length of a JSON header (u64, little-endian), the SHA-256 of length, header
and payload, the header ``{"program": StableHLO text, "devices": device ids, or None when
portable}``, then the backend's own bytes (a PJRT plugin's sealed serialized executable;
nothing for the reference backend).

The checksum makes any changed or missing byte an error before the header is trusted: a
changed program text would make the executable check arguments against the wrong types.
It does not prove who wrote the bytes; load executables only from sources you trust.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from ifrtpy.errors import InvalidArgumentError

_DIGEST_SIZE = 32


def pack(magic: bytes, program_text: str, device_ids: list[int] | None, payload: bytes = b"") -> bytes:
    header = json.dumps({"program": program_text, "devices": device_ids}).encode()
    size = struct.pack("<Q", len(header))
    return magic + size + hashlib.sha256(size + header + payload).digest() + header + payload


def unpack(magic: bytes, data: Any, what: str) -> tuple[str, list[int] | None, bytes]:
    """``(program_text, device_ids, payload)`` of what :func:`pack` wrote; InvalidArgumentError
    ("not a serialized <what>") for other bytes, "corrupt serialized executable" for bytes
    cut short, changed, or with a header that does not parse."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"a serialized executable is bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data.startswith(magic):
        raise InvalidArgumentError(f"not a serialized {what}")
    try:
        (size,) = struct.unpack_from("<Q", data, len(magic))
    except struct.error as e:
        raise InvalidArgumentError(f"corrupt serialized executable: {e!r}") from None
    start = len(magic) + 8 + _DIGEST_SIZE
    digest, rest = data[len(magic) + 8:start], data[start:]
    if len(digest) != _DIGEST_SIZE or size > len(rest):
        raise InvalidArgumentError(
            f"corrupt serialized executable: cut short ({len(data)} bytes, the header alone "
            f"needs {start + size})")
    if hashlib.sha256(data[len(magic):len(magic) + 8] + rest).digest() != digest:
        raise InvalidArgumentError("corrupt serialized executable: its SHA-256 checksum does not match")
    try:
        header = json.loads(rest[:size].decode())
        return header["program"], header["devices"], rest[size:]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise InvalidArgumentError(f"corrupt serialized executable: {e!r}") from None
