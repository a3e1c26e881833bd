"""IFRT's conformance test libraries, ported to pytest (``xla/python/ifrt/*_impl_test_lib.cc``).

Each module defines plain ``test_*`` functions that take a ``client`` fixture and use
only the ifrtpy interfaces. A backend runs them by importing the module's tests into
one of its own test modules and providing the fixture (IFRT's ``RegisterClientFactory``)::

    import pytest
    import ifrtpy as ifrt
    from ifrtpy.testing.conformance.arrays import *  # noqa: F401,F403

    @pytest.fixture(scope="module")
    def client():
        return ifrt.get_client("mybackend")

Cases that need what a backend lacks (non-addressable devices, a second memory kind,
more devices) skip with the reason; operations a backend does not implement skip with
its ``UnimplementedError`` message. Deselect cases a backend knowingly fails with
pytest's ``-k``/``--deselect`` (IFRT's ``SetTestFilterIfNotUserSpecified``).

* :mod:`~ifrtpy.testing.conformance.arrays`: ``array_impl_test_lib`` and
  ``tuple_impl_test_lib``.
"""
