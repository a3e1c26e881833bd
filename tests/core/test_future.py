"""ifrtpy.future: IFRT future_test cases, Promise rules, callbacks and thread safety."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ifrtpy.errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
)
from ifrtpy.future import Future, Promise, join_futures

# -- IFRT future_test.cc -----------------------------------------------------------------


def test_join_zero_future():
    fut = join_futures([])
    assert fut.done()
    assert fut.result() is None


def test_join_one_ok_future():
    p = Promise()
    fut = join_futures([p.future])
    assert not fut.done()
    p.set_result()
    assert fut.done()
    assert fut.result() is None and fut.exception() is None


def test_join_one_failing_future():
    p = Promise()
    fut = join_futures([p.future])
    assert not fut.done()
    p.set_exception(InvalidArgumentError("error"))
    assert fut.done()
    with pytest.raises(InvalidArgumentError, match="error"):
        fut.result()


def test_join_all_ok_futures():
    promises = [Promise() for _ in range(3)]
    fut = join_futures([p.future for p in promises])
    for p in promises:
        assert not fut.done()
        p.set_result()
    assert fut.done() and fut.result() is None


def test_join_all_failing_futures():
    promises = [Promise() for _ in range(3)]
    fut = join_futures([p.future for p in promises])
    for p in promises:
        assert not fut.done()
        p.set_exception(InvalidArgumentError("error"))
    with pytest.raises(InvalidArgumentError, match="error"):
        fut.result()


@pytest.mark.parametrize("failing", [0, 1, 2])
def test_join_all_ok_futures_except_for_one(failing):
    promises = [Promise() for _ in range(3)]
    fut = join_futures([p.future for p in promises])
    for i, p in enumerate(promises):
        assert not fut.done()
        if i == failing:
            p.set_exception(InvalidArgumentError("error"))
        else:
            p.set_result()
    assert isinstance(fut.exception(), InvalidArgumentError)


# -- join details ------------------------------------------------------------------------


def test_join_picks_first_failing_input_in_order():
    promises = [Promise() for _ in range(3)]
    fut = join_futures([p.future for p in promises])
    promises[2].set_exception(InternalError("third"))
    promises[0].set_result()
    promises[1].set_exception(InvalidArgumentError("second"))
    assert str(fut.exception()) == "second"


def test_join_of_ready_futures_is_ready_at_once():
    assert join_futures([Future.ready(1), Future.ready(2)]).result() is None
    exc = InvalidArgumentError("x")
    assert join_futures([Future.ready(), Future.failed(exc)]).exception() is exc


def test_join_ignores_values_and_accepts_iterables():
    fut = join_futures(Future.ready(v) for v in range(4))
    assert fut.result() is None


def test_join_with_inputs_completed_from_many_threads():
    promises = [Promise() for _ in range(64)]
    fut = join_futures([p.future for p in promises])
    threads = [threading.Thread(target=p.set_result) for p in promises]
    for t in threads:
        t.start()
    assert fut.result(timeout=10) is None
    for t in threads:
        t.join()


# -- Future / Promise basics -----------------------------------------------------------------


def test_ready_and_failed_constructors():
    assert Future.ready().result() is None
    assert Future.ready(42).result() == 42
    assert Future.ready(42).is_ready()
    exc = InvalidArgumentError("bad")
    f = Future.failed(exc)
    assert f.done() and f.exception() is exc
    with pytest.raises(InvalidArgumentError, match="bad"):
        f.result()
    with pytest.raises(InvalidArgumentError):  # raising again works too
        f.result()


def test_failed_needs_an_exception_instance():
    with pytest.raises(InvalidArgumentError):
        Future.failed("not an exception")
    with pytest.raises(InvalidArgumentError):
        Promise().set_exception(ValueError)  # a class, not an instance


def test_promise_sets_value_once():
    p = Promise()
    assert not p.is_set() and not p.future.done()
    p.set_result([1, 2])
    assert p.is_set() and p.future.result() == [1, 2]
    with pytest.raises(FailedPreconditionError):
        p.set_result(3)
    with pytest.raises(FailedPreconditionError):
        p.set_exception(InternalError("late"))
    assert p.future.result() == [1, 2]


def test_promise_exception_then_second_set_raises():
    p = Promise()
    p.set_exception(InternalError("first"))
    with pytest.raises(FailedPreconditionError):
        p.set_result()
    assert str(p.future.exception()) == "first"


def test_pending_future_repr_and_done():
    p = Promise()
    assert "pending" in repr(p.future) and "unset" in repr(p)
    p.set_exception(InternalError("boom"))
    assert "InternalError" in repr(p.future) and "boom" in repr(p.future)
    assert "ready" in repr(Future.ready(1))


def test_result_timeout_raises_deadline_exceeded():
    fut = Promise().future
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        fut.result(timeout=0.02)
    with pytest.raises(TimeoutError):  # also a builtin TimeoutError
        fut.exception(timeout=0.0)
    assert time.monotonic() - t0 < 30  # about a hang only (the timeouts are 0.02 s and 0)


def test_generic_subscription():
    assert Future[int] is not None and Promise[str] is not None


# -- callbacks -----------------------------------------------------------------------------


def test_callback_runs_immediately_in_caller_thread_when_done():
    seen = []
    fut = Future.ready(7)
    fut.add_done_callback(lambda f: seen.append((f.result(), threading.get_ident())))
    assert seen == [(7, threading.get_ident())]


def test_callbacks_run_once_in_completing_thread_in_order():
    p = Promise()
    seen = []
    for i in range(3):
        p.future.add_done_callback(lambda f, i=i: seen.append((i, threading.get_ident())))
    assert seen == []
    t = threading.Thread(target=p.set_result, args=("v",))
    t.start()
    t.join()
    assert [i for i, _ in seen] == [0, 1, 2]
    assert {tid for _, tid in seen} == {t.ident}
    assert p.future.result() == "v"


def test_callback_sees_failure():
    p = Promise()
    got = []
    p.future.add_done_callback(lambda f: got.append(f.exception()))
    exc = InternalError("x")
    p.set_exception(exc)
    assert got == [exc]


def test_failing_callback_is_logged_and_others_still_run(caplog):
    p = Promise()
    seen = []

    def bad(_):
        raise RuntimeError("callback failure")

    p.future.add_done_callback(bad)
    p.future.add_done_callback(lambda f: seen.append(1))
    with caplog.at_level(logging.ERROR, logger="ifrtpy"):
        p.set_result()  # does not raise
    assert seen == [1]
    assert "callback failure" in caplog.text


def test_callback_may_add_callbacks_and_read_result():
    p = Promise()
    seen = []
    p.future.add_done_callback(
        lambda f: f.add_done_callback(lambda g: seen.append(g.result() + 1))
    )
    p.set_result(1)
    assert seen == [2]


# -- thread safety ---------------------------------------------------------------------------


def test_result_blocks_until_set_from_another_thread():
    p = Promise()
    order = []

    def later():
        time.sleep(0.05)  # the main thread waits in result() by then, as a rule
        order.append("set")
        p.set_result("done")

    t = threading.Thread(target=later)
    t.start()
    assert p.future.result(timeout=60) == "done"
    order.append("returned")
    assert order == ["set", "returned"]
    t.join()


def test_blocking_wait_releases_the_gil():
    # A thread blocked in result() must let this thread run Python code and complete it.
    p = Promise()
    out = []
    waiter = threading.Thread(target=lambda: out.append(p.future.result(timeout=10)))
    waiter.start()
    total = sum(range(200_000))  # pure-Python work while the waiter is blocked
    p.set_result(total)
    waiter.join(timeout=10)
    assert out == [total]


def test_many_waiters_all_wake():
    p = Promise()
    results = []
    lock = threading.Lock()

    def wait():
        v = p.future.result(timeout=10)
        with lock:
            results.append(v)

    threads = [threading.Thread(target=wait) for _ in range(16)]
    for t in threads:
        t.start()
    time.sleep(0.01)
    p.set_result(5)
    for t in threads:
        t.join()
    assert results == [5] * 16


@pytest.mark.parametrize("round_", range(5))
def test_concurrent_add_done_callback_while_completing(round_):
    p = Promise()
    n_threads, per_thread = 8, 200
    counts = [0] * (n_threads * per_thread)
    lock = threading.Lock()
    barrier = threading.Barrier(n_threads + 1)

    def make_cb(k):
        def cb(_):
            with lock:
                counts[k] += 1
        return cb

    def adder(t):
        barrier.wait()
        for j in range(per_thread):
            p.future.add_done_callback(make_cb(t * per_thread + j))

    def completer():
        barrier.wait()
        p.set_result()

    threads = [threading.Thread(target=adder, args=(t,)) for t in range(n_threads)]
    threads.append(threading.Thread(target=completer))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == [1] * len(counts)  # every callback ran exactly once


def test_racing_setters_exactly_one_wins():
    p = Promise()
    wins, losses = [], []
    barrier = threading.Barrier(8)

    def setter(i):
        barrier.wait()
        try:
            p.set_result(i)
            wins.append(i)
        except FailedPreconditionError:
            losses.append(i)

    threads = [threading.Thread(target=setter, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 7
    assert p.future.result() == wins[0]


# -- asyncio ---------------------------------------------------------------------------------


def test_await_pending_future_completed_from_thread():
    p = Promise()

    async def main():
        threading.Timer(0.01, p.set_result, args=(3,)).start()
        return await p.future

    assert asyncio.run(main()) == 3


def test_await_ready_and_failed_futures():
    async def main():
        a = await Future.ready("a")
        with pytest.raises(InternalError):
            await Future.failed(InternalError("x"))
        return a

    assert asyncio.run(main()) == "a"


# -- property: join_futures against a plain model ---------------------------------------------


@given(st.data())
def test_join_matches_model_for_any_completion_order(data):
    outcomes = data.draw(st.lists(st.booleans(), max_size=8), label="fails")
    order = data.draw(st.permutations(range(len(outcomes))), label="order")
    promises = [Promise() for _ in outcomes]
    joined = join_futures([p.future for p in promises])
    for step, i in enumerate(order):
        assert not joined.done()  # not before the last input is set
        if outcomes[i]:
            promises[i].set_exception(InvalidArgumentError(f"failure {i}"))
        else:
            promises[i].set_result(i)
    assert joined.done()
    failing = [i for i, fails in enumerate(outcomes) if fails]
    if failing:
        assert str(joined.exception()) == f"failure {failing[0]}"
    else:
        assert joined.result() is None
