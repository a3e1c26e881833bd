"""How many executions a PJRT platform's plugin runs at once on one device, where that was
measured: the limit of executes made inside host callbacks.

A host callback that executes (docs/host-callbacks.md: callbacks may call ifrtpy) holds
its own execution in flight. Where the plugin admits at most N executions per device at
once, the next one waits inside ``PJRT_LoadedExecutable_Execute`` for a slot that only the
waiting executions would free: executes nested N deep through callbacks, or N threads
whose callbacks each execute on one device, block for good. The PjRt backend refuses such
an execute instead (ResourceExhaustedError; the rule is
``ifrtpy.backends.pjrt._execute_launch.nested_execute_refusal``, the count of executions in
flight ``ifrtpy._pjrt``'s ``callback_executions``).

The XLA CPU plugins (the official build at PJRT 0.81 and fastatomstruct's at 0.106) admit
32 (XLA's ``max_inflight_computations`` semaphore in the CPU client's Execute): depth 31
runs, depth 32 blocked before the limit was applied. Other platforms have not been
measured: nothing is refused there (list one once measured).
"""

from __future__ import annotations

import types
from typing import Mapping

__all__ = ["MAX_EXECUTIONS_PER_DEVICE", "max_executions_per_device"]

#: platform name -> the most executions its plugin runs at once on one device.
MAX_EXECUTIONS_PER_DEVICE: Mapping[str, int] = types.MappingProxyType({"cpu": 32})


def max_executions_per_device(platform_name: str) -> int | None:
    """The limit of executions in flight per device on ``platform_name``; None where not
    measured (no execute is refused there)."""
    return MAX_EXECUTIONS_PER_DEVICE.get(platform_name)
