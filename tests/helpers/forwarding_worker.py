"""Runs everyday operations on a PJRT plugin, each in its own process, and prints one
JSON object: operation -> [outcome, detail].

    python forwarding_worker.py PLUGIN_PATH OPERATION...

Outcomes: "ok" (detail: what the operation returned, as a str, or ""); "unimplemented"
(detail: the UnimplementedError's message); "error"
(another exception: its type and message); "crashed" (detail: how the process ended).
ifrtpy is imported once; each operation runs in a child forked from that process (the
plugin is loaded in the child only), at most ``PARALLEL`` at a time.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import traceback

import numpy as np

import ifrtpy as ifrt
from ifrtpy.device import MemoryKind
from ifrtpy.errors import UnimplementedError

PARALLEL = 4
#: A bound on a runaway operation, in CPU seconds (what the machine's load leaves alone):
#: one takes well under one.
CPU_LIMIT_S = 60
#: The last resort against one that hangs without using the CPU (a deadlock), in seconds.
HANG_S = 1800

ADD_ONE = """module @add_one {
  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
    %c = stablehlo.constant dense<1.0> : tensor<4xf32>
    %0 = stablehlo.add %arg0, %c : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"""
X = np.arange(4, dtype=np.float32)


def _client(path):
    return ifrt.get_client("pjrt", plugin=path, device_count=2)


def _array(path):
    client = _client(path)
    return client, ifrt.device_put(X, client.devices()[0])


def _executable(path):
    client, a = _array(path)
    return client, a, client.compile(ifrt.HloProgram(ADD_ONE))


def _same(got, want=X):
    np.testing.assert_array_equal(np.asarray(got), want)


def put_and_read(path):
    _same(_array(path)[1])


def put_and_copy_out(path):
    _same(_array(path)[1].copy_to_host_buffer().result())


def compile_and_execute(path):
    _, a, exe = _executable(path)
    _same(exe(a)[0], X + 1)


def cost_analysis(path):
    _executable(path)[2].cost_analysis()


def compiled_memory_stats(path):
    _executable(path)[2].compiled_memory_stats()


def serialize(path):
    client, a, exe = _executable(path)
    _same(client.deserialize_executable(exe.serialize())(a)[0], X + 1)


def fingerprint(path):
    _executable(path)[2].fingerprint  # noqa: B018  (a property: None where there is none)


def output_memory_kinds(path):
    assert _executable(path)[2].output_memory_kinds() == ["device"]


def output_layouts(path):
    _executable(path)[2].output_layouts()


def optimized_program(path):
    _executable(path)[2].program_text(optimized=True)


def dlpack_export(path):
    _same(np.from_dlpack(_array(path)[1]))


def dlpack_import(path):
    client = _client(path)
    _same(client.from_dlpack(X.copy()))


def unsafe_buffer_pointer(path):
    _array(path)[1].unsafe_buffer_pointer()


def copy_to_device(path):
    client, a = _array(path)
    (b,) = client.copy_arrays([a], devices=[client.devices()[1]])
    _same(b)


def copy_to_memory(path):
    client, a = _array(path)
    (b,) = client.copy_arrays([a], memory_kind=MemoryKind("pinned_host"))
    _same(b)


def memory_stats(path):
    _client(path).devices()[0].memory_stats()


def default_layout_text(path):
    return _client(path)._handle.default_layout(11, [4])  # f32[4]


def buffer_layout_text(path):
    return _array(path)[1]._buffers[0].layout_text()


def missing_functions(path):
    return " ".join(_client(path)._handle.plugin.missing_functions)


OPERATIONS = {f.__name__: f for f in (
    put_and_read, put_and_copy_out, compile_and_execute, cost_analysis, compiled_memory_stats,
    serialize, fingerprint, output_memory_kinds, output_layouts, optimized_program,
    dlpack_export, dlpack_import, unsafe_buffer_pointer, copy_to_device, copy_to_memory,
    memory_stats, default_layout_text, buffer_layout_text, missing_functions)}


def _child(operation, path, out) -> None:
    try:
        returned = OPERATIONS[operation](path)
        result = ["ok", "" if returned is None else str(returned)]
    except UnimplementedError as e:
        result = ["unimplemented", str(e)]
    except BaseException as e:  # noqa: BLE001  (reported, not judged, here)
        result = ["error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"]
    os.write(out, json.dumps(result).encode())
    os.close(out)


def _start(operation, path):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report, leave without the parent's exit handlers
        os.close(read)
        resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S + 5))
        signal.alarm(HANG_S)
        try:
            _child(operation, path, write)
        finally:
            os._exit(0)
    os.close(write)
    return pid, read


def _finish(pid, read):
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return ["crashed", f"killed by {signal.Signals(os.WTERMSIG(status)).name}"]
    if not chunks:
        return ["crashed", f"exit status {os.WEXITSTATUS(status)} without a report"]
    return json.loads(b"".join(chunks))


def main(path, operations) -> int:
    results = {}
    running = []
    for operation in operations:
        if len(running) == PARALLEL:
            name, pid, read = running.pop(0)
            results[name] = _finish(pid, read)
        running.append((operation, *_start(operation, path)))
    for name, pid, read in running:
        results[name] = _finish(pid, read)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
