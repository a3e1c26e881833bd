"""The backends, and the registry that names them.

:func:`get_client` makes a client of a named backend: ``"pjrt"`` (a PJRT plugin through
the C API), ``"reference"`` (NumPy and the StableHLO interpreter), ``"jax"`` (jax's
runtime), anything added with :func:`register_backend`, or a PJRT plugin by name
(``"cpu"``, ``"cuda"``). Built-in backends are registered by import path and imported
only when first asked for, so ``import ifrtpy`` never loads the Cython extension.

Each backend is a subpackage that imports the layers below it and never another backend.
What two backends share lives here: :mod:`.host_arrays` (arrays held as NumPy data, the
reference backend's and the PjRt backend's STRING arrays) and :mod:`.serialized` (the
envelope of serialized executables).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import threading
from typing import Any, Callable, Literal, Mapping, Sequence, overload

from ifrtpy import distributed
from ifrtpy.client import Client
from ifrtpy.device import Device
from ifrtpy.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError
from ifrtpy.plugins import find_plugin, plugin_not_found
from ifrtpy.plugins.builds import default_cpu_library

__all__ = ["register_backend", "registered_backends", "get_client", "default_client", "devices"]

_registry_lock = threading.Lock()
_defaults_lock = threading.RLock()  # a backend's factory may ask for another default
#: (name, plugin file, the distributed job when one is joined) -> the default client.
_defaults: dict[tuple[str, str | None, Any], Client] = {}
#: name -> factory, or "module:function" for a factory imported on first use.
_BACKENDS: dict[str, Callable[..., Client] | str] = {
    "pjrt": "ifrtpy.backends.pjrt:create_client",
    "reference": "ifrtpy.backends.reference:create_client",
    "jax": "ifrtpy.backends.jax:create_client",
}


def register_backend(
    name: str, factory: Callable[..., Client] | str, *, replace: bool = False
) -> None:
    """Register a backend for :func:`get_client`.

    ``factory`` is a callable taking the keyword arguments of ``get_client`` and
    returning a :class:`Client`, or a ``"module:function"`` path imported on first use.
    AlreadyExistsError if ``name`` is taken, unless ``replace``.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"backend name must be a non-empty str, got {name!r}")
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        if not module or not attr:
            raise InvalidArgumentError(
                f"backend factory path must be 'module:function', got {factory!r}"
            )
    elif not callable(factory):
        raise InvalidArgumentError(f"backend factory must be callable, got {factory!r}")
    with _registry_lock:
        if name in _BACKENDS and not replace:
            raise AlreadyExistsError(f"backend {name!r} is already registered")
        _BACKENDS[name] = factory
    with _defaults_lock:  # a replaced factory makes the next default
        for key in [k for k in _defaults if k[0] == name]:
            del _defaults[key]


def registered_backends() -> list[str]:
    """The names :func:`get_client` accepts, sorted."""
    with _registry_lock:
        return sorted(_BACKENDS)


# get_client's options, typed per backend and per plugin name (ifrtpy.plugins.options has
# the plugins' tables, checked at run time): what editors complete and mypy checks.


@overload
def get_client(backend: Literal["pjrt", "cpu"] = "pjrt", *, plugin: str | None = None,
               device_count: int | None = None, options: Mapping[str, Any] | None = None,
               name: str | None = None, cpu_device_count: int = ..., asynchronous: bool = ...,
               process_id: int = ...) -> Client: ...
@overload
def get_client(backend: Literal["reference"], *, device_count: int = 8,
               addressable_device_count: int | None = None) -> Client: ...
@overload
def get_client(backend: Literal["jax"], *, platform: str | None = None,
               device_count: int | None = None) -> Client: ...
@overload
def get_client(backend: Literal["tpu"], *, plugin: str | None = None,
               options: Mapping[str, Any] | None = None, max_inflight_computations: int = ...,
               ml_framework_name: str = ..., ml_framework_version: str = ...) -> Client: ...
@overload
def get_client(backend: Literal["cuda", "rocm"], *, plugin: str | None = None,
               options: Mapping[str, Any] | None = None, platform_name: str = ...,
               allocator: Literal["default", "platform", "bfc", "cuda_async"] = ...,
               memory_fraction: float = ..., preallocate: bool = ...,
               collective_memory_size: int = ..., visible_devices: Sequence[int] = ...,
               node_id: int = ..., num_nodes: int = ...,
               should_stage_host_to_device_transfers: bool = ...,
               abort_collectives_on_failure: bool = ..., use_tfrt_gpu_client: bool = ...,
               enable_mock_nccl: bool = ..., mock_gpu_topology: str = ...,
               partition_index: int = ...) -> Client: ...
@overload
def get_client(backend: str, *, plugin: str | None = None, device_count: int | None = None,
               options: Mapping[str, Any] | None = None,
               **kwargs: int | float | str | bool | Sequence[int] | None) -> Client: ...


