"""``stablehlo.rng_bit_generator`` on the reference backend (the NumPy evaluator, with
XLA's bit generators in NumPy) gives jax's CPU client's bits and states: Philox (also
``DEFAULT``) and ThreeFry, every unsigned width, scalars and shapes split either way."""

import numpy as np
import pytest

import ifrtpy as ifrt

jax = pytest.importorskip("jax")
lax = jax.lax

SHAPES = [(), (5,), (3, 5), (2, 3, 4)]
DTYPES = [np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("reference", device_count=1)


@pytest.mark.parametrize("algorithm", ["RNG_DEFAULT", "RNG_PHILOX", "RNG_THREE_FRY"])
def test_bits_and_states_are_jaxs(client, algorithm):
    algorithm = getattr(lax.RandomAlgorithm, algorithm)

    def draw(key):
        return [lax.rng_bit_generator(key, shape, dtype=dtype, algorithm=algorithm)
                for shape in SHAPES for dtype in DTYPES]

    with jax.enable_x64(True):  # else jax draws 64-bit values as 32-bit ones
        for seed in (0, 2**31 - 5):
            key = np.asarray(jax.random.key_data(jax.random.key(seed, impl="rbg")))
            function = jax.jit(draw)
            expected = jax.tree.leaves(function(key))
            ours = client.compile(function.lower(key))(
                ifrt.device_put(key, client.devices()[0]))
            assert len(ours) == len(expected) == 2 * len(SHAPES) * len(DTYPES)
            for got, want in zip(ours, expected):
                got, want = np.asarray(got), np.asarray(want)
                assert got.dtype == want.dtype and got.shape == want.shape
                np.testing.assert_array_equal(got, want)


def test_jaxs_rbg_keys_draw_jaxs_numbers(client):
    """jax's ``rbg`` PRNG end to end: a split, then uniform draws."""
    def sample(data):
        key = jax.random.wrap_key_data(data, impl="rbg")
        first, second = jax.random.split(key)
        return jax.random.uniform(first, (3, 4)), jax.random.randint(second, (7,), 0, 100)

    data = np.asarray(jax.random.key_data(jax.random.key(11, impl="rbg")))
    function = jax.jit(sample)
    ours = client.compile(function.lower(data))(ifrt.device_put(data, client.devices()[0]))
    for got, want in zip(ours, function(data)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_with_the_interpreter_forced_the_program_is_refused(client, monkeypatch):
    """The interpreter has no bit generator: a program with one, where the NumPy
    evaluator may not run it, is refused at compile with both reasons."""
    from ifrtpy.backends.reference import worker

    monkeypatch.setenv(worker.EVALUATOR_VARIABLE, "interpreter")
    key = np.zeros(4, np.uint32)
    lowered = jax.jit(lambda k: lax.rng_bit_generator(k, (4,))).lower(key)
    with pytest.raises(ifrt.errors.UnimplementedError,
                       match="does not run stablehlo.rng_bit_generator; the NumPy evaluator "
                             "does not run this program"):
        client.compile(lowered)


def test_a_worker_runs_them_importing_nothing_of_ifrtpy(tmp_path):
    """A worker loads the evaluator and its bit generators from their files: a program
    with a bit generator runs there without the ifrtpy package imported."""
    import subprocess
    import sys

    from ifrtpy import _jaxlib
    from ifrtpy.backends.reference import worker

    program = """module @rng { func.func public @main(%s: tensor<2xui64>) -> tensor<5xui32> {
      %0, %1 = stablehlo.rng_bit_generator %s, algorithm = PHILOX
        : (tensor<2xui64>) -> (tensor<2xui64>, tensor<5xui32>)
      return %1 : tensor<5xui32> } }"""
    script = f"""
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("w", {worker.__file__!r})
w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
context = w._context({_jaxlib.register_jax_dialects_location()!r})
evaluator = w._numpy_evaluator()
from jaxlib.mlir import ir
with context, ir.Location.unknown():
    run = evaluator.compile_module(ir.Module.parse({program!r}))
    bits, = run([np.array([3, 4], np.uint64)])
print(*bits.tolist(), "ifrtpy" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    _, expected = lax.rng_bit_generator(np.array([3, 0, 4, 0], np.uint32), (5,),
                                        algorithm=lax.RandomAlgorithm.RNG_PHILOX)
    assert done.stdout.split() == [*map(str, np.asarray(expected).tolist()), "False"]
