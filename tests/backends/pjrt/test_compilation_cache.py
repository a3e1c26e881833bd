"""The persistent compilation cache (``ifrtpy.compilation_cache``) and the in-process memo.

The oracle for "the entry was not used" is a planted entry that computes something else:
a run that gives the program's own result did not load it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy import compilation_cache
from ifrtpy.compilation_cache import CompilationCacheWarning
from pjrt_helpers import ADD_ONE_F32_4

ADD_ONE = ADD_ONE_F32_4
TIMES_THREE = ADD_ONE.replace("1.0", "3.0").replace("add", "multiply")
X = np.array([1.0, 2.0, -3.0, 0.5], dtype=np.float32)


def compile_and_run(program: str, cache_dir, **options):
    client = ifrt.get_client(device_count=1)  # a new client: no in-process memo
    exe = client.compile(ifrt.HloProgram(program),
                         ifrt.CompileOptions(compilation_cache_dir=cache_dir, **options))
    [y] = exe(client.make_array_from_host_buffer(X, ifrt.SingleDeviceSharding(client.devices()[0])))
    return exe, np.asarray(y)


def entry_files(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".exe") and not n.startswith("."))


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "cache")


@pytest.fixture
def planted(tmp_path, cache_dir):
    """The cache path of ADD_ONE's entry and bytes to put there that compute TIMES_THREE."""
    compile_and_run(ADD_ONE, cache_dir)
    [name] = entry_files(cache_dir)
    other = str(tmp_path / "other")
    compile_and_run(TIMES_THREE, other)
    [other_name] = entry_files(other)
    with open(os.path.join(other, other_name), "rb") as f:
        data = f.read()
    key = name[:-len(".exe")].encode()
    data = data.replace(other_name[:-len(".exe")].encode(), key, 1)
    return os.path.join(cache_dir, name), data


def test_off_unless_a_directory_is_named(monkeypatch):
    monkeypatch.delenv("IFRTPY_COMPILATION_CACHE_DIR", raising=False)
    assert compilation_cache.cache_for(None) is None
    monkeypatch.setenv("IFRTPY_COMPILATION_CACHE_DIR", "/nonexistent/x")
    assert compilation_cache.cache_for(None).directory == "/nonexistent/x"
    assert compilation_cache.cache_for(False) is None
    monkeypatch.setattr(ifrt.config, "compilation_cache_dir", "/nonexistent/y")
    assert compilation_cache.cache_for(None).directory == "/nonexistent/y"


def test_the_directory_is_created_private_and_an_entry_is_stored(cache_dir):
    _, y = compile_and_run(ADD_ONE, cache_dir)
    np.testing.assert_array_equal(y, X + 1)
    assert os.stat(cache_dir).st_mode & 0o777 == 0o700
    [name] = entry_files(cache_dir)
    assert os.stat(os.path.join(cache_dir, name)).st_mode & 0o077 == 0


