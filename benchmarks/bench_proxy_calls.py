"""The request path of ``ifrtpy serve``: calls through the server next to gRPC's own round
trips, in one run, and where a call's time goes in the server (docs/proxy.md).

The server (``ifrtpy.proxy.serve`` over the chosen backend, on its default unix socket)
and a grpc.aio echo server on a unix socket of its own run in this process; one jax
process started from here (``JAX_PLATFORMS=cpu,proxy``) times, the loops taking turns:

1. a synchronous ``jit(x + 1)`` on f32[8] (call and wait), against two round trips of an
   empty message on a grpc.aio echo stream (a synchronous call is two: the execute and
   the readiness check; the client also sends a one-way message freeing the last output);
2. 50 chained ``jit(x + 1)`` calls and one wait, per call, against two messages of a
   pipeline (100 messages written, then their 100 echoes read, per two messages).

With ``--steps`` the server's request path is timed too, by wrapping its functions in
this process (nothing of the server is changed): per request kind, the hand-off to the
session's worker (queued by the loop to its decode on the worker), the decode, the
handler, the answer's encode, the hand-back to the loop (answer queued to its write) and
the write.

Targets: sync <= 1.3x two echo round trips; chained <= 1.3x two pipelined
messages. The machine is shared: compare only within a run, and take several runs.

    python benchmarks/bench_proxy_calls.py [--backend pjrt] [--n 300] [--repeats 7] [--steps]
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import bench_proxy
from _timing import interleaved_median_us, serve_echo as start_echo, timed

CHAIN = 50


class Echo(bench_proxy.Echo):
    """bench_proxy's grpc.aio echo stream, also pipelined."""

    def round_trips(self, n):
        """Seconds for ``n`` round trips of an empty message."""
        return self(n)

    def pipelined(self, n):
        """Seconds for ``n`` pipelines of 2 * CHAIN messages written, then read back."""
        async def run():
            start = time.perf_counter()
            for _ in range(n):
                for _ in range(2 * CHAIN):
                    await self._call.write(b"x")
                for _ in range(2 * CHAIN):
                    await self._call.read()
            return time.perf_counter() - start

        return self._loop.run_until_complete(run())


