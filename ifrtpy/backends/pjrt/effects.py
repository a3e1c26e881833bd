"""Ordered effects of PjRt executables: the ``!stablehlo.token`` parameters and results of
programs with ordered host callbacks (``io_callback(ordered=True)``).

A caller passes and gets arrays only; the tokens are threaded here. For each client, one
chain per device set and token slot holds the token the last execute returned, and the
next execute of any program with ordered effects on those devices takes it, so that the
plugin runs their effects in the order of the executes (as jax's runtime tokens do). The
first execute takes a PRED[0] buffer, as jax does. Token buffers are never read, copied or
shown: the plugin aborts on reading one to the host.
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
    """A client's token chains: ``(device ids, slot) -> per-device token BufferHandles``.
    The lock is re-entrant: a host callback run inline by the launching thread may
    execute another program with ordered effects."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.tokens: dict[tuple[tuple[int, ...], int], tuple[Any, ...]] = {}


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

    def run(self, launch: Callable[[list[Any]], tuple[Any, Any]], arguments: list[Any],
            devices: Sequence[Any]) -> tuple[list[Any], Any]:
        """``launch(main_arguments)`` -> ``(outputs, events)`` with the token arguments put
        in (by argument: one tuple of per-device buffers each), the output tokens kept for
        the next execute; returns the array outputs and the events."""
        chains = _chains_of(self._client)
        key = tuple(d.id for d in devices)
        with chains.lock:
            full = list(arguments)
            for slot, position in enumerate(self._token_parameters):
                token = chains.tokens.get((key, slot))
                if token is None:
                    token = tuple(self._first_token(d) for d in devices)
                full.insert(position, token)
            outputs, events = launch(full)
            slot = 0
            for position, output in enumerate(outputs):
                if position in self._token_results:
                    chains.tokens[(key, slot)] = tuple(output)
                    slot += 1
        return [o for i, o in enumerate(outputs) if i not in self._token_results], events

    def _first_token(self, device: Any) -> Any:
        buffer, _ = _pjrt.buffer_from_host_buffer(
            self._client._handle, np.zeros(0, np.bool_), device._handle)
        return buffer
