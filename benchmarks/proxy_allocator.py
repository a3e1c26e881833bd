"""What glibc's allocator in a jax process costs its transfers through ``ifrtpy serve``
(docs/proxy.md, "The jax process's allocator"; docs/tpu.md).

The server runs in this process over the chosen plugin, its transfer steps timed; jax
processes started from here (``JAX_PLATFORMS=proxy``), one per variant, each put and get
``--rounds`` fresh 64 MiB float32 arrays. Per transfer a jax process reports its time,
and per thread (by name; ``main`` is the main thread) the page faults it took (minor,
from ``/proc/self/task/*/stat``) and its CPU time; after each get glibc's statistics
(``mallinfo2``: bytes in arenas, bytes mapped for large blocks), the count of arenas
(``malloc_info``), of memory mappings and the process's RSS. A variant changes one thing:
the plugin's allocator setting off (``IFRTPY_MALLOPT=0``), glibc's variables
(``MALLOC_ARENA_MAX``, ``MALLOC_TOP_PAD_``, ...) with it off, or ``mallopt`` calls made
where the plugin makes its own (after ``import jax``, before ``jax.devices()``). Each put
is split by the server's timestamps (the clocks agree: one machine, ``perf_counter``):
from jax's call to the put file's request arriving (jaxlib writing the file), the file's
read, the device put, and from the array ready to jax's wait returning.

    python benchmarks/proxy_allocator.py [--plugin tpu] [--variants a,b] [--rounds 8] [--json FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

N = 16 << 20  # float32 elements: 64 MiB

CHILD = r'''
import ctypes, json, os, re, sys, time
import numpy as np

libc = ctypes.CDLL(None)
import jax

for item in filter(None, os.environ.get("MALLOPT", "").split(",")):  # where the plugin calls
    param, value = item.split("=")
    libc.mallopt(int(param), int(value))
started = len(os.listdir("/proc/self/task"))
device = jax.devices()[0]
PID = os.getpid()


class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


libc.mallinfo2.restype = Mallinfo2


def threads():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = open(f"/proc/self/task/{tid}/stat").read()
        except OSError:
            continue
        name = "main" if int(tid) == PID else stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = (name, int(fields[7]), int(fields[11]) + int(fields[12]))
    return out


def by_name(before, after):
    faults, cpu = {}, {}
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    for tid, (name, flt, ticks) in after.items():
        _, flt0, ticks0 = before.get(tid, (name, 0, 0))
        if flt > flt0:
            faults[name] = faults.get(name, 0) + flt - flt0
        if ticks > ticks0:
            cpu[name] = cpu.get(name, 0) + round((ticks - ticks0) * tick)
    return faults, cpu


def arenas():
    path = f"/tmp/malloc_info.{PID}"
    f = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(f))
    libc.fclose(ctypes.c_void_p(f))
    text = open(path).read()
    os.unlink(path)
    return len(re.findall(r"<heap nr=", text))


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) >> 10


libc.fopen.restype = ctypes.c_void_p
n = int(sys.argv[1])
values = [np.full(n, i, np.float32) for i in range(4)]
print(json.dumps({"threads at the plugin's call": started,
                  "threads after jax.devices()": len(os.listdir("/proc/self/task")),
                  "rss_mib": status("VmRSS")}), flush=True)
for i in range(int(sys.argv[2])):
    a, t0 = threads(), time.perf_counter()
    y = jax.device_put(values[i % 4], device).block_until_ready()
    b, t1 = threads(), time.perf_counter()
    got = np.asarray(y)
    c, t2 = threads(), time.perf_counter()
    assert got[0] == i % 4 and got[-1] == i % 4
    del y, got
    info = libc.mallinfo2()
    put_faults, put_cpu = by_name(a, b)
    get_faults, get_cpu = by_name(b, c)
    print(json.dumps({"put": [t0, t1], "get_ms": (t2 - t1) * 1e3, "put_faults": put_faults,
                      "put_cpu": put_cpu, "get_faults": get_faults, "get_cpu": get_cpu,
                      "arena_mib": info.arena >> 20, "mapped_mib": info.hblkhd >> 20,
                      "free_mib": info.fordblks >> 20, "arenas": arenas(),
                      "mappings": len(open("/proc/self/maps").readlines()),
                      "rss_mib": status("VmRSS")}), flush=True)
'''

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -2, -3, -4, -8


def _mallopt(**params):
    codes = {"trim": M_TRIM_THRESHOLD, "top_pad": M_TOP_PAD, "mmap_threshold": M_MMAP_THRESHOLD,
             "mmap_max": M_MMAP_MAX, "arena_max": M_ARENA_MAX}
    return {"IFRTPY_MALLOPT": "0",
            "MALLOPT": ",".join(f"{codes[k]}={v}" for k, v in params.items())}


#: name -> the jax process's extra environment.
VARIANTS = {
    "the plugin's setting (default)": {},
    "the plugin's setting off": {"IFRTPY_MALLOPT": "0"},
    "off, MALLOC_ARENA_MAX=1": {"IFRTPY_MALLOPT": "0", "MALLOC_ARENA_MAX": "1"},
    "off, MALLOC_TOP_PAD_=256 MiB": {"IFRTPY_MALLOPT": "0", "MALLOC_TOP_PAD_": str(256 << 20)},
    "off, MALLOC_TRIM_THRESHOLD_=1 GiB": {"IFRTPY_MALLOPT": "0",
                                          "MALLOC_TRIM_THRESHOLD_": str(1 << 30)},
    "off, mallopt(M_ARENA_MAX, 1) at the plugin's call": _mallopt(arena_max=1),
    "off, mallopt ARENA_MAX 1, MMAP_MAX 0 at the plugin's call": _mallopt(arena_max=1,
                                                                           mmap_max=0),
    "off, mallopt MMAP_MAX 0, TRIM_THRESHOLD 256 MiB at the plugin's call": _mallopt(
        mmap_max=0, trim=256 << 20),
    "off, mallopt ARENA_MAX 1, TRIM_THRESHOLD 256 MiB at the plugin's call": _mallopt(
        arena_max=1, trim=256 << 20),
}


def put_steps(rounds, taken):
    """Per put of the jax process (its perf_counter span; it is the server's only client):
    ms from jax's call to the file arriving, the file's read, to the device put returning,
    to the array ready, and from ready to jax's wait returning."""
    out = []
    for r in rounds:
        t0, t1 = r["put"]
        at = {}
        for when, _, _, step, _ in taken:
            if t0 <= when <= t1:
                at.setdefault(step, when)
        if not {"file arrived", "file read", "put made", "put ready"} <= at.keys():
            continue
        out.append({"call to file arrived": at["file arrived"] - t0,
                    "file read": at["file read"] - at["file arrived"],
                    "read to put made": at["put made"] - at["file read"],
                    "made to ready": at["put ready"] - at["put made"],
                    "ready to jax's return": t1 - at["put ready"], "whole": t1 - t0})
        out[-1] = {k: v * 1e3 for k, v in out[-1].items()}
    return out


def _top(d, k=3):
    return dict(sorted(d.items(), key=lambda kv: -kv[1])[:k])


def report(name, head, rounds, puts, server_rss):
    print(f"== {name}: threads {head['threads at the plugin' + chr(39) + 's call']} at the "
          f"plugin's call, {head['threads after jax.devices()']} after jax.devices(); RSS "
          f"{head['rss_mib']} MiB before the transfers")
    for i, r in enumerate(rounds):
        print(f"  {i}: put {(r['put'][1] - r['put'][0]) * 1e3:7.1f} ms faults "
              f"{_top(r['put_faults'])}; get {r['get_ms']:7.1f} ms faults {_top(r['get_faults'])} "
              f"CPU ms {_top(r['get_cpu'])}; arenas {r['arenas']}, in arenas {r['arena_mib']} MiB "
              f"({r['free_mib']} free), mapped {r['mapped_mib']} MiB, {r['mappings']} mappings, "
              f"RSS {r['rss_mib']} MiB")
    if len(rounds) > 1:
        steady = rounds[1:]
        get = statistics.median(r["get_ms"] for r in steady)
        put = statistics.median((r["put"][1] - r["put"][0]) * 1e3 for r in steady)
        print(f"  first get {rounds[0]['get_ms']:.1f} ms / steady {get:.1f} ms: "
              f"{rounds[0]['get_ms'] / get:.2f}x; steady put {put:.1f} ms; RSS after "
              f"{len(rounds)} rounds {rounds[-1]['rss_mib']} MiB "
              f"(+{rounds[-1]['rss_mib'] - head['rss_mib']}); server RSS {server_rss} MiB")
    if len(puts) > 1:
        keys = puts[0].keys()
        print("  put, median of the steady ones (ms): " + ", ".join(
            f"{k} {statistics.median(p[k] for p in puts[1:]):.1f}" for k in keys))
        print("  the first put (ms): " + ", ".join(f"{k} {puts[0][k]:.1f}" for k in keys))
    sys.stdout.flush()


def _rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("VmRSS"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plugin", default="tpu")
    parser.add_argument("--variants", help="comma-separated indexes or names (default: all)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--json", help="write every variant's figures here")
    args = parser.parse_args()

    import ifrtpy_jax_plugin

    print(f"this process (the server): glibc's allocator set {ifrtpy_jax_plugin.tune_allocator()}")
    import ifrtpy as ifrt
    from ifrtpy import proxy
    from ifrtpy.proxy.jax_client import jax_target
    from ifrtpy.proxy.steps import LOG

    names = list(VARIANTS)
    if args.variants:
        names = [names[int(v)] if v.isdigit() else v for v in args.variants.split(",")]
    client = ifrt.get_client(args.plugin)
    results = {}
    with proxy.serve(client, f"unix:{tempfile.mkdtemp()}/proxy.sock") as server:
        target = jax_target(server.address)
        for name in names:
            env = dict(os.environ, JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=target,
                       TF_CPP_MIN_LOG_LEVEL="3", **VARIANTS[name])
            LOG.start()
            proc = subprocess.run([sys.executable, "-c", CHILD, str(N), str(args.rounds)],
                                  capture_output=True, text=True, timeout=600, env=env)
            LOG.stop()
            lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode or not lines:
                print(f"== {name}: failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
                continue
            head, rounds = lines[0], lines[1:]
            puts = put_steps(rounds, LOG.take())
            report(name, head, rounds, puts, _rss_mib())
            results[name] = {"head": head, "rounds": rounds, "puts": puts}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
