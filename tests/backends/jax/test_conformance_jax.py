"""The whole conformance suite against the jax backend: jax's CPU runtime with 8 devices
(tests/conftest.py sets XLA_FLAGS before jax starts)."""

import pytest

pytest.importorskip("jax")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy.testing.conformance import case_classes  # noqa: E402

globals().update(case_classes())


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("jax", platform="cpu", device_count=8)
