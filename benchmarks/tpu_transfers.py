"""Where the time of 64 MiB transfers goes on an accelerator plugin (a TPU), next to jax.

    python benchmarks/tpu_transfers.py [--plugin tpu] [--out DIR] [--repeats 7]
        [--parts floors,jax,ifrtpy,serve,serve-cli] [--budget 330]

Each part runs in a process of its own, one after another (one process holds a TPU at a
time); ``jax`` and ``ifrtpy`` run twice, in the order jax, ifrtpy, ifrtpy, jax, so that a
drift of the machine falls on both alike. In a part every case takes ``--repeats``
samples, the cases taking turns (one sample of each, then the next round); a case is
reported by its p50 over both runs of its part, its min..max, the bandwidth at p50, and
the process's CPU time at p50 (user and system, every thread: in a jax process through
the proxy, jaxlib's client's own work). A get always reads a device array made for it (untimed): a runtime may keep the host copy
of an array it has read once.

* ``floors`` (no device): NumPy's copy of 64 MiB into pre-faulted and into fresh memory;
  the page faults of fresh memory alone (a write per 4 KiB page; one ``mmap`` with
  ``MAP_POPULATE``); 64 MiB through a unix socket pair; a file of 64 MiB written and read
  back where the proxy's put files go (and in /dev/shm); 64 MiB over gRPC on a unix
  socket in 4 MiB messages each way (the proxy's get answers in such pieces); round trips
  of an empty message on a grpc.aio stream (a synchronous call is two).
* ``jax``: ``jax.device_put`` from a default, a page-aligned and an unaligned host array;
  ``np.asarray`` of a device array; the get through ``pinned_host`` memory (the copy
  there, then NumPy's read of it); the process's first put and get; a synchronous
  ``x + 1`` on f32[8], 20 in a row (per call), and the first right after a 64 MiB get.
* ``ifrtpy``: the same through ifrtpy's PjRt backend, with the variants that tell where
  time goes: each host-buffer semantics of the put, the bare ``_pjrt`` call under the
  Python layers, gets into a fresh array (ifrtpy's default, whose pages a second thread
  maps while the plugin copies; and one ifrtpy does not help), into a pre-faulted one,
  into a fresh 2 MiB-aligned one, the bare ``to_host_buffer``, and through ``pinned_host``.
* ``serve``: jax (``JAX_PLATFORMS=proxy``) through :func:`ifrtpy.proxy.serve` on a unix
  socket, the server in the part's process recording its own steps
  (``ifrtpy.proxy.steps``: a get from CopyToHostBuffer arriving to the last piece handed
  to gRPC, a put from its file arriving to the array being ready, and the steps between):
  the first put and get, then steady-state puts and gets; once with puts through files
  (the default on a unix socket), once with puts streamed over gRPC.
* ``serve-cli``: jax's figures through ``python -m ifrtpy serve --backend PLUGIN`` in a
  process of its own, as a user runs it: with glibc's allocator set by ifrtpy in both
  processes (the default: ``ifrtpy_jax_plugin.MALLOPT``), then with it left as glibc's in
  the jax process (``IFRTPY_MALLOPT=0``), then in both. Each jax process says what its
  allocator runs with (``allocator, ...`` beside the figures).

The summary ends with the ratios the proxy is held to, each against floors of the same
run: the first get of a process against a steady get; the server's share of a get
against the plugin's copy into mapped memory alone (``ifrtpy``) plus gRPC's own stream of
the same bytes; the server's share of a put against the file read into mapped memory plus
the plugin's put alone; a synchronous call against two echo round trips and jax direct;
the jax process's CPU time in its first get against a steady one.

Every part's log and figures go to ``--out`` (``PART.log``, ``PART.json``); the summary
prints one table and writes ``transfers.md`` and ``transfers.json``. ``--budget`` bounds
the whole run in seconds: a part that would start past it is left out, and each part
stops taking rounds before its share runs out. ``--plugin`` is a plugin name whose jax
platform has the same name (``tpu``; ``cpu`` for any CPU build).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from _timing import serve_echo
from accelerator_check import _jax_platform

HERE = os.path.dirname(os.path.abspath(__file__))
MIB64 = 64 << 20
CALLS = 20
ROW = f"synchronous x + 1 on f32[8], {CALLS} in a row (per call)"
AFTER_GET = "synchronous x + 1 on f32[8], the first after a 64 MiB get"
PAGE = 4096
HUGE = 2 << 20
#: The order of the parts' processes; jax and ifrtpy twice (ABBA).
ORDER = ("floors", "jax", "ifrtpy", "ifrtpy", "jax", "serve", "serve-cli")
#: Seconds a part may take at most (its share of the budget is smaller where less is left).
PART_LIMIT_S = 150
#: Seconds a part keeps for closing (its last round and its JSON) before its deadline.
CLOSING_S = 15


# -- sampling ------------------------------------------------------------------------------

class Cases:
    """Named cases, each a ``body`` timed after an untimed ``setup`` (whose value it gets),
    sampled in rounds until ``repeats`` samples each or the deadline; a case that raises is
    kept with its error and not sampled again. A body doing ``per`` operations is kept per
    operation. Each sample keeps the process's CPU time (user and system, every thread)
    beside its wall time: in a jax process through the proxy, jaxlib's client's own work."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.cases: dict = {}
        self.samples: dict = {}
        self.cpu: dict = {}
        self.errors: dict = {}
        self.extra: dict = {}

    def add(self, name, body, setup=None, per=1):
        self.cases[name] = (setup, body, per)
        self.samples[name] = []
        self.cpu[name] = []

    def once(self, name, body, setup=None):
        """One sample of ``body`` now (a first put or get: the process's cold path)."""
        self.add(name, body, setup)
        self._sample(name)
        self.cases.pop(name, None)

    def _sample(self, name):
        setup, body, per = self.cases[name]
        try:
            state = setup() if setup is not None else None
            cpu, start = time.process_time(), time.perf_counter()
            body(state)
            self.samples[name].append((time.perf_counter() - start) / per)
            self.cpu[name].append((time.process_time() - cpu) / per)
        except Exception as e:  # noqa: BLE001  (a variant the plugin refuses is a finding)
            self.errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.cases.pop(name, None)

    def run(self, repeats, save=None):
        for name in list(self.cases):  # a warm-up of each, not kept
            self._sample(name)
            if name in self.samples and self.samples[name]:
                self.samples[name].pop()
                self.cpu[name].pop()
        for r in range(repeats):
            if time.monotonic() > self.deadline:
                self.extra["stopped"] = f"deadline after {r} rounds"
                break
            names = list(self.cases)
            for name in names if r % 2 == 0 else names[::-1]:
                if name in self.cases:
                    self._sample(name)
            if save:
                save(self.result())

    def result(self):
        out = {name: {"samples_s": s, "cpu_s": self.cpu.get(name, [])}
               for name, s in self.samples.items()}
        for name, error in self.errors.items():
            out[name] = {"error": error, "samples_s": self.samples.get(name, [])}
        return {"cases": out, **self.extra}


