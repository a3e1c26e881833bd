"""What the reference backend does not do: its declaration to the conformance suite
(:mod:`ifrtpy.testing.conformance` reads it where a run names the backend ``reference``;
plain data, so the backend imports nothing of the suite). The cases of another process's
devices are the suite's to add for a client whose devices are all addressable."""

#: Case -> a text of its skip message; every other skip fails the run, and so does a case
#: declared here that passes.
EXPECTED_SKIPS = {
    # It compiles StableHLO for its interpreter, no HLO.
    "test_get_hlo_modules": "ReferenceLoadedExecutable has no HLO modules",
    "test_declared_inexact_dtypes_are_what_the_devices_hold": "declares every dtype exact",
}
