"""The jax backend: ifrtpy's interfaces over jax's runtime (``jax.Array`` and jaxlib's
client), for every platform jax runs on, multi-process included.

``ifrtpy.get_client("jax")`` gives a client over the runtime of the platform jax picks
(``platform="cpu"`` etc. names one; ``device_count=N`` sets jax's CPU device count when
jax has not started yet). Devices and memories are jax's; an array holds a ``jax.Array``
whose sharding is the ifrtpy one converted by :mod:`ifrtpy.backends.jax_shardings`; programs are
compiled and run by jaxlib. jax is imported only when this backend is asked for
(``pip install ifrtpy[jax]``). Every private jax/jaxlib name it uses is in :mod:`ifrtpy._jaxlib`.
Several processes: :func:`ifrtpy.distributed.initialize_distributed` in each, before
anything uses jax.
"""

from ifrtpy.backends.jax.array import JaxArray
from ifrtpy.backends.jax.client import JaxClient, JaxDevice, create_client
from ifrtpy.distributed import initialize_distributed
from ifrtpy.backends.jax.executable import JaxCompiler, JaxLoadedExecutable

__all__ = ["JaxArray", "JaxClient", "JaxDevice", "JaxCompiler",
           "JaxLoadedExecutable", "create_client", "initialize_distributed"]
