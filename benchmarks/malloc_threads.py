"""What glibc's allocator costs a thread that does what jaxlib's proxy client does in a
64 MiB get, with no jax and no server: the allocator alone (docs/proxy.md, "The jax
process's allocator").

In a fresh process per variant, a new thread (its first allocation gives it an arena of
its own unless the arenas are limited) takes sixteen 4 MiB blocks (gRPC's pieces), then
one 64 MiB block (the client's flattened copy), writing every byte of each (``memset``),
then frees them all; four rounds. Per round: the wall time, the thread's CPU time, and
after it glibc's arenas, its bytes in arenas and in blocks mapped on their own
(``mallinfo2``) and the process's memory mappings. The variants are glibc's own
variables and the setting ``ifrtpy_jax_plugin`` makes (``MALLOPT``, set first).

    python benchmarks/malloc_threads.py
"""

import json
import os
import subprocess
import sys

CHILD = r"""
import ctypes, json, os, threading, time
if os.environ.get("TUNE"):
    import ifrtpy_jax_plugin
    ifrtpy_jax_plugin.tune_allocator()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p


class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


libc.mallinfo2.restype = Mallinfo2
rounds = []


def work():
    for _ in range(4):
        cpu, start = time.thread_time(), time.perf_counter()
        blocks = []
        for size in [4 << 20] * 16 + [64 << 20]:
            block = libc.malloc(ctypes.c_size_t(size))
            ctypes.memset(block, 1, size)
            blocks.append(block)
        for block in blocks:
            libc.free(ctypes.c_void_p(block))
        info = libc.mallinfo2()
        rounds.append({"ms": round((time.perf_counter() - start) * 1e3, 1),
                       "cpu_ms": round((time.thread_time() - cpu) * 1e3, 1),
                       "in arenas MiB": info.arena >> 20, "mapped MiB": info.hblkhd >> 20,
                       "mappings": len(open("/proc/self/maps").readlines())})


thread = threading.Thread(target=work)
thread.start()
thread.join()
print(json.dumps(rounds))
"""

VARIANTS = {
    "glibc's defaults": {},
    "MALLOC_ARENA_MAX=1": {"MALLOC_ARENA_MAX": "1"},
    "MALLOC_TOP_PAD_=256 MiB": {"MALLOC_TOP_PAD_": str(256 << 20)},
    "MALLOC_TRIM_THRESHOLD_=1 GiB": {"MALLOC_TRIM_THRESHOLD_": str(1 << 30)},
    "ifrtpy_jax_plugin's setting": {"TUNE": "1"},
}


def main():
    for name, env in VARIANTS.items():
        variables = {k: v for k, v in os.environ.items()
                     if not k.startswith("MALLOC_") and k != "IFRTPY_MALLOPT"}
        done = subprocess.run([sys.executable, "-c", CHILD], env=dict(variables, **env),
                              capture_output=True, text=True, timeout=300)
        if done.returncode:
            print(f"{name}: failed: {done.stderr[-1000:]}")
            continue
        rounds = json.loads(done.stdout)
        print(f"{name}:")
        for i, r in enumerate(rounds):
            print(f"  round {i}: {r['ms']:8.1f} ms, thread CPU {r['cpu_ms']:8.1f} ms; in arenas "
                  f"{r['in arenas MiB']} MiB, mapped {r['mapped MiB']} MiB, {r['mappings']} mappings")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
