"""Every private jaxlib and jax name ifrtpy uses, in one place, chosen by jaxlib version.

jaxlib's Python modules other than its MLIR bindings (``jaxlib.mlir.ir`` and the
``jaxlib.mlir.dialects`` modules, which follow upstream MLIR's Python API) are jax's
internals: they move between releases, as do jax's ``jax._src`` modules. ifrtpy reaches
them only through the functions here, each of which knows where the name lives in each
supported version (the jax backend, :mod:`ifrtpy.interop.jax`, the PjRt backend, the
builder and the program readers alike). jax's names are switched on the jaxlib version
too: each jax release requires the jaxlib of its own version. jax and jaxlib are imported
only when a function here is called; where jax (or jaxlib) is not installed at all, the
ModuleNotFoundError comes through unchanged.

Supported (and tested): jaxlib 0.10.x, 0.11.x and 0.12.x (``SUPPORTED``), up to
``NEWEST_TESTED``; see README "Supported versions" for what CI runs with which.
:func:`jax_problem` names a jax/jaxlib pair that cannot work together, or a release newer
than any tested, with the command that installs a tested pair.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import warnings
from typing import Any, NamedTuple, Sequence

from ifrtpy.errors import FailedPreconditionError, UnimplementedError, error_from_status_text

__all__ = [
    "SUPPORTED", "version", "version_text", "xla_client", "hlo_module_class",
    "register_jax_dialects", "register_jax_dialects_location", "distributed_runtime_service",
    "distributed_runtime_client",
    "xla_computation_to_mlir_module", "hlo_to_stablehlo", "hlo_module_from_text",
    "backends_are_initialized", "runtime_client", "device_list", "compile_options",
    "array_from_single_device_arrays", "addressable_device_assignment",
    "result_handler", "runtime_error_type", "gspmd_sharding", "buffer_to_dlpack",
    "dlpack_to_buffer", "jax_distributed_state", "cpu_cost_analysis", "lowered_host_callbacks",
    "tile_form", "reduction_op", "with_reduction_op",
    "ffi_kernels", "load_ffi_kernels", "set_native_log_level", "device_assignment",
    "lowered_unreduced_values",
    "to_xla_hlo_sharding", "single_device_sharding", "is_single_device_sharding",
    "NEWEST_TESTED", "JaxProblem", "jax_problem", "check_jax",
]

#: The jaxlib (major, minor) versions ifrtpy is tested with.
SUPPORTED = ((0, 10), (0, 11), (0, 12))
#: The newest jax/jaxlib release ifrtpy is tested with (CI's newest leg installs the
#: newest the index serves, so a newer release shows up there first).
NEWEST_TESTED = (0, 12, 1)

#: name -> [(first jaxlib version, "module:attribute")], newest first: the version switch.
#: Versions are whole tuples: (0, 12, 1) is a release of its own.
_LOCATIONS: dict[str, list[tuple[tuple[int, ...], str]]] = {
    # CompileOptions, DeviceAssignment, HloSharding and OpSharding.
    "xla_client": [((0, 10), "jaxlib.xla_client:")],
    # HloModule.from_serialized_hlo_module_proto, spmd_*_sharding(s).
    "HloModule": [((0, 10), "jaxlib._hlo:HloModule")],
    # register_dialects(DialectRegistry): func and the other upstream dialects.
    "register_dialects": [((0, 10), "jaxlib.mlir._mlir_libs._jax_mlir_ext:register_dialects")],
    # The coordination service and its client (ifrtpy.distributed).
    "distributed_service": [((0, 10), "jaxlib._jax:get_distributed_runtime_service")],
    "distributed_client": [((0, 10), "jaxlib._jax:get_distributed_runtime_client")],
    # jaxlib's converters to MLIR (xla_computation_to_mlir_module, hlo_to_stablehlo).
    "jax_mlir": [((0, 10), "jaxlib._jax:mlir")],
    # XLA's HLO cost analysis, and the CPU client whose costs it uses (the PjRt backend,
    # for plugins without PJRT_Executable_GetCostAnalysis).
    "hlo_module_cost_analysis": [((0, 10), "jaxlib._jax:hlo_module_cost_analysis")],
    "cpu_client": [((0, 10), "jaxlib._jax:get_tfrt_cpu_client")],
    # HLO text -> HloModule (the program readers' child process).
    "hlo_module_from_text": [((0, 10), "jaxlib._hlo:hlo_module_from_text")],
    # What jax's runtime client compiles for and deserializes onto.
    "DeviceList": [((0, 10), "jaxlib._jax:DeviceList")],
    # Output buffers -> jax.Array, as jax's jit makes them.
    "array_result_handler": [((0, 10), "jaxlib._jax:array_result_handler")],
    # DLPack both ways without jax's Python-level checks (legacy capsules, a given device).
    "buffer_to_dlpack": [((0, 10), "jaxlib._jax:buffer_to_dlpack_managed_tensor")],
    "dlpack_to_buffer": [((0, 10), "jaxlib._jax:dlpack_managed_tensor_to_buffer")],
    # jax's side (the jax release matching the jaxlib version).
    "backends_are_initialized": [((0, 10), "jax._src.xla_bridge:backends_are_initialized")],
    "GSPMDSharding": [((0, 10), "jax._src.sharding_impls:GSPMDSharding")],
    "get_backend": [((0, 10), "jax.extend.backend:get_backend")],
    "ShapedArray": [((0, 10), "jax.core:ShapedArray")],
    # One device's sharding: 0.12.1 deprecates the class for a constructor and a test.
    "make_single_device_sharding": [((0, 12, 1), "jax.sharding:make_single_device_sharding"),
                                    ((0, 10), "jax.sharding:SingleDeviceSharding")],
    "is_single_device_sharding": [((0, 12, 1), "jax.sharding:is_single_device_sharding"),
                                  ((0, 10), "jax.sharding:SingleDeviceSharding")],
    # jax.Array's class: built from checked per-device arrays without jax's checks.
    "ArrayImpl": [((0, 10), "jax._src.array:ArrayImpl")],
    "JaxRuntimeError": [((0, 10), "jax.errors:JaxRuntimeError")],
    # jax's distributed runtime state (the coordination client its CPU backend and gloo use).
    "jax_distributed_state": [((0, 10), "jax._src.distributed:global_state")],
    # The XLA FFI handlers jaxlib ships (registrations() -> {platform: [(name, capsule,
    # api_version)]}), and the loader of the LAPACK functions its CPU kernels call.
    "lapack": [((0, 10), "jaxlib.lapack:")],
    "lapack_initialize": [((0, 10), "jaxlib.lapack:_lapack")],
    "cpu_sparse": [((0, 10), "jaxlib.cpu_sparse:")],
    # lgamma and digamma (jax lowers them to these on CPU from 0.12.1): registrations()
    # -> {name: capsule}.
    "cpu_math": [((0, 12, 1), "jaxlib.cpu._math:")],
    "gpu_solver": [((0, 10), "jaxlib.gpu_solver:")],
    "gpu_linalg": [((0, 10), "jaxlib.gpu_linalg:")],
    "gpu_prng": [((0, 10), "jaxlib.gpu_prng:")],
    "gpu_sparse": [((0, 10), "jaxlib.gpu_sparse:")],
    # jaxlib's C++ log threshold, set after it loaded (it reads TF_CPP_MIN_LOG_LEVEL once).
    "absl_set_min_log_level": [((0, 10), "jaxlib.utils:absl_set_min_log_level")],
}

#: The jaxlib modules with XLA FFI kernels, per platform (as their registrations() name it).
_FFI_KERNEL_MODULES = {
    "cpu": ("lapack", "cpu_sparse", "cpu_math"),
    "CUDA": ("gpu_solver", "gpu_linalg", "gpu_prng", "gpu_sparse"),
    "ROCM": ("gpu_solver", "gpu_linalg", "gpu_prng", "gpu_sparse"),
}

#: array_result_handler's keyword arguments beyond (aval, sharding, committed), newest first:
#: jaxlib 0.11 (extension version 489) dropped ``_skip_checks`` along with the checks.
_RESULT_HANDLER_KWARGS: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((0, 11), {}),
    ((0, 10), {"_skip_checks": True}),
]


@functools.lru_cache(maxsize=None)
def version() -> tuple[int, ...]:
    """The installed jaxlib's version, e.g. ``(0, 11, 2)``."""
    from jaxlib import version as jaxlib_version

    parts = []
    for part in jaxlib_version.__version__.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def version_text() -> str:
    """The installed jaxlib's version string, e.g. ``"0.11.2"`` (part of cache keys)."""
    from jaxlib import version as jaxlib_version

    return str(jaxlib_version.__version__)


