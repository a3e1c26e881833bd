"""jax-lowered programs holding CHLO ops (``jnp.square``, ``jnp.sinh``, ``jnp.nextafter``,
``lax.erf_inv`` and ``jax.random.normal``, which uses it) compile quietly and go to the
plugin as portable artifacts: their CHLO ops are legalized to StableHLO first, so the
StableHLO version negotiation applies to them, and a module that still cannot be written
so goes as text without MLIR's diagnostics reaching stderr (docs/logging.md: ifrtpy is
quiet).

Each compile runs in a subprocess whose stderr is read whole; the bytes handed to the
plugin are recorded there (a spy on ``_pjrt.compile``) and read back here with jaxlib's
own deserializer, and the results are checked against NumPy and ``math.erf`` (and
``jax.random.normal``'s against jax's own run).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ifrtpy as ifrt

#: The subprocess: compiles each program with the default PJRT client, runs it, and
#: prints, per program, the hex of the code the plugin got and the results.
_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, jax, jax.numpy as jnp
    import ifrtpy as ifrt
    from ifrtpy import _pjrt

    sent = []
    real_compile = _pjrt.compile

    def spy(handle, code, options):
        sent.append(bytes(code))
        return real_compile(handle, code, options)

    _pjrt.compile = spy
    x = np.linspace(-0.9, 0.9, 8, dtype=np.float32)
    y = np.float32(1.0)
    functions = {
        "square": (jnp.square, (x,)),
        "sinh": (jnp.sinh, (x,)),
        "next_after": (jnp.nextafter, (x, np.full_like(x, y))),
        "erf_inv": (jax.lax.erf_inv, (x,)),
        "normal": (lambda k: jax.random.normal(jax.random.wrap_key_data(k), (8,)),
                   (np.asarray(jax.random.key_data(jax.random.key(7))),)),
    }
    client = ifrt.get_client("pjrt")
    device = client.devices()[0]
    report = {}
    for name, (fn, args) in functions.items():
        program = ifrt.HloProgram(jax.jit(fn).lower(*args))
        sent.clear()
        exe = client.compile(program)
        out, = exe(*[ifrt.device_put(a, device) for a in args])
        report[name] = {"code": sent[0].hex(), "result": np.asarray(out).tolist(),
                        "args": [np.asarray(a).tolist() for a in args],
                        "jax": np.asarray(fn(*args)).tolist() if name == "normal" else None}
    print(json.dumps(report))
""")


def _artifact_text(code: bytes) -> str:
    """The StableHLO module of a portable artifact, read by jaxlib's deserializer."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    context = ir.Context()
    stablehlo.register_dialect(context)
    return str(stablehlo.deserialize_portable_artifact(context, code))


@pytest.fixture(scope="module")
def compiled():
    """What the subprocess printed and wrote to stderr."""
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=300)  # a generous bound against a hang, not a timing
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_compiling_chlo_programs_writes_nothing_to_stderr(compiled):
    _, stderr = compiled
    assert stderr == ""


@pytest.mark.parametrize("name", ["square", "sinh", "next_after", "erf_inv", "normal"])
def test_chlo_programs_go_to_the_plugin_as_portable_artifacts(compiled, name):
    code = bytes.fromhex(compiled[0][name]["code"])
    assert code.startswith(b"ML\xefR"), code[:40]  # MLIR bytecode, not text
    text = _artifact_text(code)
    assert "stablehlo." in text and "chlo." not in text


def test_chlo_programs_compute_what_numpy_does(compiled):
    report, _ = compiled
    x = np.asarray(report["square"]["args"][0], np.float32)
    np.testing.assert_array_equal(np.asarray(report["square"]["result"], np.float32), x * x)
    np.testing.assert_allclose(np.asarray(report["sinh"]["result"], np.float32), np.sinh(x),
                               rtol=1e-6)
    toward = np.asarray(report["next_after"]["args"][1], np.float32)
    np.testing.assert_array_equal(np.asarray(report["next_after"]["result"], np.float32),
                                  np.nextafter(x, toward))
    inverse = report["erf_inv"]["result"]
    np.testing.assert_allclose([math.erf(v) for v in inverse], x, rtol=1e-5, atol=1e-6)
    # jax.random.normal's samples: no NumPy oracle draws the same, so jax's own run is it
    np.testing.assert_allclose(report["normal"]["result"], report["normal"]["jax"], rtol=1e-6)


def test_serialize_for_legalizes_chlo_and_keeps_the_text():
    """The program's text keeps its CHLO ops (what the user gave); the artifact has none."""
    program = ifrt.HloProgram("""
        func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
          %0 = chlo.square %x : tensor<4xf32> -> tensor<4xf32>
          return %0 : tensor<4xf32>
        }""")
    code, how = program.serialize_for(ifrt.program.stablehlo_version())
    assert how.startswith("bytecode ")
    assert "chlo." not in _artifact_text(code)
    assert "chlo.square" in program.text


def test_a_module_that_cannot_be_an_artifact_goes_as_text_quietly(capfd):
    """A module whose op jaxlib cannot write as a portable artifact (an mhlo op) falls back
    to text, and MLIR's diagnostics of the failed attempt are not printed."""
    program = ifrt.HloProgram("""
        func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
          %0 = "mhlo.add"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
          return %0 : tensor<4xf32>
        }""")
    code, how = program.serialize_for(ifrt.program.stablehlo_version())
    assert (code, how) == (program.text.encode(), "text")
    assert capfd.readouterr().err == ""
