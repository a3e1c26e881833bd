"""Testing support for ifrtpy and its backends.

* :mod:`ifrtpy.testing.strategies`: hypothesis strategies for dtypes, shapes, host
  arrays, meshes, partition specs and shardings (needs ``hypothesis``).
* :mod:`ifrtpy.testing.conformance`: IFRT's implementation-agnostic conformance cases,
  run by each backend's test module against its own ``client`` fixture (needs ``pytest``).
"""
