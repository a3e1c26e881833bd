"""The whole conformance suite against the jax backend: jax's CPU runtime with 8 devices
(tests/conftest.py sets XLA_FLAGS before jax starts)."""

import pytest

pytest.importorskip("jax")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy.testing.conformance import case_classes, declaration_of  # noqa: E402

#: What the jax backend does not do: the declaration it ships
#: (ifrtpy/backends/jax/conformance.py, see docs/jax-backend.md), which the plugin's runs
#: use too.
DECLARATION = declaration_of("jax")
globals().update(case_classes(expected_skips=DECLARATION))


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("jax", platform="cpu", device_count=8)
