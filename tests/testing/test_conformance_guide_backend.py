"""The backend docs/implementing-a-backend.md writes, as a reader assembles it: the page's
``ExampleArray`` and ``ExampleClient`` exactly as printed, and what the page leaves to the
file (devices, memories, the compiler and its executable, ``make_error_arrays``, the
client's constructor and properties) from ifrtpy/testing/example_backend.py. It passes the
whole conformance suite with the example backend's declaration: the page's code is a
conformant backend, not a sketch of one."""

import pathlib
import types

import pytest

from doc_blocks import blocks
from ifrtpy.array import StoredArray
from ifrtpy.testing import example_backend
from ifrtpy.testing.conformance import ONE_PROCESS_SKIPS, case_classes

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "implementing-a-backend.md"


def guide_backend() -> types.ModuleType:
    """A module of the page's array and client over the rest of the example backend."""
    module = types.ModuleType("guide_backend")
    path = example_backend.__file__
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), module.__dict__)
    from_the_file = module.ExampleClient
    (block,) = [b for b in blocks(GUIDE) if "class ExampleArray(" in b.code]
    padded = "\n" * block.line + block.code  # tracebacks give the page's line numbers
    exec(compile(padded, str(GUIDE), "exec"), module.__dict__)
    # What the page shows of the client comes first; what it leaves to the file follows.
    module.ExampleClient = type("ExampleClient", (module.ExampleClient, from_the_file), {})
    return module


GUIDE_BACKEND = guide_backend()

globals().update(case_classes(expected_skips={**ONE_PROCESS_SKIPS, **example_backend.EXPECTED_SKIPS}))


@pytest.fixture(scope="module")
def client():
    return GUIDE_BACKEND.create_client()


def test_the_array_is_the_pages_own(client):
    """The page's array is whole: nothing of it is inherited from the file's."""
    array_type = GUIDE_BACKEND.ExampleArray
    assert array_type is not example_backend.ExampleArray
    assert array_type.__bases__ == (StoredArray,)
    assert array_type.__init__.__code__.co_filename == str(GUIDE)
    method = type(client).make_array_from_host_buffer
    assert method.__code__.co_filename == str(GUIDE)
