"""The persistent compilation cache: compiled executables kept on disk across processes.

Off by default. It is on when a directory is named: ``ifrtpy.config.compilation_cache_dir``,
else the environment variable ``IFRTPY_COMPILATION_CACHE_DIR``; one compile can name its
own directory, or turn the cache off, with ``CompileOptions(compilation_cache_dir=...)``
(a path, or False).

An entry is one file, named by the SHA-256 key of what determines the executable (the
program bytes sent to the plugin, the serialized compile options, the plugin's identity
and version, the devices' kinds and count, and for CPU devices the host processor's model
and features, on Linux). It holds the key and the plugin's sealed
serialized executable (plugin identity + SHA-256 checksum: the PjRt backend seals it,
``ifrtpy.backends.pjrt.seal``, and gives :meth:`CompilationCache.load` the check of the
seal), so a truncated, corrupted or foreign entry is detected before the plugin sees it
(the C layer hands bytes to the plugin unchecked): it is discarded with a
:class:`CompilationCacheWarning` and the program compiled afresh.

Entries are written atomically (a private temporary file, fsync, rename), so processes
compiling the same program at once each write a whole entry and readers see a whole one.
The cache is trimmed to ``ifrtpy.config.compilation_cache_max_bytes`` by removing the
least recently used entries (a hit refreshes an entry's modification time).

An entry is machine code that the process will run. The directory is created private
(mode 0700); a directory or entry that is not owned by this user or that others can
write, and an entry that is a symlink, are not loaded (a warning, then a normal compile),
so nobody can plant code in another user's process. A directory that cannot be written
gives a warning and the compile goes on without storing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import stat
import tempfile
import time
import warnings
from typing import Callable, Iterable

from ifrtpy import config

__all__ = ["CompilationCache", "CompilationCacheWarning", "cache_for"]

_MAGIC = b"IFRTPY-CACHE-ENTRY-1\n"
_SUFFIX = ".exe"
_STALE_TEMPORARY_S = 3600


class CompilationCacheWarning(UserWarning):
    """An entry or the cache directory was not used (corrupt, unsafe or unwritable)."""


def cache_for(override: str | os.PathLike[str] | bool | None) -> CompilationCache | None:
    """The cache a compile uses: ``override`` (a path, or False for none), else the
    configured directory, else None (off)."""
    if override is False:
        return None
    if override is None or override is True:
        configured = config.compilation_cache_dir or os.environ.get("IFRTPY_COMPILATION_CACHE_DIR")
        if not configured:
            return None
        return CompilationCache(configured, config.compilation_cache_max_bytes)
    return CompilationCache(os.fspath(override), config.compilation_cache_max_bytes)


def cache_key(parts: Iterable[bytes]) -> str:
    """The hex SHA-256 of ``parts``, each length-prefixed (no two part lists collide)."""
    h = hashlib.sha256(_MAGIC)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def host_cpu_identity() -> bytes:
    """This machine's processor as a CPU plugin compiles for it: the architecture, and on
    Linux the model and feature flags of ``/proc/cpuinfo``. Part of the key of CPU
    executables, so that a cache shared between machines never hands one machine code
    using instructions its processor lacks (which would end the process)."""
    parts = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, sep, value = line.partition(":")
                name = name.strip()
                if sep and name in ("flags", "Features"):
                    parts.append(f"{name}={' '.join(sorted(value.split()))}")
                elif sep and name in ("model name", "CPU implementer", "CPU part"):
                    parts.append(f"{name}={value.strip()}")
                elif not line.strip() and len(parts) > 2:
                    break  # the first processor's fields are enough
    except OSError:
        pass
    return "\n".join(parts).encode()


def warn(message: str) -> None:
    """Issue a CompilationCacheWarning."""
    warnings.warn(message, CompilationCacheWarning, stacklevel=4)


def _unsafe(st: os.stat_result) -> str | None:
    """Why a file or directory with this status may not be trusted, or None."""
    if st.st_uid != os.getuid():
        return f"it is owned by user {st.st_uid}, not by this user ({os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others can write it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


class CompilationCache:
    """Entries in ``directory``, at most ``max_bytes`` in all."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes

    def _usable_directory(self, create: bool) -> bool:
        """Whether the directory exists (created private when ``create``) and is safe."""
        try:
            if create and not os.path.exists(self.directory):
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
            st = os.stat(self.directory)
        except FileNotFoundError:
            return False
        except OSError as e:
            warn(f"compilation cache directory {self.directory!r} cannot be used: {e}")
            return False
        if not stat.S_ISDIR(st.st_mode):
            warn(f"compilation cache {self.directory!r} is not a directory; not used")
            return False
        why = _unsafe(st)
        if why is not None:
            warn(f"compilation cache directory {self.directory!r} is not used: {why}")
            return False
        return True

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key + _SUFFIX)

    def load(self, key: str, unseal: Callable[[bytes], bytes]) -> bytes | None:
        """What ``unseal`` makes of the sealed executable stored under ``key`` (the plugin's
        payload; ``unseal`` raises for bytes of another plugin or with a changed byte), or
        None. A bad entry is removed with a warning; an unsafe one is left alone with a
        warning."""
        if not self._usable_directory(create=False):
            return None
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        except OSError as e:  # ELOOP: a symlink
            warn(f"compilation cache entry {path!r} is not loaded: "
                  f"{'it is a symlink' if os.path.islink(path) else e}")
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            why = "it is not a regular file" if not stat.S_ISREG(st.st_mode) else _unsafe(st)
            if why is not None:
                warn(f"compilation cache entry {path!r} is not loaded: {why}")
                return None
            data = f.read()
        head = _MAGIC + key.encode() + b"\n"
        try:
            if not data.startswith(head):
                raise ValueError("it does not start with its key")
            payload = unseal(data[len(head):])
        except Exception as e:  # noqa: BLE001 - any reason makes the entry unusable
            warn(f"compilation cache entry {path!r} is discarded and the program compiled "
                  f"again: {e}")
            self._remove(path)
            return None
        try:
            os.utime(path)  # most recently used
        except OSError:
            pass
        return payload

    def store(self, key: str, sealed: bytes) -> None:
        """Write the entry atomically, then trim the cache; a warning if it cannot."""
        if not self._usable_directory(create=True):
            return
        try:
            fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=_SUFFIX)
        except OSError as e:
            warn(f"compilation cache {self.directory!r} cannot be written ({e}); "
                  f"the executable is not stored")
            return
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + key.encode() + b"\n")
                f.write(sealed)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self._path(key))
        except OSError as e:
            self._remove(temporary)
            warn(f"compilation cache entry for {key} could not be written: {e}")
            return
        self.trim()

    def entries(self) -> list[tuple[float, int, str]]:
        """``(modification time, size, path)`` of each entry, oldest first."""
        out = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        for name in names:
            if not name.endswith(_SUFFIX):
                continue
            path = os.path.join(self.directory, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not name.startswith("."):
                out.append((st.st_mtime, st.st_size, path))
            elif time.time() - st.st_mtime > _STALE_TEMPORARY_S:  # left by a process that died
                self._remove(path)
        return sorted(out)

    def trim(self) -> None:
        """Remove the least recently used entries until the cache fits ``max_bytes``."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            self._remove(path)
            total -= size

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass
