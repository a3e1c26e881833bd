"""Timing helpers shared by the benchmark scripts."""

import statistics
import time


def interleaved_median_us(fns, n, repeats):
    """Median µs per call of each loop in ``fns``, the loops taking turns in every repeat
    so that a slow stretch of the machine falls on all of them alike."""
    for fn in fns.values():
        fn(max(1, n // 10))
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(fn(n) / n * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def timed(body):
    """A loop of ``n`` calls of ``body``, returning the seconds it took."""
    def run(n):
        start = time.perf_counter()
        for _ in range(n):
            body()
        return time.perf_counter() - start
    return run
