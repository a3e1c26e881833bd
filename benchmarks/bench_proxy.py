"""jax through ifrtpy's IFRT Proxy server next to jax direct, in one run (docs/proxy.md).

The server (``ifrtpy.proxy.serve`` over the chosen backend, on its default unix socket or
on ``--address``) runs in this process; one jax process started from here holds both jax's
own CPU backend and the ``proxy`` backend (``JAX_PLATFORMS=cpu,proxy``), and times each
case on both, the loops taking turns:

1. synchronous ``jit(x + 1)`` on f32[8]: call and wait, per call;
2. 50 chained ``jit(x + 1)`` calls, then one wait: per call (the client pipelines);
3. a 64 MiB f32 ``device_put`` and wait: GB/s;
4. a 64 MiB get (``np.array(x)`` of an array put just before, as a user's first read of
   a result): GB/s.

Targets (the IFRT Proxy issues): synchronous <= 30x and chained <= 10x jax direct's time
per call; put >= 0.5x jax direct's bandwidth; get >= 0.5x what a plain socket of the
server's kind moves; a synchronous call <= 1.3x two echo round trips.

Floors, measured from the same jax process in the same repeats as the cases they bound
(taking turns with them, so that a slow stretch of the machine falls on both), on a unix
socket and on loopback TCP (the one the server listens on is the floor of its figures):
one round trip of an empty message on a grpc.aio stream served like the proxy's (grpc.aio
at both ends; a synchronous call is two round trips, execute and the readiness check, and
a third one-way message that frees the previous output); 64 MiB over a plain socket each
way (the bytes of a put or a get cross one); and 64 MiB streamed by a grpc.aio server in
the pieces the server's HostBufferLookup sends, read by a grpcio client that keeps none of
it (what gRPC itself moves for a get, before any client copies the bytes).

It also prints the CPU time per operation through the server, of the server's process and
of the jax process (jaxlib's client), measured over the same loops.

The server's own share of each transfer comes from its step timestamps
(``ifrtpy.proxy.steps``): a get from ``CopyToHostBuffer`` arriving to the last piece of
its lookup handed to gRPC, a put from its file (or store) arriving to the array being
ready. They are held against floors measured in the same run: the backend's own put of
the same 64 MiB (from fresh 64-byte aligned memory, as the server's file read leaves it)
and its copy out, each in a process of its own (before and after the jax process); a
64 MiB file read from the put files' directory into fresh memory, as the server reads
one; and gRPC's own stream of the same bytes (above). The process's first get is held
against its steady gets.

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


class Echo:
    """A grpc.aio echo stream at ``address``, driven from this thread: ``echo(n)`` makes n
    round trips and returns the seconds they took."""

    def __init__(self, address):
        import asyncio

        import grpc

        self._loop = asyncio.new_event_loop()

        async def open_call():
            self._channel = grpc.aio.insecure_channel(address)
            return self._channel.stream_stream("/bench.Echo/Stream")()

        self._call = self._loop.run_until_complete(open_call())

    def __call__(self, n):
        async def round_trips():
            start = time.perf_counter()
            for _ in range(n):
                await self._call.write(b"x")
                await self._call.read()
            return time.perf_counter() - start

        return self._loop.run_until_complete(round_trips())


def socket_seconds(address, data):
    """Seconds to send 64 MiB over a plain socket to the sink at ``address`` and to
    receive 64 MiB back: (up, down)."""
    with _connect(address) as conn:
        start = time.perf_counter()
        conn.sendall(data)
        conn.recv(1)
        up = time.perf_counter() - start
        start = time.perf_counter()
        view, got = memoryview(data), 0
        while got < MIB64:
            got += conn.recv_into(view[got:])
        return up, time.perf_counter() - start


def stream_seconds(call):
    """Seconds to read the 64 MiB the floor's grpc.aio server streams."""
    start = time.perf_counter()
    got = sum(len(piece) for piece in call(b""))
    seconds = time.perf_counter() - start
    assert got == MIB64, got
    return seconds


