"""Host callbacks through the server, against an unmodified jax.

jax forwards host callbacks (``jax.debug.print``, ``pure_callback``, ``io_callback``) to a
proxy server only on a TPU, where it lowers them to send/recv; a server then hands each call
to the client (``LoadedHostCallbackPoll``) and takes its results
(``LoadedHostCallbackReturn``). Here the server calls its devices a TPU, so that jax sends
them. The first test is the product's behaviour: the program is refused at compile, with
the reason. The second is that reason, taken from jaxlib itself: a server that accepts the
program and hands the client one call gets ``UNIMPLEMENTED: ExecuteLoadedHostCallback is
unsupported.`` back. When a jaxlib runs the calls, the second test fails: serve them then.
"""

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading

import pytest

pytest.importorskip("grpc")
pytest.importorskip("jax")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402
from ifrtpy.proxy import executables, session, topology  # noqa: E402
from ifrtpy.proxy._protocol import messages  # noqa: E402

#: Generous bound on a hang, not a timing assertion.
HANG_S = 240

#: A jax process on the server at argv[1]: compiles a program printing from the device.
JAX_PROGRAM = """
import sys, time
from ifrtpy.proxy import connect_jax
connect_jax(sys.argv[1])
import jax, jax.numpy as jnp
assert jax.default_backend() == "tpu", jax.default_backend()

def f(x):
    jax.debug.print("x = {}", x)
    return x + 1

try:
    jax.jit(f).lower(jnp.zeros(3, jnp.float32)).compile()
    print("COMPILED", flush=True)
except Exception as e:
    print("REFUSED", str(e).replace("\\n", " "), flush=True)
time.sleep(float(sys.argv[2]))  # the client's callback poller runs meanwhile
"""


def run_jax(address, linger_s=0.0):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_BACKEND_TARGET", "XLA_FLAGS")}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(JAX_PROGRAM), address,
                           str(linger_s)], capture_output=True, text=True, timeout=HANG_S, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("COMPILED", "REFUSED"))]
    assert lines, f"rc {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    return lines[0]


def handling(kinds, kind, handler):
    """The record of ``kind`` with another handler."""
    return dataclasses.replace(kinds[kind], handler=handler)


@pytest.fixture
def tpu_server(monkeypatch):
    """A server over the CPU plugin whose devices call themselves a TPU, and its handler
    table (patched by the test as it needs)."""
    handlers = session.kinds()
    real_init = handlers["init_request"].handler

    def init(s, request):
        response = real_init(s, request)
        response.platform_name = "tpu"
        return response

    monkeypatch.setitem(handlers, "init_request", handling(handlers, "init_request", init))
    with proxy.serve(ifrt.get_client("pjrt", device_count=1)) as running:
        yield running, handlers


def test_a_program_with_host_callbacks_is_refused_at_compile_with_the_reason(tpu_server):
    server, _ = tpu_server
    line = run_jax(server.address)
    assert line.startswith("REFUSED"), line
    assert "UNIMPLEMENTED" in line and "1 host callbacks" in line
    assert "ExecuteLoadedHostCallback is unsupported" in line
    assert executables.CLIENT_RUNS_NO_CALLBACKS in line


def test_jaxlibs_proxy_client_answers_every_host_callback_call_unimplemented(tpu_server, monkeypatch):
    server, handlers = tpu_server
    real_compile = handlers["compile_request"].handler
    returned, polls = [], []
    answered = threading.Event()

    def compile_accepting_callbacks(s, request):
        if not request.host_callbacks:  # jax's own helper programs
            return real_compile(s, request)
        response = messages().CompileResponse(
            loaded_executable_handle=s.put_executable(None), name="with_callbacks", num_devices=1)
        response.loaded_host_callback_handles.extend(range(1000, 1000 + len(request.host_callbacks)))
        response.ready_future_handle = s.put_future(0, ifrt.Future.ready())
        return response

    def poll(s, request):  # the first poll gets one call (the operand: f32[3]); later, none
        polls.append(request.loaded_host_callback_handle)
        if len(polls) > 1:
            return messages().LoadedHostCallbackPollResponse()
        s.store_host_buffer(request.operand_host_buffer_handle, bytes(12))
        return messages().LoadedHostCallbackPollResponse(host_callback_execution_handle=77)

    def take_return(s, request):
        returned.append(request)
        answered.set()
        return messages().LoadedHostCallbackReturnResponse()

    for kind, handler in [("compile_request", compile_accepting_callbacks),
                          ("loaded_host_callback_poll_request", poll),
                          ("loaded_host_callback_return_request", take_return)]:
        monkeypatch.setitem(handlers, kind, handling(handlers, kind, handler))
    assert run_jax(server.address, linger_s=5.0) == "COMPILED"
    assert answered.wait(HANG_S)
    assert polls[0] == 1000
    (answer,) = returned
    assert answer.host_callback_execution_handle == 77
    assert answer.WhichOneof("result") == "error", answer
    assert answer.error.code == 12  # UNIMPLEMENTED
    assert answer.error.message == "ExecuteLoadedHostCallback is unsupported."
