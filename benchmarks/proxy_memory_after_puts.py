"""The proxy server's memory after sessions that put large arrays have ended
(docs/proxy.md, "Memory after sessions end"): lost, or kept by an allocator?

The server (``ifrtpy.proxy.serve`` over the pjrt backend) runs in this process. jax
processes put f32 arrays of ``--mib`` MiB over gRPC (puts through files are turned off):
``--killed N`` of them are killed once half their put has arrived, then ``--whole N``
complete theirs. After each session has ended it prints this process's resident memory,
then the same after ``malloc_trim(0)`` (what glibc's heap kept), and where tracemalloc
finds the Python allocations still held.

    python benchmarks/proxy_memory_after_puts.py [--mib 1024] [--killed 3] [--whole 3]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import signal
import subprocess
import sys
import time
import tracemalloc

import ifrtpy as ifrt
from ifrtpy import proxy

PUT = """
import sys
import jax, numpy as np
x = np.ones(int(sys.argv[1]) << 18, np.float32)
jax.device_put(x).block_until_ready()
print("done", flush=True)
"""

#: A bound on a hang (seconds), not a timing.
HANG_S = 900


def rss_mib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) >> 10
    return -1


def wait(predicate, what: str) -> None:
    end = time.monotonic() + HANG_S
    while not predicate():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def settled(server) -> int:
    wait(lambda: not server.sessions() and server.host_buffer_bytes == 0, "the session to end")
    gc.collect()
    time.sleep(1)
    return rss_mib()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="MiB per put (default 1024)")
    parser.add_argument("--killed", type=int, default=3, help="puts killed half way")
    parser.add_argument("--whole", type=int, default=3, help="puts that complete")
    args = parser.parse_args()
    tracemalloc.start()
    server = proxy.serve(ifrt.get_client("pjrt", device_count=1))
    env = {k: v for k, v in os.environ.items() if not k.startswith("IFRT_PROXY_")}
    env.update(JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=f"grpc://{server.address}",
               IFRT_PROXY_GRPC_LARGE_TRANSFER_OPTIMIZATION_THRESHOLD_BYTES=str(2**63 - 1))
    put = [sys.executable, "-c", PUT, str(args.mib)]
    libc = ctypes.CDLL("libc.so.6")
    try:
        print(f"start: {rss_mib()} MiB", flush=True)
        for i in range(args.killed):
            client = subprocess.Popen(put, env=env, stdout=subprocess.DEVNULL)
            wait(lambda: server.host_buffer_bytes > (args.mib << 19), "half the put to arrive")
            at_kill = rss_mib()
            client.send_signal(signal.SIGKILL)
            client.wait()
            print(f"killed put {i + 1}: {at_kill} MiB at the kill, {settled(server)} MiB after",
                  flush=True)
        libc.malloc_trim(0)
        print(f"after malloc_trim(0): {rss_mib()} MiB", flush=True)
        for i in range(args.whole):
            done = subprocess.run(put, env=env, capture_output=True, text=True, timeout=HANG_S)
            assert done.stdout.strip() == "done", done.stderr[-2000:]
            print(f"whole put {i + 1}: {settled(server)} MiB after", flush=True)
        libc.malloc_trim(0)
        print(f"after malloc_trim(0): {rss_mib()} MiB", flush=True)
        print("Python allocations held (tracemalloc), largest first:")
        for stat in tracemalloc.take_snapshot().statistics("lineno")[:3]:
            print(f"  {stat}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
