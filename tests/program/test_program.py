"""HloProgram: what it is made from, the signature and donation it reads, Shardy
detection and version negotiation (``serialize_for``). No backend needed."""

import io
import threading

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import ifrtpy as ifrt
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.program import HloProgram, Program, TensorType, stablehlo_version
from ifrtpy.program.mlir import context as _context
from ifrtpy.shape import Shape
from pjrt_helpers import shardy_lowering

K = ifrt.DType.Kind
PLUGIN_VERSION = (1, 13, 3)  # the CPU plugin's StableHLO version

ADD = """
module @adder {
  func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %0 = stablehlo.add %a, %b : tensor<2x3xf32>
    return %0 : tensor<2x3xf32>
  }
}
"""

SIGNATURE = """
module @sig {
  func.func @main(%a: tensor<bf16>, %b: tensor<4xf8E4M3FN>, %c: tensor<2x2xi1>,
                  %d: tensor<3xui8>, %e: tensor<complex<f32>>, %f: tensor<1x2x3xcomplex<f64>>,
                  %g: tensor<0x5xi64>, %h: tensor<f8E5M2>, %i: tensor<7xi4>, %j: tensor<ui32>,
                  %k: tensor<2x1x1x2xf16>, %l: tensor<f64>, %m: tensor<i8>)
      -> (tensor<bf16>, tensor<2x2xi1>, tensor<1x2x3xcomplex<f64>>) {
    return %a, %c, %f : tensor<bf16>, tensor<2x2xi1>, tensor<1x2x3xcomplex<f64>>
  }
}
"""
SIGNATURE_PARAMS = [
    (K.BF16, []), (K.F8E4M3FN, [4]), (K.PRED, [2, 2]), (K.U8, [3]), (K.C64, []),
    (K.C128, [1, 2, 3]), (K.S64, [0, 5]), (K.F8E5M2, []), (K.S4, [7]), (K.U32, []),
    (K.F16, [2, 1, 1, 2]), (K.F64, []), (K.S8, []),
]
SIGNATURE_RESULTS = [(K.BF16, []), (K.PRED, [2, 2]), (K.C128, [1, 2, 3])]

DONORS = """
module @donors {
  func.func @main(%a: tensor<4xf32> {jax.buffer_donor = true},
                  %b: tensor<4xf32>,
                  %c: tensor<4xf32> {jax.buffer_donor = false},
                  %d: tensor<4xf32> {tf.aliasing_output = 0 : i32},
                  %e: tensor<4xf32> {jax.buffer_donor = true})
      -> tensor<4xf32> {
    return %a : tensor<4xf32>
  }
}
"""


def _signature(types):
    return [(t.dtype.kind, list(t.shape)) for t in types]


def _mesh(shape=(4, 2), names=("x", "y")):
    return Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), names)


def _sharded_lowering():
    mesh = _mesh()
    f = jax.jit(lambda x, w: x @ w,
                in_shardings=(NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P())),
                out_shardings=NamedSharding(mesh, P("x", "y")))
    return f.lower(np.zeros((8, 4), np.float32), np.zeros((4, 6), np.float32))


def _mlir_module(text):
    from jaxlib.mlir import ir

    with _context():
        return ir.Module.parse(text)


def _bytecode(text) -> bytes:
    module = _mlir_module(text)
    out = io.BytesIO()
    with _context():
        module.operation.write_bytecode(out)
    return out.getvalue()


def _portable(text, version="1.13.3") -> bytes:
    from jaxlib.mlir.dialects import stablehlo

    return stablehlo.serialize_portable_artifact_str(text, version)


# -- sources ------------------------------------------------------------------------------

def _check_adder(program):
    assert isinstance(program, Program)
    assert program.name == "adder"
    assert _signature(program.parameters) == [(K.F32, [2, 3])] * 2
    assert _signature(program.results) == [(K.F32, [2, 3])]
    assert program.donated_inputs == frozenset()
    assert not program.uses_shardy
    assert "stablehlo.add" in program.text


