"""``python -m ifrtpy``: --version, one-line errors, --debug, bench --quick (no timing asserts)."""

import os
import re
import subprocess
import sys

import pytest

import ifrtpy
from ifrtpy.cli import bench as _bench
from ifrtpy.__main__ import main
from ifrtpy.errors import NotFoundError

FIGURE = r"[\d.]+ (?:ns|µs|ms|s)"


def test_version():
    proc = subprocess.run([sys.executable, "-m", "ifrtpy", "--version"],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"ifrtpy {ifrtpy.__version__}\n", "")


def test_an_error_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys):
    missing = str(tmp_path / "nothing.so")
    assert main(["info", "--plugin", missing]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: NotFoundError: no PJRT plugin file at {missing!r} "
                   "(--debug shows the traceback)\n")
    for argv in (["--debug", "info", "--plugin", missing], ["info", "--plugin", missing, "--debug"]):
        with pytest.raises(NotFoundError, match="no PJRT plugin file"):
            main(argv)


def test_an_error_of_several_lines_prints_its_first(capsys):
    """The first line says what is missing and the fix; --debug shows the rest."""
    assert main(["info", "--plugin", "nosuchchip"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: NotFoundError: no PJRT plugin named 'nosuchchip': give its "
                          "library with plugin='/path/to/plugin.so'")
    assert err.endswith(") (--debug shows the rest of the message and the traceback)\n")
    assert "plugins found" not in err and len(err) < 400
    with pytest.raises(NotFoundError, match="(?s)nosuchchip.*plugins found: 'cpu'"):
        main(["info", "--plugin", "nosuchchip", "--debug"])


@pytest.mark.parametrize("argv", [[], ["info"], ["demo"], ["bench"], ["launch"], ["serve"]])
def test_help_is_plain_text(argv, capsys):
    """What --help prints says each command's purpose, without reST markup."""
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and not re.search(r":(func|mod|data|class|meth):", text), text
    description = text.split("\n\n")[1]  # under the usage
    assert not description.startswith(("options:", "positional arguments:")), text


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


#: Modules --help, --version and an argument error must not import (the runtime's cost).
HEAVY = ("numpy", "ml_dtypes", "jaxlib", "jax", "ifrtpy.array", "ifrtpy.program", "ifrtpy.builder",
         "ifrtpy.backends", "ifrtpy._pjrt", "ifrtpy.cli.bench", "ifrtpy.cli.demo", "ifrtpy.cli.info")


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["bench", "--quik"], ["frobnicate"],
                                  ["demo", "--devices", "many"], ["serve", "--help"]])