def package_dir() -> str:
    """The folder of the installed jaxlib package (its shared objects lie there)."""
    import jaxlib

    return os.path.dirname(jaxlib.__file__)


class JaxProblem(NamedTuple):
    """What :func:`jax_problem` found: its message (with the command that fixes it), and
    whether jax cannot work at all (else it is only untested)."""
    message: str
    fatal: bool


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:4])


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def jax_problem() -> JaxProblem | None:
    """What is wrong with the installed jax and jaxlib (read from their package metadata,
    without importing jax): a pair that cannot work together (the jaxlib outside the range
    the jax requires, or jax without jaxlib), a release older than ifrtpy supports, or one
    newer than any it was tested with; None where all is well or jax is not installed."""
    jax_text, jaxlib_text = _installed("jax"), _installed("jaxlib")
    if jax_text is None:
        return None
    tested = ".".join(map(str, NEWEST_TESTED))
    requirement = next((r for r in importlib.metadata.requires("jax") or ()
                        if re.match(r"jaxlib\s*[<>=!~]", r) and ";" not in r), None)
    if jaxlib_text is None or requirement is not None and not _satisfies(jaxlib_text, requirement):
        wanted = (requirement or "jaxlib").replace(" ", "")
        return JaxProblem(
            f"jax {jax_text} cannot work with jaxlib {jaxlib_text or '(not installed)'}: it "
            f"requires {wanted}. Install a matching pair: pip install \"jax=={jax_text}\" "
            f"\"{wanted}\"", fatal=True)
    jax_version, jaxlib_version = _numbers(jax_text), _numbers(jaxlib_text)
    if min(jax_version, jaxlib_version)[:2] < min(SUPPORTED):
        return JaxProblem(
            f"jax {jax_text} with jaxlib {jaxlib_text} is older than ifrtpy supports "
            f"({_supported_text()}): pip install --upgrade \"jax>=0.10\" \"jaxlib>=0.10\"",
            fatal=True)
    if max(jax_version, jaxlib_version) > NEWEST_TESTED:
        return JaxProblem(
            f"jax {jax_text} with jaxlib {jaxlib_text} is newer than any ifrtpy was tested "
            f"with ({_supported_text()}); where something fails, install the newest tested: "
            f"pip install \"jax=={tested}\" \"jaxlib=={tested}\"", fatal=False)
    return None