def get_client(backend: str = "pjrt", **kwargs: Any) -> Client:
    """The named backend's (or PJRT plugin's) default client, or with ``kwargs`` a new one.

    Without options this is :func:`default_client`: one client per backend, made on first
    use and then shared by every caller (``from_jax``, ``from_dlpack`` and ``device_put``
    use it too). With options, a new client; ``kwargs`` go to the backend's factory.

    A name that is not a registered backend is a PJRT plugin name (``"cpu"``,
    ``"cuda"``, ...) found by :func:`ifrtpy.plugins.find_plugin` (or at ``plugin=``, a
    path); the other ``kwargs`` are its create options, typed and checked before the
    call (:mod:`ifrtpy.plugins.options`). NotFoundError listing the registered backends,
    the plugins found and where ifrtpy looked for a name found nowhere. Importing a
    backend's module may raise ImportError (e.g. the Cython extension is not built).
    """
    if not kwargs:
        return default_client(backend)
    return _new_client(backend, kwargs)


def default_client(backend: str = "pjrt") -> Client:
    """The process's client of the named backend or PJRT plugin made with no options: made
    on first use, then the same object for every caller. The PjRt backend's default
    plugin by name (``"cpu"``: xla-cpu-pjrt's) gives the same client as ``"pjrt"``. A
    process that joins a distributed job gets new default clients (with the job's
    key-value store)."""
    name, plugin = _default_of(backend)
    key = (name, plugin, _job())
    with _defaults_lock:
        client = _defaults.get(key)
        if client is None:
            client = _defaults[key] = _new_client(name, {})
        return client


def devices(backend: str = "pjrt") -> list[Device]:
    """The devices of the process's default client of ``backend`` (``get_client(backend)
    .devices()``), as ``jax.devices()``."""
    return default_client(backend).devices()


def _default_of(backend: str) -> tuple[str, str | None]:
    """The name to make ``backend``'s default client with, and the plugin file a plugin
    name stands for now (the PjRt backend's own default plugin by name is "pjrt")."""
    with _registry_lock:
        if backend in _BACKENDS:
            return backend, None
    try:
        path = os.path.realpath(find_plugin(backend).path)
    except (NotFoundError, InvalidArgumentError):
        return backend, None  # making it raises the error get_client gives with options
    try:
        default = os.path.realpath(default_cpu_library())
    except NotFoundError:  # no CPU build: a plugin named otherwise needs none
        default = None
    if path == default:
        return "pjrt", None
    return backend, path


def _job() -> Any:
    if not distributed.is_initialized():
        return None
    return (distributed.job_backend(), distributed.process_id(), distributed.num_processes())


def _new_client(backend: str, kwargs: dict[str, Any]) -> Client:
    with _registry_lock:
        factory = _BACKENDS.get(backend)
    if factory is None:
        return _plugin_client(backend, kwargs)
    if isinstance(factory, str):
        module_name, _, attr = factory.partition(":")
        module = importlib.import_module(module_name)
        try:
            factory = getattr(module, attr)
        except AttributeError:
            raise NotFoundError(
                f"backend {backend!r}: module {module_name!r} has no {attr!r}"
            ) from None
    return _checked(backend, _made(backend, factory, kwargs))


def _plugin_client(name: str, kwargs: dict[str, Any]) -> Client:
    """A PjRt-backend client of the plugin called ``name``."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"backend name must be a non-empty str, got {name!r}")
    from ifrtpy.backends.pjrt import create_client

    plugin = kwargs.pop("plugin", None)
    if plugin is None:
        try:
            plugin = find_plugin(name).path
        except NotFoundError:
            raise plugin_not_found(name, registered_backends()) from None
    return _checked(name, _made(name, create_client, {"plugin": plugin, "name": name, **kwargs}))


def _made(backend: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """``factory(**kwargs)``; where it refuses an option that looks like ``device_count``
    (``devices=8``, jax's word) and takes ``device_count``, InvalidArgumentError saying
    so first."""
    try:
        return factory(**kwargs)
    except (TypeError, InvalidArgumentError) as e:
        text = str(e)
        for key, value in kwargs.items():
            unknown = f"no create option {key!r}" in text or f"unexpected keyword argument {key!r}" in text
            if unknown and key != "device_count" and _takes_device_count(factory) and (
                    "devic" in key.lower() or difflib.SequenceMatcher(None, key, "device_count").ratio() >= 0.6):
                raise InvalidArgumentError(
                    f"get_client({backend!r}) has no option {key!r}: did you mean "
                    f"device_count={value!r} (the number of devices)?\n{text}") from e
        raise


def _takes_device_count(factory: Callable[..., Any]) -> bool:
    try:
        return "device_count" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


def _checked(backend: str, client: Any) -> Client:
    if not isinstance(client, Client):
        raise InvalidArgumentError(
            f"backend {backend!r} factory returned {type(client).__name__}, not a Client"
        )
    return client
