"""A jax client after departed clients' programs (docs/proxy.md, "The end of a session").

The server (``ifrtpy.proxy.serve`` over the reference backend, whose programs can be
stopped) runs in this process. A jax process first runs ``jit(x + 1)`` alone; then ``--n``
raw clients each start a program of about ``--seconds`` s and disconnect, and another jax
process runs the same: the seconds each jax process took, start to result.

    python benchmarks/proxy_departed_clients.py [--n 8] [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

import ifrtpy as ifrt
from ifrtpy import proxy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from proxy_helpers import RawSession, compile_request, execute_request, put_values  # noqa: E402
from slow_program import SLOW, slow_call  # noqa: E402

JAX = "import jax, jax.numpy as jnp; print(jax.jit(lambda x: x + 1)(jnp.arange(4.0)).tolist())"
#: A bound on a hang (seconds), not a timing.
HANG_S = 1800


def main() -> None:
    import grpc  # type: ignore[import-untyped]

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8, help="departed clients (default 8)")
    parser.add_argument("--seconds", type=float, default=60.0, help="each one's program")
    args = parser.parse_args()
    client = ifrt.get_client("reference", device_count=2)
    _, steps = slow_call(client, args.seconds)
    with proxy.serve(client) as server, grpc.insecure_channel(server.address) as channel:
        env = {k: v for k, v in os.environ.items() if not k.startswith("IFRT_PROXY_")}
        env.update(JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=f"grpc://{server.address}")

        def jax_run() -> float:
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", JAX], env=env, capture_output=True,
                                  text=True, timeout=HANG_S)
            assert done.returncode == 0, done.stderr[-2000:]
            return time.perf_counter() - start

        print(f"a jax client alone: {jax_run():.1f} s", flush=True)
        for _ in range(args.n):
            raw = RawSession(channel)
            slow = raw.call("compile_request", compile_request(SLOW)
                            ).compile_response.loaded_executable_handle
            put_values(channel, raw, np.eye(32, dtype=np.float32), 1)
            put_values(channel, raw, np.array(steps, np.int32), 2)
            raw.send("loaded_executable_execute_request", execute_request(slow, [1, 2]))
            time.sleep(0.2)  # its program has started
            raw.cancel()
        took = jax_run()
        print(f"after {args.n} departed clients' {args.seconds:g} s programs: {took:.1f} s "
              f"(sessions counted then: {len(server.sessions())})", flush=True)


if __name__ == "__main__":
    main()