def test_a_hit_after_a_restart_is_the_same_executable(cache_dir):
    script = textwrap.dedent(f"""
        import numpy as np, ifrtpy as ifrt
        from ifrtpy.backends.pjrt import executable
        if HIT:
            def refuse(*args):
                raise AssertionError("compiled although the entry was there")
            executable._compile = refuse
        ifrt.config.compilation_cache_dir = {cache_dir!r}
        c = ifrt.get_client(device_count=1)
        exe = c.compile(ifrt.HloProgram({ADD_ONE!r}))
        [y] = exe(c.make_array_from_host_buffer(np.arange(4, dtype=np.float32), ifrt.SingleDeviceSharding(c.devices()[0])))
        print(exe.fingerprint, exe.name, np.asarray(y).tolist(), exe.output_shardings())
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    runs = [subprocess.run([sys.executable, "-W", "error", "-c", script.replace("HIT", str(hit))],
                           capture_output=True, text=True, timeout=300, env=env) for hit in (False, True)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout
    assert "[1.0, 2.0, 3.0, 4.0]" in runs[0].stdout


@pytest.mark.parametrize("damage", ["truncate", "flip_payload", "flip_header", "empty", "wrong_plugin"])
def test_a_damaged_entry_is_discarded_and_compiled_again(cache_dir, damage):
    first, _ = compile_and_run(ADD_ONE, cache_dir)
    [name] = entry_files(cache_dir)
    path = os.path.join(cache_dir, name)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip_payload":
        data[-100] ^= 0xFF
    elif damage == "flip_header":
        data[5] ^= 0xFF
    elif damage == "empty":
        data = bytearray()
    else:  # the same bytes, sealed as by another version of the plugin
        major, minor = ifrt.get_client("pjrt").plugin.api_version
        data = data.replace(b"(%d, %d)" % (major, minor), b"(%d, %d)" % (major, minor + 1), 1)
        assert b"(%d, %d)" % (major, minor + 1) in data
    with open(path, "wb") as f:
        f.write(data)
    with pytest.warns(CompilationCacheWarning, match="discarded and the program compiled again"):
        again, y = compile_and_run(ADD_ONE, cache_dir)
    np.testing.assert_array_equal(y, X + 1)
    assert again.fingerprint == first.fingerprint
    with open(path, "rb") as f:
        assert len(f.read()) > len(data) // 2  # rewritten whole


def test_the_least_recently_used_entries_are_evicted(cache_dir, monkeypatch):
    programs = [ADD_ONE.replace("1.0", f"{k}.0") for k in (2, 3, 4)]
    compile_and_run(programs[0], cache_dir)
    [first] = entry_files(cache_dir)
    size = os.stat(os.path.join(cache_dir, first)).st_size
    monkeypatch.setattr(ifrt.config, "compilation_cache_max_bytes", int(size * 2.5))
    compile_and_run(programs[1], cache_dir)
    [second] = set(entry_files(cache_dir)) - {first}
    os.utime(os.path.join(cache_dir, first), (1000, 1000))  # the oldest two, first older
    os.utime(os.path.join(cache_dir, second), (2000, 2000))
    compile_and_run(programs[0], cache_dir)  # a hit makes first the most recently used
    compile_and_run(programs[2], cache_dir)  # three entries do not fit: second goes
    names = entry_files(cache_dir)
    assert len(names) == 2 and first in names and second not in names


def test_two_processes_racing_on_one_key_share_one_entry(cache_dir):
    script = textwrap.dedent(f"""
        import numpy as np, ifrtpy as ifrt
        ifrt.config.compilation_cache_dir = {cache_dir!r}
        c = ifrt.get_client(device_count=1)
        exe = c.compile(ifrt.HloProgram({ADD_ONE!r}))
        [y] = exe(c.make_array_from_host_buffer(np.arange(4, dtype=np.float32), ifrt.SingleDeviceSharding(c.devices()[0])))
        assert np.asarray(y).tolist() == [1.0, 2.0, 3.0, 4.0]
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    procs = [subprocess.Popen([sys.executable, "-W", "error", "-c", script], env=env,
                              stderr=subprocess.PIPE) for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
    assert len(entry_files(cache_dir)) == 1
    assert not [n for n in os.listdir(cache_dir) if n.startswith(".tmp-")]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, y = compile_and_run(ADD_ONE, cache_dir)
    np.testing.assert_array_equal(y, X + 1)


def test_an_unwritable_directory_warns_and_the_compile_goes_on(tmp_path):
    if os.geteuid() == 0:  # root writes anywhere: a directory that cannot be made
        (tmp_path / "file").write_text("")
        directory = str(tmp_path / "file" / "cache")
    else:
        directory = str(tmp_path / "read_only")
        os.mkdir(directory, 0o500)
    with pytest.warns(CompilationCacheWarning, match="cannot be"):
        _, y = compile_and_run(ADD_ONE, directory)
    np.testing.assert_array_equal(y, X + 1)


def test_a_planted_entry_that_is_well_formed_is_loaded(planted, cache_dir):
    path, data = planted  # shows that the tests below would see a load
    with open(path, "wb") as f:
        f.write(data)
    _, y = compile_and_run(ADD_ONE, cache_dir)
    np.testing.assert_array_equal(y, X * 3)


@pytest.mark.parametrize("where", ["entry", "directory"])
def test_what_others_can_write_is_not_loaded(planted, cache_dir, where):
    path, data = planted
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path if where == "entry" else cache_dir, 0o666 if where == "entry" else 0o777)
    with pytest.warns(CompilationCacheWarning, match="others can write it"):
        _, y = compile_and_run(ADD_ONE, cache_dir)
    np.testing.assert_array_equal(y, X + 1)


def test_a_symlinked_entry_is_not_loaded(planted, cache_dir, tmp_path):
    path, data = planted
    outside = tmp_path / "outside.exe"
    outside.write_bytes(data)
    os.chmod(outside, 0o600)
    os.unlink(path)
    os.symlink(outside, path)
    with pytest.warns(CompilationCacheWarning, match="it is a symlink"):
        _, y = compile_and_run(ADD_ONE, cache_dir)
    np.testing.assert_array_equal(y, X + 1)


def test_the_in_process_memo_returns_the_executable_until_deleted():
    client = ifrt.get_client(device_count=1)
    program = ifrt.HloProgram(ADD_ONE)
    first = client.compile(program)
    assert client.compile(program) is first
    assert client.compile(ifrt.HloProgram(ADD_ONE)) is first  # equal text
    assert client.compile(program, ifrt.CompileOptions(use_spmd_partitioning=True)) is not first
    first.delete()
    fresh = client.compile(program)
    assert fresh is not first and not fresh.is_deleted()


def test_compilation_cache_dir_is_checked():
    with pytest.raises(ifrt.errors.InvalidArgumentError, match="compilation_cache_dir"):
        ifrt.CompileOptions(compilation_cache_dir=3)


def test_temporary_files_of_dead_writers_are_removed_after_an_hour(cache_dir):
    compile_and_run(ADD_ONE, cache_dir)
    stale, fresh = (os.path.join(cache_dir, f".tmp-{n}.exe") for n in ("stale", "fresh"))
    for path in (stale, fresh):
        with open(path, "wb") as f:
            f.write(b"half an entry")
    os.utime(stale, (1000, 1000))
    compile_and_run(ADD_ONE.replace("1.0", "5.0"), cache_dir)  # a store trims
    assert not os.path.exists(stale) and os.path.exists(fresh)
    assert len(entry_files(cache_dir)) == 2


def test_a_hit_of_a_partitioned_program_has_the_compiled_shardings(cache_dir, monkeypatch):
    program = ifrt.HloProgram("""
    func.func @main(%a: tensor<8x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"})
        -> (tensor<8x4xf32> {mhlo.sharding = "{replicated}"}) {
      %0 = stablehlo.add %a, %a : tensor<8x4xf32>
      return %0 : tensor<8x4xf32>
    }""")
    options = ifrt.CompileOptions(num_partitions=4, compilation_cache_dir=cache_dir)
    fresh = ifrt.get_client(device_count=4).compile(program, options)

    def refuse(*args):
        raise AssertionError("compiled although the entry was there")

    from ifrtpy.backends.pjrt import executable
    monkeypatch.setattr(executable, "_compile", refuse)
    hit = ifrt.get_client(device_count=4).compile(program, options)
    assert hit.fingerprint == fresh.fingerprint
    assert hit.program_text(optimized=True) == fresh.program_text(optimized=True)
    for mine, theirs in ((hit.parameter_shardings(), fresh.parameter_shardings()),
                         (hit.output_shardings(), fresh.output_shardings())):
        assert [list(s.index_domains((8, 4))) for s in mine] == [list(s.index_domains((8, 4))) for s in theirs]
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    client = hit.client
    [y] = hit(client.make_array_from_host_buffer(x, hit.parameter_shardings()[0]))
    np.testing.assert_array_equal(np.asarray(y), 2 * x)


def test_a_cpu_entry_is_not_loaded_on_another_processor(planted, cache_dir, monkeypatch):
    """The key of a CPU executable holds the host processor's model and features: on a
    machine with another processor the entry (here planted, computing x * 3) is not used."""
    path, data = planted
    with open(path, "wb") as f:
        f.write(data)
    identity = compilation_cache.host_cpu_identity()
    assert platform_flags_in(identity)
    _, y = compile_and_run(ADD_ONE, cache_dir)
    np.testing.assert_array_equal(y, X * 3)  # the same processor: the entry is loaded
    monkeypatch.setattr(compilation_cache, "host_cpu_identity", lambda: identity + b" avx9")
    _, y = compile_and_run(ADD_ONE, cache_dir)
    np.testing.assert_array_equal(y, X + 1)  # another processor: compiled afresh
    assert len(entry_files(cache_dir)) == 2


def platform_flags_in(identity: bytes) -> bool:
    """Whether ``identity`` names the processor's features where the OS lists them."""
    return not sys.platform.startswith("linux") or b"flags=" in identity or b"Features=" in identity
