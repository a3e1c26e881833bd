"""Futures over jax values: ready when the value is, failing with its error (an ifrtpy
error); values not ready yet are waited on by a small thread pool."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable

from ifrtpy.backends.jax.calls import translate
from ifrtpy.future import Future, Promise

__all__ = ["future_of"]

_waiters: list[concurrent.futures.ThreadPoolExecutor] = []
_pools_lock = threading.Lock()


def _waiter() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that wait on jax values for futures that are not ready yet."""
    with _pools_lock:
        if not _waiters:
            _waiters.append(concurrent.futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="ifrtpy-jax-wait"))
        return _waiters[0]


def future_of(value: Any, result: Callable[[], Any] = lambda: None) -> Future[Any]:
    """A future that fails as jax value ``value`` does, else holds ``result()``."""
    def wait() -> Any:
        try:
            value.block_until_ready()
        except Exception as e:
            raise translate(e) from None
        return result()

    if value.is_ready():
        try:
            return Future.ready(wait())
        except Exception as e:
            return Future.failed(e)
    promise: Promise[Any] = Promise()

    def run() -> None:
        try:
            promise.set_result(wait())
        except BaseException as e:
            promise.set_exception(e)

    _waiter().submit(run)
    return promise.future
