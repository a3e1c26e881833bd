"""``python -m ifrtpy bench``: the headline figures of ifrtpy next to jax, in one run.

Each case is a pair of loops (ifrtpy, jax) returning the seconds ``n`` calls took; the two
take turns in every repeat (so a slow stretch of the machine falls on both alike) and the
figure is the median time per call. jax is optional: without it the jax column is empty,
and on an accelerator too (jax would run on the CPU here; a TPU serves one process).
``benchmarks/`` holds the longer scripts with floors (the raw plugin call, a C loop).
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

import ifrtpy as ifrt
from ifrtpy.builder import Builder
from ifrtpy.cli.demo import DEMO_PROGRAM

Loop = Callable[[int], float]
#: Sets a case up; returns its loops (ifrtpy, jax or None).
Make = Callable[[], tuple[Loop, Optional[Loop]]]

MiB = 1 << 20


@dataclass(frozen=True)
class Row:
    """One line of the table: seconds per call, ``None`` where not measured; ``noisy``
    where its repeats differed by more than :data:`NOISY` times (a busy machine)."""

    operation: str
    ifrtpy: float
    jax: Optional[float]
    noisy: bool = False


#: Repeats of a row further apart than this factor mark it noisy in the table.
NOISY = 2.0


def _timed(body: Callable[[], object]) -> Loop:
    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            body()
        return time.perf_counter() - start
    return run


def _timed_after(setup: Callable[[], Any], body: Callable[[Any], object]) -> Loop:
    """Like :func:`_timed`, with an untimed ``setup()`` before each call (its value passed)."""
    def run(n: int) -> float:
        total = 0.0
        for _ in range(n):
            value = setup()
            start = time.perf_counter()
            body(value)
            total += time.perf_counter() - start
        return total
    return run


def _median_per_call(loops: list[Loop], n: int, repeats: int) -> tuple[list[float], bool]:
    """The median seconds per call of each loop, and whether the repeats of one of them
    differed by more than :data:`NOISY` times."""
    for loop in loops:
        loop(max(1, n // 10))
    samples: list[list[float]] = [[] for _ in loops]
    for _ in range(repeats):
        for loop, out in zip(loops, samples):
            out.append(loop(n) / n)
    noisy = any(max(s) > NOISY * min(s) for s in samples)
    return [statistics.median(s) for s in samples], noisy


def _import_jax(devices: int) -> Any:
    """jax on its CPU platform with ``devices`` devices, or None when not installed."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={devices}")
    try:
        import jax
    except ImportError:
        return None
    return jax