def _aligned(nbytes, alignment, offset=0):
    """A fresh uninitialised uint8 array of ``nbytes`` starting ``offset`` bytes past an
    ``alignment`` boundary."""
    raw = np.empty(nbytes + alignment + offset, np.uint8)
    start = -raw.ctypes.data % alignment + offset
    return raw[start:start + nbytes]


def _host():
    """The 64 MiB of float32 every put sends (the same values in every part)."""
    return np.random.default_rng(0).random(MIB64 // 4, dtype=np.float32)


def _like(values, alignment, offset=0):
    copy = _aligned(values.nbytes, alignment, offset).view(values.dtype)
    np.copyto(copy, values)
    return copy


def _first_put_and_get(cases, put, values):
    """The process's first put (``put()``, returning the ready array) and first get of
    ``values``: its cold path, timed once; the values got are checked."""
    held = {}
    cases.once("first put of the process", lambda _: held.setdefault("x", put()))
    rss = _rss_mib()
    cases.once("first get of the process", lambda _: held.setdefault("got", np.asarray(held["x"])))
    cases.extra[FIRST_GET_RSS] = _rss_mib() - rss
    if "got" in held:
        cases.extra["values"] = "equal" if np.array_equal(held.pop("got"), values) else "DIFFER"


#: The memory the process's first get added to its RSS (MiB): the pages it touched first.
FIRST_GET_RSS = "RSS added by the first get (MiB)"


def _rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("VmRSS"))


def _synchronous_calls(cases, jax, device, fresh):
    """A synchronous ``x + 1`` on f32[8]: 20 in a row (per call), as a loop of steps runs;
    and the first right after a 64 MiB get (its setup)."""
    add_one = jax.jit(lambda v: v + 1)
    small = jax.device_put(np.arange(8, dtype=np.float32), device)

    def calls(_):
        for _ in range(CALLS):
            add_one(small).block_until_ready()

    def after_get():
        np.asarray(fresh())

    cases.add(ROW, calls, per=CALLS)
    cases.add(AFTER_GET,
              lambda _: add_one(small).block_until_ready(), after_get)


# -- floors --------------------------------------------------------------------------------

