"""Host memory the server reuses for copies out of devices.

A get copies the array into a host buffer, streams it and deletes it. Fresh memory for
each copy costs its page faults every time, about as much as the copy itself (on a TPU
machine's sandbox twice as much: 64 MiB copied in 11 ms into mapped memory, 38-42 ms into
fresh). So a deleted host buffer's memory is kept, up to :data:`KEPT_BYTES` in all, and
the next copy out of the same size writes into it. Memory is given back only when nothing
reads it any more, which the host-buffer store knows (:mod:`ifrtpy.proxy.host_buffers`:
a buffer a lookup streams goes back when the lookup ends; one a request consumed, which
an array may alias, never does); reference counts, which Python may read lower than the
references held, decide nothing here.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

import numpy as np

__all__ = ["POOL", "HostPool", "KEPT_BYTES", "machine_memory"]


def machine_memory() -> int:
    """The memory this process may use: the machine's, or its cgroup's limit where lower
    (the proxy's default host-buffer budgets are its half for the server and
    its quarter for a session)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 16 << 30
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                memory = min(memory, int(f.read().strip()))
        except (OSError, ValueError):  # none, or "max"
            pass
    return memory


#: Bytes of deleted host buffers kept for reuse, at most.
KEPT_BYTES = min(2 << 30, machine_memory() // 16)
#: A buffer smaller than this is not kept: malloc reuses small blocks itself.
SMALLEST = 1 << 20


class HostPool:
    """Deleted host buffers' memory, by size (see the module docstring); any thread."""

    def __init__(self, limit: int = KEPT_BYTES):
        self.limit = limit
        self.kept = 0
        self._free: collections.OrderedDict[int, list[np.ndarray]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray | None:
        """A kept block of exactly ``nbytes`` (flat uint8, C-contiguous, its pages mapped),
        the session's alone from now on; None if none is kept."""
        with self._lock:
            blocks = self._free.get(nbytes)
            if not blocks:
                return None
            block = blocks.pop()
            if not blocks:
                del self._free[nbytes]
            self.kept -= nbytes
        return block

    def give(self, held: list[Any]) -> bool:
        """Keep the memory of the host buffer in ``held`` (a list of one, emptied), which
        nothing reads any more (the caller's promise: see the module docstring), where it
        is a flat block NumPy owns; whether it was kept."""
        data = held.pop()
        if not isinstance(data, np.ndarray):
            return False
        owner = data if data.base is None else data.base
        del data
        if (not isinstance(owner, np.ndarray) or not owner.flags.owndata
                or not owner.flags.c_contiguous or owner.nbytes < SMALLEST
                or owner.nbytes > self.limit):
            return False
        block = owner.reshape(-1).view(np.uint8)
        del owner
        with self._lock:
            while self.kept + block.nbytes > self.limit:  # the oldest size goes first
                size, blocks = next(iter(self._free.items()))
                blocks.pop(0)
                self.kept -= size
                if not blocks:
                    del self._free[size]
            self._free.setdefault(block.nbytes, []).append(block)
            self._free.move_to_end(block.nbytes)
            self.kept += block.nbytes
        return True

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self.kept = 0


POOL = HostPool()

