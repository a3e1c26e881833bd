"""Test configuration shared by the whole suite.

* XLA_FLAGS gives jax 8 CPU devices (set before anything imports jax), so tests can
  compare against jax.sharding with the same meshes.
* Hypothesis profiles are ifrtpy's own (``ifrtpy.testing.strategies``): "ci" (the
  default here), "dev" and "debug"; choose with HYPOTHESIS_PROFILE.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings  # noqa: E402

from ifrtpy.testing import strategies  # noqa: E402,F401  (registers the profiles)

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