@pytest.mark.parametrize("source", [
    "text", "text_bytes", "bytecode", "portable_1.13.3", "portable_0.9.0", "portable_current",
    "bytearray", "memoryview", "mlir_module", "hlo_program",
])
def test_made_from(source):
    make = {
        "text": lambda: ADD,
        "text_bytes": lambda: ADD.encode(),
        "bytecode": lambda: _bytecode(ADD),
        "portable_1.13.3": lambda: _portable(ADD, "1.13.3"),
        "portable_0.9.0": lambda: _portable(ADD, "0.9.0"),
        "portable_current": lambda: _portable(ADD, ".".join(map(str, stablehlo_version()))),
        "bytearray": lambda: bytearray(_portable(ADD)),
        "memoryview": lambda: memoryview(_portable(ADD)),
        "mlir_module": lambda: _mlir_module(ADD),
        "hlo_program": lambda: HloProgram(ADD),
    }[source]
    _check_adder(HloProgram(make()))


def test_from_jax_lowered_and_its_mlir_module():
    lowered = jax.jit(lambda x, y: (x * 2 + y, x)).lower(
        np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32))
    for source in (lowered, lowered.compiler_ir("stablehlo"), lowered.as_text()):
        program = HloProgram(source)
        assert program.name == "jit__lambda"
        assert _signature(program.parameters) == [(K.F32, [3, 4])] * 2
        assert _signature(program.results) == [(K.F32, [3, 4])] * 2
        assert not program.uses_shardy


def test_text_round_trips():
    program = HloProgram(ADD)
    again = HloProgram(program.text)
    assert again.text == program.text
    assert str(program) == program.text
    assert again.parameters == program.parameters and again.results == program.results
    assert repr(program) == "<HloProgram adder(f32[2, 3], f32[2, 3]) -> (f32[2, 3])>"


def test_module_without_a_name_is_main():
    program = HloProgram("module { func.func @main() { return } }")
    assert program.name == "main"
    assert program.parameters == () and program.results == ()


def test_main_among_other_functions():
    text = """
    module @m {
      func.func private @helper(%a: tensor<8xf32>) -> tensor<8xf32> { return %a : tensor<8xf32> }
      func.func @main(%a: tensor<8xi32>, %b: tensor<8xf32>) -> tensor<8xf32> {
        %0 = func.call @helper(%b) : (tensor<8xf32>) -> tensor<8xf32>
        return %0 : tensor<8xf32>
      }
    }"""
    program = HloProgram(text)
    assert _signature(program.parameters) == [(K.S32, [8]), (K.F32, [8])]


# -- signature ----------------------------------------------------------------------------

def test_signature_dtypes_and_shapes():
    program = HloProgram(SIGNATURE)
    assert _signature(program.parameters) == SIGNATURE_PARAMS
    assert _signature(program.results) == SIGNATURE_RESULTS
    assert all(isinstance(t, TensorType) and isinstance(t.shape, Shape)
               for t in program.parameters + program.results)
    assert str(program.parameters[0]) == "bf16[]"


@pytest.mark.parametrize("dtype", [
    np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_, np.complex64,
    np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (5,), (2, 0), (1, 2, 3)], ids=str)
def test_signature_matches_jax(dtype, shape):
    x = np.zeros(shape, dtype)
    with jax.enable_x64(True):  # else jax lowers 64-bit types as 32-bit ones
        program = HloProgram(jax.jit(lambda a, b: (b, a)).lower(x, np.int32(0)))
    expected = ifrt.DType.from_numpy(np.dtype(dtype))
    assert [(t.dtype, tuple(t.shape)) for t in program.parameters] == [
        (expected, shape), (ifrt.DType(K.S32), ())]
    assert [(t.dtype, tuple(t.shape)) for t in program.results] == [
        (ifrt.DType(K.S32), ()), (expected, shape)]


# -- donation -----------------------------------------------------------------------------

def test_donated_inputs_from_attributes():
    # jax.buffer_donor = true and tf.aliasing_output donate; buffer_donor = false does not
    assert HloProgram(DONORS).donated_inputs == frozenset({0, 3, 4})


