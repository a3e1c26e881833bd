"""The custom call targets registered with ifrtpy: what users touch, for every backend.

Nothing here needs ifrtpy's C layer (the jax backend runs without it). A target is
recorded once per (platform, name); backends learn the targets through listeners
(:func:`add_listener`): the PjRt backend registers them with its plugins
(``ifrtpy.backends.pjrt.ffi``: on demand, with the check of each handler's XLA FFI version
against the plugin's), the jax backend with jax's runtime. jaxlib's own kernels (LAPACK,
sparse) are found here (:func:`jaxlib_kernels`) and made ready to run
(:func:`load_jaxlib_kernels`); a program's host callbacks are checked to carry their
callables (:func:`check_host_callables`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from typing import Any, Callable

from ifrtpy import _jaxlib
from ifrtpy.errors import (
    AlreadyExistsError, FailedPreconditionError, IfrtError, InvalidArgumentError, check_type,
    combined, invalid_argument,
)
from ifrtpy.program import HloProgram
from ifrtpy.program.hlo import HOST_CALLBACK_TARGETS

__all__ = [
    "Target", "register_ffi_target", "pycapsule", "registered_targets", "add_listener",
    "canonical_platform", "jaxlib_kernels", "load_jaxlib_kernels", "check_host_callables",
    "PLATFORMS",
]

#: Platform names as ifrtpy and jax write them -> as XLA's FFI registry names them.
PLATFORMS = {"cpu": "Host", "cuda": "CUDA", "rocm": "ROCM"}
_ALIASES = {"host": "cpu", "cpu": "cpu", "cuda": "cuda", "rocm": "rocm"}
#: The FFI stages jax accepts in a dict of handlers.
STAGES = ("instantiate", "prepare", "initialize", "execute")
#: The private handler the C layer registers with each plugin to learn its XLA FFI version
#: (``ifrtpy._pjrt._ffi.PROBE_TARGET``, written here too: this module runs without the C layer).
PROBE_TARGET = "ifrtpy_xla_ffi_version_probe"


@dataclasses.dataclass(frozen=True)
class Target:
    """A custom call target: ``handlers`` maps FFI stage names to PyCapsules (typed FFI,
    ``api_version`` 1) or holds the one legacy handler under "execute" (``api_version``
    0); ``source`` is "user", "jaxlib" or "ifrtpy"."""

    name: str
    platform: str
    handlers: dict[str, Any]
    api_version: int
    source: str = "user"

    @property
    def execute(self) -> Any:
        return self.handlers["execute"]


_lock = threading.RLock()
_targets: dict[tuple[str, str], Target] = {}
_listeners: list[Callable[[Target], None]] = []


def canonical_platform(platform: str) -> str | None:
    """``platform`` as the keys of :data:`PLATFORMS` name it ("host" is "cpu"), or None for
    a platform ifrtpy has no custom calls for."""
    return _ALIASES.get(platform.lower())


def _platform(platform: Any) -> str:
    canonical = canonical_platform(platform) if isinstance(platform, str) else None
    if canonical is None:
        raise invalid_argument("platform", f"one of {sorted(PLATFORMS)}", platform)
    return canonical


def _handlers(name: str, target: Any, api_version: int) -> dict[str, Any]:
    if isinstance(target, dict):
        if api_version != 1:
            raise InvalidArgumentError(
                f"custom call target {name!r}: a dict of stages takes api_version=1 (typed FFI)")
        unknown = sorted(set(target) - set(STAGES))
        if unknown or "execute" not in target:
            raise InvalidArgumentError(
                f"custom call target {name!r}: the dict of handlers needs an 'execute' entry "
                f"and takes only the stages {list(STAGES)}, got {sorted(target)}")
        handlers = dict(target)
    else:
        handlers = {"execute": target}
    for stage, capsule in handlers.items():
        address = _capsule_address(capsule)
        if not address:
            raise InvalidArgumentError(
                f"custom call target {name!r}: the {stage} handler must be a PyCapsule of a "
                f"function pointer (ifrtpy.ffi.pycapsule), got {type(capsule).__name__}")
        if not _is_code(address):
            raise InvalidArgumentError(
                f"custom call target {name!r}: the {stage} handler's address {address:#x} is "
                f"not in executable memory (XLA calls a handler when it is registered)")
    return handlers


def _is_code(address: int) -> bool:
    """Whether ``address`` lies in a mapping of this process that can be executed (True
    where the system does not tell: only Linux's /proc/self/maps is read)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, permissions = line.split(None, 2)[:2]
                low, high = (int(v, 16) for v in span.split("-"))
                if low <= address < high:
                    return "x" in permissions
    except OSError:
        return True
    return False


def _capsule_address(capsule: Any) -> int:
    """The pointer a PyCapsule holds (whatever its name), or 0 for anything else."""
    if type(capsule).__name__ != "PyCapsule":
        return 0
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule)) or 0


