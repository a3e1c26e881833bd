"""What the PjRt backend does not do on the CPU plugin (xla-cpu-pjrt): its declaration to
the conformance suite (:mod:`ifrtpy.testing.conformance` reads it where a run names the
backend ``pjrt``; plain data, so the backend imports nothing of the suite). The cases of
another process's devices are the suite's to add for a client whose devices are all
addressable. Another plugin declares its own (``--ifrtpy-expected-skips``)."""

#: Case -> a text of its skip message; every other skip fails the run, and so does a case
#: declared here that passes.
EXPECTED_SKIPS = {
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
