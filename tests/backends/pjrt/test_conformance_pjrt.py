"""The whole conformance suite (IFRT's array, tuple, client, executable and remap cases,
and the NumPy laws) run against the PjRt backend: the CPU plugin with 8 devices."""

import pytest

import ifrtpy as ifrt
from ifrtpy.testing.conformance import ONE_PROCESS_SKIPS, case_classes

#: What the PjRt backend does not do on the CPU plugin (case -> a text of its skip
#: message); every other skip fails the run, and so does a case declared here that passes.
EXPECTED_SKIPS = {
    **ONE_PROCESS_SKIPS,
    # The CPU plugin keeps elements row-major whatever layout it reports (docs/plugins.md).
    "test_make_array_from_host_buffer_with_a_column_major_layout":
        "in the default layout only, not in device layout {0,1}",
    "test_make_arrays_from_host_buffer_shards_with_layout":
        "in the default layout only, not in device layout {0,1}",
    "test_compile_with_a_column_major_result_layout":
        "cannot compile for layout {0,1} (f32[2, 3]) on the CPU platform",
    "test_cancel_execution": "has no call to cancel a launched execution",
    "test_declared_inexact_dtypes_are_what_the_devices_hold": "declares every dtype exact",
}

globals().update(case_classes(expected_skips=EXPECTED_SKIPS))


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=8)
