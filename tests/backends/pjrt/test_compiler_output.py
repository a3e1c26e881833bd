"""What the compiler did: the optimized HLO (``hlo_modules``, ``program_text(optimized=True)``),
per-parameter and per-output shardings, memory stats and cost analysis."""

from __future__ import annotations

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.plugins import builds
from ifrtpy.errors import FailedPreconditionError

MATMUL = """
func.func @main(%a: tensor<8x16xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"},
                %b: tensor<16x4xf32> {mhlo.sharding = "{replicated}"})
    -> (tensor<8x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}"""


@pytest.fixture(scope="module")
def compiled():
    client = ifrt.get_client(device_count=4)
    return client.compile(ifrt.HloProgram(MATMUL), ifrt.CompileOptions(num_partitions=4))


def test_the_optimized_program_is_the_partitioned_hlo(compiled):
    [module] = compiled.hlo_modules()
    text = compiled.program_text(optimized=True)
    assert text == module.to_string()
    assert text.startswith("HloModule")
    entry = next(line for line in text.splitlines() if line.startswith("ENTRY"))
    # one device's program: its parameters and result are the shards
    assert "f32[2,16]" in entry and "f32[16,4]" in entry and "f32[2,4]" in entry
    assert "tensor<8x16xf32>" in compiled.program_text()


def test_shardings_per_parameter_and_output_follow_the_program(compiled):
    a, b = compiled.parameter_shardings()
    [out] = compiled.output_shardings()
    assert a.shard_shape((8, 16)) == (2, 16) and not a.is_fully_replicated
    assert b.is_fully_replicated
    assert out.shard_shape((8, 4)) == (2, 4)


def test_a_program_without_parameters_keeps_its_output_sharding():
    # a partitioned module without parameters has no parameter shardings: its outputs are
    # still sharded (they were once read as replicated, and jax refused them)
    client = ifrt.get_client(device_count=4)
    program = ifrt.HloProgram("""
func.func public @main() -> (tensor<8xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) {
  %0 = stablehlo.iota dim = 0 : tensor<8xf32>
  return %0 : tensor<8xf32>
}""")
    executable = client.compile(program, ifrt.CompileOptions(num_partitions=4))
    assert executable.parameter_shardings() == []
    [out] = executable.output_shardings()
    assert out.shard_shape((8,)) == (2,) and not out.is_fully_replicated
    [result] = executable.execute([]).outputs
    assert [tuple(s.shape.dims) for s in result.disassemble_into_single_device_arrays()] == [(2,)] * 4
    np.testing.assert_array_equal(np.asarray(result), np.arange(8, dtype=np.float32))


def test_memory_stats_and_cost_analysis_are_present(compiled):
    stats = compiled.compiled_memory_stats()
    assert stats.argument_size_in_bytes == 4 * (2 * 16 + 16 * 4)  # one device's shards
    assert stats.output_size_in_bytes == 4 * 2 * 4
    cost = compiled.cost_analysis()
    assert cost["flops"] == 2 * 2 * 16 * 4  # one device's matmul


@pytest.mark.parametrize("build", [b.name for b, _ in builds.installed_builds()])
def test_every_cpu_build_gives_the_cost_analysis(build):
    """The plugin's own on the official build; XLA's HLO cost analysis of the optimized
    module on newer builds, which have no PJRT_Executable_GetCostAnalysis."""
    client = ifrt.get_client(build, device_count=4)
    exe = client.compile(ifrt.HloProgram(MATMUL), ifrt.CompileOptions(num_partitions=4))
    cost = exe.cost_analysis()
    assert cost["flops"] == 2 * 2 * 16 * 4
    assert cost["bytes accessed"] == 4 * (2 * 16 + 16 * 4 + 2 * 4)


def test_a_deleted_executable_has_no_modules():
    client = ifrt.get_client(device_count=1)
    exe = client.compile(ifrt.HloProgram(MATMUL.replace('{mhlo.sharding = "{devices=[4,1]<=[4]}"}', "")
                                          .replace('{mhlo.sharding = "{replicated}"}', "")),
                         ifrt.CompileOptions(compilation_cache_dir=False))
    assert "dot" in exe.program_text(optimized=True)
    exe.delete()
    with pytest.raises(FailedPreconditionError, match="deleted"):
        exe.hlo_modules()


def test_the_reference_backend_runs_the_program_as_it_is():
    client = ifrt.get_client("reference", device_count=4)
    exe = client.compile(ifrt.HloProgram(MATMUL), ifrt.CompileOptions(num_partitions=4))
    assert exe.program_text(optimized=True) == exe.program_text()
    with pytest.raises(ifrt.errors.UnimplementedError):
        exe.hlo_modules()


def test_a_partitioned_program_without_results_has_no_output_shardings():
    # its compiled module returns an empty tuple, whose sharding is not an output's
    client = ifrt.get_client(device_count=4)
    program = ifrt.HloProgram("""
func.func public @main(%x: tensor<8xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> () {
  return
}""")
    executable = client.compile(program, ifrt.CompileOptions(num_partitions=4))
    assert executable.output_shardings() == []
    assert executable.output_memory_kinds() == []
    x = client.make_array_from_host_buffer(np.arange(8, dtype=np.float32),
                                           executable.parameter_shardings()[0])
    assert executable.execute([x]).outputs == []
