"""Custom calls through XLA FFI, with jax's names (see docs/custom-calls.md).

::

    import ctypes, ifrtpy
    lib = ctypes.cdll.LoadLibrary("./libscale.so")
    ifrtpy.ffi.register_ffi_target("scale", ifrtpy.ffi.pycapsule(lib.Scale), platform="cpu")

A program naming ``"scale"`` (from ``jax.ffi.ffi_call`` or ``Builder.ffi_call``) then runs
on the PjRt backend (which registers the handler with its plugin when a program needs it:
``ifrtpy.backends.pjrt.ffi``) and on ``get_client("jax")`` (registered with jax's
runtime). jaxlib's own kernels (LAPACK behind ``jnp.linalg``, sparse) are registered on
demand the same way, and host callbacks (``jax.pure_callback``, ``io_callback``,
``jax.debug.print``) are served by ifrtpy.
"""

from ifrtpy.ffi._registry import (
    PLATFORMS, Target, add_listener, canonical_platform, check_host_callables, jaxlib_kernels,
    load_jaxlib_kernels, pycapsule, register_ffi_target, registered_targets,
)

__all__ = ["register_ffi_target", "pycapsule", "registered_targets", "Target", "PLATFORMS",
           "add_listener", "canonical_platform", "jaxlib_kernels", "check_host_callables",
           "load_jaxlib_kernels"]
