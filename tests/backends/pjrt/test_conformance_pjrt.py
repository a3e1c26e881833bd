"""The whole conformance suite (IFRT's array, tuple, client, executable and remap cases,
and the NumPy laws) run against the PjRt backend: the CPU plugin with 8 devices."""

import pytest

import ifrtpy as ifrt
from ifrtpy.testing.conformance import case_classes

globals().update(case_classes())


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)