def test_donated_inputs_from_jax_donate_argnums():
    x = np.zeros((2, 3), np.float32)
    lowered = jax.jit(lambda a, b, c: (a + b, c * b), donate_argnums=(0, 2)).lower(x, x, x)
    assert "tf.aliasing_output" in lowered.as_text()
    assert HloProgram(lowered).donated_inputs == frozenset({0, 2})
    assert HloProgram(jax.jit(lambda a: a + 1).lower(x)).donated_inputs == frozenset()


def test_donated_inputs_survive_bytecode():
    assert HloProgram(_portable(DONORS)).donated_inputs == frozenset({0, 3, 4})


# -- Shardy and version negotiation -------------------------------------------------------

def test_shardy_lowering_uses_shardy_and_goes_as_bytecode():
    """Shardy's mesh and shardings travel beside the versioned StableHLO (plain MLIR
    bytecode), so an older plugin reads the program as it reads any other."""
    with shardy_lowering(True):
        lowered = _sharded_lowering()
    assert "sdy.mesh" in lowered.as_text()
    program = HloProgram(lowered)
    assert program.uses_shardy
    code, how = program.serialize_for(PLUGIN_VERSION)
    assert how == "bytecode 1.13.3"
    again = HloProgram(code)
    assert again.uses_shardy and "sdy.mesh" in again.text
    assert again.parameters == program.parameters and again.results == program.results


def test_gspmd_lowering_does_not_use_shardy():
    """(Skipped from jax 0.12.1, which always lowers for Shardy: its
    ``jax_use_shardy_partitioner`` "has no effect".)"""
    with shardy_lowering(False):
        lowered = _sharded_lowering()
    text = lowered.as_text()
    assert "mhlo.sharding" in text and "sdy." not in text
    program = HloProgram(lowered)
    assert not program.uses_shardy
    code, how = program.serialize_for(PLUGIN_VERSION)
    assert how == "bytecode 1.13.3"
    again = HloProgram(code)
    assert again.parameters == program.parameters and again.results == program.results
    assert "mhlo.sharding" in again.text


def test_shardy_config_is_restored():
    before = jax.config.jax_use_shardy_partitioner
    with shardy_lowering(not before):
        assert jax.config.jax_use_shardy_partitioner == (not before)
    assert jax.config.jax_use_shardy_partitioner == before


def test_shardy_only_in_the_body():
    mesh = _mesh()
    with shardy_lowering(True):
        lowered = jax.jit(lambda x: jax.lax.with_sharding_constraint(
            x * 2, NamedSharding(mesh, P("x")))).lower(np.zeros((8, 4), np.float32))
    assert HloProgram(lowered).uses_shardy


def test_shardy_only_on_arguments_with_inline_mesh():
    text = """module @r {
      func.func @main(%a: tensor<8xf32> {sdy.sharding = #sdy.sharding<mesh<["x"=8]>, [{"x"}]>})
          -> tensor<8xf32> { return %a : tensor<8xf32> } }"""
    assert HloProgram(text).uses_shardy


@pytest.mark.parametrize("where", ["results", "body"])
def test_shardy_without_mesh_op_on_results_or_in_body(where):
    """A Shardy sharding with an inline mesh, only on a result or only on an op in the
    body, still makes the program a Shardy program (else it is compiled with the Shardy
    partitioner off and XLA fails: "custom call named 'xla.sdy.*' ... Shardy was then
    disabled")."""
    if where == "results":
        text = """module @r {
          func.func @main(%a: tensor<8xf32>)
              -> (tensor<8xf32> {sdy.sharding = #sdy.sharding<mesh<["x"=8]>, [{"x"}]>}) {
            return %a : tensor<8xf32> } }"""
    else:
        text = """module @r {
          func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> {
            %0 = sdy.sharding_constraint %a <mesh<["x"=8]>, [{"x"}]> : tensor<8xf32>
            return %0 : tensor<8xf32> } }"""
    program = HloProgram(text)
    assert program.uses_shardy
    code, how = program.serialize_for(PLUGIN_VERSION)
    assert how == "bytecode 1.13.3" and HloProgram(code).uses_shardy


