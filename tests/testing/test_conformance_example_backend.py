"""The example backend of docs/implementing-a-backend.md through the conformance suite's
core cases (``ifrtpy.testing.conformance.CORE_CASES``): 2 devices, arrays of any sharding
with index domains, programs that are Python functions only. A core case may not skip: an
UnimplementedError there fails, and so does a skip for the too few devices or memory kinds
of its client, unless declared."""

import pytest

import ifrtpy as ifrt
from ifrtpy.testing.conformance import case_classes

#: What the example backend does not do among the core cases: nothing (case -> a text of
#: its skip message, as tests/backends/*/test_conformance_*.py declare theirs).
EXPECTED_SKIPS: dict[str, str] = {}

globals().update(case_classes(core_only=True, expected_skips=EXPECTED_SKIPS))


@pytest.fixture(scope="module")
def client():
    if "example" not in ifrt.registered_backends():
        ifrt.register_backend("example", "ifrtpy.testing.example_backend:create_client")
    return ifrt.get_client("example", device_count=2)


def test_example_backend_compiles_no_stablehlo(client):
    with pytest.raises(ifrt.errors.UnimplementedError, match="does not compile"):
        client.compile("module { func.func @main() { return } }")
