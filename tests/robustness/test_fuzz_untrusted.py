"""Fuzz ``HloProgram(...)`` and ``deserialize_executable(...)`` with mutated valid inputs.

Every case must end in a program/executable or an InvalidArgumentError; the cases run in
subprocess batches, so an abort or a crash fails the batch (and names its last case). CI
runs 7 cases (one per kind of input); ``IFRTPY_FUZZ_CASES=2000`` runs the full profile.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

CASES = int(os.environ.get("IFRTPY_FUZZ_CASES", "7"))
BATCH = 100

WORKER = textwrap.dedent('''
    import random, sys
    import numpy as np
    import ifrtpy as ifrt
    from ifrtpy.errors import InvalidArgumentError

    first, count, seed = map(int, sys.argv[1:4])
    jax = None
    try:
        import jax, jax.numpy as jnp
    except ImportError:
        pass
    TEXT = """
    func.func public @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {
      %one = stablehlo.constant dense<1.0> : tensor<8xf32>
      %s = stablehlo.add %x, %one : tensor<8xf32>
      %p = stablehlo.multiply %s, %y : tensor<8xf32>
      return %p : tensor<8xf32>
    }"""
    HLO = """HloModule m

    ENTRY main {
      x = f32[8] parameter(0)
      y = f32[8] parameter(1)
      s = f32[8] add(x, y)
      ROOT p = f32[8] multiply(s, y)
    }"""
    program = ifrt.HloProgram(TEXT)
    client = ifrt.get_client(device_count=2)
    reference = ifrt.get_client("reference", device_count=2)
    from jaxlib import _hlo
    inputs = {
        "stablehlo_text": TEXT.encode(),
        "hlo_text": HLO.encode(),
        "portable_artifact": program.serialize_for((1, 13, 3))[0],
        "hlo_module_proto": _hlo.hlo_module_from_text(HLO).as_serialized_hlo_module_proto(),
        "pjrt_executable": client.compile(program).serialize(),
        "reference_executable": reference.compile(program).serialize(),
    }
    if jax is not None:
        exported = jax.export.export(jax.jit(lambda x, y: jnp.sin(x) * y))(np.ones(8, np.float32), np.ones(8, np.float32))
        inputs["jax_exported"] = bytes(exported.serialize())
    kinds = sorted(inputs)

    def mutate(rng, data):
        data = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 4, 16))):
            how = rng.random()
            at = rng.randrange(len(data)) if data else 0
            if how < 0.6 and data:
                data[at] = rng.randrange(256)
            elif how < 0.75:
                data[at:] = data[at:at + rng.randrange(1, 64)] + data[at:] if rng.random() < 0.5 else data[at + 1:]
            elif how < 0.9:
                data = data[:at]
            else:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        return bytes(data)

    for case in range(first, first + count):
        rng = random.Random(seed * 1_000_003 + case)
        kind = kinds[case % len(kinds)]
        data = mutate(rng, inputs[kind])
        print("case", case, kind, len(data), flush=True)
        try:
            if kind == "pjrt_executable":
                client.deserialize_executable(data)
            elif kind == "reference_executable":
                reference.deserialize_executable(data)
            elif kind.endswith("_text"):
                text = data.decode("utf-8", errors="replace")
                ifrt.HloProgram(text)
            else:
                ifrt.HloProgram(data)
            outcome = "accepted"
        except InvalidArgumentError:
            outcome = "refused"
        print("done", case, outcome, flush=True)
    print("batch ok", flush=True)
''')


def run_batch(first: int, count: int, seed: int = 14) -> str:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", WORKER, str(first), str(count), str(seed)],
                          capture_output=True, text=True, timeout=3600, env=env)
    last = [line for line in done.stdout.splitlines() if line.startswith("case")][-1:]
    assert done.returncode == 0 and "batch ok" in done.stdout, (
        f"exit status {done.returncode} at {last}: {done.stderr[-3000:]}")
    return done.stdout


@pytest.mark.parametrize("first", range(0, CASES, BATCH))
def test_mutated_inputs_end_in_a_value_or_a_clear_error(first):
    out = run_batch(first, min(BATCH, CASES - first))
    outcomes = [line.split()[2] for line in out.splitlines() if line.startswith("done")]
    assert len(outcomes) == min(BATCH, CASES - first)
    assert "refused" in outcomes
