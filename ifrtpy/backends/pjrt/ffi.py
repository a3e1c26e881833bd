"""The PjRt backend's custom calls: the targets of :mod:`ifrtpy.ffi` registered with PJRT
plugins, and the execute contexts of host callbacks.

A target is registered with a plugin when a program compiled by it names the target (or
at once, with the plugins that have compiled before: this module listens to the
registry). jaxlib's own kernels (LAPACK, sparse) are registered the same way, on demand,
and ifrtpy's handlers of host callbacks and of ``dce_sink`` too. Before a handler reaches
a plugin, the XLA FFI version it claims is compared with the plugin's: a plugin takes
handlers claiming its own version or an older one (from 0.1) and silently drops the
others, so those are refused here, with both versions named. A refusal is remembered per
plugin and target, and raised again by every compile that needs the target.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ifrtpy import _pjrt
from ifrtpy._pjrt import _ffi, _host_callback
from ifrtpy.backends.pjrt.host_callbacks import serving
from ifrtpy.errors import (
    FailedPreconditionError, IfrtError, NotFoundError, UnimplementedError, combined,
)
from ifrtpy.ffi import (
    PLATFORMS, Target, add_listener, canonical_platform, check_host_callables, jaxlib_kernels,
    load_jaxlib_kernels, registered_targets,
)
from ifrtpy.program import HloProgram
from ifrtpy.program.hlo import CPU_HOST_CALLBACK_TARGETS, HOST_CALLBACK_TARGETS

__all__ = ["prepare", "execute_context", "explain_compile_error"]

#: Targets ifrtpy serves itself, with a handler that does nothing.
_NOOP_TARGETS = frozenset({"dce_sink"})

_lock = threading.RLock()
_registered: set[tuple[str, str]] = set()  # (plugin path, target) registered
_refused: dict[tuple[str, str], IfrtError] = {}  # (plugin path, target) -> why not
_plugins: dict[str, tuple[_pjrt.PluginHandle, str]] = {}  # path -> (plugin, platform) seen compiling


def _plugin_name(plugin: _pjrt.PluginHandle) -> str:
    major, minor = plugin.api_version
    return f"the plugin {os.path.basename(plugin.path)} (PJRT {major}.{minor})"


def _check_registrable(plugin: _pjrt.PluginHandle, target: Target) -> None:
    what = ("jaxlib's kernel" if target.source == "jaxlib" else "custom call target")
    if target.api_version != 1:
        raise UnimplementedError(
            f"{what} {target.name!r} is a legacy custom call (api_version=0): PJRT plugins "
            f"register typed XLA FFI handlers only (api_version=1); get_client('jax') runs "
            f"legacy targets")
    if set(target.handlers) != {"execute"}:
        raise UnimplementedError(
            f"{what} {target.name!r} has stages {sorted(target.handlers)}: a PJRT plugin's FFI "
            f"extension registers the execute stage only")
    framework = _ffi.framework_version(plugin)
    major, minor, _ = _ffi.handler_metadata(plugin, target.execute)
    if major == framework[0] and 1 <= minor <= framework[1]:
        return
    hint = (" (jnp.linalg and jax.scipy.linalg call these kernels): use a CPU plugin whose "
            "XLA runs that version or newer, or get_client('jax')" if target.source == "jaxlib"
            else ": build the handler against XLA FFI headers of that version or older, or "
                 "use a plugin whose XLA runs the handler's version")
    raise FailedPreconditionError(
        f"{what} {target.name!r} is built for XLA FFI {major}.{minor}; {_plugin_name(plugin)} "
        f"runs XLA FFI {framework[0]}.{framework[1]} and takes handlers built for 0.1 to that "
        f"version{hint}")


def _register_with(plugin: _pjrt.PluginHandle, target: Target) -> None:
    key = (plugin.path, target.name)
    with _lock:
        if key in _registered:
            return
        refused = _refused.get(key)
        if refused is not None:
            raise type(refused)(str(refused))
        try:
            _check_registrable(plugin, target)
            _ffi.register_handler(plugin, target.name, target.execute, PLATFORMS[target.platform])
        except IfrtError as e:
            _refused[key] = e
            raise
        _registered.add(key)


def _on_registered(target: Target) -> None:
    """A target just registered with ifrtpy, registered at once with the plugins of its
    platform that have compiled before; the plugins' refusals in one error."""
    with _lock:
        plugins = [p for p, platform in _plugins.values() if platform == target.platform]
    errors = []
    for plugin in plugins:
        try:
            _register_with(plugin, target)
        except IfrtError as e:
            errors.append(e)
    if errors:
        raise combined(errors)


