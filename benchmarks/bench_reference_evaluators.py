"""The reference backend's two evaluators on jax's rejection samplers: seconds per execute
of ``jax.random.gamma``, ``binomial`` and ``chisquare`` over ``--samples`` samples (the
programs of jax's ``random_lax_test.py``: ``while`` loops over uniform draws), run by the
NumPy evaluator (the default) and by jaxlib's StableHLO interpreter
(``IFRTPY_REFERENCE_EVALUATOR=interpreter``), and whether their results are the same bits.

    python benchmarks/bench_reference_evaluators.py [--samples 12000] [--repeats 3]
        [--skip-interpreter]

Each program is lowered by jax (its CHLO ops expanded, as a portable artifact carries
them) and compiled once on a one-device reference client; the first execute of each
evaluator is not counted (a worker parses the program then).
"""

import argparse
import os
import statistics
import time

import numpy as np


def programs(samples: int) -> dict:
    import jax
    from jaxlib.mlir import ir

    from ifrtpy.program import mlir

    def lowered(function, key):
        text = jax.jit(function).lower(key).as_text()
        with mlir.context():
            module = ir.Module.parse(text)
            mlir._expand_chlo(module)
            return str(module)

    def wrap(k):
        return jax.random.wrap_key_data(k)

    key = np.asarray(jax.random.key_data(jax.random.key(0)))
    return key, {
        "gamma": lowered(lambda k: jax.random.gamma(wrap(k), 1.3, shape=(samples,)), key),
        "binomial": lowered(lambda k: jax.random.binomial(wrap(k), 20.0, 0.3, shape=(samples,)), key),
        "chisquare": lowered(lambda k: jax.random.chisquare(wrap(k), 3.0, shape=(samples,)), key),
    }


def timed(evaluator: str, texts: dict, key: np.ndarray, repeats: int) -> dict:
    import ifrtpy as ifrt
    from ifrtpy.backends.reference import pool, worker

    os.environ[worker.EVALUATOR_VARIABLE] = evaluator
    pool._pool.close()  # workers start again, reading the variable
    client = ifrt.get_client("reference", device_count=1)
    device = client.devices()[0]
    out = {}
    for name, text in texts.items():
        executable = client.compile(ifrt.HloProgram(text))
        arg = ifrt.device_put(key, device)
        first, = executable(arg)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            result, = executable(arg)
            np.asarray(result)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times), np.asarray(first)
    pool._pool.close()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-interpreter", action="store_true")
    args = parser.parse_args()
    key, texts = programs(args.samples)
    numpy_times = timed("numpy", texts, key, args.repeats)
    interpreter_times = {} if args.skip_interpreter else timed("interpreter", texts, key, 1)
    print(f"| program ({args.samples} samples) | NumPy evaluator, s | interpreter, s | same bits |")
    print("|---|---|---|---|")
    for name in texts:
        ours, ours_out = numpy_times[name]
        if name in interpreter_times:
            theirs, their_out = interpreter_times[name]
            same = ours_out.tobytes() == their_out.tobytes()
            print(f"| {name} | {ours:.3f} | {theirs:.1f} | {same} |")
        else:
            print(f"| {name} | {ours:.3f} | not run | |")


if __name__ == "__main__":
    main()