def _satisfies(version_text: str, requirement: str) -> bool:
    """Whether ``version_text`` meets a requirement's clauses (``<=``, ``>=``, ``==``,
    ``<``, ``>``, ``!=`` on release numbers; others are taken as met)."""
    have = _numbers(version_text)
    checks = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b,
              ">": lambda a, b: a > b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}

    def padded(v: tuple[int, ...]) -> tuple[int, ...]:
        return v + (0,) * (4 - len(v))
    for op, number in re.findall(r"(<=|>=|==|!=|<|>)\s*([\d.]+)", requirement):
        if not checks[op](padded(have), padded(_numbers(number))):
            return False
    return True


@functools.lru_cache(maxsize=1)
def _warn_untested(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def check_jax() -> None:
    """Called where ifrtpy first uses jax: FailedPreconditionError naming a jax/jaxlib pair
    that cannot work (before ``import jax`` fails with jax's own message), a warning (once)
    for one newer than any tested."""
    problem = jax_problem()
    if problem is None:
        return
    if problem.fatal:
        raise FailedPreconditionError(problem.message)
    _warn_untested(problem.message)


def _location(name: str) -> str:
    """Where ``name`` lives in the installed jaxlib ("module:attribute")."""
    installed = version()
    for first, location in _LOCATIONS[name]:
        if installed >= first:
            return location
    shown = ".".join(map(str, installed))
    if installed[:2] < min(SUPPORTED):
        raise UnimplementedError(f"jaxlib {shown} is older than any ifrtpy supports "
                                 f"({_supported_text()})")
    raise UnimplementedError(f"jaxlib {shown} has no {name} (jaxlib "
                             f"{'.'.join(map(str, _LOCATIONS[name][-1][0]))} and later have it)")


@functools.lru_cache(maxsize=None)
def _lookup(name: str) -> Any:
    location = _location(name)
    module_name, _, attr = location.partition(":")
    if module_name.partition(".")[0] == "jax":
        check_jax()
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr) if attr else module
    except ModuleNotFoundError as e:
        if e.name == module_name.partition(".")[0]:
            raise  # jax (or jaxlib) is not installed at all: not a moved name
        raise _moved(version(), location, e) from None
    except (ImportError, AttributeError) as e:
        raise _moved(version(), location, e) from None