def part_floors(cases, args):
    import socket

    src = np.frombuffer(np.random.default_rng(1).bytes(MIB64), np.uint8)
    warm = np.ones(MIB64, np.uint8)
    cases.add("memcpy 64 MiB into pre-faulted memory", lambda _: np.copyto(warm, src))
    cases.add("memcpy 64 MiB into fresh memory (np.empty)", lambda d: np.copyto(d, src),
              lambda: np.empty(MIB64, np.uint8))
    cases.add("page faults of 64 MiB np.empty (a write per 4 KiB page; NumPy asks for huge pages)",
              lambda d: d[::PAGE].fill(1), lambda: np.empty(MIB64, np.uint8))
    if hasattr(mmap, "MAP_POPULATE"):
        cases.add("page faults of 64 MiB in one mmap(MAP_POPULATE), no huge-page advice",
                  lambda _: mmap.mmap(-1, MIB64, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                                      | mmap.MAP_POPULATE).close())

    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def through_socket(_):
        sender = threading.Thread(target=left.sendall, args=(memoryview(src),))
        sender.start()
        view, got = memoryview(warm), 0
        while got < MIB64:
            got += right.recv_into(view[got:])
        sender.join()

    cases.add("unix socket pair: 64 MiB one way into pre-faulted memory", through_socket)

    folders = {"the put files' folder": _put_file_root()}
    cases.extra["the put files' folder"] = folders["the put files' folder"]
    if os.path.isdir("/dev/shm") and os.path.realpath("/dev/shm") != folders["the put files' folder"]:
        folders["/dev/shm"] = "/dev/shm"
    for label, folder in folders.items():
        path = os.path.join(tempfile.mkdtemp(dir=folder), "floor.bin")
        cases.add(f"file in {label}: write 64 MiB",
                  lambda _, path=path: _write_file(path, src))
        cases.add(f"file in {label}: read 64 MiB in 16 MiB pieces into pre-faulted memory",
                  lambda _, path=path: _read_file(path, warm), lambda path=path: _ensure(path, src))
        cases.add(f"file in {label}: read 64 MiB into fresh memory",
                  lambda d, path=path: _read_file(path, d),
                  lambda path=path: (_ensure(path, src), np.empty(MIB64, np.uint8))[1])
    from ifrtpy.proxy import local

    put_file = os.path.join(tempfile.mkdtemp(dir=folders["the put files' folder"]), "lt_1")
    cases.add("file in the put files' folder: read as the server reads a put file",
              lambda _: local.read_put_file(put_file, MIB64),
              lambda: _write_file(put_file, src))
    try:
        _grpc_floors(cases, src)
    except ImportError as e:
        cases.extra["grpc"] = f"not measured: {e}"


def _put_file_root():
    """Where the proxy's clients write their put files (the folder of the server's shared
    directory: /dev/shm where there is one)."""
    import ifrtpy_jax_plugin

    return os.path.realpath(os.path.dirname(ifrtpy_jax_plugin.shared_directory("unix:/x")))


def _write_file(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view, done = memoryview(data), 0
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)


def _ensure(path, data):
    if not os.path.exists(path) or os.path.getsize(path) != data.nbytes:
        _write_file(path, data)


def _read_file(path, out):
    fd = os.open(path, os.O_RDONLY)
    try:
        view, got = memoryview(out), 0
        while got < len(view):
            read = os.readv(fd, [view[got:got + (16 << 20)]])
            if not read:
                raise EOFError(f"{path} ended at {got} bytes")
            got += read
    finally:
        os.close(fd)


def _grpc_floors(cases, src):
    """64 MiB over gRPC on a unix socket, in 4 MiB messages each way (Python at both ends:
    the proxy's server is grpc.aio, jax's client C++)."""
    from concurrent import futures

    import grpc

    pieces = [bytes(src[i:i + (4 << 20)]) for i in range(0, MIB64, 4 << 20)]

    def download(request, context):
        yield from pieces

    def upload(requests, context):
        return str(sum(len(r) for r in requests)).encode()

    unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=unlimited)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("floor.Bytes", {
        "Down": grpc.unary_stream_rpc_method_handler(download),
        "Up": grpc.stream_unary_rpc_method_handler(upload)})])
    address = f"unix:{tempfile.mkdtemp()}/floor.sock"
    server.add_insecure_port(address)
    server.start()
    channel = grpc.insecure_channel(address, options=unlimited)
    down = channel.unary_stream("/floor.Bytes/Down")
    up = channel.stream_unary("/floor.Bytes/Up")

    def receive(_):
        got = sum(len(m) for m in down(b""))
        assert got == MIB64, got

    def send(_):
        assert up(iter(pieces)) == str(MIB64).encode()

    cases.add("gRPC on a unix socket: 64 MiB down in 4 MiB messages", receive)
    cases.add("gRPC on a unix socket: 64 MiB up in 4 MiB messages", send)
    _KEEP.extend([server, channel])
    cases.add("grpc.aio echo on a unix socket: 20 round trips of an empty message",
              _aio_echo(f"unix:{tempfile.mkdtemp()}/echo.sock"))


def _aio_echo(address):
    """20 round trips on a grpc.aio stream served as the proxy serves its sessions (a
    grpc.aio server in a thread of its own): a synchronous call is two of them."""
    import asyncio

    import grpc

    serve_echo(address, "floor.Echo")
    loop = asyncio.new_event_loop()

    async def open_call():
        channel = grpc.aio.insecure_channel(address)
        _KEEP.append(channel)
        return channel.stream_stream("/floor.Echo/Stream")()

    call = loop.run_until_complete(open_call())

    async def round_trips():
        for _ in range(20):
            await call.write(b"x")
            await call.read()

    return lambda _: loop.run_until_complete(round_trips())


_KEEP: list = []  # objects the cases use until the part ends


# -- jax direct ----------------------------------------------------------------------------

def part_jax(cases, args):
    import jax

    device = jax.devices()[0]
    values = _host()
    pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    cases.extra["device"] = f"{device.device_kind} ({device.platform}), jax {jax.__version__}"

    def fresh():
        return jax.device_put(values, device).block_until_ready()

    _first_put_and_get(cases, fresh, values)

    def put(source):
        return lambda _: jax.device_put(source, device).block_until_ready().delete()

    cases.add("put, default host array", put(values))
    cases.add("put, page-aligned host array", put(_like(values, PAGE)))
    cases.add("put, host array 16 bytes past a 64-byte boundary", put(_like(values, 64, 16)))
    cases.add("get, np.asarray", lambda x: np.asarray(x), fresh)
    _synchronous_calls(cases, jax, device, fresh)
    cases.add("get via pinned_host: the copy into pinned_host",
              lambda x: jax.device_put(x, pinned).block_until_ready(), fresh)
    cases.add("get via pinned_host: np.asarray of the pinned_host array",
              lambda p: np.asarray(p), lambda: jax.device_put(fresh(), pinned).block_until_ready())


