"""Helpers shared by the conformance case modules."""

from __future__ import annotations

import pytest


def addressable_devices(client, count: int) -> list:
    """The first ``count`` addressable devices; a skip when the client has fewer."""
    devices = client.addressable_devices()
    if len(devices) < count:
        pytest.skip(f"needs {count} addressable devices, the client has {len(devices)}")
    return devices[:count]
