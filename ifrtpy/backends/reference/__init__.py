"""The reference backend: IFRT's interfaces in pure Python + NumPy, programs run in NumPy.

``ifrtpy.get_client("reference", device_count=8)`` gives a client of N virtual CPU
devices, each with three memories (``device``, the default, ``pinned_host`` and
``unpinned_host``, as the CPU plugin has). An array is one NumPy array per addressable
shard, in the sharding's device order. Programs are the StableHLO the PjRt backend takes;
they run in the NumPy evaluator (:mod:`.numpy_eval`) on the *global* values where it
implements every op (else in jaxlib's StableHLO interpreter, ``stablehlo.eval_module``):
sharding annotations are identities, the inputs are gathered, and the outputs are split
by the compiled output shardings (the program's, or Shardy's propagation where it leaves
one open). A manual computation (shard_map's ``sdy.manual_computation``) runs once per
device on that device's shard, its collectives computed in NumPy across the devices
(:mod:`.per_device`); unreduced values are held as partial values (:mod:`.partials`). A
program over replicas (``num_replicas``, one partition) runs on each replica's own
values, its collectives computed between the runs (:mod:`.replicas`). What the
interpreter lacks (FFT, Cholesky, triangular solves, XLA's stateful RNG and jaxlib's
LAPACK custom calls) is computed with NumPy and SciPy between its runs (:mod:`.kernels`,
:mod:`.stages`). The platform is ``cpu``, so jax lowers for the CPU through the IFRT Proxy.
Programs run in worker processes (:mod:`.pool`), so a running program holds neither
the GIL nor any lock of this process (but while a LAPACK kernel computes), and cannot take
it down.

The backend is slow and simple on purpose: it is the executable specification the other
backends are compared against, and a worked example of implementing the interfaces.
"""

from ifrtpy.backends.reference.array import ReferenceArray
from ifrtpy.backends.reference.client import (
    ReferenceClient, ReferenceDevice, create_client,
)
from ifrtpy.backends.reference.executable import ReferenceCompiler, ReferenceLoadedExecutable

__all__ = [
    "ReferenceArray", "ReferenceClient", "ReferenceDevice",
    "ReferenceCompiler", "ReferenceLoadedExecutable", "create_client",
]
