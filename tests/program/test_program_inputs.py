"""Every front end into HloProgram compiles and runs, on the PjRt backend and (where the
program is StableHLO) on the reference backend, against NumPy; garbage of each input type
gets a clear InvalidArgumentError."""

from __future__ import annotations

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.errors import InvalidArgumentError

jax = pytest.importorskip("jax")
jnp = jax.numpy

HLO_TEXT = """HloModule twice_plus

ENTRY main {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  s = f32[4] add(x, x)
  ROOT z = f32[4] add(s, y)
}"""
X = np.array([0.5, -1.0, 2.0, 3.5], dtype=np.float32)
Y = np.array([1.0, 2.0, -3.0, 0.25], dtype=np.float32)


def f(x, y):
    return jnp.sin(x) * 2 + y


def hlo_proto():
    from jaxlib import _hlo
    return _hlo.hlo_module_from_text(HLO_TEXT).as_serialized_hlo_module_proto()


def lowered():
    return jax.jit(f).lower(X, Y)


def exported():
    return jax.export.export(jax.jit(f))(X, Y)


SOURCES = {  # name -> (make the input, expected output, runs on the reference backend)
    "hlo_text": (lambda: HLO_TEXT, 2 * X + Y, True),
    "hlo_text_bytes": (lambda: HLO_TEXT.encode(), 2 * X + Y, True),
    "hlo_module_proto": (hlo_proto, 2 * X + Y, True),
    "xla_computation": (lambda: lowered().compiler_ir("hlo"), np.sin(X) * 2 + Y, True),
    "jax_lowered": (lowered, np.sin(X) * 2 + Y, True),
    "jax_compiled": (lambda: lowered().compile(), np.sin(X) * 2 + Y, False),  # optimized HLO (fusions)
    "jax_exported": (exported, np.sin(X) * 2 + Y, True),
    "jax_exported_bytes": (lambda: bytes(exported().serialize()), np.sin(X) * 2 + Y, True),
    "mlir_bytecode": (lambda: bytes(exported().mlir_module_serialized), np.sin(X) * 2 + Y, True),
}


def run(client, program):
    sharding = ifrt.SingleDeviceSharding(client.devices()[0])
    [out] = client.compile(program)(client.make_array_from_host_buffer(X, sharding),
                                    client.make_array_from_host_buffer(Y, sharding))
    return np.asarray(out)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_front_end_runs(name):
    make, expected, on_reference = SOURCES[name]
    program = ifrt.HloProgram(make())
    assert [str(p) for p in program.parameters] == ["f32[4]", "f32[4]"]
    np.testing.assert_allclose(run(ifrt.get_client(device_count=1), program), expected, rtol=1e-6)
    if on_reference:
        np.testing.assert_allclose(run(ifrt.get_client("reference", device_count=1), program),
                                   expected, rtol=1e-6)


def test_bytes_are_read_once_per_process():
    from ifrtpy.program import inputs as _program_input

    data = hlo_proto()
    first = ifrt.HloProgram(data)
    key_count = len(_program_input._memo)
    assert ifrt.HloProgram(data).text == first.text
    assert len(_program_input._memo) == key_count


GARBAGE = {
    "hlo_text": ("HloModule broken\n\nENTRY main {\n  ROOT x = f32[4] parameter(\n}",
                 "HLO text that does not parse"),
    "stablehlo_text": ("func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> { return %y }",
                       "not a StableHLO module"),
    "bytecode": (b"ML\xefR" + bytes(range(60)), "MLIR bytecode that does not parse"),
    "random_bytes": (bytes(range(256)) * 2, "neither MLIR bytecode, a serialized HloModuleProto nor"),
    "empty_bytes": (b"", "the program is empty"),
    "other_object": (3.5, "HloProgram takes StableHLO or HLO text"),
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_of_each_type_is_refused(name):
    value, message = GARBAGE[name]
    with pytest.raises(InvalidArgumentError, match=message):
        ifrt.HloProgram(value)


def test_a_tensorflow_function_without_arguments_is_pointed_to_from_tensorflow():
    class Function:  # what HloProgram sees of a tf.function: no way to trace it without args
        def experimental_get_compiler_ir(self, *args):
            raise AssertionError("not called")

    with pytest.raises(InvalidArgumentError, match="from_tensorflow"):
        ifrt.HloProgram(Function())
    with pytest.raises(InvalidArgumentError, match="from_tensorflow takes a tf.function"):
        ifrt.program.from_tensorflow(lambda x: x, X)


@pytest.mark.tensorflow
def test_a_tensorflow_function_runs_on_both_backends():
    tf = pytest.importorskip("tensorflow")

    @tf.function(jit_compile=True)
    def g(x, y):
        return tf.sin(x) * 2.0 + tf.exp(y)

    program = ifrt.program.from_tensorflow(g, tf.constant(X), tf.constant(Y))
    for client in (ifrt.get_client(device_count=1), ifrt.get_client("reference", device_count=1)):
        np.testing.assert_allclose(run(client, program), np.sin(X) * 2 + np.exp(Y), rtol=1e-5)

    @tf.function(jit_compile=True)
    def h(x, y):
        return tf.matmul(tf.reshape(x, (2, 2)), tf.reshape(y, (2, 2)))

    program = ifrt.program.from_tensorflow(h, tf.constant(X), tf.constant(Y))
    np.testing.assert_allclose(run(ifrt.get_client(device_count=1), program).reshape(2, 2),
                               X.reshape(2, 2) @ Y.reshape(2, 2), rtol=1e-5)
