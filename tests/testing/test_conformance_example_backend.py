"""The example backend of docs/implementing-a-backend.md through the conformance suite's
core cases (``ifrtpy.testing.conformance.CORE_CASES``): 2 devices, arrays of any sharding
with index domains, programs that are Python functions only. What it lacks skips with its
UnimplementedError message."""

import pytest

import ifrtpy as ifrt
from ifrtpy.testing.conformance import case_classes

globals().update(case_classes(core_only=True))


@pytest.fixture(scope="module")
def client():
    if "example" not in ifrt.registered_backends():
        ifrt.register_backend("example", "ifrtpy.testing.example_backend:create_client")
    return ifrt.get_client("example", device_count=2)


def test_example_backend_compiles_no_stablehlo(client):
    with pytest.raises(ifrt.errors.UnimplementedError, match="does not compile"):
        client.compile("module { func.func @main() { return } }")
