"""The form in which ifrtpy's backends serialize executables: a magic line naming the
backend, the length of a JSON header (u64, little-endian), the header
``{"program": StableHLO text, "devices": device ids, or None when portable}``, then the
backend's own bytes (a PJRT plugin's serialized executable; nothing for the reference
backend)."""

from __future__ import annotations

import json
import struct

from ifrtpy.errors import InvalidArgumentError


def pack(magic: bytes, program_text: str, device_ids: list[int] | None, payload: bytes = b"") -> bytes:
    header = json.dumps({"program": program_text, "devices": device_ids}).encode()
    return magic + struct.pack("<Q", len(header)) + header + payload


def unpack(magic: bytes, data, what: str) -> tuple[str, list[int] | None, bytes]:
    """``(program_text, device_ids, payload)`` of what :func:`pack` wrote; InvalidArgumentError
    ("not a serialized <what>") for other bytes, or a header that does not parse."""
    data = bytes(data)
    if not data.startswith(magic):
        raise InvalidArgumentError(f"not a serialized {what}")
    try:
        (size,) = struct.unpack_from("<Q", data, len(magic))
        start = len(magic) + 8
        header = json.loads(data[start:start + size].decode())
        return header["program"], header["devices"], data[start + size:]
    except (struct.error, ValueError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise InvalidArgumentError(f"corrupt serialized executable: {e!r}") from None
