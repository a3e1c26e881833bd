"""Futures over PJRT events (``ifrtpy.backends.pjrt.events``): ready, failed and pending
events, checked with stand-in events that record which calls the future made (a blocking
``result()`` awaits the events and registers no callback; a wait with a timeout or a
callback registers the ready callbacks, once)."""

import threading

import numpy as np
import pytest

from ifrtpy import errors, join_futures
from ifrtpy.backends.pjrt.events import future_of_events


class StandInEvent:
    """The EventHandle interface over a threading.Event; records on_ready and await_
    calls. ``await_`` raises the event's error, as EventHandle's does."""

    def __init__(self, error=None):
        self._fired = threading.Event()
        self._error = error
        self._callbacks = []
        self._lock = threading.Lock()
        self.registered = 0
        self.awaited = 0

    def await_(self):
        self.awaited += 1
        self._fired.wait()
        if self._error is not None:
            raise self._error

    def is_ready(self):
        return self._fired.is_set()

    def error(self):
        assert self._fired.is_set(), "error() of a pending event"
        return self._error

    def on_ready(self, callback):
        with self._lock:
            self.registered += 1
            if not self._fired.is_set():
                self._callbacks.append(callback)
                return
        callback(self._error)

    def fire(self):
        with self._lock:
            self._fired.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self._error)


def fire_later(*events, delay=0.05):
    timer = threading.Timer(delay, lambda: [e.fire() for e in events])
    timer.start()
    return timer


def test_events_already_fired_give_a_ready_or_failed_future():
    ok, bad = StandInEvent(), StandInEvent(error=errors.InternalError("boom"))
    ok.fire(), bad.fire()
    assert future_of_events([ok], "v").result() == "v"
    assert isinstance(future_of_events([ok, bad]).exception(), errors.InternalError)
    assert ok.registered == bad.registered == 0


def test_a_blocking_result_awaits_the_events_and_registers_no_callback():
    events = [StandInEvent() for _ in range(8)]
    future = future_of_events(events, "value")
    assert not future.done() and not future.is_ready()
    fire_later(*events)
    assert future.result() == "value" and future.result() == "value"
    assert future.done() and future.is_ready()
    assert [e.registered for e in events] == [0] * 8
    assert [e.awaited for e in events] == [1] * 8


def test_an_event_that_cannot_be_awaited_is_waited_for_by_callback():
    """A zero-copy buffer's done event refuses an await while the buffer lives: the wait
    falls back to the callbacks, and completes when the event fires."""
    class Unawaitable(StandInEvent):
        def await_(self):
            raise errors.FailedPreconditionError("would never return")

    events = [Unawaitable(), StandInEvent()]
    future = future_of_events(events, "v")
    fire_later(*events)
    assert future.result() == "v"
    assert [e.registered for e in events] == [1, 1]


def test_a_wait_with_a_timeout_registers_the_callbacks_once():
    events = [StandInEvent() for _ in range(3)]
    future = future_of_events(events, "value")
    fire_later(*events)
    assert future.result(timeout=30) == "value" and future.result(timeout=30) == "value"
    assert [e.registered for e in events] == [1, 1, 1] and [e.awaited for e in events] == [0] * 3


def test_an_event_whose_callback_the_plugin_refuses_fails_the_future():
    class Refusing(StandInEvent):
        def on_ready(self, callback):
            raise errors.InternalError("no callbacks today")

    events = [StandInEvent(), Refusing()]
    future = future_of_events(events, "value")
    with pytest.raises(errors.InternalError, match="no callbacks today"):
        future.result(timeout=5)


def test_done_turns_true_once_the_events_fired_without_callbacks():
    events = [StandInEvent(), StandInEvent()]
    future = future_of_events(events, 1)
    events[0].fire()
    assert not future.done()
    events[1].fire()
    assert future.done() and future.result() == 1
    assert [e.registered for e in events] == [0, 0]


def test_the_first_error_of_the_events_fails_the_future():
    events = [StandInEvent(), StandInEvent(error=errors.AbortedError("first")),
              StandInEvent(error=errors.InternalError("second"))]
    future = future_of_events(events, "v")
    fire_later(*events)
    with pytest.raises(errors.AbortedError, match="first"):
        future.result()


def test_callbacks_register_once_and_run_once():
    events = [StandInEvent() for _ in range(3)]
    future = future_of_events(events, "v")
    seen = []
    future.add_done_callback(lambda f: seen.append(("a", f.result())))
    future.add_done_callback(lambda f: seen.append(("b", f.result())))
    assert [e.registered for e in events] == [1, 1, 1]
    for e in events:
        e.fire()
    assert seen == [("a", "v"), ("b", "v")]
    future.add_done_callback(lambda f: seen.append(("c", f.result())))  # already done: now
    assert seen[-1] == ("c", "v") and [e.registered for e in events] == [1, 1, 1]


def test_a_wait_with_a_timeout_expires_then_succeeds():
    events = [StandInEvent()]
    future = future_of_events(events, "v")
    with pytest.raises(errors.DeadlineExceededError):
        future.result(timeout=0.01)
    events[0].fire()
    assert future.result(timeout=5) == "v"


def test_many_threads_waiting_and_joined_futures_all_see_the_value():
    events = [StandInEvent() for _ in range(4)]
    futures = [future_of_events(events[:k + 1], k) for k in range(4)]
    joined = join_futures(futures)
    results = []
    threads = [threading.Thread(target=lambda f=f: results.append(f.result()))
               for f in futures * 3]
    for t in threads:
        t.start()
    fire_later(*events)
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == sorted([0, 1, 2, 3] * 3)
    assert joined.result(timeout=30) is None


def test_a_sharded_array_read_equals_numpy():
    """The shards of an array read into one host array: rows straight into it, columns
    through staging arrays, under one future."""
    import ifrtpy as ifrt

    client8 = ifrt.get_client(device_count=8)
    mesh = ifrt.Mesh(np.array(client8.devices()).reshape(4, 2), ("a", "b"))
    data = np.random.default_rng(0).random((16, 6), dtype=np.float32)
    for spec in (ifrt.PartitionSpec("a", "b"), ifrt.PartitionSpec("a"),
                 ifrt.PartitionSpec(None, "b"), ifrt.PartitionSpec()):
        array = client8.make_array_from_host_buffer(data, ifrt.NamedSharding(mesh, spec))
        np.testing.assert_array_equal(np.asarray(array), data)
        np.testing.assert_array_equal(array.copy_to_host_buffer().result(timeout=30), data)
