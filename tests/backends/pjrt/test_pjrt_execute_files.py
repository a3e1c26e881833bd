"""How many of ifrtpy's files an ``exe(a)`` enters: the first call (the contract, in
Python) and a repeat (the C path), seen by the plain ``sys.setprofile`` hook of
``benchmarks/count_execute_files.py`` (``--plain``: the package as installed, whose Cython
functions the hook does not see, so a file counts when a Python function of it runs).
docs/pjrt-backend.md gives these figures and the script's with the Cython modules; a
change to either path that enters more files fails here first.

Each program runs in a fresh interpreter: what an earlier test cached (a sharding's
devices, a memo of placements) would hide files a first call enters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "count_execute_files.py"

#: The figures of docs/pjrt-backend.md ("Execute"): the ifrtpy files a plain hook sees the
#: first ``exe(a)`` and a repeated one enter.
EXPECTED = {
    "add": (5, 0),    # x + 1 on f32[8], one device
    "spmd": (10, 0),  # x * 2 + 1 on f32[128] split over 8 devices by a NamedSharding
}


@pytest.mark.parametrize("program", sorted(EXPECTED))
def test_files_entered_by_the_first_and_a_repeated_call(program):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--plain", "--json", "--program", program],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    first, repeated = json.loads(done.stdout.strip().splitlines()[-1])
    assert (len(first), len(repeated)) == EXPECTED[program], (
        f"{program}: the first exe(a) enters {first}, a repeat {repeated}; "
        f"docs/pjrt-backend.md and EXPECTED give {EXPECTED[program]}")
