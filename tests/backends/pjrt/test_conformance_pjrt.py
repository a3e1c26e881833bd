"""The whole conformance suite (IFRT's array, tuple, client, executable and remap cases,
and the NumPy laws) run against the PjRt backend: the CPU plugin with 8 devices."""

import pytest

import ifrtpy as ifrt
from ifrtpy.testing.conformance import case_classes, declaration_of

#: What the PjRt backend does not do on the CPU plugin: the declaration it ships
#: (ifrtpy/backends/pjrt/conformance.py), which the plugin's runs use too.
DECLARATION = declaration_of("pjrt")
globals().update(case_classes(expected_skips=DECLARATION))


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)
