"""A session's in-order processor and dispatch (ifrtpy.proxy.processor, .session): a
worker that cannot go on ends its stream with an error, the table of request kinds is
never seen half built, a deferred answer is bound to its own request, and the limits are
checked against their ranges by name."""

import threading
from collections.abc import Mapping

import pytest

grpc = pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402
from ifrtpy.errors import InvalidArgumentError  # noqa: E402
from ifrtpy.proxy import executables, session as session_module  # noqa: E402
from ifrtpy.proxy.kind import Kind, Later  # noqa: E402
from ifrtpy.proxy.limits import Budget, Limits  # noqa: E402
from ifrtpy.proxy.session import Session, kinds  # noqa: E402

from proxy_helpers import (ADD_ONE, WAIT_S, Delegating, M, RawSession,  # noqa: E402
                           compile_request, wait_for)


@pytest.fixture(scope="module")
def pjrt():
    return ifrt.get_client("pjrt", device_count=1)


class Interrupting(Delegating):
    """A Client whose compile raises KeyboardInterrupt, which is no ``Exception``."""

    def compile(self, *args, **kwargs):
        raise KeyboardInterrupt


def test_a_handler_raising_a_base_exception_ends_its_stream_with_an_error(pjrt):
    """The worker cannot answer such a request: its stream ends with INTERNAL naming the
    session (the client's later requests are not left unanswered), the session leaves the
    count, and other sessions are served."""
    with proxy.serve(Interrupting(pjrt)) as server, grpc.insecure_channel(server.address) as ch:
        broken = RawSession(ch)
        broken.send("compile_request", compile_request(ADD_ONE))
        broken.send("check_future_request", M.CheckFutureRequest(future_handle=1))
        with pytest.raises(grpc.RpcError) as ended:
            broken.receive()
        assert ended.value.code() == grpc.StatusCode.INTERNAL
        assert f"session {broken.id} ended: handling a request raised KeyboardInterrupt" in (
            ended.value.details())
        wait_for(lambda: not server.sessions(), "the broken session to leave the count")
        RawSession(ch).close()


class Blocking(Mapping):
    """A mapping whose listing waits for ``go`` once ``entered`` is set: a module's
    KINDS read slowly, as by a thread the system does not schedule for a while."""

    def __init__(self, inner):
        self.inner, self.entered, self.go = inner, threading.Event(), threading.Event()

    def keys(self):
        self.entered.set()
        assert self.go.wait(WAIT_S)
        return self.inner.keys()

    def __getitem__(self, key):
        return self.inner[key]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self.inner)


def test_a_concurrent_first_caller_never_sees_part_of_the_kinds(monkeypatch):
    """While one thread builds the table of request kinds, another thread's kinds() waits
    for it, and finds every kind (not those of the modules read so far)."""
    full = dict(kinds())
    slow = Blocking(executables.KINDS)
    monkeypatch.setattr(executables, "KINDS", slow)
    monkeypatch.setattr(session_module, "_KINDS", None)
    seen = {}
    first = threading.Thread(target=lambda: seen.setdefault("first", kinds()))
    first.start()
    assert slow.entered.wait(WAIT_S)
    second = threading.Thread(target=lambda: seen.setdefault("second", kinds()))
    second.start()
    second.join(1.0)  # a caller that does not wait returns a partial table meanwhile
    slow.go.set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert set(seen["second"]) == set(full)
    assert set(seen["first"]) == set(full)


def test_a_deferred_answer_is_bound_to_its_own_request(pjrt, monkeypatch):
    """Requests whose answers wait on futures are answered, each with its own op_id and
    kind, whatever the session handles meanwhile and in whichever order the futures
    complete."""
    promises = [ifrt.Promise() for _ in range(2)]
    table = dict(kinds())
    # a kind whose handler defers on the next promise: the request context is the
    # session's, not a "current request" read when the future completes
    table["check_future_request"] = Kind(lambda s, r: Later(promises[r.future_handle].future,
                                                            bytes), 3)
    monkeypatch.setattr(session_module, "_KINDS", table)
    answers = []
    session = Session(1, "test", pjrt, Limits(), 25, answers.append, Budget(1 << 30, "test"))

    def request(op_id, kind, message):
        wrapped = M.IfrtRequest()
        wrapped.request_metadata.op_id = op_id
        getattr(wrapped, kind).CopyFrom(message)
        return wrapped

    session.handle(request(10, "check_future_request", M.CheckFutureRequest(future_handle=0)))
    session.handle(request(11, "check_future_request", M.CheckFutureRequest(future_handle=1)))
    session.handle(request(12, "get_default_device_assignment_request",
                           M.GetDefaultDeviceAssignmentRequest(num_replicas=1,
                                                               num_partitions=1)))
    promises[1].set_result()
    promises[0].set_exception(InvalidArgumentError("the first future failed"))
    responses = [M.IfrtResponse.FromString(bytes(a)) for a in answers]
    assert [r.response_metadata.op_id for r in responses] == [12, 11, 10]
    assert [r.WhichOneof("response") for r in responses] == [
        "get_default_device_assignment_response", "check_future_response", None]
    assert responses[2].response_metadata.status.message == "the first future failed"
    session.close()


@pytest.mark.parametrize("limit, value, words", [
    ("max_sessions", 10 ** 12, "from 1 to 4096"),
    ("max_host_buffer_rpcs", 10 ** 9, "from 1 to 65536"),
    ("max_pending_requests", 10 ** 15, "from 1 to 1048576"),
    ("max_message_bytes", 1 << 31, "from 1 to 2147483647"),
    ("max_sessions", 0, "from 1 to 4096"),
    ("idle_timeout_s", 1e-9, "from 1 to 1e+07, or None for no idle timeout"),
    ("idle_timeout_s", float("inf"), "from 1 to 1e+07"),
])
def test_a_limit_out_of_its_range_is_refused_naming_it_and_the_range(pjrt, limit, value, words):
    with pytest.raises(InvalidArgumentError) as refused:
        proxy.serve(pjrt, **{limit: value})
    assert f"proxy limit {limit} must be" in str(refused.value)
    assert words in str(refused.value)