# -- ifrtpy direct -------------------------------------------------------------------------

def part_ifrtpy(cases, args):
    import ifrtpy as ifrt
    from ifrtpy import _pjrt
    from ifrtpy.array import HostBufferSemantics as S
    from ifrtpy.device import MemoryKind

    client = ifrt.get_client(args.plugin)
    device = client.devices()[0]
    one = ifrt.SingleDeviceSharding(device)
    values = _host()
    put = client.make_array_from_host_buffer
    cases.extra["device"] = f"{device.kind} ({client.platform_name}), ifrtpy {ifrt.__version__}"

    def fresh():
        return put(values, one).block_until_ready()

    _first_put_and_get(cases, fresh, values)

    def put_with(source, semantics=S.IMMUTABLE_ONLY_DURING_CALL):
        return lambda _: put(source, one, semantics).block_until_ready()

    cases.add("put, default host array", put_with(values))
    cases.add("put, IMMUTABLE_UNTIL_TRANSFER_COMPLETES", put_with(values, S.IMMUTABLE_UNTIL_TRANSFER_COMPLETES))
    cases.add("put, IMMUTABLE_ZERO_COPY", put_with(values, S.IMMUTABLE_ZERO_COPY))
    cases.add("put, page-aligned host array", put_with(_like(values, PAGE)))
    cases.add("put, host array 16 bytes past a 64-byte boundary", put_with(_like(values, 64, 16)))
    memory = device.default_memory()._handle

    def bare_put(_):
        buffer, _event = _pjrt.buffer_from_host_buffer(client._handle, values, None, memory, 0)
        buffer.ready_event().await_()

    cases.add("put, bare _pjrt.buffer_from_host_buffer", bare_put)
    aligned = _like(values, 64)
    cases.add("put, IMMUTABLE_ZERO_COPY of 64-byte aligned memory (as the server's put of a file)",
              put_with(aligned, S.IMMUTABLE_ZERO_COPY))
    warm = np.ones_like(values)
    cases.add("get, np.asarray (fresh destination, pages mapped on a second thread)",
              lambda x: np.asarray(x), fresh)
    cases.add("get, copy_to_host_buffer(out=np.empty(...)) (fresh, no help)",
              lambda x: x.copy_to_host_buffer(out=np.empty_like(values)).result(), fresh)
    cases.add("get, into a pre-faulted destination",
              lambda x: x.copy_to_host_buffer(out=warm).result(), fresh)
    cases.add("get, into a fresh 2 MiB-aligned destination",
              lambda x: x.copy_to_host_buffer(out=_aligned(values.nbytes, HUGE).view(np.float32)).result(),
              fresh)

    def bare_get(out):
        def get(x):
            buffer = x._buffers[0]
            _, event = buffer.to_host_buffer(warm if out == "warm" else None)
            event.await_()
        return get

    cases.add("get, bare to_host_buffer into a pre-faulted destination", bare_get("warm"), fresh)
    cases.add("get, bare to_host_buffer() (the Cython layer allocates)", bare_get(None), fresh)
    pinned = MemoryKind("pinned_host")
    cases.add("get via pinned_host: the copy into pinned_host",
              lambda x: client.copy_arrays([x], None, pinned)[0].block_until_ready(), fresh)
    cases.add("get via pinned_host: np.asarray (a view, no copy)", lambda p: np.asarray(p),
              lambda: client.copy_arrays([fresh()], None, pinned)[0].block_until_ready())
    cases.add("get via pinned_host: np.array (a copy of the view)", lambda p: np.array(p),
              lambda: client.copy_arrays([fresh()], None, pinned)[0].block_until_ready())


# -- jax through the proxy -----------------------------------------------------------------

def part_serve(cases, args):
    """The server in this process (its steps timed), jax in a child: puts through files,
    then puts over gRPC."""
    import ifrtpy as ifrt
    import ifrtpy_jax_plugin
    from ifrtpy import proxy
    from ifrtpy.proxy.jax_client import jax_target

    from ifrtpy.proxy.steps import LOG

    ifrtpy_jax_plugin.tune_allocator()  # as python -m ifrtpy serve does
    client = ifrt.get_client(args.plugin)
    folder = tempfile.mkdtemp()
    with proxy.serve(client, f"unix:{folder}/proxy.sock") as server:
        target = jax_target(server.address)
        for i, mode in enumerate(("files", "gRPC")):
            env = {ifrtpy_jax_plugin.TRANSFER_THRESHOLD: str(1 << 62)} if mode == "gRPC" else {}
            share = (cases.deadline - time.monotonic()) / (2 - i)
            LOG.start()
            _record_jax_through(cases, mode, target, args, env, time.monotonic() + share)
            LOG.stop()
            _server_steps(cases, mode, LOG.take())


