"""IFRT's executable conformance cases, run against the PjRt backend (CPU plugin,
8 devices)."""

import pytest

import ifrtpy as ifrt
from ifrtpy.testing.conformance.executables import *  # noqa: F401,F403


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)
