"""Programs holding complex constants: jaxlib's MLIR bindings cannot convert a dense
complex attribute (looking one up raises TypeError; reading it through a NamedAttribute
aborts the process), so HloProgram's Shardy detection must step around them."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.builder import Builder
from ifrtpy.program import HloProgram

COMPLEX_CONSTANT = """
module @c {
  func.func @main(%a: tensor<2xcomplex<f32>>) -> tensor<2xcomplex<f32>> {
    %0 = stablehlo.constant dense<[(1.0,2.0), (3.0,-4.0)]> : tensor<2xcomplex<f32>>
    %1 = stablehlo.add %a, %0 : tensor<2xcomplex<f32>>
    return %1 : tensor<2xcomplex<f32>>
  }
}
"""


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_builder_complex_constant_builds_and_runs(dtype):
    value = np.array([1 + 2j, -3.5 + 0.25j], dtype)
    b = Builder()
    program = b.build(b.constant(value))
    assert not program.uses_shardy
    client = ifrt.get_client("pjrt")
    out = client.compile(program, ifrt.CompileOptions())()[0]
    np.testing.assert_array_equal(np.asarray(out), value)


def test_hlo_program_of_text_with_complex_constant():
    program = HloProgram(COMPLEX_CONSTANT)
    assert not program.uses_shardy
    assert [str(t) for t in program.parameters] == ["c64[2]"]
    client = ifrt.get_client("pjrt")
    a = np.array([0.5 + 0.5j, 1 - 1j], np.complex64)
    out = client.compile(program, ifrt.CompileOptions())(ifrt.device_put(a, client.devices()[0]))[0]
    np.testing.assert_allclose(np.asarray(out), a + np.array([1 + 2j, 3 - 4j]))


def test_shardy_still_found_next_to_a_complex_constant():
    text = """module @r {
      func.func @main(%a: tensor<2xcomplex<f32>> {sdy.sharding = #sdy.sharding<mesh<["x"=2]>, [{"x"}]>})
          -> tensor<2xcomplex<f32>> {
        %0 = stablehlo.constant dense<(1.0,2.0)> : tensor<2xcomplex<f32>>
        %1 = stablehlo.add %a, %0 : tensor<2xcomplex<f32>>
        return %1 : tensor<2xcomplex<f32>> } }"""
    assert HloProgram(text).uses_shardy


def test_complex_constants_nested_in_dict_and_array_attributes():
    """Complex dense attributes inside dictionary and array attributes (where reading
    them the obvious way aborts the interpreter): run in a subprocess."""
    script = textwrap.dedent('''
        from ifrtpy.program import HloProgram
        text = """module @r {
          func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> attributes {
              x.d = {y = dense<(1.0,2.0)> : tensor<1xcomplex<f32>>, sdy.z = 1 : i32},
              x.a = [dense<(1.0,2.0)> : tensor<1xcomplex<f32>>]} {
            return %a : tensor<2xf32> } }"""
        print(HloProgram(text).uses_shardy)
        print(HloProgram(text.replace("sdy.z", "w")).uses_shardy)
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
