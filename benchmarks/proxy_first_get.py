"""Where a jax process's first 64 MiB get through ``ifrtpy serve`` goes, and what the
server's choices change of it (docs/tpu.md, "Where 64 MiB transfers spend their time").

The server runs in this process over the chosen plugin (its transfer steps timed, and
each piece of a lookup timed as it is handed to gRPC); jax processes started from here,
one after the other, each put and get five fresh 64 MiB arrays and report, per get, its
time and the process's CPU time (user and system, every thread: jaxlib's client's own
work). The variants change one thing each: the server's lookup piece size, glibc's
allocator thresholds in the jax process, a 1 MiB get first, puts over gRPC instead of
files, and gRPC's flow-control trace in the jax process (``GRPC_TRACE=bdp_estimator``:
the window estimate of its connections). ``--calls`` adds synchronous ``x + 1`` calls,
in a row and right after a 64 MiB get, with the server's request events (arrival, on
the worker or the loop, answered, written).

    python benchmarks/proxy_first_get.py [--plugin tpu] [--variants base,trace,...] [--calls]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

N = 16 << 20  # float32 elements: 64 MiB

CHILD = r'''
import json, os, resource, sys, time
import numpy as np
import jax

n, device = int(sys.argv[1]), jax.devices()[0]
first = int(os.environ.get("FIRST_GET_BYTES", "0"))


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


out = {"gets": [], "calls": [], "after_get": []}
if first:
    np.asarray(jax.device_put(np.ones(first // 4, np.float32), device).block_until_ready())
for i in range(5):
    y = jax.device_put(np.full(n, i, np.float32), device).block_until_ready()
    c, t = cpu(), time.perf_counter()
    v = np.asarray(y)
    ms, d = (time.perf_counter() - t) * 1e3, cpu()
    assert v[0] == i and v[-1] == i
    out["gets"].append({"ms": round(ms, 1), "user_ms": round((d[0] - c[0]) * 1e3),
                        "sys_ms": round((d[1] - c[1]) * 1e3)})
    del y, v
if os.environ.get("CALLS"):
    add_one = jax.jit(lambda v: v + 1)
    small = jax.device_put(np.arange(8, dtype=np.float32), device)
    add_one(small).block_until_ready()
    for _ in range(40):
        t = time.perf_counter()
        add_one(small).block_until_ready()
        out["calls"].append(round((time.perf_counter() - t) * 1e3, 2))
    for k in range(6):
        np.asarray(jax.device_put(np.full(n, k, np.float32), device).block_until_ready())
        row = []
        for _ in range(4):
            t = time.perf_counter()
            add_one(small).block_until_ready()
            row.append(round((time.perf_counter() - t) * 1e3, 2))
        out["after_get"].append(row)
print("RESULT " + json.dumps(out), flush=True)
'''


def variants(transfer_threshold):
    """name -> (the jax process's extra environment, the server's lookup piece size)."""
    return {
        "base": ({}, 4 << 20),
        "base again": ({}, 4 << 20),
        "glibc thresholds in the jax process": (  # in place of ifrtpy_jax_plugin's setting
            {"IFRTPY_MALLOPT": "0", "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
             "MALLOC_TRIM_THRESHOLD_": str(4 << 30)},
            4 << 20),
        "pieces of 64 KiB": ({}, 64 << 10),
        "pieces of 1 MiB": ({}, 1 << 20),
        "pieces of 16 MiB": ({}, 16 << 20),
        "a 1 MiB get first": ({"FIRST_GET_BYTES": str(1 << 20)}, 4 << 20),
        "puts over gRPC": ({transfer_threshold: str(1 << 62)}, 4 << 20),
        "trace": ({"GRPC_TRACE": "bdp_estimator", "GRPC_VERBOSITY": "debug"}, 4 << 20),
    }


class Recorder:
    """The server's request events and lookup pieces, by wrapping its functions in this
    process (nothing of the server is changed)."""

    def __init__(self, server_module):
        self.events, self.pieces = [], []
        stream = server_module._Stream
        take, put, queue_, write = stream.take, stream.put, stream._queue, stream.write
        chunk = server_module._chunk_message
        events, pieces = self.events, self.pieces

        def timed_chunk(data):
            pieces.append(time.perf_counter())
            return chunk(data)

        def timed_take(self, request, size):
            events.append((time.perf_counter(), "arrived", request.WhichOneof("request")))
            return take(self, request, size)

        def timed_put(self, request, size):
            events.append((time.perf_counter(), "to the worker", request.WhichOneof("request")))
            return put(self, request, size)

        def timed_queue(self, answer, last):
            events.append((time.perf_counter(), "answered", ""))
            return queue_(self, answer, last)

        async def timed_write(self, context):
            class Timed:
                async def write(_, answer):
                    await context.write(answer)
                    events.append((time.perf_counter(), "written", ""))

                def __getattr__(_, name):
                    return getattr(context, name)
            return await write(self, Timed())

        server_module._chunk_message = timed_chunk
        stream.take, stream.put, stream._queue, stream.write = (
            timed_take, timed_put, timed_queue, timed_write)

    def clear(self):
        self.events.clear()
        self.pieces.clear()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plugin", default="tpu")
    parser.add_argument("--variants", help="comma-separated names (default: all)")
    parser.add_argument("--calls", action="store_true", help="time synchronous calls too")
    args = parser.parse_args()

    import ifrtpy as ifrt
    import ifrtpy_jax_plugin
    import ifrtpy.proxy.server as server_module
    from ifrtpy import proxy
    from ifrtpy.proxy.jax_client import jax_target
    from ifrtpy.proxy.steps import LOG, spans

    chosen = variants(ifrtpy_jax_plugin.TRANSFER_THRESHOLD)
    if args.variants:
        chosen = {name: chosen[name] for name in args.variants.split(",")}
    recorder = Recorder(server_module)
    client = ifrt.get_client(args.plugin)
    with proxy.serve(client, f"unix:{tempfile.mkdtemp()}/proxy.sock") as server:
        target = jax_target(server.address)
        for name, (env, piece) in chosen.items():
            server_module._CHUNK = piece
            recorder.clear()
            LOG.start()
            before = resource.getrusage(resource.RUSAGE_SELF)
            env = dict(os.environ, JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=target, **env)
            if args.calls:
                env["CALLS"] = "1"
            proc = subprocess.run([sys.executable, "-c", CHILD, str(N)], capture_output=True,
                                  text=True, timeout=600, env=env)
            after = resource.getrusage(resource.RUSAGE_SELF)
            LOG.stop()
            print(f"== {name} (pieces of {piece >> 10} KiB); the server meanwhile: CPU "
                  f"{after.ru_utime - before.ru_utime:.2f} s user, "
                  f"{after.ru_stime - before.ru_stime:.2f} s system")
            found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if not found:
                print(f"  failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
                continue
            result = json.loads(found[0][len("RESULT "):])
            for get in result["gets"]:
                print(f"  get: {get['ms']} ms; the jax process's CPU {get['user_ms']} ms user, "
                      f"{get['sys_ms']} ms system")
            for nbytes, seconds, steps in spans(LOG.take(), "copy arrived", "last piece written"):
                if nbytes >= N * 4:
                    print(f"  server: CopyToHostBuffer arriving to the last piece handed to gRPC "
                          f"{seconds * 1e3:.1f} ms; " + ", ".join(
                              f"{step} +{at * 1e3:.1f}" for step, at in steps.items() if at))
            gaps = [round((b - a) * 1e3, 1) for a, b in zip(recorder.pieces, recorder.pieces[1:])]
            print(f"  ms between pieces handed to gRPC, every lookup in order: {gaps[:100]}")
            if "GRPC_TRACE" in env:
                for line in proc.stderr.splitlines():
                    if "bdp" in line and ("complete" in line or "increased" in line):
                        print("   ", line[:200])
            if args.calls:
                print(f"  synchronous x + 1, in a row, ms: {result['calls']}")
                print(f"  synchronous x + 1, four after each 64 MiB get, ms: {result['after_get']}")
                start = recorder.events[0][0] if recorder.events else 0
                for at, what, kind in recorder.events[-120:]:
                    print(f"    {(at - start) * 1e3:10.2f} ms {what:13s} {kind}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
