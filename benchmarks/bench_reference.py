"""The reference backend's execute: what one costs, the first one, and what a running
program leaves to the process's other threads.

1. ``x + 1`` on f32[8], one device: median µs per ``execute`` + reading the output back;
   and on f32[262144] (1 MiB in, 1 MiB out), median ms.
2. A fresh process (each figure the median over ``--fresh`` child processes): seconds
   from ``import ifrtpy`` to a client, to the first compile, to the first execute's
   answer, and the second execute.
3. A program of about ``--seconds`` s (a loop of 64x64 matmuls): its time alone, the
   longest another Python thread of the process waited meanwhile for a turn (a loop of
   1 ms sleeps, each gap measured), and the wall time of two such programs run at once
   from two threads.

    python benchmarks/bench_reference.py [--n 300] [--repeats 7] [--fresh 3] [--seconds 1]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

ADD_ONE = """module @add_one { func.func public @main(%a: tensor<Nxf32>) -> tensor<Nxf32> {
  %c = stablehlo.constant dense<1.0> : tensor<Nxf32>
  %0 = stablehlo.add %a, %c : tensor<Nxf32>
  return %0 : tensor<Nxf32> } }"""

#: n steps of a 64x64 matmul (n is the second argument).
SLOW = """module @slow { func.func public @main(%a: tensor<64x64xf32>, %n: tensor<i32>)
    -> tensor<64x64xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %one = stablehlo.constant dense<1> : tensor<i32>
  %r:3 = stablehlo.while(%i = %c0, %m = %n, %x = %a) : tensor<i32>, tensor<i32>, tensor<64x64xf32>
    cond { %p = stablehlo.compare LT, %i, %m : (tensor<i32>, tensor<i32>) -> tensor<i1>
           stablehlo.return %p : tensor<i1> }
    do { %j = stablehlo.add %i, %one : tensor<i32>
         %y = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0]
             : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
         %z = stablehlo.tanh %y : tensor<64x64xf32>
         stablehlo.return %j, %m, %z : tensor<i32>, tensor<i32>, tensor<64x64xf32> }
  return %r#2 : tensor<64x64xf32> } }"""

FRESH = """
import time
start = time.perf_counter()
import numpy as np, ifrtpy as ifrt
client = ifrt.get_client("reference", device_count=1)
t_client = time.perf_counter()
exe = client.compile(ifrt.HloProgram(PROGRAM.replace("N", "8")))
t_compile = time.perf_counter()
x = ifrt.device_put(np.arange(8, dtype=np.float32), client.devices()[0])
np.asarray(exe.execute([x]).outputs[0])
t_first = time.perf_counter()
np.asarray(exe.execute([x]).outputs[0])
t_second = time.perf_counter()
print(json.dumps([t_client - start, t_compile - t_client, t_first - t_compile,
                  t_second - t_first]))
"""


def per_execute_us(client, n, repeats, size=8):
    import ifrtpy as ifrt
    exe = client.compile(ifrt.HloProgram(ADD_ONE.replace("N", str(size))))
    x = ifrt.device_put(np.arange(size, dtype=np.float32), client.devices()[0])
    np.testing.assert_array_equal(np.asarray(exe.execute([x]).outputs[0]), np.arange(size) + 1)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            np.asarray(exe.execute([x]).outputs[0])
        samples.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(samples)


def fresh_process(count):
    code = "import json\nPROGRAM = " + repr(ADD_ONE) + FRESH
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                      text=True, check=True, timeout=300).stdout)
            for _ in range(count)]
    return [statistics.median(column) for column in zip(*runs)]


def slow_program(client, seconds):
    """(an execute of about ``seconds``, its steps) on ``client``."""
    import ifrtpy as ifrt
    device = client.devices()[0]
    exe = client.compile(ifrt.HloProgram(SLOW))
    a = ifrt.device_put(np.eye(64, dtype=np.float32) * 0.5, device)

    def run(steps):
        n = ifrt.device_put(np.int32(steps), device)
        start = time.perf_counter()
        np.asarray(exe.execute([a, n]).outputs[0])
        return time.perf_counter() - start

    steps = 4
    while (took := run(steps)) < 0.2:
        steps *= 4
    steps = max(1, int(steps * seconds / took))
    return (lambda: run(steps)), steps


def longest_gap_s(busy):
    """The longest gap a thread of 1 ms sleeps saw while ``busy()`` ran."""
    gaps, stop = [0.0], threading.Event()

    def ticker():
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    thread = threading.Thread(target=ticker)
    thread.start()
    took = busy()
    stop.set()
    thread.join()
    return took, max(gaps)


def two_at_once_s(run):
    threads = [threading.Thread(target=run) for _ in range(2)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--fresh", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()

    import ifrtpy as ifrt

    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    client = ifrt.get_client("reference", device_count=2)
    print(f"execute x + 1, f32[8]:          {per_execute_us(client, args.n, args.repeats):8.0f} µs "
          "(median per execute + read back)")
    big = per_execute_us(client, 3, args.repeats, size=1 << 18)
    print(f"execute x + 1, f32[262144]:     {big / 1000:8.1f} ms")
    to_client, to_compile, first, second = fresh_process(args.fresh)
    print(f"fresh process: import + client  {to_client:8.3f} s")
    print(f"               first compile    {to_compile:8.3f} s")
    print(f"               first execute    {first:8.3f} s")
    print(f"               second execute   {second:8.3f} s")
    run, steps = slow_program(client, args.seconds)
    took, gap = longest_gap_s(run)
    print(f"program of {steps} steps:         {took:8.3f} s alone")
    print(f"  another thread's longest wait {gap:8.3f} s meanwhile")
    print(f"  two at once, from 2 threads   {two_at_once_s(run):8.3f} s")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