@pytest.mark.parametrize("where", ["location", "string"])
def test_sdy_in_a_location_or_string_is_not_shardy(where):
    """"sdy." in a debug location (a file named sdy.py) or in a string attribute is not a
    Shardy sharding: the GSPMD module must still go as bytecode."""
    if where == "location":
        op = '%0 = stablehlo.add %a, %a : tensor<8xf32> loc("/home/user/sdy.py":3:4)'
    else:
        op = ('%0 = stablehlo.add %a, %a {mhlo.frontend_attributes = {note = "not sdy.mesh"}}'
              ' : tensor<8xf32>')
    text = f"""module @m {{
      func.func @main(%a: tensor<8xf32> {{mhlo.sharding = "{{devices=[8]<=[8]}}"}}) -> tensor<8xf32> {{
        {op}
        return %0 : tensor<8xf32>
      }}
    }}"""
    program = HloProgram(text)
    assert not program.uses_shardy
    assert program.serialize_for(PLUGIN_VERSION)[1] == "bytecode 1.13.3"


def test_serialize_for_plain_module():
    program = HloProgram(ADD)
    code, how = program.serialize_for(PLUGIN_VERSION)
    assert how == "bytecode 1.13.3"
    assert isinstance(code, bytes) and not code.lstrip().startswith(b"module")
    _check_adder(HloProgram(code))
    code, how = program.serialize_for([0, 9, 0])  # any sequence
    assert how == "bytecode 0.9.0"
    _check_adder(HloProgram(code))


def test_serialize_for_no_target_is_text():
    program = HloProgram(ADD)
    code, how = program.serialize_for(None)
    assert how == "text"
    assert code.decode() == program.text


def test_serialize_for_newer_target_is_capped_at_jaxlib():
    current = stablehlo_version()
    code, how = HloProgram(ADD).serialize_for((current[0] + 1, 0, 0))
    assert how == "bytecode " + ".".join(map(str, current))
    _check_adder(HloProgram(code))


@pytest.mark.parametrize("target", [(0, 0, 1), (1, 13), ()], ids=str)
def test_serialize_for_unusable_target_falls_back_to_text(target):
    code, how = HloProgram(ADD).serialize_for(target)
    assert how == "text"
    _check_adder(HloProgram(code))


def test_stablehlo_version():
    version = stablehlo_version()
    assert len(version) == 3 and all(isinstance(v, int) for v in version)
    assert version >= PLUGIN_VERSION


# -- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    "garbage",
    "module { func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { return %a } }",  # no type
    b"\x00\x01garbage",
    b"ML\xefR\x0dgarbage",  # bytecode magic, then junk
    _portable(ADD)[:20],  # truncated artifact
    "",  # an empty module: no main
    "module { func.func @not_main() { return } }",
    # parses, fails verification (result type)
    "module { func.func @main(%a: tensor<2xf32>) -> tensor<3xf32> {\n"
    "  %0 = stablehlo.add %a, %a : tensor<2xf32>\n  return %0 : tensor<2xf32> } }",
    "module { func.func @main(%a: tensor<?xf32>) { return } }",  # dynamic
    "module { func.func @main(%a: tensor<*xf32>) { return } }",  # unranked
    "module { func.func @main(%a: tuple<tensor<2xf32>>) { return } }",  # tuple
    "module { func.func @main() -> tensor<?xf32> {\n"
    "  %0 = stablehlo.constant dense<1.0> : tensor<1xf32>\n"
    "  %1 = tensor.cast %0 : tensor<1xf32> to tensor<?xf32>\n  return %1 : tensor<?xf32> } }",
    5, None, 1.5, ["module {}"], object(),
], ids=lambda b: repr(b)[:30] if type(b) is not object else "object()")  # one id in every process
def test_bad_input_is_invalid_argument(bad):
    with pytest.raises(InvalidArgumentError):
        HloProgram(bad)


def test_invalid_argument_is_a_value_error():
    with pytest.raises(ValueError, match="main"):
        HloProgram("module { func.func @other() { return } }")


def test_concurrent_construction():
    lowered = _sharded_lowering().as_text()
    errors = []

    def work():
        try:
            for _ in range(10):
                program = HloProgram(lowered)
                assert _signature(program.parameters) == [(K.F32, [8, 4]), (K.F32, [4, 6])]
                program.serialize_for(PLUGIN_VERSION)
                HloProgram(ADD).serialize_for(PLUGIN_VERSION)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
