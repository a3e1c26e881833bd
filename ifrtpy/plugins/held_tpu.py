"""A TPU held by another process: who holds it, and the error that says so.

libtpu lets one process at a time use a host's TPU chips: it takes a lock (``lockf``) on
:data:`LOCK_FILE` for the whole life of the process. Another process's client then fails
with libtpu's text: the holder's pid where libtpu finds it, else "Internal error when
accessing libtpu multi-process lockfile" with advice to delete the lock file with sudo,
advice that is wrong while a live process holds the chip (deleting the file lets a second
process open the chip beside it). :func:`tpu_in_use_error` turns such an error into one
that says what is true: the processes holding the chip, as far as ``/proc`` shows them
to this user, how to find them, and that ``python -m ifrtpy serve`` lets several
processes share one chip.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Iterator, Sequence

from ifrtpy.errors import IfrtError, UnavailableError

__all__ = ["LIBTPU_IN_USE_TEXTS", "LOCK_FILE", "DEVICE_FILES", "chip_holders",
           "tpu_in_use_error"]

#: Texts of libtpu's errors for a chip another process holds.
LIBTPU_IN_USE_TEXTS = ("libtpu multi-process lockfile", "TPU is already in use")
#: The lock file libtpu locks while a process holds the host's chips.
LOCK_FILE = "/tmp/libtpu_lockfile"
#: The device files of TPU chips (``/dev/accel*`` on v2-v4, VFIO groups on v5e and later).
DEVICE_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*")


def chip_holders(device_files: Sequence[str] = DEVICE_FILES, lock_file: str = LOCK_FILE,
                 proc: str = "/proc") -> list[int]:
    """The pids of the other processes holding a TPU: those ``{proc}/locks`` lists with a
    lock on ``lock_file``, and those with a file of ``device_files`` (glob patterns) open.
    Processes whose ``/proc`` entries this one may not read are not seen."""
    found = set(_lockers(lock_file, proc))
    devices = {os.path.realpath(path) for pattern in device_files for path in glob.glob(pattern)}
    if devices:
        try:
            pids = [int(e) for e in os.listdir(proc) if e.isdigit()]
        except OSError:
            pids = []
        found.update(pid for pid in pids if _has_open(os.path.join(proc, str(pid), "fd"), devices))
    found.discard(os.getpid())
    return sorted(found)


def _lockers(lock_file: str, proc: str) -> Iterator[int]:
    """The pids ``{proc}/locks`` lists holding a lock on ``lock_file`` (by its inode)."""
    try:
        inode = str(os.stat(lock_file).st_ino)
        with open(os.path.join(proc, "locks")) as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; "1: -> POSIX ..." waits for one
        fields = line.split()
        if len(fields) >= 6 and fields[1] != "->" and fields[4].isdigit() \
                and fields[5].rpartition(":")[2] == inode:
            yield int(fields[4])


def _has_open(fd_dir: str, paths: set[str]) -> bool:
    try:
        fds = os.listdir(fd_dir)
    except OSError:  # gone, or another user's
        return False
    for fd in fds:
        try:
            if os.readlink(os.path.join(fd_dir, fd)) in paths:
                return True
        except OSError:
            continue
    return False


def _described(pid: int, proc: str) -> str:
    """``pid 1234 (python train.py)``; the pid alone where its command line is unreadable."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
    except OSError:
        words = []
    command = " ".join(words)
    if len(command) > 80:
        command = command[:77] + "..."
    return f"pid {pid} ({command})" if command else f"pid {pid}"


def tpu_in_use_error(error: IfrtError, device_files: Sequence[str] = DEVICE_FILES,
                     lock_file: str = LOCK_FILE, proc: str = "/proc") -> IfrtError | None:
    """The error to raise for ``error`` where it is libtpu's refusal of a chip another
    process holds: an UnavailableError naming the holders (:func:`chip_holders`, and the
    pid libtpu's text gives), saying how to find them and how several processes share
    one chip, libtpu's text last. None for any other error."""
    text = str(error)
    if not any(t in text for t in LIBTPU_IN_USE_TEXTS):
        return None
    holders = set(chip_holders(device_files, lock_file, proc))
    holders.update(int(pid) for pid in re.findall(r"process with pid (\d+)", text))
    who = (": " + ", ".join(_described(pid, proc) for pid in sorted(holders)) if holders
           else ", one this user cannot see in /proc (another user's?)")
    return UnavailableError(
        f"the TPU is in use by another process{who}; a TPU serves one process at a time: end "
        f"that process, or share the chip through one server (python -m ifrtpy serve "
        f"--backend tpu; docs/tpu.md)\n"
        f"Find the holder with: lsof -w {lock_file} {' '.join(device_files)} (with sudo for "
        f"another user's). Do not delete {lock_file} while it runs: its lock keeps a second "
        f"process off the chip, and libtpu releases it when the holder exits.\n"
        f"libtpu said: {type(error).__name__}: {text}")