#: The jax process's environment that leaves glibc's allocator as it is (ifrtpy_jax_plugin).
ALLOCATOR_OFF = {"IFRTPY_MALLOPT": "0"}
#: serve-cli's runs: (the server's extra environment, [(mode, the jax process's extra
#: environment)]): ifrtpy's allocator setting in both processes (the default), then left
#: off in the jax process, then in both (what a run showed before ifrtpy set it).
SERVE_CLI_RUNS = (
    ({}, [("files", {}), ("files, allocator setting off in jax", ALLOCATOR_OFF)]),
    (ALLOCATOR_OFF, [("files, allocator setting off in both", ALLOCATOR_OFF)]),
)


def part_serve_cli(cases, args):
    """jax through ``python -m ifrtpy serve`` in a process of its own (its output in
    ``serve-cli-server.log``), each of :data:`SERVE_CLI_RUNS` in turn."""
    runs = [(server_env, mode, env) for server_env, jax_runs in SERVE_CLI_RUNS
            for mode, env in jax_runs]
    done = 0
    for i, (server_env, jax_runs) in enumerate(SERVE_CLI_RUNS):
        log_path = os.path.join(os.path.dirname(os.path.abspath(args.save or ".")),
                                f"serve-cli-server{'-' + str(i + 1) if i else ''}.log")
        with _serve_cli(args.plugin, server_env, log_path, cases.deadline) as target:
            for mode, env in jax_runs:
                share = (cases.deadline - time.monotonic()) / (len(runs) - done)
                _record_jax_through(cases, mode, target, args, env, time.monotonic() + share)
                cases.extra[f"the server's allocator, puts through {mode}"] = (
                    "glibc's own (IFRTPY_MALLOPT=0)" if server_env else "set by ifrtpy serve")
                done += 1


@contextlib.contextmanager
def _serve_cli(plugin, env, log_path, deadline):
    """``python -m ifrtpy serve --backend PLUGIN`` on a unix socket, with ``env`` added to
    its environment: its jax target while it serves; stopped after."""
    socket_path = os.path.join(tempfile.mkdtemp(), "proxy.sock")
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "ifrtpy", "serve", "--backend",
                                   plugin, "--address", f"unix:{socket_path}"],
                                  stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **env))
    try:
        yield _serving_at(log_path, server, min(120.0, deadline - time.monotonic()))
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


def _serving_at(log_path, server, seconds):
    """The address ``python -m ifrtpy serve`` prints in its log once it serves."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and server.poll() is None:
        with open(log_path) as f:
            for line in f:
                if line.startswith("ifrtpy proxy: serving ") and " at " in line:
                    return line.rsplit(" at ", 1)[1].strip()
        time.sleep(0.2)
    with open(log_path) as f:
        raise RuntimeError(f"the server did not start (exit {server.poll()}): {f.read()[-500:]!r}")


def _record_jax_through(cases, mode, target, args, env, deadline):
    """Run the ``proxy-jax`` worker against the server at ``target`` until ``deadline``
    and keep its figures in ``cases``, named by ``mode`` (how puts travel)."""
    result = _jax_through(target, args, env, deadline)
    for name, entry in result["cases"].items():
        cases.samples[f"jax, puts through {mode}: {name}"] = entry.get("samples_s", [])
        cases.cpu[f"jax, puts through {mode}: {name}"] = entry.get("cpu_s", [])
        if "error" in entry:
            cases.errors[f"jax, puts through {mode}: {name}"] = entry["error"]
    for key in ("values", "allocator", FIRST_GET_RSS):
        if key in result:
            cases.extra[f"{key}, puts through {mode}"] = result[key]


def _jax_through(target, args, env, deadline):
    """The ``proxy-jax`` worker's result against the server at ``target``."""
    env = dict(os.environ, JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=target, **env)
    left = max(10.0, deadline - time.monotonic())
    proc = subprocess.run([sys.executable, __file__, "--worker", "proxy-jax", "--repeats",
                           str(args.repeats), "--deadline-in", str(left - CLOSING_S / 2)],
                          env=env, capture_output=True, text=True, timeout=left + 5, cwd=HERE)
    lines = proc.stdout.splitlines()
    print("\n".join(line for line in lines if not line.startswith("{")), proc.stderr[-4000:])
    found = [line for line in lines if line.startswith("{")]
    if proc.returncode != 0 or not found:
        return {"cases": {"run": {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}}}
    return json.loads(found[-1])


def part_proxy_jax(cases, args):
    """In the jax process (``JAX_PLATFORMS=proxy``): first put and get, steady-state put,
    get and a synchronous x + 1."""
    import jax

    import ifrtpy_jax_plugin

    device = jax.devices()[0]
    values = _host()
    cases.extra["allocator"] = _allocator(ifrtpy_jax_plugin)

    def fresh():
        return jax.device_put(values, device).block_until_ready()

    _first_put_and_get(cases, fresh, values)
    cases.add("put 64 MiB", lambda _: fresh().delete())
    cases.add("get 64 MiB", lambda x: np.asarray(x), fresh)
    _synchronous_calls(cases, jax, device, fresh)


def _allocator(plugin):
    """What glibc's allocator runs with in this process: what ifrtpy_jax_plugin set
    (``mallopt``, when jax started its proxy backend) and glibc's own variables."""
    tuned = plugin.tune_allocator()  # what the plugin set at jax's start (set once)
    said = ", ".join(f"{name} {value}" for name, value in tuned.items())
    variables = {k: v for k, v in os.environ.items()
                 if k.startswith("MALLOC_") or k == plugin.MALLOPT_VARIABLE}
    return (f"mallopt by ifrtpy_jax_plugin: {said or 'none'}; "
            f"variables: {variables or 'none'}")


