"""What a backend declares to the conformance suite, and where a backend keeps it.

A :class:`Declaration` says what a backend does not do (``expected_skips``: case -> a text
of its skip message), which draws of which laws it refuses (``rejected_draws``: law -> a
text of the ``UnimplementedError`` of each draw it may reject) and what it holds of what
the laws draw (``multi_device_arrays``: arrays over several devices; ``sharding_kinds``:
the kinds of sharding). The suite reads it and probes nothing.

A backend ships its declaration next to its code, as plain data (so the backend imports
nothing of the suite): a module holding ``EXPECTED_SKIPS`` and, where they apply,
``REJECTED_DRAWS``, ``MULTI_DEVICE_ARRAYS`` and ``SHARDING_KINDS``. For a backend named by a factory path
``package.module:function`` that module is ``package.module.conformance`` where
``package.module`` is a package, else ``package.module`` itself; a built-in backend's
(``reference``, ``pjrt``, ``jax``) is ``ifrtpy.backends.<name>.conformance``
(:func:`declaration_of`). The suite joins :data:`ONE_PROCESS_SKIPS` to a shipped
declaration for a client whose devices are all addressable (:meth:`Declaration.skips_for`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from types import MappingProxyType, ModuleType
from typing import Any, Mapping, Optional

#: The skips of a client whose devices are all addressable (one process): the cases that
#: need devices of another process. Spread it into such a client's expected skips
#: (``{**ONE_PROCESS_SKIPS, ...}``); a shipped declaration gets it where it applies.
ONE_PROCESS_SKIPS = {name: "non-addressable device(s), the client has 0" for name in (
    "test_make_array_from_host_buffer_with_addressable_and_non_addressable_device",
    "test_make_error_arrays_with_addressable_and_non_addressable_device",
    "test_assemble_and_disassemble_non_addressable_array",
    "test_a_replicated_array_with_non_addressable_devices_is_read_whole",
)}


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What a backend does not do, and what it does that the laws draw.

    * ``expected_skips``: case name (or pytest item name ``"test_x[param]"``) -> a text its
      skip message holds.
    * ``rejected_draws``: law name -> a text each ``UnimplementedError`` the law may reject
      a draw for holds. A law rejects no draw without it (the draw's error then stands for
      the whole law), and a core law rejects none.
    * ``multi_device_arrays``: whether the backend's arrays may span several devices; the
      laws draw single-device shardings only where it is False.
    * ``sharding_kinds``: the kinds of sharding the laws draw for the backend's arrays
      (names of :data:`ifrtpy.testing.strategies.SHARDING_KINDS`; None: all of them).
    * ``one_process``: join :data:`ONE_PROCESS_SKIPS` to the expected skips for a client
      whose devices are all addressable (a shipped declaration's way).
    """

    expected_skips: Mapping[str, str] = dataclasses.field(default_factory=dict)
    rejected_draws: Mapping[str, str] = dataclasses.field(default_factory=dict)
    multi_device_arrays: bool = True
    sharding_kinds: Optional[tuple[str, ...]] = None
    one_process: bool = False

    def __post_init__(self):
        for name in ("expected_skips", "rejected_draws"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        if self.sharding_kinds is not None:
            from ifrtpy.testing.strategies import SHARDING_KINDS

            kinds = tuple(self.sharding_kinds)
            if not kinds or not set(kinds) <= set(SHARDING_KINDS):
                raise ValueError(f"sharding_kinds are some of {SHARDING_KINDS}, got {kinds}")
            object.__setattr__(self, "sharding_kinds", kinds)

    def skips_for(self, client: Any) -> Mapping[str, str]:
        """The expected skips of a run on ``client``: with :data:`ONE_PROCESS_SKIPS` where
        ``one_process`` and every device of the client is addressable."""
        if self.one_process and client is not None and all(
                d.is_addressable for d in client.devices()):
            return {**ONE_PROCESS_SKIPS, **self.expected_skips}
        return self.expected_skips

    def names(self) -> list[str]:
        """Every case name the declaration holds (the one-process ones aside)."""
        return [*self.expected_skips, *self.rejected_draws]

    @classmethod
    def from_module(cls, module: ModuleType | str) -> "Declaration":
        """The declaration a backend ships in ``module`` (or the module of that name):
        its ``EXPECTED_SKIPS``, ``REJECTED_DRAWS``, ``MULTI_DEVICE_ARRAYS`` and ``SHARDING_KINDS``."""
        if isinstance(module, str):
            module = importlib.import_module(module)
        if not hasattr(module, "EXPECTED_SKIPS"):
            raise ValueError(f"{module.__name__} declares nothing to the conformance suite: "
                             "it has no EXPECTED_SKIPS")
        return cls(expected_skips=getattr(module, "EXPECTED_SKIPS"),
                   rejected_draws=getattr(module, "REJECTED_DRAWS", {}),
                   multi_device_arrays=getattr(module, "MULTI_DEVICE_ARRAYS", True),
                   sharding_kinds=getattr(module, "SHARDING_KINDS", None), one_process=True)


def declaration_module(backend: str) -> Optional[str]:
    """The module that holds the declaration of ``backend`` (a built-in backend's name or
    a ``module:function`` factory path), or None where it ships none."""
    module, sep, _ = backend.partition(":")
    if not sep:
        if not backend.isidentifier():
            return None
        module = f"ifrtpy.backends.{backend}"
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations is not None:  # a package: its conformance module
        name = f"{module}.conformance"
        try:
            return name if importlib.util.find_spec(name) is not None else None
        except (ImportError, ValueError):
            return None
    if not sep:
        return None
    return module if hasattr(importlib.import_module(module), "EXPECTED_SKIPS") else None


def declaration_of(backend: str) -> Optional[Declaration]:
    """The declaration ``backend`` ships (:func:`declaration_module`), or None."""
    name = declaration_module(backend)
    return None if name is None else Declaration.from_module(name)