#: What each capsule made by pycapsule points into (a ctypes callback must outlive it).
_kept: dict[int, Any] = {}


def pycapsule(funcptr: Any) -> Any:
    """A PyCapsule of ``funcptr`` (a ctypes function from a shared library, a
    ``ctypes.c_void_p`` or an address), as ``jax.ffi.pycapsule`` makes it: what
    :func:`register_ffi_target` takes. ``funcptr`` is kept alive for the process.

    A ctypes callback of a Python function is refused: when it raises, ctypes prints the
    exception and hands XLA whatever its result held, which XLA reads as an error pointer
    (a crash). Python code runs in host callbacks (``jax.pure_callback``)."""
    if isinstance(funcptr, bool):
        raise invalid_argument("funcptr", "a ctypes function pointer or an address", funcptr)
    try:
        address = ctypes.cast(funcptr, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        raise invalid_argument("funcptr", "a ctypes function pointer or an address", funcptr) from None
    if _holds_python_callback(funcptr):
        raise InvalidArgumentError(
            "funcptr is a ctypes callback of a Python function, which cannot be an XLA FFI "
            "handler: ctypes cannot pass its exceptions to XLA (XLA then reads an unset "
            "result as an error pointer and the process crashes). Write the handler in "
            "C/C++, or run the Python code as a host callback (jax.pure_callback)")
    if not address:
        raise InvalidArgumentError("funcptr is a null pointer")
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    with _lock:
        _kept.setdefault(address, funcptr)
    return new(address, None, None)


def _holds_python_callback(value: Any, depth: int = 0) -> bool:
    """Whether ctypes object ``value`` is (or, as a cast of one, keeps) a ctypes callback
    of a Python callable: ctypes keeps such a callback's thunk among its ``_objects``."""
    if type(value).__name__ == "CThunkObject":
        return True
    if isinstance(value, ctypes.CDLL):  # a library a function came from (its attributes are symbols)
        return False
    kept = value if isinstance(value, dict) else getattr(value, "_objects", None)
    return (isinstance(kept, dict) and depth < 8
            and any(_holds_python_callback(v, depth + 1) for v in kept.values()))


def register_ffi_target(name: str, target: Any, platform: str = "cpu", api_version: int = 1) -> None:
    """Register custom call target ``name``, jax's ``jax.ffi.register_ffi_target``:
    ``target`` is a PyCapsule of an XLA FFI handler (:func:`pycapsule`) or a dict of them
    by stage ("execute" required); ``api_version`` 1 is XLA's typed FFI, 0 the legacy
    custom call API; ``platform`` "cpu" (or "cuda", "rocm").

    The target is registered with every plugin of ``platform`` that compiles a program
    naming it (the PjRt backend), and with jax's runtime for ``get_client("jax")``: each
    backend's listener (:func:`add_listener`) is told. Raises AlreadyExistsError for
    another handler under a registered name (plugins keep the first), and a listener's
    refusal, such as a plugin's already in use that cannot take it (a typed handler built
    for a newer XLA FFI than the plugin runs, a legacy target, or stages other than
    "execute"): the target stays registered for the others.
    """
    check_type(name, str, "name")
    if not name:
        raise InvalidArgumentError("a custom call target needs a name")
    if name in HOST_CALLBACK_TARGETS:
        raise InvalidArgumentError(f"custom call target {name!r} is served by ifrtpy itself")
    if name == PROBE_TARGET:
        raise InvalidArgumentError(
            f"custom call target name {name!r} is reserved by ifrtpy (its probe of each "
            "plugin's XLA FFI version)")
    if isinstance(api_version, bool) or api_version not in (0, 1):
        raise invalid_argument("api_version", "1 (typed FFI) or 0 (legacy custom call)", api_version)
    entry = Target(name, _platform(platform), _handlers(name, target, api_version), api_version)
    with _lock:
        known = _targets.get((entry.platform, name))
        if known is not None:
            if _same(known, entry):
                return
            raise AlreadyExistsError(
                f"custom call target {name!r} is registered for {entry.platform} with another "
                f"handler; plugins keep the first registration of a name")
        _targets[(entry.platform, name)] = entry
        listeners = list(_listeners)
    errors = []
    for listener in listeners:
        try:
            listener(entry)
        except IfrtError as e:
            errors.append(e)
    if errors:
        raise combined(errors)


def _same(a: Target, b: Target) -> bool:
    return (a.api_version == b.api_version and set(a.handlers) == set(b.handlers)
            and all(_capsule_address(a.handlers[s]) == _capsule_address(b.handlers[s])
                    for s in a.handlers))


def registered_targets(platform: str = "cpu") -> dict[str, Target]:
    """The targets registered with ifrtpy for ``platform``, by name (not jaxlib's, which
    are registered on demand)."""
    canonical = _platform(platform)
    with _lock:
        return {name: t for (p, name), t in _targets.items() if p == canonical}


def add_listener(listener: Callable[[Target], None]) -> None:
    """Call ``listener(target)`` for every target registered so far and from now on (how
    a backend learns them: the PjRt backend registers them with the plugins it has
    compiled with, the jax backend with jax's runtime). An IfrtError a listener raises for
    a target registered from now on is raised by :func:`register_ffi_target`, after every
    listener was told."""
    with _lock:
        _listeners.append(listener)
        known = list(_targets.values())
    for target in known:
        listener(target)


# -- jaxlib's kernels and host callbacks ----------------------------------------------------

_kernels: dict[str, dict[str, Any]] = {}
_loaded: set[str] = set()


def _jaxlib_platform(platform: str) -> str:
    return "cpu" if platform == "cpu" else platform.upper()


def jaxlib_kernels(platform: str) -> dict[str, Any]:
    """The XLA FFI kernels jaxlib ships for ``platform`` (name -> capsule)."""
    platform = _platform(platform)
    with _lock:
        if platform not in _kernels:
            _kernels[platform] = _jaxlib.ffi_kernels(_jaxlib_platform(platform))  # none without jaxlib
        return _kernels[platform]


def load_jaxlib_kernels(platform: str, targets: frozenset[str]) -> None:
    """Make jaxlib's kernels of ``platform`` ready to run where ``targets`` name one (the
    CPU ones call LAPACK through pointers jaxlib loads, from SciPy: a runtime that runs
    them without, jax's included, crashes)."""
    platform = _platform(platform)
    if platform in _loaded or not targets & set(jaxlib_kernels(platform)):
        return
    with _lock:
        if platform not in _loaded:
            _jaxlib.load_ffi_kernels(_jaxlib_platform(platform))
            _loaded.add(platform)


def check_host_callables(program: HloProgram) -> frozenset[str]:
    """The host callback targets ``program`` calls, once checked that it carries a
    callable for each call (a runtime would crash on a call without)."""
    targets = program.custom_call_targets & HOST_CALLBACK_TARGETS
    carried = len(program.host_callbacks)
    if targets and not carried:
        raise FailedPreconditionError(
            f"the program makes host callbacks (custom calls {', '.join(sorted(targets))}) "
            "but carries no Python callables: text and bytes cannot carry them. Make the "
            "HloProgram from the jax Lowered stage (jax.jit(f).lower(...)), or give "
            "HloProgram(..., host_callbacks=[...])")
    missing = sorted(i for i in program.host_callback_indices if not 0 <= i < carried)
    if missing:
        raise InvalidArgumentError(
            f"the program calls host callback {missing[0]}, but carries {carried} callables")
    return targets
