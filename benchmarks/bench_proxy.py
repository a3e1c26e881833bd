"""jax through ifrtpy's IFRT Proxy server next to jax direct, in one run (docs/proxy.md).

The server (``ifrtpy.proxy.serve`` over the chosen backend, on its default unix socket or
on ``--address``) runs in this process; one jax process started from here holds both jax's
own CPU backend and the ``proxy`` backend (``JAX_PLATFORMS=cpu,proxy``), and times each
case on both, the loops taking turns:

1. synchronous ``jit(x + 1)`` on f32[8]: call and wait, per call;
2. 50 chained ``jit(x + 1)`` calls, then one wait: per call (the client pipelines);
3. a 64 MiB f32 ``device_put`` and wait: GB/s;
4. a 64 MiB get (``np.array(x)``, a fresh device array each time): GB/s.

Targets (the IFRT Proxy issues): synchronous <= 30x and chained <= 10x jax direct's time
per call; put >= 0.5x jax direct's bandwidth; get >= 0.5x what a plain socket of the
server's kind moves; a synchronous call <= 1.3x two echo round trips.

Floors, measured in the same run from the same jax process, on a unix socket and on
loopback TCP (the one the server listens on is the floor of its figures): one round trip of
an empty message on a grpc.aio stream served like the proxy's (grpc.aio at both ends; a
synchronous call is two round trips, execute and the readiness check, and a third one-way
message that frees the previous output), and 64 MiB over a plain socket each way (the bytes
of a put or a get cross one; gRPC adds its framing and copies on top).

    python benchmarks/bench_proxy.py [--backend pjrt] [--address unix:PATH|HOST:PORT] [--n 300] [--repeats 7]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from _timing import interleaved_median_us, timed

MIB64 = 64 * 2**20
CHAIN = 50
KINDS = ("unix", "tcp")


def _connect(address):
    if address.startswith("unix:"):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(address[len("unix:"):])
        return conn
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)))


def floors(echo, sink, repeats, n):
    """In the jax process: per kind of socket, the echo round trip (us) and the socket
    GB/s each way."""
    import asyncio

    import grpc

    async def round_trips(address):
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.stream_stream("/bench.Echo/Stream")()
            samples = []
            for _ in range(repeats + 1):  # the first is a warm-up
                start = time.perf_counter()
                for _ in range(n):
                    await call.write(b"x")
                    await call.read()
                samples.append((time.perf_counter() - start) / n * 1e6)
            await call.done_writing()
            return statistics.median(samples[1:])

    result = {}
    for kind in KINDS:
        rtt = asyncio.run(round_trips(echo[kind]))
        data = bytearray(MIB64)
        up, down = [], []
        for _ in range(repeats):
            with _connect(sink[kind]) as conn:
                start = time.perf_counter()
                conn.sendall(data)
                conn.recv(1)
                up.append(time.perf_counter() - start)
                start = time.perf_counter()
                view, got = memoryview(data), 0
                while got < MIB64:
                    got += conn.recv_into(view[got:])
                down.append(time.perf_counter() - start)
        result[kind] = {"rtt_us": rtt, "up_gbs": MIB64 / statistics.median(up) / 1e9,
                        "down_gbs": MIB64 / statistics.median(down) / 1e9}
    return result


def serve_floors():
    """An echo stream on a grpc.aio server and a socket server that takes 64 MiB,
    acknowledges it and sends 64 MiB back, each on a unix socket and on loopback TCP, in
    threads of this process; their addresses by kind."""
    import asyncio
    import threading

    import grpc

    async def echo(requests, context):
        async for message in requests:
            yield message

    directory = tempfile.mkdtemp(prefix="bench-proxy-")
    ready = threading.Event()
    echo_at = {"unix": f"unix:{directory}/echo.sock"}

    async def run_echo():
        server = grpc.aio.server(handlers=[grpc.method_handlers_generic_handler(
            "bench.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(echo)})])
        server.add_insecure_port(echo_at["unix"])
        echo_at["tcp"] = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        ready.set()
        await server.wait_for_termination()

    threading.Thread(target=asyncio.run, args=(run_echo(),), daemon=True).start()
    unix_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_listener.bind(f"{directory}/sink.sock")
    unix_listener.listen()
    listeners = {"unix": unix_listener, "tcp": socket.create_server(("127.0.0.1", 0))}

    def sink(listener):
        data = bytearray(MIB64)
        while True:
            conn, _ = listener.accept()
            with conn:
                view, got = memoryview(data), 0
                while got < MIB64:
                    got += conn.recv_into(view[got:])
                conn.sendall(b"k")
                conn.sendall(data)

    for listener in listeners.values():
        threading.Thread(target=sink, args=(listener,), daemon=True).start()
    ready.wait()
    sink_at = {"unix": f"unix:{directory}/sink.sock",
               "tcp": "127.0.0.1:%d" % listeners["tcp"].getsockname()[1]}
    return echo_at, sink_at


def worker(n, repeats, echo, sink):
    """In the jax process: the figures of every case on ``cpu`` and ``proxy``, and the
    floors, as JSON."""
    import jax
    import numpy as np

    devices = {"jax direct": jax.devices("cpu")[0], "proxy": jax.devices("proxy")[0]}
    add_one = jax.jit(lambda v: v + 1)
    small = {k: jax.device_put(np.arange(8, dtype=np.float32), d) for k, d in devices.items()}

    def chained(x):
        for _ in range(CHAIN):
            x = add_one(x)
        x.block_until_ready()

    sync = interleaved_median_us(
        {k: timed(lambda x=x: add_one(x).block_until_ready()) for k, x in small.items()},
        n, repeats)
    chain = interleaved_median_us(
        {k: timed(lambda x=x: chained(x)) for k, x in small.items()}, max(1, n // CHAIN), repeats)
    host = np.random.default_rng(0).random(MIB64 // 4, dtype=np.float32)
    put = {k: [] for k in devices}
    get = {k: [] for k in devices}
    for _ in range(repeats):
        for k, d in devices.items():
            start = time.perf_counter()
            x = jax.device_put(host, d).block_until_ready()
            put[k].append(time.perf_counter() - start)
            start = time.perf_counter()
            np.array(x)
            get[k].append(time.perf_counter() - start)
            del x
    figures = {k: {"sync_us": sync[k], "chained_us": chain[k] / CHAIN,
                   "put_gbs": MIB64 / statistics.median(put[k]) / 1e9,
                   "get_gbs": MIB64 / statistics.median(get[k]) / 1e9} for k in devices}
    figures["floor"] = floors(echo, sink, repeats, n)
    print(json.dumps(figures))


def measure(backend, device_count, address, n, repeats):
    """Serve ``backend`` here, run the jax process against it; its figures, and the kind
    of socket the server listens on."""
    import ifrtpy as ifrt
    from ifrtpy import proxy
    from ifrtpy.proxy.jax_client import jax_target

    client = ifrt.get_client(backend, device_count=device_count)
    echo, sink = serve_floors()
    with proxy.serve(client, address) as server:
        env = dict(os.environ, JAX_PLATFORMS="cpu,proxy",
                   JAX_BACKEND_TARGET=jax_target(server.address))
        here = os.path.dirname(os.path.abspath(__file__))
        proc = subprocess.run([sys.executable, __file__, "--worker", "--n", str(n),
                               "--repeats", str(repeats), "--echo", json.dumps(echo),
                               "--sink", json.dumps(sink)],
                              env=env, cwd=here, capture_output=True, text=True, timeout=1800)
        kind = "unix" if server.address.startswith("unix:") else "tcp"
    if proc.returncode:
        raise SystemExit(f"the jax process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.splitlines()[-1]), kind


def report(backend, figures, kind):
    jax_direct, through = figures["jax direct"], figures["proxy"]
    floor = figures["floor"][kind]
    rows = [  # name, unit, key, against, target, lower is better
        ("sync jit(x + 1)", "us/call", "sync_us", jax_direct["sync_us"], 30, True),
        (f"{CHAIN} chained jit(x + 1)", "us/call", "chained_us", jax_direct["chained_us"], 10,
         True),
        ("put 64 MiB", "GB/s", "put_gbs", jax_direct["put_gbs"], 0.5, False),
        ("get 64 MiB", "GB/s", "get_gbs", floor["down_gbs"], 0.5, False),
    ]
    print(f"jax through `ifrtpy serve --backend {backend}` on a {kind} socket next to jax "
          "direct (CPU), one run; the get against the plain socket's rate")
    print(f"{'case':24s} {'unit':8s} {'proxy':>10s} {'jax':>10s} {'against':>10s} {'ratio':>8s}"
          "  target")
    for name, unit, key, against, target, lower in rows:
        ratio = through[key] / against
        meets = ratio <= target if lower else ratio >= target
        bound = f"<= {target}x" if lower else f">= {target}x"
        print(f"{name:24s} {unit:8s} {through[key]:10.2f} {jax_direct[key]:10.2f} "
              f"{against:10.2f} {ratio:7.2f}x  {bound} {'meets' if meets else 'MISSES'}")
    echo = through["sync_us"] / (2 * floor["rtt_us"])
    print(f"sync call / two echo round trips on the server's socket: {echo:.2f}x  <= 1.3x "
          f"{'meets' if echo <= 1.3 else 'MISSES'}")
    for name in KINDS:
        f = figures["floor"][name]
        print(f"floor, {name} socket{' (the server' + chr(39) + 's)' if name == kind else ''}: "
              f"grpc.aio echo round trip {f['rtt_us']:.1f} us; 64 MiB {f['up_gbs']:.2f} GB/s up, "
              f"{f['down_gbs']:.2f} GB/s down")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="pjrt", help="the server's backend (default pjrt)")
    parser.add_argument("--device-count", type=int, default=1)
    parser.add_argument("--address", help="where the server listens (default: its own, a "
                                          "private unix socket)")
    parser.add_argument("--n", type=int, default=300, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--echo", help=argparse.SUPPRESS)
    parser.add_argument("--sink", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.n, args.repeats, json.loads(args.echo), json.loads(args.sink))
    else:
        report(args.backend, *measure(args.backend, args.device_count, args.address, args.n,
                                      args.repeats))


if __name__ == "__main__":
    main()
