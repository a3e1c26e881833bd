"""Several processes, one job: the coordination service and the plugins' key-value store.

``initialize(coordinator_address, num_processes, process_id)`` works as
``jax.distributed.initialize``: process 0 starts the job's coordinator (a process of its
own, :mod:`ifrtpy.distributed._coordinator`) at ``coordinator_address``; once all
``num_processes`` processes have met there (:mod:`ifrtpy.distributed._join`), it serves
jaxlib's coordination service
there, and every process connects to it. PJRT clients created afterwards get
``node_id`` / ``num_nodes`` (for plugins whose create options have them: CUDA, ROCm) and
the key-value callbacks of ``PJRT_Client_Create``, which read and write the service's
key-value store; a multi-process plugin exchanges its topology there, and the devices of
other processes appear as non-addressable devices with their ``process_index``.

jax's runtime is handed the same client when ``get_client("jax")`` starts it, or at once
with ``backend="jax"`` (:mod:`ifrtpy.distributed.jax_runtime`).

``initialize()`` without arguments finds the job in the environment its launcher set
(:mod:`ifrtpy.distributed.clusters`): ``python -m ifrtpy launch``, Open MPI's ``mpirun``,
SLURM's ``srun``, a Kubernetes Indexed Job.

Failures are Python errors of :mod:`ifrtpy.errors` within the timeouts given: no process's
end takes the service from the others (jaxlib's client ends, SIGABRT, any process whose
service is gone; only the coordinator's own end would do that). See :func:`initialize`.

The service has no authentication (as jax's): it listens exactly at the address given,
and anyone who can reach it can join the job or read and write its keys. Use a loopback
or private-network address.
"""

from ifrtpy.distributed.job import COLLECTIVE_TIMEOUT_S as COLLECTIVE_TIMEOUT_S
from ifrtpy.distributed.job import attach_jax_runtime as attach_jax_runtime
from ifrtpy.distributed.job import CoordinationStore as CoordinationStore
from ifrtpy.distributed.job import initialize as initialize
from ifrtpy.distributed.job import initialize_distributed as initialize_distributed
from ifrtpy.distributed.job import is_initialized as is_initialized
from ifrtpy.distributed.job import job_backend as job_backend
from ifrtpy.distributed.job import key_value_store as key_value_store
from ifrtpy.distributed.job import num_processes as num_processes
from ifrtpy.distributed.job import process_id as process_id
from ifrtpy.distributed.job import shutdown as shutdown

__all__ = [
    "initialize", "initialize_distributed", "shutdown", "is_initialized", "job_backend",
    "process_id", "num_processes", "key_value_store", "CoordinationStore",
    "attach_jax_runtime",
]
