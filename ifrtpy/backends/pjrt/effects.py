"""Ordered effects of PjRt executables: the ``!stablehlo.token`` parameters and results of
programs with ordered host callbacks (``io_callback(ordered=True)``).

A caller passes and gets arrays only; the tokens are threaded here. Ordering is per
device, as jax's runtime tokens are: for each client, device and token slot, a chain
holds the token the last execute on that device returned, and the next execute of any
program with ordered effects on that device takes it, so that the plugin runs their
effects in the order of the executes. The first execute takes a PRED[0] buffer, as jax
does. Token buffers are never read, copied or shown: the plugin aborts on reading one to
the host.

An execute claims its devices from taking their tokens until it has stored its own: an
execute on a device another thread is launching on waits for that launch to return (its
effects come after); one on other devices does not wait. No lock is held while a launch
(and the callbacks it runs inline) runs, and a callback may itself execute programs with
ordered effects on the devices its execute claimed: the thread holding a claim may claim
again, and the nested execute takes the device's current token.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from ifrtpy import _pjrt
from ifrtpy.program import HloProgram

__all__ = ["OrderedEffects"]


class _Chains:
    """A client's token chains, ``(device id, slot) -> token BufferHandle``, and the claims
    of the executes launching: ``device id -> [thread ident, depth]``. Only the thread
    holding a device's claim reads or writes that device's tokens."""

    def __init__(self) -> None:
        self.tokens: dict[tuple[int, int], Any] = {}
        self._claims: dict[int, list[int]] = {}
        self._released = threading.Condition(threading.Lock())

    def claim(self, device_ids: Sequence[int]) -> None:
        """Wait until no other thread claims any of ``device_ids``, then claim them all."""
        me = threading.get_ident()
        with self._released:
            self._released.wait_for(lambda: all(
                self._claims[i][0] == me for i in device_ids if i in self._claims))
            for i in device_ids:
                self._claims.setdefault(i, [me, 0])[1] += 1

    def release(self, device_ids: Sequence[int]) -> None:
        with self._released:
            for i in device_ids:
                claim = self._claims[i]
                claim[1] -= 1
                if claim[1] == 0:
                    del self._claims[i]
            self._released.notify_all()


_chains: weakref.WeakKeyDictionary[Any, _Chains] = weakref.WeakKeyDictionary()
_chains_lock = threading.Lock()


def _chains_of(client: Any) -> _Chains:
    with _chains_lock:
        chains = _chains.get(client)
        if chains is None:
            chains = _chains[client] = _Chains()
        return chains


class OrderedEffects:
    """The token parameters and results of one program, threaded through its executes."""

    def __init__(self, client: Any, program: HloProgram):
        self._client = client
        self._token_parameters = program.token_parameters
        self._token_results = frozenset(program.token_results)
        count = len(program.parameters) + len(self._token_parameters)
        #: The position in main of each array parameter (caller index -> main index).
        self.array_positions = [i for i in range(count) if i not in self._token_parameters]

    def main_indices(self, indices: Sequence[int]) -> list[int]:
        """Caller's parameter indices as indices into main's parameters."""
        return [self.array_positions[i] for i in indices]

    def launch(self, run: Callable[..., tuple[Any, Any]], arguments: list[Any], launch_id: int,
               non_donatable: Sequence[int], device: Any, donated: Sequence[int],
               devices: Sequence[Any]) -> tuple[list[Any], Any]:
        """``(outputs, events)`` of a launch with ``arguments`` (one tuple of per-device
        buffers each, without tokens) on ``devices`` (``device`` for a portable executable,
        else None), the tokens put in and kept (:meth:`run`): ``run(main_arguments,
        launch_id, non_donatable, device_handle, donated)`` runs the executable on main's
        parameters (the executable's ``_launch_buffers``); ``non_donatable`` and ``donated``
        are the caller's parameter indices."""
        main_non_donatable = self.main_indices(non_donatable)
        main_donated = self.main_indices(sorted(donated))
        device_handle = None if device is None else device._handle
        return self.run(lambda main_arguments: run(main_arguments, launch_id, main_non_donatable,
                                                   device_handle, main_donated),
                        arguments, devices)

    def run(self, launch: Callable[[list[Any]], tuple[Any, Any]], arguments: list[Any],
            devices: Sequence[Any]) -> tuple[list[Any], Any]:
        """``launch(main_arguments)`` -> ``(outputs, events)`` with the token arguments put
        in (by argument: one tuple of per-device buffers each), the output tokens kept for
        the next execute on each device; returns the array outputs and the events."""
        chains = _chains_of(self._client)
        device_ids = [d.id for d in devices]
        chains.claim(device_ids)
        try:
            full = list(arguments)
            for slot, position in enumerate(self._token_parameters):
                full.insert(position, tuple(self._token(chains, d, slot) for d in devices))
            outputs, events = launch(full)
            slot = 0
            for position, output in enumerate(outputs):
                if position in self._token_results:
                    for device_id, token in zip(device_ids, output):
                        chains.tokens[(device_id, slot)] = token
                    slot += 1
        finally:
            chains.release(device_ids)
        return [o for i, o in enumerate(outputs) if i not in self._token_results], events

    def _token(self, chains: _Chains, device: Any, slot: int) -> Any:
        """The token the last execute on ``device`` returned in ``slot``, else a first one."""
        token = chains.tokens.get((device.id, slot))
        return token if token is not None else self._first_token(device)

    def _first_token(self, device: Any) -> Any:
        buffer, _ = _pjrt.buffer_from_host_buffer(
            self._client._handle, np.zeros(0, np.bool_), device._handle)
        return buffer
