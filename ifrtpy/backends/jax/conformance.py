"""What the jax backend does not do: its declaration to the conformance suite
(:mod:`ifrtpy.testing.conformance` reads it where a run names the backend ``jax``; plain
data, so the backend imports nothing of the suite). The cases of another process's
devices are the suite's to add for a client whose devices are all addressable."""

_NO_JAX_SHARDING = "ConcreteEvenSharding has no jax equivalent"

#: Case -> a text of its skip message (see docs/jax-backend.md); every other skip fails
#: the run, and so does a case declared here that passes.
EXPECTED_SKIPS = {
    # Sharding kinds a jax.Array cannot have (IFRT's remap cases all use ConcreteEvenSharding).
    "test_assemble_and_disassemble_array[concrete_even]": _NO_JAX_SHARDING,
    "test_copy_to_different_device[concrete]": "ConcreteSharding has no jax equivalent",
    "test_assemble_array": "cannot hold arrays of OpaqueSharding",
    "test_an_error_array_poisons_what_is_made_from_it[assemble]": _NO_JAX_SHARDING,
    "test_always_copy_is_refused": _NO_JAX_SHARDING,
    "test_batch_mapping_deinterleave": _NO_JAX_SHARDING,
    "test_batch_mapping_identity": _NO_JAX_SHARDING,
    "test_deinterleave_arrays": _NO_JAX_SHARDING,
    "test_detect_bad_input": _NO_JAX_SHARDING,
    "test_extract_single_shard": _NO_JAX_SHARDING,
    "test_interleave_arrays_donate": _NO_JAX_SHARDING,
    "test_interleave_arrays_reuse": _NO_JAX_SHARDING,
    # jax arrays hold no strings.
    "test_make_array_from_host_buffer_and_copy_to_host_buffer_with_string": "no STRING arrays",
    "test_make_arrays_from_host_buffer_shards_and_copy_to_host_buffer_with_string":
        "no STRING arrays",
    # Not implemented in this backend yet.
    "test_bitcast_arrays": "JaxClient does not implement bitcast_arrays",
    "test_bitcast_arrays_refuses_a_different_byte_count":
        "JaxClient does not implement bitcast_arrays",
    # jax has no call for these.
    "test_cancel_execution": "JaxClient cannot cancel executions",
    "test_compile_and_execute_portable": "does not compile portable executables",
    # Row-major only on the CPU platform.
    "test_make_array_from_host_buffer_with_a_column_major_layout":
        "in their default layout ({1,0}) only, not in {0,1}",
    "test_make_arrays_from_host_buffer_shards_with_layout":
        "in their default layout ({1,0}) only, not in {0,1}",
    "test_compile_with_a_column_major_result_layout":
        "cannot compile for layout {0,1} (f32[2, 3]) on the CPU platform",
    "test_declared_inexact_dtypes_are_what_the_devices_hold": "declares every dtype exact",
}

#: The kinds of sharding the laws draw for its arrays (ifrtpy.testing.strategies
#: SHARDING_KINDS): those with a jax equivalent (no ShardingParamSharding, no concrete ones).
SHARDING_KINDS = ("single", "named")