def _moved(installed: tuple[int, ...], location: str, error: Exception) -> UnimplementedError:
    return UnimplementedError(
        f"jaxlib {'.'.join(map(str, installed))} has no {location} ({error}); ifrtpy "
        f"supports {_supported_text()}")


def _supported_text() -> str:
    minors = ['%d.%d' % v for v in SUPPORTED]
    return (f"jaxlib {', '.join(minors[:-1])} and {minors[-1]} up to "
            f"{'.'.join(map(str, NEWEST_TESTED))}, each with the jax of its version")


def xla_client() -> Any:
    """The ``jaxlib.xla_client`` module."""
    return _lookup("xla_client")


def set_native_log_level(level: int) -> None:
    """Show jaxlib's C++ log lines of ``level`` and above (0 INFO ... 3 FATAL only), also
    in a jaxlib loaded already."""
    _lookup("absl_set_min_log_level")(level)


def hlo_module_class() -> Any:
    """jaxlib's ``HloModule`` class (reads serialized HloModuleProtos)."""
    return _lookup("HloModule")


def register_jax_dialects(registry: Any) -> None:
    """Add jaxlib's upstream MLIR dialects (func, ...) to an ``ir.DialectRegistry``."""
    _lookup("register_dialects")(registry)


def register_jax_dialects_location() -> str:
    """Where the function :func:`register_jax_dialects` calls lives ("module:attribute"),
    for a process that registers the dialects without importing ifrtpy."""
    return _location("register_dialects")


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a call into jaxlib, with its "CODE: message" errors raised
    as the ifrtpy errors of their codes."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - jaxlib raises its own runtime error type
        raise error_from_status_text(str(e)) from None


@functools.lru_cache(maxsize=1)
def _cost_client() -> Any:
    return _lookup("cpu_client")(asynchronous=False, num_devices=1)


def cpu_cost_analysis(module: Any) -> dict[str, Any]:
    """XLA's HLO cost analysis (``flops``, ``bytes accessed``, ...) of an ``HloModule``,
    with a CPU's costs: those of a one-device jaxlib CPU client, made on first use."""
    return dict(call(_lookup("hlo_module_cost_analysis"), _cost_client(), module))


def distributed_runtime_service(address: str, num_nodes: int, **timeouts: int) -> Any:
    """jaxlib's coordination service, listening at ``address`` (timeouts in seconds)."""
    return _lookup("distributed_service")(address, num_nodes, **timeouts)


def distributed_runtime_client(address: str, node_id: int, **options: Any) -> Any:
    """jaxlib's coordination client of the service at ``address`` (not yet connected)."""
    return _lookup("distributed_client")(address, node_id, **options)


# -- the program readers (ifrtpy.program.inputs) -------------------------------------------


def xla_computation_to_mlir_module(computation: Any) -> Any:
    """jaxlib's StableHLO module (printable) of an ``XlaComputation``."""
    return _lookup("jax_mlir").xla_computation_to_mlir_module(computation)


def hlo_to_stablehlo(serialized_hlo_module_proto: bytes) -> bytes:
    """MLIR bytecode (StableHLO) of a serialized HloModuleProto. jaxlib trusts its input:
    call it on untrusted bytes only in a child process."""
    return bytes(_lookup("jax_mlir").hlo_to_stablehlo(serialized_hlo_module_proto))


def hlo_module_from_text(text: str) -> Any:
    """jaxlib's ``HloModule`` parsed from HLO text (``as_serialized_hlo_module_proto()``)."""
    return _lookup("hlo_module_from_text")(text)


# -- the jax backend (ifrtpy.backends.jax) ------------------------------------------------


def backends_are_initialized() -> bool:
    """Whether jax has created its runtime clients (after that the CPU device count is fixed)."""
    return bool(_lookup("backends_are_initialized")())


def jax_distributed_state() -> Any:
    """jax's distributed runtime state (``service``, ``client``, ``process_id``,
    ``num_processes``, ``coordinator_address``): what jax's CPU backend reads when it starts
    (its coordination client, for the topology exchange and gloo's rendezvous)."""
    return _lookup("jax_distributed_state")


def runtime_client(platform: str | None) -> Any:
    """jax's runtime client (``jaxlib._jax.Client``) of ``platform`` (None: jax's default);
    jax's RuntimeError where it has no such platform."""
    return _lookup("get_backend")(platform)