class CpuClock:
    """CPU seconds spent by this process and by the server's (``server_pid``)."""

    def __init__(self, server_pid):
        self._stat = f"/proc/{server_pid}/stat"
        self._tick = os.sysconf("SC_CLK_TCK")

    def now(self):
        times = os.times()
        with open(self._stat) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return times.user + times.system, (int(fields[11]) + int(fields[12])) / self._tick


def worker(n, repeats, grpc_at, sink_at, kind, server_pid):
    """In the jax process: the figures of every case on ``cpu`` and ``proxy``, the floors,
    and the CPU per operation through the server, as JSON."""
    import grpc
    import jax
    import numpy as np

    devices = {"jax direct": jax.devices("cpu")[0], "proxy": jax.devices("proxy")[0]}
    add_one = jax.jit(lambda v: v + 1)
    small = {k: jax.device_put(np.arange(8, dtype=np.float32), d) for k, d in devices.items()}
    clock = CpuClock(server_pid)
    cpu = {}  # case -> [jax process seconds, server seconds, operations]

    def counted(case, fn, per_call=1):
        """``fn``, its CPU (and the server's) added to ``cpu[case]`` per operation."""
        def run(count):
            before = clock.now()
            seconds = fn(count)
            after = clock.now()
            totals = cpu.setdefault(case, [0.0, 0.0, 0])
            totals[0] += after[0] - before[0]
            totals[1] += after[1] - before[1]
            totals[2] += count * per_call
            return seconds
        return run

    def chained(x):
        for _ in range(CHAIN):
            x = add_one(x)
        x.block_until_ready()

    echoes = {k: Echo(address) for k, address in grpc_at.items()}
    sync = {k: timed(lambda x=x: add_one(x).block_until_ready()) for k, x in small.items()}
    sync["proxy"] = counted("sync", sync["proxy"])
    sync.update({f"echo {k}": echo for k, echo in echoes.items()})
    sync_us = interleaved_median_us(sync, n, repeats)
    chain = {k: timed(lambda x=x: chained(x)) for k, x in small.items()}
    chain["proxy"] = counted("chained", chain["proxy"], CHAIN)
    chain_us = interleaved_median_us(chain, max(1, n // CHAIN), repeats)

    host = np.random.default_rng(0).random(MIB64 // 4, dtype=np.float32)
    data = bytearray(MIB64)
    streams = {k: grpc.insecure_channel(a, options=[("grpc.max_receive_message_length", -1)])
               for k, a in grpc_at.items()}
    calls = {k: ch.unary_stream("/bench.Echo/Bytes") for k, ch in streams.items()}
    seconds = {name: [] for name in ("put jax direct", "put proxy", "get jax direct", "get proxy",
                                     *(f"{w} {k}" for w in ("up", "down", "stream") for k in KINDS))}
    stream_seconds(calls[kind])  # a warm-up: the channel connects
    for _ in range(repeats + 1):  # the first round: the process's first put and get
        for k, d in devices.items():
            before = clock.now()
            start = time.perf_counter()
            x = jax.device_put(host, d).block_until_ready()
            seconds[f"put {k}"].append(time.perf_counter() - start)
            middle = clock.now()
            start = time.perf_counter()
            np.array(x)
            seconds[f"get {k}"].append(time.perf_counter() - start)
            after = clock.now()
            if k == "proxy":
                for case, (a, b) in (("put", (before, middle)), ("get", (middle, after))):
                    totals = cpu.setdefault(case, [0.0, 0.0, 0])
                    totals[0] += b[0] - a[0]
                    totals[1] += b[1] - a[1]
                    totals[2] += 1
            del x
        for k in KINDS:
            up, down = socket_seconds(sink_at[k], data)
            seconds[f"up {k}"].append(up)
            seconds[f"down {k}"].append(down)
            seconds[f"stream {k}"].append(stream_seconds(calls[k]))
    first_get = {k: seconds[f"get {k}"].pop(0) for k in devices}
    first_put = {k: seconds[f"put {k}"].pop(0) for k in devices}
    for k in KINDS:  # the floors' first round went with the first transfers
        for w in ("up", "down", "stream"):
            seconds[f"{w} {k}"].pop(0)
    gbs = {name: MIB64 / statistics.median(s) / 1e9 for name, s in seconds.items()}
    figures = {k: {"sync_us": sync_us[k], "chained_us": chain_us[k] / CHAIN,
                   "put_gbs": gbs[f"put {k}"], "get_gbs": gbs[f"get {k}"],
                   "get_ms": statistics.median(seconds[f"get {k}"]) * 1e3,
                   "put_ms": statistics.median(seconds[f"put {k}"]) * 1e3,
                   "first_get_ms": first_get[k] * 1e3, "first_put_ms": first_put[k] * 1e3,
                   "stream_ms": statistics.median(seconds[f"stream {kind}"]) * 1e3}
               for k in devices}
    figures["floor"] = {k: {"rtt_us": sync_us[f"echo {k}"], "up_gbs": gbs[f"up {k}"],
                            "down_gbs": gbs[f"down {k}"], "stream_gbs": gbs[f"stream {k}"]}
                        for k in KINDS}
    figures["cpu_ms"] = {case: {"jax": t[0] / t[2] * 1e3, "server": t[1] / t[2] * 1e3}
                         for case, t in cpu.items()}
    print(json.dumps(figures))


def serve_floors(piece):
    """An echo stream and a 64 MiB stream (in pieces of ``piece`` bytes) on a grpc.aio
    server, and a socket server that takes 64 MiB, acknowledges it and sends 64 MiB back,
    each on a unix socket and on loopback TCP, in threads of this process; their
    addresses by kind: (echo and stream, socket)."""
    import asyncio
    import threading

    import grpc

    async def echo(requests, context):
        async for message in requests:
            yield message

    pieces = [bytes(min(piece, MIB64 - start)) for start in range(0, MIB64, piece)]

    async def stream(request, context):
        for chunk in pieces:
            yield chunk

    directory = tempfile.mkdtemp(prefix="bench-proxy-")
    ready = threading.Event()
    grpc_at = {"unix": f"unix:{directory}/echo.sock"}

    async def run_echo():
        server = grpc.aio.server(
            handlers=[grpc.method_handlers_generic_handler("bench.Echo", {
                "Stream": grpc.stream_stream_rpc_method_handler(echo),
                "Bytes": grpc.unary_stream_rpc_method_handler(stream)})],
            options=[("grpc.max_send_message_length", -1)])
        server.add_insecure_port(grpc_at["unix"])
        grpc_at["tcp"] = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
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
    return grpc_at, sink_at


def backend_floors(backend, device_count, repeats, folder):
    """In this process (one of its own): the backend's put of 64 MiB from fresh 64-byte
    aligned memory, made the array's own where the backend can (as the server's put of a
    file it read), and its copy of 64 MiB out to a new host buffer (as the server's get);
    a 64 MiB file in ``folder`` read into fresh memory as the server reads a put file, and
    into memory read before. Medians in ms, as JSON."""
    import numpy as np

    import ifrtpy as ifrt
    from ifrtpy.array import HostBufferSemantics
    from ifrtpy.proxy import local

    client = ifrt.get_client(backend, device_count=device_count)
    sharding = ifrt.SingleDeviceSharding(client.devices()[0])
    values = np.random.default_rng(0).random(MIB64 // 4, dtype=np.float32)
    path = os.path.join(tempfile.mkdtemp(dir=folder), "floor")
    warm = local.aligned_bytes(MIB64)
    warm.fill(1)
    samples = {"put": [], "copy": [], "file read": [], "file read, mapped memory": []}

    def read_into(out):
        fd = os.open(path, os.O_RDONLY)
        try:
            view, got = memoryview(out), 0
            while got < MIB64:
                got += os.preadv(fd, [view[got:got + (16 << 20)]], got)
        finally:
            os.close(fd)

    for _ in range(repeats + 1):
        fresh = local.aligned_bytes(MIB64).view(np.float32)
        np.copyto(fresh, values)
        start = time.perf_counter()
        x = client.make_array_from_host_buffer(fresh, sharding,
                                               HostBufferSemantics.IMMUTABLE_ZERO_COPY)
        x.block_until_ready()
        samples["put"].append(time.perf_counter() - start)
        start = time.perf_counter()
        x.copy_to_host_buffer().result()
        samples["copy"].append(time.perf_counter() - start)
        del x, fresh
        values.tofile(path)
        start = time.perf_counter()
        local.read_put_file(path, MIB64)
        samples["file read"].append(time.perf_counter() - start)
        values.tofile(path)
        start = time.perf_counter()
        read_into(warm)
        samples["file read, mapped memory"].append(time.perf_counter() - start)
    os.unlink(path)
    print(json.dumps({k: statistics.median(v[1:]) * 1e3 for k, v in samples.items()}))


def _backend_floors(backend, device_count, repeats, folder):
    proc = subprocess.run([sys.executable, __file__, "--backend-floors", folder, "--backend",
                           backend, "--device-count", str(device_count), "--repeats",
                           str(repeats)], cwd=os.path.dirname(os.path.abspath(__file__)),
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"the floors' process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def server_steps(taken):
    """The server's share of each 64 MiB get and put, from its step timestamps: medians
    in ms of the whole share and of each step after its first, the first get apart."""
    from ifrtpy.proxy.steps import spans

    found = {}
    for what, first, last in (("get", "copy arrived", "last piece written"),
                              ("put", "file arrived", "put ready"),
                              ("put over gRPC", "store arrived", "put ready")):
        runs = [(seconds, marks) for nbytes, seconds, marks in spans(taken, first, last)
                if nbytes >= MIB64]
        if not runs:
            continue
        entry = {"first_ms": runs[0][0] * 1e3, "ms": statistics.median(s for s, _ in runs[1:] or runs) * 1e3,
                 "count": len(runs)}
        steady = [marks for _, marks in runs[1:]] or [runs[0][1]]
        entry["steps_ms"] = {step: statistics.median(m[step] for m in steady if step in m) * 1e3
                             for step in steady[0]}
        entry["first_steps_ms"] = {step: at * 1e3 for step, at in runs[0][1].items()}
        found[what] = entry
    return found


def measure(backend, device_count, address, n, repeats):
    """Serve ``backend`` here, run the jax process against it; its figures, and the kind
    of socket the server listens on."""
    import ifrtpy as ifrt
    from ifrtpy import proxy
    from ifrtpy.proxy.jax_client import jax_target
    from ifrtpy.proxy.service import _CHUNK as LOOKUP_PIECE
    from ifrtpy.proxy.steps import LOG

    import ifrtpy_jax_plugin

    folder = os.path.dirname(ifrtpy_jax_plugin.shared_directory("unix:/x"))  # /dev/shm
    alone = [_backend_floors(backend, device_count, repeats, folder)]
    client = ifrt.get_client(backend, device_count=device_count)
    grpc_at, sink_at = serve_floors(LOOKUP_PIECE)
    LOG.start()
    with proxy.serve(client, address) as server:
        kind = "unix" if server.address.startswith("unix:") else "tcp"
        env = dict(os.environ, JAX_PLATFORMS="cpu,proxy",
                   JAX_BACKEND_TARGET=jax_target(server.address))
        here = os.path.dirname(os.path.abspath(__file__))
        proc = subprocess.run([sys.executable, __file__, "--worker", "--n", str(n),
                               "--repeats", str(repeats), "--floors",
                               json.dumps([grpc_at, sink_at, kind, os.getpid()])],
                              env=env, cwd=here, capture_output=True, text=True, timeout=1800)
    LOG.stop()
    if proc.returncode:
        raise SystemExit(f"the jax process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    figures = json.loads(proc.stdout.splitlines()[-1])
    figures["server"] = server_steps(LOG.take())
    alone.append(_backend_floors(backend, device_count, repeats, folder))
    figures["alone"] = {k: statistics.median(a[k] for a in alone) for k in alone[0]}
    return figures, kind



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
    print(f"get / gRPC's own 64 MiB stream on the server's socket: "
          f"{through['get_gbs'] / floor['stream_gbs']:.2f}x")
    for name in KINDS:
        f = figures["floor"][name]
        print(f"floor, {name} socket{' (the server' + chr(39) + 's)' if name == kind else ''}: "
              f"grpc.aio echo round trip {f['rtt_us']:.1f} us; 64 MiB {f['up_gbs']:.2f} GB/s up, "
              f"{f['down_gbs']:.2f} GB/s down; gRPC stream of 64 MiB {f['stream_gbs']:.2f} GB/s")
    cpu = figures["cpu_ms"]
    print("CPU per operation through the server, ms (jax process / server process): " + "; ".join(
        f"{case} {cpu[case]['jax']:.3f} / {cpu[case]['server']:.3f}"
        for case in ("sync", "chained", "put", "get")))
    alone, server = figures["alone"], figures["server"]
    print(f"floors, the backend alone in a process of its own (ms, 64 MiB): put {alone['put']:.1f}, "
          f"copy out {alone['copy']:.1f}; a put file read as the server reads one "
          f"{alone['file read']:.1f}, into mapped memory {alone['file read, mapped memory']:.1f}; "
          f"gRPC's own stream {through['stream_ms']:.1f}")
    ratio = through["first_get_ms"] / through["get_ms"]
    print(f"first get of the process {through['first_get_ms']:.1f} ms / a steady get "
          f"{through['get_ms']:.1f} ms: {ratio:.2f}x  <= 1.5x {'meets' if ratio <= 1.5 else 'MISSES'}"
          f" (jax direct: first {jax_direct['first_get_ms']:.1f}, steady {jax_direct['get_ms']:.1f})")
    for what, floor, target, names in (
            ("get", alone["copy"] + through["stream_ms"], 1.2, "copy out + gRPC stream"),
            ("put", alone["file read, mapped memory"] + alone["put"], 1.3,
             "file read into mapped memory + put"),
            ("put over gRPC", None, None, "")):
        if what not in server:
            continue
        entry = server[what]
        marks = ", ".join(f"{step} +{ms:.1f}" for step, ms in entry["steps_ms"].items())
        first = ", ".join(f"{step} +{ms:.1f}" for step, ms in entry["first_steps_ms"].items())
        line = (f"server's share of a {what}: {entry['ms']:.1f} ms (the first {entry['first_ms']:.1f}; "
                f"{entry['count']} seen)")
        if floor is not None:
            r = entry["ms"] / floor
            line += (f" / floor {floor:.1f} ms ({names}): {r:.2f}x  <= {target}x "
                     f"{'meets' if r <= target else 'MISSES'}")
        print(line)
        print(f"  steps, ms after the first (median): {marks}")
        print(f"  the process's first: {first}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="pjrt", help="the server's backend (default pjrt)")
    parser.add_argument("--device-count", type=int, default=1)
    parser.add_argument("--address", help="where the server listens (default: its own, a "
                                          "private unix socket)")
    parser.add_argument("--n", type=int, default=300, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--floors", help=argparse.SUPPRESS)
    parser.add_argument("--backend-floors", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.backend_floors:
        backend_floors(args.backend, args.device_count, args.repeats, args.backend_floors)
    elif args.worker:
        worker(args.n, args.repeats, *json.loads(args.floors))
    else:
        report(args.backend, *measure(args.backend, args.device_count, args.address, args.n,
                                      args.repeats))


if __name__ == "__main__":
    main()