#: The server's steps of a transfer (ifrtpy.proxy.steps): (name, first step, last step);
#: "the server's share" runs from the request's arrival to the last piece handed to gRPC
#: (a get) or to the array being ready (a put).
SERVER_SPANS = (
    ("get: the server's share (CopyToHostBuffer arriving to the last piece handed to gRPC)",
     "copy arrived", "last piece written"),
    ("get: CopyToHostBuffer arriving to the copy done", "copy arrived", "copy done"),
    ("get: the lookup arriving to the last piece handed to gRPC", "lookup arrived",
     "last piece written"),
    ("put: the server's share (the put file arriving to the array ready)", "file arrived",
     "put ready"),
    ("put: the put file read", "file arrived", "file read"),
    ("put: the server's share (HostBufferStore arriving to the array ready)", "store arrived",
     "put ready"),
    ("put: HostBufferStore received", "store arrived", "store received"),
    ("put: MakeArrayFromHostBuffer arriving to the array ready", "put arrived", "put ready"),
)


def _server_steps(cases, mode, taken):
    """The server's steps of every transfer of 1 MiB or more, from its timestamps: each
    span's first (the process's cold path) and the others."""
    from ifrtpy.proxy.steps import spans

    for name, first, last in SERVER_SPANS:
        found = [seconds for nbytes, seconds, _ in spans(taken, first, last) if nbytes >= 1 << 20]
        if found:
            cases.samples[f"server step, {name} (puts through {mode}), the first"] = found[:1]
            cases.samples[f"server step, {name} (puts through {mode}), the others"] = found[1:]


PARTS = {"floors": part_floors, "jax": part_jax, "ifrtpy": part_ifrtpy, "serve": part_serve,
         "serve-cli": part_serve_cli, "proxy-jax": part_proxy_jax}


# -- the run -------------------------------------------------------------------------------

