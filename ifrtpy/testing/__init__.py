"""Testing support for ifrtpy and its backends.

* :mod:`ifrtpy.testing.strategies`: hypothesis strategies for dtypes, shapes, host
  arrays, meshes, partition specs and shardings (needs ``hypothesis``).
* :mod:`ifrtpy.testing.conformance`: IFRT's implementation-agnostic conformance cases,
  run by each backend's test module against its own ``client`` fixture and the skips it
  declares, or by the pytest plugin ``ifrtpy.testing.conformance.plugin`` (needs ``pytest``).
* :mod:`ifrtpy.testing.asserts`: per-shard comparisons of arrays against NumPy.
* :mod:`ifrtpy.testing.example_backend`: the smallest complete backend, a worked example
  (see docs/implementing-a-backend.md), and the fake backend of ifrtpy's own tests
  (devices that are not addressable, the memory kinds you name).
"""
