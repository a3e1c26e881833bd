"""How much ifrtpy, the PJRT plugin and jaxlib write: quiet by default.

Two kinds of messages exist:

* ifrtpy's own diagnostics go through the :mod:`logging` module, logger ``"ifrtpy"``.
* The plugin and jaxlib are C++ libraries logging straight to the process's stderr
  (``I0000 ...``, ``W0000 ...``, ``E0000 ...`` lines). They read their threshold from the
  environment variable ``TF_CPP_MIN_LOG_LEVEL`` (0 all, 1 no INFO, 2 no WARNING, 3 no
  ERROR; FATAL always shows) once, when each library is loaded.

When ``TF_CPP_MIN_LOG_LEVEL`` is not set (or holds only the default ``import jax`` puts
there), importing ifrtpy sets it (in ``os.environ``, so libraries loaded later in this
process and child processes read it) from ``IFRTPY_LOG_LEVEL``, or to 3 when that is not
set either. Errors of the plugin still reach
the caller as :mod:`ifrtpy.errors` exceptions; only its log lines are hidden.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Union

from ifrtpy.errors import InvalidArgumentError

__all__ = ["set_log_level", "apply_to_jaxlib", "NATIVE_LEVELS", "ENV_VAR", "NATIVE_ENV_VAR"]

#: ifrtpy's switch: a level name (``debug info warning error critical``) or number.
ENV_VAR = "IFRTPY_LOG_LEVEL"
#: The variable the plugin and jaxlib read.
NATIVE_ENV_VAR = "TF_CPP_MIN_LOG_LEVEL"
#: ``TF_CPP_MIN_LOG_LEVEL`` for each :mod:`logging` level: the native lines shown at it.
NATIVE_LEVELS = {logging.DEBUG: 0, logging.INFO: 0, logging.WARNING: 1, logging.ERROR: 2,
                 logging.CRITICAL: 3}

_logger = logging.getLogger("ifrtpy")


def _as_level(level: Union[int, str], where: str) -> int:
    if isinstance(level, str) and not level.strip().lstrip("-").isdigit():
        number = logging.getLevelName(level.strip().upper())
        if not isinstance(number, int):
            raise InvalidArgumentError(
                f"{where} must be one of debug, info, warning, error, critical (or a "
                f"logging level number), got {level!r}")
        return number
    if isinstance(level, bool) or not isinstance(level, (int, str)):
        raise InvalidArgumentError(f"{where} must be a level name or number, got {level!r}")
    return int(level)


def _native_level(level: int) -> int:
    """The native threshold showing what ``level`` shows (levels between round down)."""
    return max((n for lv, n in NATIVE_LEVELS.items() if lv <= level), default=0)


def set_log_level(level: Union[int, str]) -> None:
    """Show messages of ``level`` and above (``"info"``, ``logging.WARNING``, ...), from
    ifrtpy's logger and from the plugin and jaxlib.

    Sets the ``"ifrtpy"`` logger's level and ``TF_CPP_MIN_LOG_LEVEL``. The plugin and jaxlib
    read that variable once, when loaded: call this before the first client is created
    (or set ``IFRTPY_LOG_LEVEL`` before starting Python). ifrtpy's own messages print
    only where :mod:`logging` has a handler (Python's last-resort handler shows WARNING and
    above; ``logging.basicConfig()`` shows all that pass the level).
    """
    number = _as_level(level, "level")
    _logger.setLevel(number)
    os.environ[NATIVE_ENV_VAR] = str(_native_level(number))
    apply_to_jaxlib()


def apply_to_jaxlib() -> None:
    """Give jaxlib, where it is loaded already, the threshold ``TF_CPP_MIN_LOG_LEVEL`` holds
    (jaxlib reads the variable only when it loads; a jax process registering the proxy
    backend has loaded it before ifrtpy is imported)."""
    if "jaxlib" not in sys.modules:
        return  # it reads the variable when it loads
    text = os.environ.get(NATIVE_ENV_VAR, "").strip()
    if text.isdigit():
        from ifrtpy import _jaxlib

        _jaxlib.set_native_log_level(min(int(text), 3))


def _apply_environment() -> None:
    """At import: the native threshold from ``IFRTPY_LOG_LEVEL``, or 3, unless already set.

    ``IFRTPY_LOG_LEVEL`` also sets the ``"ifrtpy"`` logger's level; a value it cannot read
    is reported on that logger (importing still succeeds) and ignored.
    """
    requested = os.environ.get(ENV_VAR, "").strip()
    try:
        number = _as_level(requested, ENV_VAR) if requested else None
    except InvalidArgumentError as e:
        _logger.warning("%s; ignored", e)
        number = None
    if number is not None:
        _logger.setLevel(number)
    if NATIVE_ENV_VAR not in os.environ or _set_by_jax():
        os.environ[NATIVE_ENV_VAR] = str(3 if number is None else _native_level(number))


def _set_by_jax() -> bool:
    """Whether ``TF_CPP_MIN_LOG_LEVEL`` holds the default ``import jax`` sets (``1``) rather
    than a value of the user's: jax is loaded and the process did not start with it
    (read from ``/proc/self/environ``; where that cannot be read, the value is kept)."""
    if os.environ.get(NATIVE_ENV_VAR) != "1" or "jax" not in sys.modules:
        return False
    try:
        with open("/proc/self/environ", "rb") as f:
            initial = f.read().split(b"\0")
    except OSError:
        return False
    return not any(entry.startswith(NATIVE_ENV_VAR.encode() + b"=") for entry in initial)
