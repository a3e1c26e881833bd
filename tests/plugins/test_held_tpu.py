"""A TPU another process holds: its holders found as libtpu's lock and the chip's device
files show them, and libtpu's refusal turned into an error that says so (CI has no TPU:
a fake /proc, lock file and device file stand in, and create_client's plugin call is
made to fail with libtpu's text)."""

import os

import pytest

import ifrtpy as ifrt
from ifrtpy import _pjrt
from ifrtpy.errors import AbortedError, InvalidArgumentError, UnavailableError
from ifrtpy.plugins import discovery as plugins
from ifrtpy.plugins.held_tpu import chip_holders, tpu_in_use_error

from plugin_env import CPU_SO, clean_env  # noqa: F401  (fixture)

#: libtpu's text where it cannot tell which process holds the lock (libtpu 0.0.42.1).
LOCKFILE_ERROR = ('Internal error when accessing libtpu multi-process lockfile. '
                  'Run "$ sudo rm /tmp/libtpu_lockfile".')


@pytest.fixture
def machine(tmp_path):
    """A lock file, a chip's device file and a /proc where pid 4242 (python train.py) holds
    the lock, pid 5151 (jupyter) has the device file open, pid 6006 waits for the lock and
    pid 7007 locks another file: (device files, lock file, proc)."""
    lock = tmp_path / "libtpu_lockfile"
    lock.write_text("")
    other = tmp_path / "other"
    other.write_text("")
    chip = tmp_path / "dev" / "vfio" / "0"
    chip.parent.mkdir(parents=True)
    chip.write_text("")
    proc = tmp_path / "proc"
    inode, elsewhere = os.stat(lock).st_ino, os.stat(other).st_ino
    proc.mkdir()
    (proc / "locks").write_text(
        f"1: POSIX  ADVISORY  WRITE 4242 00:2f:{inode} 0 EOF\n"
        f"1: -> POSIX  ADVISORY  WRITE 6006 00:2f:{inode} 0 EOF\n"
        f"2: FLOCK  ADVISORY  WRITE 7007 00:2f:{elsewhere} 0 EOF\n")
    for pid, command, opened in [(4242, b"python\0train.py\0", other), (5151, b"jupyter\0", chip),
                                 (6006, b"python\0", other), (7007, b"python\0", other)]:
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(command)
        (proc / str(pid) / "fd" / "3").symlink_to(opened)
    return (str(tmp_path / "dev" / "vfio" / "[0-9]*"),), str(lock), str(proc)


def test_the_holders_are_the_lock_owner_and_who_has_the_chip_open(machine):
    assert chip_holders(*machine) == [4242, 5151]


def test_libtpu_lockfile_error_names_the_holders_and_how_to_share(machine):
    devices, lock, proc = machine
    error = tpu_in_use_error(AbortedError(LOCKFILE_ERROR), *machine)
    assert isinstance(error, UnavailableError)
    assert str(error).splitlines() == [
        "the TPU is in use by another process: pid 4242 (python train.py), pid 5151 "
        "(jupyter); a TPU serves one process at a time: end that process, or share the chip "
        "through one server (python -m ifrtpy serve --backend tpu; docs/tpu.md)",
        f"Find the holder with: lsof -w {lock} {devices[0]} (with sudo for another user's). "
        f"Do not delete {lock} while it runs: its lock keeps a second process off the chip, "
        "and libtpu releases it when the holder exits.",
        f"libtpu said: AbortedError: {LOCKFILE_ERROR}"]


def test_a_holder_no_one_can_see_is_said_so_and_libtpus_pid_is_kept(tmp_path):
    nothing = ((str(tmp_path / "no-device*"),), str(tmp_path / "no-lock"), str(tmp_path))
    first = str(tpu_in_use_error(AbortedError(LOCKFILE_ERROR), *nothing)).splitlines()[0]
    assert first.startswith("the TPU is in use by another process, one this user cannot see "
                            "in /proc (another user's?); a TPU serves one process at a time")
    named = AbortedError("The TPU is already in use by process with pid 31337. Not attempting "
                         "to load libtpu.so in this process.")
    first = str(tpu_in_use_error(named, *nothing)).splitlines()[0]
    assert first.startswith("the TPU is in use by another process: pid 31337; a TPU serves")


def test_other_errors_are_left_alone(machine):
    assert tpu_in_use_error(AbortedError("Internal error in the compiler"), *machine) is None


def test_create_client_raises_the_held_chip_error(clean_env, monkeypatch):
    clean_env.setenv(plugins.TPU_ENV_VAR, CPU_SO)          # a library found as 'tpu'

    def refused(*args, **kwargs):
        raise AbortedError(LOCKFILE_ERROR)

    monkeypatch.setattr(_pjrt, "create_client", refused)
    with pytest.raises(UnavailableError) as caught:
        ifrt.get_client("pjrt", plugin="tpu")
    message = str(caught.value)
    assert message.startswith("the TPU is in use by another process")
    assert message.endswith(f"libtpu said: AbortedError: {LOCKFILE_ERROR}")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__

    def bad(*args, **kwargs):
        raise InvalidArgumentError("another refusal")

    monkeypatch.setattr(_pjrt, "create_client", bad)
    with pytest.raises(InvalidArgumentError, match="^another refusal$"):
        ifrt.get_client("pjrt", plugin="tpu")