def device_list(jax_devices: Sequence[Any]) -> Any:
    """A ``jaxlib._jax.DeviceList`` (what compile and deserialize take)."""
    return _lookup("DeviceList")(tuple(jax_devices))


def compile_options(serialized: bytes) -> Any:
    """A ``jaxlib`` CompileOptions from a serialized ``xla.CompileOptionsProto``."""
    return xla_client().CompileOptions.ParseFromString(serialized)


def result_handler(dtype: Any, dims: tuple[int, ...], jax_sharding: Any) -> Any:
    """What turns one output of ``execute_sharded`` into a ``jax.Array`` (as jax's jit does)."""
    shaped_array = _lookup("ShapedArray")(dims, dtype)
    kwargs = next(k for first, k in _RESULT_HANDLER_KWARGS if version() >= first)
    return _lookup("array_result_handler")(shaped_array, jax_sharding, committed=True, **kwargs)


def array_from_single_device_arrays(dims: tuple[int, ...], dtype: Any, jax_sharding: Any,
                                    arrays: Sequence[Any]) -> Any:
    """A ``jax.Array`` of ``jax_sharding`` from its per-device arrays (one per addressable
    device, in the sharding's order, each of the shard's shape and ``dtype``), without the
    checks of ``jax.make_array_from_single_device_arrays``: the caller made them so."""
    aval = _lookup("ShapedArray")(dims, dtype)
    return _lookup("ArrayImpl")(aval, jax_sharding, list(arrays), committed=True,
                                _skip_checks=True)


def device_assignment(jax_sharding: Any) -> list[Any]:
    """The devices of a jax sharding in its HLO sharding's order (jax's private
    ``Sharding._device_assignment``)."""
    return list(jax_sharding._device_assignment)


def to_xla_hlo_sharding(jax_sharding: Any, ndim: int) -> Any:
    """A jax sharding as jaxlib's HloSharding for an array of rank ``ndim`` (jax's private
    ``Sharding._to_xla_hlo_sharding``), its devices numbered as in :func:`device_assignment`."""
    return jax_sharding._to_xla_hlo_sharding(ndim)


def single_device_sharding(jax_device: Any, memory_kind: str | None = None) -> Any:
    """jax's sharding of one device (``make_single_device_sharding`` from 0.12.1, which
    deprecates the ``SingleDeviceSharding`` class)."""
    return _lookup("make_single_device_sharding")(jax_device, memory_kind=memory_kind)


def is_single_device_sharding(jax_sharding: Any) -> bool:
    """Whether ``jax_sharding`` is jax's sharding of one device (and not a Named or other
    sharding that happens to have one device)."""
    test = _lookup("is_single_device_sharding")
    return isinstance(jax_sharding, test) if isinstance(test, type) else bool(test(jax_sharding))


def addressable_device_assignment(jax_sharding: Any) -> list[Any]:
    """The order in which a ``jax.Array`` of ``jax_sharding`` holds its per-device arrays
    (jax's private ``Sharding._addressable_device_assignment``)."""
    return list(jax_sharding._addressable_device_assignment)


def runtime_error_type() -> type[Exception]:
    """The exception jaxlib raises for a failed runtime status (``XlaRuntimeError``)."""
    error: type[Exception] = _lookup("JaxRuntimeError")
    return error


def lowered_host_callbacks(lowered: Any) -> tuple[Any, ...]:
    """The Python callables of a jax ``Lowered`` stage's host callbacks, by the ``index``
    its custom calls name (what jax hands its compiler)."""
    lowering = getattr(lowered, "_lowering", None)
    compile_args = getattr(lowering, "compile_args", None)
    if not isinstance(compile_args, dict):
        return ()
    return tuple(compile_args.get("host_callbacks") or ())


def lowered_unreduced_values(lowered: Any) -> list[str]:
    """Where a jax ``Lowered`` stage's parameters and results are unreduced, each as
    "parameter 0 f32[4,6] unreduced over ('y',)", where jax lowers them as arrays with a
    leading axis per unreduced mesh axis (jax 0.12.1 and later; its private
    ``Lowered._in_types``/``_out_types`` hold the values' own types); [] elsewhere."""
    if version() < (0, 12, 1):
        return []
    found = []
    for what, types in (("parameter", getattr(lowered, "_in_types", None)),
                        ("result", getattr(lowered, "_out_types", None))):
        avals = types[1] if isinstance(types, tuple) and len(types) == 2 else ()
        for i, aval in enumerate(avals):
            spec = getattr(getattr(aval, "sharding", None), "spec", None)
            unreduced = getattr(spec, "unreduced", None)
            if unreduced:
                shape = ",".join(map(str, getattr(aval, "shape", ())))
                found.append(f"{what} {i} {getattr(aval, 'dtype', '')}[{shape}] unreduced "
                             f"over {tuple(sorted(unreduced))}")
    return found


