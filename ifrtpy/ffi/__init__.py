"""Custom calls through XLA FFI, with jax's names (see docs/custom-calls.md).

::

    import ctypes, ifrtpy
    lib = ctypes.cdll.LoadLibrary("./libscale.so")
    ifrtpy.ffi.register_ffi_target("scale", ifrtpy.ffi.pycapsule(lib.Scale), platform="cpu")

A program naming ``"scale"`` (from ``jax.ffi.ffi_call`` or ``Builder.ffi_call``) then runs
on the PjRt backend (the handler is registered with the plugin when a program needs it)
and on ``get_client("jax")`` (registered with jax's runtime). jaxlib's own kernels (LAPACK
behind ``jnp.linalg``, sparse) are registered on demand the same way, and host callbacks
(``jax.pure_callback``, ``io_callback``, ``jax.debug.print``) are served by ifrtpy.
"""

from ifrtpy.ffi._registry import (
    PLATFORMS, Target, add_listener, check_host_callables, execute_context, explain_compile_error,
    jaxlib_kernels, load_jaxlib_kernels, prepare, pycapsule, register_ffi_target,
    registered_targets,
)

__all__ = ["register_ffi_target", "pycapsule", "registered_targets", "Target", "PLATFORMS",
           "add_listener", "prepare", "execute_context", "explain_compile_error", "jaxlib_kernels",
           "check_host_callables", "load_jaxlib_kernels"]