def run(command, env, timeout, log):
    """Run ``command`` in a process group of its own; its return code and output (also
    written to ``log``). Past ``timeout`` the whole group is killed: a server a part
    started must not outlive it holding the chip."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=HERE, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        code = 124
    with open(log, "w") as f:
        f.write(output)
    print(f"  (exit {code} in {time.perf_counter() - start:.0f} s; log {log})", flush=True)
    return code, output


def worker(args):
    """One part in this process: its figures as one JSON line (and in ``--save``)."""
    cases = Cases(time.monotonic() + args.deadline_in - CLOSING_S)

    def save(result):
        if args.save:
            with open(args.save, "w") as f:
                json.dump(result, f)

    PARTS[args.worker](cases, args)
    cases.run(args.repeats, save)
    _KEEP.clear()
    save(cases.result())
    print(json.dumps(cases.result()), flush=True)


def summary(results):
    """Per case (in the order first seen): (part, case, p50 ms, min..max ms, GB/s at p50,
    the process's CPU ms at p50, samples, errors) over every run of its part; and each
    case's p50 in seconds."""
    rows, merged, p50s = [], {}, {}
    for part, result in results:
        for name, entry in result.get("cases", {}).items():
            slot = merged.setdefault((part, name), {"samples_s": [], "cpu_s": [], "errors": []})
            slot["samples_s"] += entry.get("samples_s", [])
            slot["cpu_s"] += entry.get("cpu_s", [])
            if "error" in entry:
                slot["errors"].append(entry["error"])
    for (part, name), slot in merged.items():
        samples, errors = slot["samples_s"], "; ".join(slot["errors"])
        if not samples:
            rows.append((part, name, "", "", "", "", "0", errors or "no sample"))
            continue
        p50 = p50s[part, name] = statistics.median(samples)
        if slot["cpu_s"]:
            p50s[part, f"{name}, CPU"] = statistics.median(slot["cpu_s"])
        gbs = "" if "x + 1" in name else f"{MIB64 / p50 / 1e9:.3f}"
        cpu = f"{statistics.median(slot['cpu_s']) * 1e3:.1f}" if slot["cpu_s"] else ""
        rows.append((part, name, f"{p50 * 1e3:.2f}",
                     f"{min(samples) * 1e3:.2f}..{max(samples) * 1e3:.2f}", gbs, cpu,
                     str(len(samples)), errors))
    return rows, p50s


#: The ratios the run is for: (what, numerator case, denominator case), each a p50 time.
HEADLINES = [
    ("ifrtpy / jax time, put 64 MiB", ("ifrtpy", "put, default host array"),
     ("jax", "put, default host array")),
    ("ifrtpy / jax time, get 64 MiB", ("ifrtpy", "get, np.asarray (fresh destination, pages "
                                                 "mapped on a second thread)"),
     ("jax", "get, np.asarray")),
    ("jax through serve (in-process server), bandwidth / jax direct's, put", ("jax", "put, default host array"),
     ("serve", "jax, puts through files: put 64 MiB")),
    ("jax through serve (in-process server), bandwidth / jax direct's, get", ("jax", "get, np.asarray"),
     ("serve", "jax, puts through files: get 64 MiB")),
    ("jax through python -m ifrtpy serve, bandwidth / jax direct's, put", ("jax", "put, default host array"),
     ("serve-cli", "jax, puts through files: put 64 MiB")),
    ("jax through python -m ifrtpy serve, bandwidth / jax direct's, get", ("jax", "get, np.asarray"),
     ("serve-cli", "jax, puts through files: get 64 MiB")),
    ("jax through python -m ifrtpy serve, get bandwidth / the gRPC floor's (down)",
     ("floors", "gRPC on a unix socket: 64 MiB down in 4 MiB messages"),
     ("serve-cli", "jax, puts through files: get 64 MiB")),
    ("jax through python -m ifrtpy serve, put bandwidth / a file written and read back",
     ("floors", "file in the put files' folder: write+read"), ("serve-cli", "jax, puts through files: put 64 MiB")),
    # issue 50's targets, each against floors measured in the same run
    ("first get of a process / a steady get, in-process server (target <= 1.5)",
     ("serve", "jax, puts through files: first get of the process"),
     ("serve", "jax, puts through files: get 64 MiB")),
    ("first get of a process / a steady get, python -m ifrtpy serve (target <= 1.5)",
     ("serve-cli", "jax, puts through files: first get of the process"),
     ("serve-cli", "jax, puts through files: get 64 MiB")),
    ("the server's share of a get / (the plugin's copy into mapped memory alone + gRPC's own "
     "stream) (target <= 1.2)",
     ("serve", "server step, get: the server's share (CopyToHostBuffer arriving to the last "
               "piece handed to gRPC) (puts through files), the others"),
     ("floors", "copy alone + gRPC down")),
    ("the server's share of a put through a file / (the file read into mapped memory + the "
     "plugin's put alone) (target <= 1.3)",
     ("serve", "server step, put: the server's share (the put file arriving to the array ready) "
               "(puts through files), the others"),
     ("floors", "file read + put alone")),
    ("the server's read of a put file / the file read into mapped memory",
     ("serve", "server step, put: the put file read (puts through files), the others"),
     ("floors", "file in the put files' folder: read 64 MiB in 16 MiB pieces into pre-faulted "
                "memory")),
    ("a put file read as the server reads one, alone / the file read into mapped memory",
     ("floors", "file in the put files' folder: read as the server reads a put file"),
     ("floors", "file in the put files' folder: read 64 MiB in 16 MiB pieces into pre-faulted "
                "memory")),
    ("a synchronous x + 1 through python -m ifrtpy serve / two grpc.aio echo round trips "
     "(target <= 1.3 on a CPU)",
     ("serve-cli", f"jax, puts through files: {ROW}"), ("floors", "two echo round trips")),
    ("a synchronous x + 1 through python -m ifrtpy serve / jax direct's (target <= 2 on a TPU)",
     ("serve-cli", f"jax, puts through files: {ROW}"), ("jax", ROW)),
    ("the first synchronous x + 1 after a 64 MiB get, python -m ifrtpy serve / jax direct's",
     ("serve-cli", f"jax, puts through files: {AFTER_GET}"), ("jax", AFTER_GET)),
    ("first get of a process / a steady get, python -m ifrtpy serve, allocator setting off in jax",
     ("serve-cli", "jax, puts through files, allocator setting off in jax: first get of the process"),
     ("serve-cli", "jax, puts through files, allocator setting off in jax: get 64 MiB")),
    ("first get of a process / a steady get, python -m ifrtpy serve, allocator setting off in both",
     ("serve-cli", "jax, puts through files, allocator setting off in both: first get of the process"),
     ("serve-cli", "jax, puts through files, allocator setting off in both: get 64 MiB")),
    ("jax through python -m ifrtpy serve, allocator setting off in jax, bandwidth / jax direct's, get",
     ("jax", "get, np.asarray"),
     ("serve-cli", "jax, puts through files, allocator setting off in jax: get 64 MiB")),
    ("jax through python -m ifrtpy serve, allocator setting off in both, bandwidth / jax direct's, get",
     ("jax", "get, np.asarray"),
     ("serve-cli", "jax, puts through files, allocator setting off in both: get 64 MiB")),
    ("jax through python -m ifrtpy serve, allocator setting off in both, bandwidth / jax direct's, put",
     ("jax", "put, default host array"),
     ("serve-cli", "jax, puts through files, allocator setting off in both: put 64 MiB")),
    ("a put through python -m ifrtpy serve / its floor (the file written and read back + jax "
     "direct's put)", ("serve-cli", "jax, puts through files: put 64 MiB"),
     ("floors", "file write+read + jax's put")),
    ("the put floor's bandwidth / jax direct's (the most a put through a file reaches)",
     ("jax", "put, default host array"), ("floors", "file write+read + jax's put")),
    ("the first get's excess over a steady one / the page faults of the memory it adds to the "
     "process (its RSS growth, at the floors' cost per 64 MiB), python -m ifrtpy serve",
     ("serve-cli", "first get - steady get (files)"),
     ("serve-cli", "page faults of the first get's new memory (files)")),
    ("jaxlib's client's CPU time, the first get of a process / a steady get (python -m ifrtpy serve)",
     ("serve-cli", "jax, puts through files: first get of the process, CPU"),
     ("serve-cli", "jax, puts through files: get 64 MiB, CPU")),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plugin", default="tpu", help="plugin name (default tpu)")
    parser.add_argument("--out", default="transfers", help="folder for logs and figures")
    parser.add_argument("--repeats", type=int, default=7, help="samples per case and run")
    parser.add_argument("--parts", default="floors,jax,ifrtpy,serve,serve-cli")
    parser.add_argument("--budget", type=float, default=330, help="seconds for the whole run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--deadline-in", type=float, default=PART_LIMIT_S, help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    start = time.monotonic()
    wanted = set(args.parts.split(","))
    unknown = wanted - set(ORDER)
    if unknown:
        sys.exit(f"unknown parts: {', '.join(sorted(unknown))} (known: {', '.join(dict.fromkeys(ORDER))})")
    os.makedirs(args.out, exist_ok=True)
    platform = _jax_platform(args.plugin)
    results, seen = [], {}
    for part in (p for p in ORDER if p in wanted):
        left = args.budget - (time.monotonic() - start)
        if left < 30:
            print(f"== {part}: left out, {left:.0f} s of the budget left", flush=True)
            continue
        seen[part] = seen.get(part, 0) + 1
        label = part if seen[part] == 1 else f"{part}-{seen[part]}"
        share = min(PART_LIMIT_S, left)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        if part == "jax":
            env["JAX_PLATFORMS"] = platform
        print(f"== {label}", flush=True)
        code, out = run([sys.executable, __file__, "--worker", part, "--plugin", args.plugin,
                         "--repeats", str(args.repeats), "--deadline-in", str(share - 10),
                         "--save", os.path.join(args.out, f"{label}.json")],
                        env, share, os.path.join(args.out, f"{label}.log"))
        found = [line for line in out.splitlines() if line.startswith("{")]
        if found:
            result = json.loads(found[-1])
        elif os.path.exists(os.path.join(args.out, f"{label}.json")):
            with open(os.path.join(args.out, f"{label}.json")) as f:
                result = json.load(f)  # what it saved before it was stopped
            result["stopped"] = f"exit {code}"
        else:
            result = {"cases": {}, "stopped": f"exit {code}: {out.strip()[-300:]}"}
        for key, value in result.items():
            if key != "cases" and not key.startswith("_"):
                print(f"  {key}: {value}", flush=True)
        results.append((part, result))
    rows, p50s = summary(results)
    write_read = [p50s.get(("floors", "file in the put files' folder: write 64 MiB")),
                  p50s.get(("floors", "file in the put files' folder: read 64 MiB in 16 MiB pieces "
                                      "into pre-faulted memory"))]
    if None not in write_read:
        p50s["floors", "file in the put files' folder: write+read"] = sum(write_read)
        if ("jax", "put, default host array") in p50s:
            p50s["floors", "file write+read + jax's put"] = (
                sum(write_read) + p50s["jax", "put, default host array"])
    for name, parts in (
            ("copy alone + gRPC down", [("ifrtpy", "get, into a pre-faulted destination"),
                                        ("floors", "gRPC on a unix socket: 64 MiB down in 4 MiB "
                                                   "messages")]),
            ("file read + put alone", [write_read[1], (
                "ifrtpy", "put, IMMUTABLE_ZERO_COPY of 64-byte aligned memory (as the server's "
                          "put of a file)")])):
        found = [p50s.get(k) if isinstance(k, tuple) else k for k in parts]
        if None not in found:
            p50s["floors", name] = sum(found)
    faults = p50s.get(("floors", "page faults of 64 MiB np.empty (a write per 4 KiB page; NumPy "
                                 "asks for huge pages)"))
    for part, result in results:
        for key, value in result.items():
            if key.startswith(FIRST_GET_RSS) and faults is not None and (part, key) not in p50s:
                mode = key[len(FIRST_GET_RSS):].removeprefix(", puts through ")
                p50s[part, f"page faults of the first get's new memory ({mode})"] = value / 64 * faults
                first = p50s.get((part, f"jax, puts through {mode}: first get of the process"))
                steady = p50s.get((part, f"jax, puts through {mode}: get 64 MiB"))
                if first is not None and steady is not None:
                    p50s[part, f"first get - steady get ({mode})"] = first - steady
    echo = p50s.get(("floors", "grpc.aio echo on a unix socket: 20 round trips of an empty message"))
    if echo is not None:
        p50s["floors", "two echo round trips"] = echo / 10
    header = ("part", "case", "p50 ms", "min..max ms", "GB/s at p50", "process CPU ms (p50)",
              "samples", "errors")
    lines = [f"{part}, {key}: {value}" for part, result in results
             for key, value in result.items() if "allocator" in key]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    print("\n".join(lines))
    with open(os.path.join(args.out, "transfers.json"), "w") as f:
        json.dump({"plugin": args.plugin, "repeats": args.repeats,
                   "seconds": time.monotonic() - start, "parts": results}, f, indent=1)
    for what, top, bottom in HEADLINES:
        if top in p50s and bottom in p50s:
            lines.append(f"{what}: {p50s[top] / p50s[bottom]:.3f}")
            print(lines[-1])
    with open(os.path.join(args.out, "transfers.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"done in {time.monotonic() - start:.0f} s; figures in {args.out}/transfers.md")


if __name__ == "__main__":
    main()