def ffi_kernels(platform: str) -> dict[str, Any]:
    """The typed XLA FFI handlers jaxlib ships for ``platform`` ("cpu", "CUDA", "ROCM"):
    name -> PyCapsule. Modules jaxlib lacks (the GPU ones without the jax CUDA plugin)
    give none. Call :func:`load_ffi_kernels` before running one."""
    kernels: dict[str, Any] = {}
    for name in _FFI_KERNEL_MODULES.get(platform, ()):
        try:
            module = _lookup(name)
        except (ModuleNotFoundError, UnimplementedError):
            continue
        registrations = module.registrations()
        if all(isinstance(v, list) for v in registrations.values()):
            for target, capsule, api_version in registrations.get(platform, ()):
                if api_version == 1:
                    kernels[target] = capsule
        elif platform == "cpu":  # {name: capsule}: typed FFI handlers (jaxlib.cpu._math)
            kernels.update(registrations)
    return kernels


def load_ffi_kernels(platform: str) -> None:
    """Make jaxlib's kernels of ``platform`` ready to run: its CPU kernels call LAPACK
    through pointers loaded here (from SciPy); one run before that crashes the process."""
    if platform == "cpu":
        _lookup("lapack_initialize").initialize()


# -- the jax.Array bridge (ifrtpy.interop.jax, ifrtpy.backends.jax_shardings) ---------------


def tile_form(hlo_sharding: Any) -> Any:
    """``hlo_sharding`` (a jaxlib HloSharding) in XLA's tile-assignment form. From 0.12,
    jaxlib keeps the mesh-based form ("V3", Shardy's) of a sharding read from a compiled
    module (newer XLA CPU builds write it); ifrtpy's sharding math reads tile assignments."""
    convert = getattr(hlo_sharding, "v3_to_v2_sharding", None)  # jaxlib >= 0.12
    return hlo_sharding if convert is None else convert()


def reduction_op(hlo_sharding: Any) -> int | None:
    """The reduction of ``hlo_sharding``'s unreduced axes as jaxlib numbers it (0 sum,
    1 max, 2 min: jaxlib >= 0.12 reads it from the OpSharding's ``sdy::reduction_op``
    metadata); None where this jaxlib has no reduction ops (0.10: every unreduced axis is
    a sum)."""
    read = getattr(hlo_sharding, "reduction_op", None)
    return None if read is None else int(read())


def with_reduction_op(hlo_sharding: Any, op: int) -> Any:
    """A copy of ``hlo_sharding`` whose unreduced axes reduce with ``op`` (jaxlib's number);
    UnimplementedError for an op other than 0 (sum) where this jaxlib has no reduction ops."""
    if getattr(hlo_sharding, "set_reduction_op", None) is None:
        if op == 0:
            return hlo_sharding
        raise UnimplementedError(
            f"jaxlib {version_text()} has no reductions other than a sum for unreduced "
            f"axes (jaxlib 0.12 has them), asked for reduction op {op}")
    copy = xla_client().HloSharding.from_proto(hlo_sharding.to_proto())
    copy.set_reduction_op(op)  # in place (jaxlib 0.12)
    return copy


def gspmd_sharding(jax_devices: Sequence[Any], op_sharding: Any, memory_kind: str | None) -> Any:
    """jax's own sharding class for HLO shardings (``GSPMDSharding``) over ``jax_devices``."""
    return _lookup("GSPMDSharding")(list(jax_devices), op_sharding, memory_kind=memory_kind)


def buffer_to_dlpack(single_device_array: Any) -> Any:
    """A legacy DLPack capsule of a single-device jax array (jaxlib's export, without jax's
    Python-level checks)."""
    return _lookup("buffer_to_dlpack")(single_device_array, stream=None)


def dlpack_to_buffer(capsule: Any, jax_device: Any) -> Any:
    """A legacy DLPack capsule as a jax array on ``jax_device`` (aliased where jax can)."""
    return _lookup("dlpack_to_buffer")(capsule, jax_device, None, None)
