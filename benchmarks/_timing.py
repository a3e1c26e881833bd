"""Timing helpers shared by the benchmark scripts."""

import statistics
import time


def interleaved_median_us(fns, n, repeats):
    """Median µs per call of each loop in ``fns``, the loops taking turns in every repeat
    so that a slow stretch of the machine falls on all of them alike."""
    for fn in fns.values():
        fn(max(1, n // 10))
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(fn(n) / n * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def timed(body):
    """A loop of ``n`` calls of ``body``, returning the seconds it took."""
    def run(n):
        start = time.perf_counter()
        for _ in range(n):
            body()
        return time.perf_counter() - start
    return run


def serve_echo(address, service="bench.Echo", timeout_s=60.0):
    """A grpc.aio stream at ``address`` that answers each message with itself
    (``/SERVICE/Stream``), served as the proxy serves its sessions: a grpc.aio server on
    an event loop in a daemon thread of this process. Returns once it serves."""
    import asyncio
    import threading

    import grpc

    async def echo(requests, context):
        async for message in requests:
            yield message

    ready = threading.Event()

    async def run():
        server = grpc.aio.server(handlers=[grpc.method_handlers_generic_handler(
            service, {"Stream": grpc.stream_stream_rpc_method_handler(echo)})])
        server.add_insecure_port(address)
        await server.start()
        ready.set()
        await server.wait_for_termination()

    threading.Thread(target=asyncio.run, args=(run(),), daemon=True).start()
    if not ready.wait(timeout_s):
        raise RuntimeError(f"the echo server at {address} did not start in {timeout_s:g} s")
