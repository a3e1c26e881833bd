"""Peak host memory of 64 MiB transfers, each measured in a fresh process.

The CPU plugin's device memory is host RAM, so a put's result counts in the process's
resident set as much as a get's does. Each case runs in a new Python process: it makes
the client and the 64 MiB float32 source, warms up with a small transfer of the same
kind, resets the peak (``/proc/self/clear_refs`` = 5), notes VmRSS, runs the transfer
once, keeps the result and reads VmHWM. "peak" is VmHWM minus the VmRSS before, "result"
is what the result holds (its bytes, in RAM), and "beyond" = (peak - result) / array
size: the transient cost of the transfer (target for a put: <= 0.1, i.e. the peak is at
most 1.1x the array beyond the result itself).

    cd benchmarks && PYTHONPATH=.. python bench_peak_memory.py [--runs 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

MiB = 1 << 20

CHILD = r"""
import json, os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
import numpy as np

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)

case = sys.argv[1]
MiB = 1 << 20
data = np.random.default_rng(0).random(64 * MiB // 4, dtype=np.float32)
small = data[:1 << 16].copy()

if case.startswith("jax"):
    import jax
    devices = jax.devices()
    one = devices[0]
    sharded = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), ("x",)),
                                         jax.sharding.PartitionSpec("x"))
    put = lambda x, s: jax.device_put(x, s).block_until_ready()
    get = lambda a: np.array(a)
else:
    import ifrtpy as ifrt
    from ifrtpy import _pjrt
    client = ifrt.get_client("pjrt", device_count=8)
    devices = client.devices()
    one = ifrt.SingleDeviceSharding(devices[0])
    sharded = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))
    put = lambda x, s: client.make_array_from_host_buffer(x, s).block_until_ready()
    get = lambda a: np.array(a)  # a copy: np.asarray of one device is a view
    memory = devices[0].memory(one.memory_kind)._handle

if case in ("ifrtpy put", "jax put"):
    op, warm, source = (lambda: put(data, one)), (lambda: put(small, one)), None
elif case in ("ifrtpy sharded put", "jax sharded put"):
    op, warm = (lambda: put(data, sharded)), (lambda: put(small, sharded))
elif case == "plugin put":
    op = lambda: _pjrt.buffer_from_host_buffer(client._handle, data, None, memory, 0)
    warm = lambda: _pjrt.buffer_from_host_buffer(client._handle, small, None, memory, 0)
elif case in ("ifrtpy get", "jax get"):
    source = put(data, one)
    op, warm = (lambda: get(source)), (lambda: get(put(small, one)))
elif case in ("ifrtpy sharded get", "jax sharded get"):
    source = put(data, sharded)
    op, warm = (lambda: get(source)), (lambda: get(put(small, sharded)))
else:
    raise SystemExit(f"unknown case {case!r}")

warm()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current VmRSS
before = status("VmRSS")
result = op()
peak = status("VmHWM")
after = status("VmRSS")
print(json.dumps({"peak": peak - before, "kept": after - before}), flush=True)
os._exit(0)  # measured: skip interpreter teardown
"""

CASES = [
    # (case, bytes the result holds in RAM)
    ("plugin put", 64 * MiB),
    ("ifrtpy put", 64 * MiB),
    ("jax put", 64 * MiB),
    ("ifrtpy sharded put", 64 * MiB),
    ("jax sharded put", 64 * MiB),
    ("ifrtpy get", 64 * MiB),
    ("jax get", 64 * MiB),
    ("ifrtpy sharded get", 64 * MiB),
    ("jax sharded get", 64 * MiB),
]


def run_case(case: str) -> dict:
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True,
                          env=env, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{case}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    size = 64 * MiB
    print(f"{'case':22s} {'peak MiB':>9s} {'kept MiB':>9s} {'result MiB':>11s} {'peak/array':>11s} {'beyond':>7s}")
    for case, result in CASES:
        runs = [run_case(case) for _ in range(args.runs)]
        peak = statistics.median(r["peak"] for r in runs)
        kept = statistics.median(r["kept"] for r in runs)
        print(f"{case:22s} {peak / MiB:9.1f} {kept / MiB:9.1f} {result / MiB:11.1f} "
              f"{peak / size:10.2f}x {(peak - result) / size:6.2f}x")
    print(f"(median of {args.runs} fresh processes per case)")


if __name__ == "__main__":
    main()