def _size(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // 1024} KiB"


def run(client: Any, *, quick: bool = False, progress: Callable[[str], None] = print) -> list[Row]:
    """Measure every case on ``client`` (all its addressable devices for the sharded ones)
    and return the rows. ``quick``: small sizes and few repeats (seconds; figures rough)."""
    devices = client.addressable_devices()
    count = len(devices)
    # jax here runs on the CPU: next to an accelerator's figures it would measure another
    # machine (and a TPU serves one process at a time)
    jax: Any = _import_jax(count) if client.platform_name == "cpu" else None
    jdevs = jax.devices() if jax is not None else []
    repeats, n_small, n_big = (3, 50, 2) if quick else (9, 5000, 10)
    nbytes = 256 * 1024 if quick else 64 * MiB
    big = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32).reshape(count * 8, -1)
    one = ifrt.SingleDeviceSharding(devices[0])
    sharded = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))
    jsharded = None
    if len(jdevs) >= count:
        jsharded = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jdevs[:count]), ("x",)),
                                              jax.sharding.PartitionSpec("x"))

    jdev0 = jdevs[0] if jdevs else None

    def execute() -> tuple[Loop, Optional[Loop]]:
        b = Builder("plus_one")
        x = np.arange(8, dtype=np.float32)
        exe = client.compile(b.build(b.parameter((8,), np.float32) + 1.0), ifrt.CompileOptions())
        a = ifrt.device_put(x, devices[0])
        np.testing.assert_array_equal(np.asarray(exe(a)[0]), x + 1)
        ours = _timed(lambda: exe(a)[0].block_until_ready())
        if jax is None:
            return ours, None
        f, xj = jax.jit(lambda v: v + 1), jax.device_put(x, jdev0)
        return ours, _timed(lambda: f(xj).block_until_ready())

    def spmd() -> tuple[Loop, Optional[Loop]]:
        x = np.arange(count * 8 * 4, dtype=np.float32).reshape(count * 8, 4)
        exe = client.compile(ifrt.HloProgram(DEMO_PROGRAM.format(rows=count * 8, n=count)),
                             ifrt.CompileOptions(devices=devices, num_partitions=count))
        a = client.make_array_from_host_buffer(x, sharded)
        np.testing.assert_array_equal(np.asarray(exe(a)[0]), x * 2 + 1)
        ours = _timed(lambda: exe(a)[0].block_until_ready())
        if jsharded is None:
            return ours, None
        g = jax.jit(lambda v: v * 2 + 1, in_shardings=jsharded, out_shardings=jsharded)
        xj = jax.device_put(x, jsharded)
        return ours, _timed(lambda: g(xj).block_until_ready())

    def step() -> tuple[Loop, Optional[Loop]]:
        """An inference step: put a fresh batch, run a tanh MLP, read the result (jax: the
        same function through jax.jit)."""
        width, batch, layers = (128, 8, 2) if quick else (512, 32, 4)
        rng = np.random.default_rng(1)
        weights = [rng.standard_normal((width, width), dtype=np.float32) / np.float32(width ** 0.5)
                   for _ in range(layers)]
        batches = [rng.standard_normal((batch, width), dtype=np.float32) for _ in range(8)]
        b = Builder("mlp")
        h = b.parameter((batch, width), np.float32)
        params = [b.parameter((width, width), np.float32) for _ in range(layers)]
        for param in params:
            h = b.tanh(b.dot(h, param))
        exe = client.compile(b.build(h), ifrt.CompileOptions())
        on_device = [ifrt.device_put(w, devices[0]) for w in weights]
        expected = batches[0]
        for weight in weights:
            expected = np.tanh(expected @ weight)
        # A TPU multiplies f32 in one bfloat16 pass at the default precision (jax's too):
        # its products differ from NumPy's by about 1e-2 here.
        rtol, atol = (1e-4, 1e-5) if client.platform_name == "cpu" else (2e-2, 2e-2)
        np.testing.assert_allclose(np.asarray(exe(ifrt.device_put(batches[0], devices[0]), *on_device)[0]),
                                   expected, rtol=rtol, atol=atol)
        turn = iter(range(1 << 62))
        ours = _timed(lambda: np.asarray(
            exe(client.make_array_from_host_buffer(batches[next(turn) % 8], one), *on_device)[0]))
        if jax is None:
            return ours, None

        def mlp(x: Any, *ws: Any) -> Any:
            for w in ws:
                x = jax.numpy.tanh(x @ w)
            return x

        f = jax.jit(mlp)
        jweights = [jax.device_put(w, jdev0) for w in weights]
        return ours, _timed(lambda: np.asarray(
            f(jax.device_put(batches[next(turn) % 8], jdev0), *jweights)))

    def put(data: np.ndarray, sharding: Any, target: Any) -> Make:
        """``data`` put with ``sharding`` (ifrtpy) and on ``target`` (jax, None: not measured)."""
        def make() -> tuple[Loop, Optional[Loop]]:
            ours = _timed(lambda: client.make_array_from_host_buffer(data, sharding).block_until_ready())
            if target is None:
                return ours, None
            return ours, _timed(lambda: jax.device_put(data, target).block_until_ready())
        return make

    def get(sharding: Any, target: Any) -> Make:
        """``big``, held with ``sharding`` (ifrtpy) and on ``target`` (jax), read to the host."""
        def make() -> tuple[Loop, Optional[Loop]]:
            a = client.make_array_from_host_buffer(big, sharding)
            np.testing.assert_array_equal(np.asarray(a), big)
            ours = _timed(lambda: np.asarray(a))
            if target is None:
                return ours, None
            # jax caches an array's host value: each call copies out a new array (made untimed).
            return ours, _timed_after(lambda: jax.device_put(big, target).block_until_ready(),
                                      np.array)
        return make

    small = np.arange(1024, dtype=np.float32)
    size = _size(nbytes)
    cases: list[tuple[str, int, Make]] = [
        ("execute x+1, f32[8], one device", n_small, execute),
        (f"SPMD x*2+1, {count * 8 * 4 * 4} bytes over {count} devices", n_small // 10 or 1, spmd),
        ("step: put, MLP, read" + (" (small)" if quick else " (4x512, batch 32)"),
         n_small // 10 or 1, step),
        ("put 4 KiB", n_small, put(small, one, jdev0)),
        (f"put {size}", n_big, put(big, one, jdev0)),
        (f"get {size}", n_big, get(one, jdev0)),
        (f"sharded put {size} / {count}", n_big, put(big, sharded, jsharded)),
        (f"sharded get {size} / {count}", n_big, get(sharded, jsharded)),
    ]

    rows = []
    for i, (name, n, make) in enumerate(cases, 1):
        progress(f"[{i}/{len(cases)}] {name}")
        ours, theirs = make()
        loops = [ours] if theirs is None else [ours, theirs]
        times, noisy = _median_per_call(loops, n, repeats)
        rows.append(Row(name, times[0], times[1] if theirs is not None else None, noisy))
    return rows


def _fmt(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def table(rows: list[Row]) -> str:
    """The rows as an aligned text table with the ratio ifrtpy / jax (two significant
    digits below 0.1, never 0.00), ``~`` after the ratio of a noisy row."""
    lines = [("operation", "ifrtpy", "jax", "ifrtpy/jax")]
    for r in rows:
        ratio = "-" if not r.jax else _ratio(r.ifrtpy / r.jax)
        lines.append((r.operation, _fmt(r.ifrtpy), _fmt(r.jax), ratio + (" ~" if r.noisy else "")))
    width = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join(
        f"{a:<{width[0]}}  {b:>{width[1]}}  {c:>{width[2]}}  {d:>{width[3]}}" for a, b, c, d in lines)


def _ratio(x: float) -> str:
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def require_matplotlib() -> None:
    """Raise ModuleNotFoundError saying how to install matplotlib when it is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ModuleNotFoundError("--plot needs matplotlib: pip install matplotlib")


def plot(rows: list[Row], path: str) -> None:
    """A bar chart of the rows (log time axis) written to ``path``; needs matplotlib."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    y = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.5))
    ax.barh(y - 0.2, [r.ifrtpy for r in rows], height=0.4, label="ifrtpy")
    ax.barh(y + 0.2, [r.jax or 0.0 for r in rows], height=0.4, label="jax")
    ax.set_yticks(y, [r.operation for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds per call (median; lower is faster)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def progress_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bench(client: Any, quick: bool = False, plot_file: str | None = None) -> None:
    """The command: measure, print the table, and draw it into ``plot_file`` if given."""
    if plot_file:
        require_matplotlib()  # before measuring, not after
    rows = run(client, quick=quick, progress=progress_to_stderr)
    print(f"median time per call, {len(client.addressable_devices())} devices"
          f"{' (--quick: small sizes, rough figures)' if quick else ''}")
    print(table(rows))
    if any(row.noisy for row in rows):
        print(f"~: its repeats differed by more than {NOISY:g} times (a busy machine): rough "
              "figures; run again on quiet cores")
    if client.platform_name != "cpu":
        print(f"no jax column on {client.platform_name}: benchmarks/accelerator_check.py "
              f"--parts speed times jax and ifrtpy there, each in its own process")
    elif all(row.jax is None for row in rows):
        print("the jax column needs jax: pip install jax (or the bench extra: "
              "pip install \"ifrtpy[bench]\")")
    if plot_file:
        plot(rows, plot_file)
        print(f"plot written to {plot_file}")