add_listener(_on_registered)


def _builtin(platform: str, name: str) -> Target | None:
    """jaxlib's kernel or ifrtpy's own handler for ``name`` on ``platform``, if any."""
    if name in _NOOP_TARGETS:
        return Target(name, platform, {"execute": _ffi.noop_handler()}, 1, "ifrtpy")
    kernels = jaxlib_kernels(platform)
    if name in kernels:
        load_jaxlib_kernels(platform, frozenset({name}))
        return Target(name, platform, {"execute": kernels[name]}, 1, "jaxlib")
    return None


def prepare(plugin: _pjrt.PluginHandle, platform: str, program: HloProgram,
            num_devices: int) -> int | None:
    """Make ``plugin`` (of a client of ``platform``) ready to compile ``program`` for
    ``num_devices`` devices: register every target the program names that ifrtpy knows
    (registered ones, jaxlib's kernels, ifrtpy's own) and check its host callbacks. Returns
    the user data type id of host callback tables where the program makes host callbacks,
    else None. Targets nobody registered are left to the plugin, which refuses them by name
    (:func:`explain_compile_error`)."""
    targets = program.custom_call_targets
    known = canonical_platform(platform)
    if known is None:  # a platform ifrtpy has no handlers for: the plugin decides
        if targets & HOST_CALLBACK_TARGETS:
            raise UnimplementedError(f"ifrtpy runs host callbacks on CPU plugins only, not {platform}")
        return None
    platform = known
    with _lock:  # before the targets are read: a target registered meanwhile is seen by one
        _plugins.setdefault(plugin.path, (plugin, platform))
    registered = registered_targets(platform)
    for name in sorted(targets - HOST_CALLBACK_TARGETS):
        target = registered.get(name)
        if target is None:
            target = _builtin(platform, name)
        if target is not None:
            _register_with(plugin, target)
    if not targets & HOST_CALLBACK_TARGETS:
        return None
    _check_host_callbacks(program, platform, num_devices)
    with _lock:  # once per plugin, whichever thread compiles first
        return _host_callback.install(plugin, sorted(CPU_HOST_CALLBACK_TARGETS))


def _check_host_callbacks(program: HloProgram, platform: str, num_devices: int) -> None:
    targets = check_host_callables(program)
    if platform != "cpu":
        raise UnimplementedError(
            f"the program makes host callbacks ({', '.join(sorted(targets))}): ifrtpy runs host "
            f"callbacks on CPU plugins only, not {platform}")
    partitioned = sorted(t for t in targets if "partitioned" in t)
    if partitioned and num_devices > 1:
        raise UnimplementedError(
            f"partitioned host callbacks ({partitioned[0]}, from "
            "jax.debug.callback(partitioned=True)) need a custom partitioner that PJRT plugins "
            "lack; they run on one device only")


def execute_context(client_handle: _pjrt.ClientHandle, program: HloProgram,
                    type_id: int) -> _ffi.ExecuteContext:
    """The execute context carrying ``program``'s host callbacks (user data ``type_id``,
    each held to the contract of :mod:`.host_callbacks`) to ifrtpy's handler, for every
    execute of its executable on ``client_handle``."""
    served = tuple(serving(i, callback) for i, callback in enumerate(program.host_callbacks))
    return _ffi.ExecuteContext(client_handle, {type_id: served})


def explain_compile_error(error: IfrtError) -> IfrtError | None:
    """A clearer error for a plugin's refusal of a custom call target nobody registered
    (or None where ``error`` is not one)."""
    text = str(error)
    marker = "No FFI handler registered for "
    if marker in text:
        name = text.split(marker, 1)[1].split(" ", 1)[0]
        return NotFoundError(
            f"the program calls custom call target {name!r}, which has no handler: register "
            f"one with ifrtpy.ffi.register_ffi_target({name!r}, ifrtpy.ffi.pycapsule(...)) "
            f"(the plugin said: {text})")
    if "No registered implementation for untyped custom call" in text:
        return UnimplementedError(
            f"the program makes a legacy (untyped) custom call, which PJRT plugins cannot "
            f"register handlers for: use typed XLA FFI (api_version=4) (the plugin said: {text})")
    return None