def test_help_version_and_argument_errors_import_nothing_heavy(argv):
    code = ("import runpy, sys\n"
            f"sys.argv = ['ifrtpy', *{argv!r}]\n"
            "try:\n    runpy.run_module('ifrtpy', run_name='__main__', alter_sys=True)\n"
            "except SystemExit as e:\n    code = e.code\n"
            f"print(code, sorted(m for m in sys.modules if m.startswith({HEAVY!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    status, imported = proc.stdout.splitlines()[-1].split(" ", 1)
    assert status in ("0", "2") and imported == "[]", (proc.stdout, proc.stderr)


def test_an_unknown_option_names_the_nearest(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--quik"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith(
        "error: unrecognized arguments: --quik (did you mean --quick?)\n")
    with pytest.raises(SystemExit):
        main(["demo", "--devics=2", "--zzz"])
    assert capsys.readouterr().err.endswith(
        "error: unrecognized arguments: --devics=2 (did you mean --devices?) --zzz\n")


def test_each_command_says_how_many_devices_it_runs_on_and_why(capsys):
    assert main(["demo", "--devices", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "demo: 2 cpu devices (--devices 2)"
    assert main(["info", "--devices", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "info: 1 cpu device (--devices 1)"


@pytest.mark.parametrize("flags, first", [
    (None, "info: 4 cpu devices (the CPU plugin's default, as for ifrt.get_client(); "
           "--devices N or XLA_FLAGS=--xla_force_host_platform_device_count=N for another)"),
    ("--xla_force_host_platform_device_count=3",
     "info: 3 cpu devices (XLA_FLAGS' --xla_force_host_platform_device_count, as for jax; "
     "--devices N for another)"),
])
def test_a_command_says_what_chose_its_default_devices(flags, first):
    # In a process of its own: XLA reads XLA_FLAGS once a process.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if flags:
        env["XLA_FLAGS"] = flags
    proc = subprocess.run([sys.executable, "-m", "ifrtpy", "info"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.stdout.splitlines()[0] == first, proc.stderr


def test_info_prints_versions(capsys):
    assert main(["info", "--devices", "1"]) == 0
    assert f"ifrtpy   {ifrtpy.__version__} (Python " in capsys.readouterr().out


def test_bench_quick_prints_one_table(capsys):
    pytest.importorskip("jax")
    assert main(["bench", "--quick"]) == 0
    captured = capsys.readouterr()
    first, *lines = captured.out.splitlines()
    assert first == "bench: 8 cpu devices (bench's default, its sharded rows span 8; --devices N for another)"
    assert lines[0].startswith("median time per call, 8 devices")
    assert lines[1].split() == ["operation", "ifrtpy", "jax", "ifrtpy/jax"]
    names = ["execute x+1", "SPMD x*2+1", "step: put, MLP, read", "put 4 KiB", "put 256 KiB", "get 256 KiB",
             "sharded put 256 KiB / 8", "sharded get 256 KiB / 8"]
    noisy = any(line.endswith(" ~") for line in lines[2:])  # a busy machine's repeats
    assert len(lines) == 2 + len(names) + noisy
    for name, line in zip(names, lines[2:]):
        assert line.startswith(name)
        assert re.search(rf"{FIGURE}\s+{FIGURE}\s+[\d.]+( ~)?$", line), line
    if noisy:
        assert lines[-1].startswith("~: its repeats differed by more than 2 times")
    assert captured.err.splitlines() == [                    # progress, one line per case
        f"[{i}/{len(names)}] {line.split('  ')[0]}"
        for i, line in enumerate(lines[2:2 + len(names)], 1)]


def test_plot_without_matplotlib_fails_before_measuring(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # as if not installed
    monkeypatch.setattr(_bench, "run", lambda *a, **k: pytest.fail("measured anyway"))
    assert main(["bench", "--quick", "--devices", "1", "--plot", "out.png"]) == 1
    assert capsys.readouterr().err == ("error: ModuleNotFoundError: --plot needs matplotlib: "
                                       "pip install matplotlib (--debug shows the traceback)\n")


def test_table_and_plot(tmp_path):
    rows = [_bench.Row("put", 2e-6, 4e-6), _bench.Row("get", 0.0125, None)]
    text = _bench.table(rows)
    assert re.search(r"^put\s+2 µs\s+4 µs\s+0\.50$", text, re.M), text
    assert re.search(r"^get\s+12\.5 ms\s+-\s+-$", text, re.M), text
    small = _bench.table([_bench.Row("execute", 3e-8, 1e-5, noisy=True)])
    assert re.search(r"^execute\s+30 ns\s+10 µs\s+0\.003 ~$", small, re.M), small  # not 0.00
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    _bench.plot(rows, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("missing", ["grpc", "google"])
def test_serve_without_the_proxy_extra_says_what_to_install(monkeypatch, capsys, missing):
    monkeypatch.setitem(sys.modules, missing, None)        # as if not installed
    if missing == "google":
        monkeypatch.setitem(sys.modules, "google.protobuf", None)
    assert main(["serve", "--backend", "reference"]) == 1
    assert capsys.readouterr().err == (
        "error: ModuleNotFoundError: serve needs grpcio and protobuf (the proxy extra): "
        "pip install \"ifrtpy[proxy]\" (in a checkout: pip install -e \".[proxy]\") "
        "(--debug shows the traceback)\n")


def test_bench_without_jax_says_the_jax_column_needs_it(monkeypatch, capsys):
    monkeypatch.setattr(_bench, "run", lambda *a, **k: [_bench.Row("put", 2e-6, None)])
    assert main(["bench", "--quick", "--devices", "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == ("the jax column needs jax: pip install jax (or the bench "
                                    "extra: pip install \"ifrtpy[bench]\")"), out
