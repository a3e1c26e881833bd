"""Test configuration shared by the whole suite.

* XLA_FLAGS gives jax 8 CPU devices (set before anything imports jax), so tests can
  compare against jax.sharding with the same meshes.
* Hypothesis profiles: "ci" (default), "dev" (more examples), "debug" (verbose);
  choose with HYPOTHESIS_PROFILE.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import HealthCheck, Verbosity, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.register_profile("dev", max_examples=300, deadline=None)
settings.register_profile("debug", max_examples=20, deadline=None, verbosity=Verbosity.verbose)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
