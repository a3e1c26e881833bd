"""Helpers shared by the conformance case modules."""

from __future__ import annotations

import contextlib

import pytest

from ifrtpy.errors import UnimplementedError


@contextlib.contextmanager
def skip_if_unimplemented(what: str = ""):
    """Turn the backend's UnimplementedError into a skip carrying its message."""
    try:
        yield
    except UnimplementedError as e:
        pytest.skip(f"UNIMPLEMENTED{' ' + what if what else ''}: {e}")


def addressable_devices(client, count: int) -> list:
    """The first ``count`` addressable devices; a skip when the client has fewer."""
    devices = client.addressable_devices()
    if len(devices) < count:
        pytest.skip(f"needs {count} addressable devices, the client has {len(devices)}")
    return devices[:count]