def worker(n, repeats, echo_at):
    """In the jax process: the figures as JSON (µs)."""
    import jax
    import numpy as np

    devices = {"jax direct": jax.devices("cpu")[0], "proxy": jax.devices("proxy")[0]}
    add_one = jax.jit(lambda v: v + 1)
    small = {k: jax.device_put(np.arange(8, dtype=np.float32), d) for k, d in devices.items()}

    def chained(x):
        for _ in range(CHAIN):
            x = add_one(x)
        x.block_until_ready()

    echo = Echo(echo_at)
    sync = {k: timed(lambda x=x: add_one(x).block_until_ready()) for k, x in small.items()}
    sync["two echo round trips"] = lambda count: echo.round_trips(2 * count)
    sync_us = interleaved_median_us(sync, n, repeats)
    chain = {k: timed(lambda x=x: chained(x)) for k, x in small.items()}
    chain["two pipelined messages"] = echo.pipelined
    chain_us = {k: v / CHAIN for k, v in
                interleaved_median_us(chain, max(1, n // CHAIN), repeats).items()}
    print(json.dumps({"sync": sync_us, "chained": chain_us}))


def serve_echo():
    """A grpc.aio echo stream on a unix socket, in a thread of this process: its address."""
    address = f"unix:{tempfile.mkdtemp(prefix='bench-proxy-calls-')}/echo.sock"
    start_echo(address)
    return address


class Steps:
    """The server's request path timed by wrapping its functions (see the docstring)."""

    def __init__(self):
        from ifrtpy.proxy import processor, session, wire

        self.samples = collections.defaultdict(list)  # (kind, step) -> seconds
        self._queued = {}  # id(raw request) -> when the loop queued it for the worker
        self._sent = collections.deque()  # when each answer was queued
        self._lock = threading.Lock()
        steps = self
        parse, take, handle = wire.parse, processor.Processor.take, session.Session.handle
        answer, write = session.Session.answer, processor.Processor.write
        send = processor.Processor.send

        def timed_parse(cls, raw, what):
            start = time.perf_counter()
            queued = steps._queued.pop(id(raw), None)
            message = parse(cls, raw, what)
            if what == "a request of the session stream":
                kind = message.WhichOneof("request")
                if queued is not None:
                    steps.add(kind, "to the worker", start - queued)
                steps.add(kind, "decode", time.perf_counter() - start)
            return message

        def timed_take(self, raw):
            steps._queued[id(raw)] = time.perf_counter()
            take(self, raw)

        def timed_handle(self, request):
            start = time.perf_counter()
            handle(self, request)
            steps.add(request.WhichOneof("request"), "handler", time.perf_counter() - start)

        def timed_answer(self, op_id, kind, inner):
            start = time.perf_counter()
            answer(self, op_id, kind, inner)
            steps.add(kind, "encode", time.perf_counter() - start)

        def timed_send(self, data):
            with steps._lock:
                steps._sent.append(time.perf_counter())
            send(self, data)

        class Context:
            def __init__(self, context):
                self._context = context

            async def write(self, data):
                start = time.perf_counter()
                with steps._lock:
                    sent = steps._sent.popleft() if steps._sent else None
                if sent is not None:
                    steps.add("answer", "to the loop", start - sent)
                await self._context.write(data)
                steps.add("answer", "write", time.perf_counter() - start)

        async def timed_write(self, context, written):
            await write(self, Context(context), written)

        wire.parse = timed_parse
        processor.Processor.take = timed_take
        session.Session.handle = timed_handle
        session.Session.answer = timed_answer
        processor.Processor.send = timed_send
        processor.Processor.write = timed_write

    def add(self, kind, step, seconds):
        self.samples[(kind, step)].append(seconds)

    def report(self):
        print("the server's request path, median us (count) per step:")
        by_kind = collections.defaultdict(dict)
        for (kind, step), values in self.samples.items():
            by_kind[kind][step] = (statistics.median(values) * 1e6, len(values))
        for kind, steps in sorted(by_kind.items()):
            print(f"  {kind}: " + "; ".join(f"{step} {us:.1f} ({count})"
                                           for step, (us, count) in steps.items()))


def measure(backend, n, repeats, steps):
    import ifrtpy as ifrt
    from ifrtpy import proxy
    from ifrtpy.proxy.jax_client import jax_target

    timing = Steps() if steps else None
    client = ifrt.get_client(backend)
    echo_at = serve_echo()
    with proxy.serve(client) as server:
        env = dict(os.environ, JAX_PLATFORMS="cpu,proxy",
                   JAX_BACKEND_TARGET=jax_target(server.address))
        here = os.path.dirname(os.path.abspath(__file__))
        proc = subprocess.run([sys.executable, __file__, "--worker", "--n", str(n),
                               "--repeats", str(repeats), "--echo", echo_at],
                              env=env, cwd=here, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"the jax process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.splitlines()[-1]), timing


def report(backend, figures, timing):
    sync, chained = figures["sync"], figures["chained"]
    print(f"calls through `ifrtpy serve --backend {backend}` (unix socket), one run, us per call")
    for name, case, floor in (("sync jit(x + 1)", sync, "two echo round trips"),
                              (f"{CHAIN} chained, per call", chained, "two pipelined messages")):
        ratio = case["proxy"] / case[floor]
        print(f"{name:24s} proxy {case['proxy']:8.1f}  jax direct {case['jax direct']:7.1f}  "
              f"{floor} {case[floor]:7.1f}  ratio {ratio:.2f}x  <= 1.3x "
              f"{'meets' if ratio <= 1.3 else 'MISSES'}")
    if timing is not None:
        timing.report()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="pjrt", help="the server's backend (default pjrt)")
    parser.add_argument("--n", type=int, default=300, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", action="store_true", help="time the server's steps too")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--echo", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.n, args.repeats, args.echo)
    else:
        report(args.backend, *measure(args.backend, args.n, args.repeats, args.steps))


if __name__ == "__main__":
    main()
