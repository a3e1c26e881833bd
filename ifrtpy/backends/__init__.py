"""Backends implementing ifrtpy's interfaces: ``pjrt`` (any PJRT plugin, through the
Cython layer). Each registers a factory by name with :func:`ifrtpy.client.register_backend`."""
