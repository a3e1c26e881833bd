"""Test configuration shared by the whole suite.

* XLA_FLAGS gives jax 8 CPU devices (set before anything imports jax), so tests can
  compare against jax.sharding with the same meshes.
* Hypothesis profiles are ifrtpy's own (``ifrtpy.testing.strategies``): "ci" (the
  default here), "dev" and "debug"; choose with HYPOTHESIS_PROFILE.
* tests/helpers (shared fixtures and helpers, worker scripts, data) goes on
  ``sys.path``, so test modules in every folder import ``pjrt_helpers``,
  ``builder_helpers``, ... by name. The folders mirror the package (tests/core for the
  top-level modules, tests/sharding, tests/program, tests/ffi, tests/pjrt_layer for _pjrt,
  tests/backends/..., ...) and are not packages: every test module's
  basename is unique across tests/.
"""

import os
import pathlib
import sys

HELPERS = pathlib.Path(__file__).resolve().parent / "helpers"
if str(HELPERS) not in sys.path:
    sys.path.insert(0, str(HELPERS))

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings  # noqa: E402

from ifrtpy.testing import strategies  # noqa: E402,F401  (registers the profiles)

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
