"""The old path of :func:`ifrtpy.distributed.initialize_distributed` (the jax backend's
multi-process runs: :mod:`ifrtpy.distributed.jax_runtime`), kept for one release."""

import warnings

from ifrtpy.distributed import initialize_distributed as initialize_distributed

__all__ = ["initialize_distributed"]

warnings.warn("ifrtpy.backends.jax.distributed is now ifrtpy.distributed "
              "(initialize_distributed)", DeprecationWarning, stacklevel=2)
