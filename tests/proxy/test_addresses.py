"""Where the server listens and what it leaves: by default a unix socket in a directory only
its user may enter; a unix socket in use is refused, not taken; two addresses never share a
directory; malformed addresses are refused by name; what a killed server left is removed by
the next; a jax client pointed where no server listens says so and gives up."""

import os
import signal
import socket
import stat
import subprocess
import sys

import pytest

grpc = pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
import ifrtpy_jax_plugin  # noqa: E402
from ifrtpy import proxy  # noqa: E402
from ifrtpy.__main__ import main  # noqa: E402
from ifrtpy.errors import AlreadyExistsError, InvalidArgumentError  # noqa: E402

from proxy_helpers import RawSession, client_directory  # noqa: E402

#: Generous bound on a hang, not a timing assertion (a process starts in seconds).
HANG_S = 120


@pytest.fixture(scope="module")
def pjrt():
    return ifrt.get_client("pjrt", device_count=1)


def serves(address):
    with grpc.insecure_channel(address) as ch:
        RawSession(ch).close()
    return True


def test_the_default_is_a_unix_socket_only_this_user_may_reach(pjrt):
    with proxy.serve(pjrt) as server:
        assert server.address.startswith("unix:") and serves(server.address)
        directory = os.path.dirname(server.address[len("unix:"):])
        found = os.stat(directory)
        assert found.st_uid == os.getuid() and stat.S_IMODE(found.st_mode) == 0o700
        assert "only user" in server.who
    assert not os.path.exists(directory)
    with proxy.serve(pjrt, "127.0.0.1:0") as server:
        assert "every user of this machine can connect" in server.who


def test_a_unix_socket_in_use_is_refused_not_taken(pjrt, tmp_path):
    address = f"unix:{tmp_path}/s.sock"
    with proxy.serve(pjrt, address):
        with pytest.raises(AlreadyExistsError, match="a server listens there already"):
            proxy.serve(pjrt, address)
        assert serves(address)  # the first one still does
    (tmp_path / "file").write_text("not a socket")
    with pytest.raises(AlreadyExistsError, match="not a socket"):
        proxy.serve(pjrt, f"unix:{tmp_path}/file")
    stale = socket.socket(socket.AF_UNIX)  # a socket no one listens on: a stopped server's
    stale.bind(str(tmp_path / "stale.sock"))
    stale.close()
    with proxy.serve(pjrt, f"unix:{tmp_path}/stale.sock") as server:
        assert serves(server.address)


def test_two_addresses_never_share_a_directory(pjrt, tmp_path):
    (tmp_path / "a").mkdir()
    first, second = f"unix:{tmp_path}/a_b", f"unix:{tmp_path}/a/b"
    assert ifrtpy_jax_plugin.shared_directory(first) != ifrtpy_jax_plugin.shared_directory(second)
    with proxy.serve(pjrt, first):
        path, _ = client_directory(first)
        with proxy.serve(pjrt, second):
            assert os.path.isdir(path)  # the second server's start left the first's alone


@pytest.mark.parametrize("address, says", [
    ("unix:", "names no socket path"),
    ("127.0.0.1:99999", "not a port number"),
    ("127.0.0.1:http", "not a port number"),
    ("localhost", "'HOST:PORT' or 'unix:PATH'"),
    ("dns:///localhost:5000", "'HOST:PORT' or 'unix:PATH'"),
    ("unix-abstract:proxy", "lets every user of the machine connect"),
    ("unix:/" + "x" * 120, "at most 107"),
])
def test_malformed_addresses_are_refused_by_name(pjrt, address, says, capsys):
    with pytest.raises(InvalidArgumentError, match=says):
        proxy.serve(pjrt, address)
    assert main(["serve", "--address", address]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: InvalidArgumentError: ") and says in err
    assert len(err.splitlines()) == 1


def test_what_a_killed_server_left_is_removed_by_the_next(pjrt):
    proc = subprocess.Popen([sys.executable, "-m", "ifrtpy", "serve", "--device-count", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        address = line.rsplit(" at grpc://", 1)[1].strip()
        left = [os.path.dirname(address[len("unix:"):]),
                ifrtpy_jax_plugin.shared_directory(address)]
        client_directory(address)  # and a client's, with a put file in it
        assert all(os.path.isdir(path) for path in left), line
    finally:
        proc.kill()
        proc.wait(HANG_S)
    assert all(os.path.isdir(path) for path in left)  # a killed server cleans up nothing
    with proxy.serve(pjrt):
        assert not any(os.path.exists(path) for path in left)


def _free_tcp_port():
    with socket.socket() as probe:  # bound, never listening: connections are refused
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wrong_addresses(tmp_path):
    stale = socket.socket(socket.AF_UNIX)  # a socket file whose server is gone
    stale.bind(str(tmp_path / "gone.sock"))
    stale.close()
    port = _free_tcp_port()
    return {
        "missing": (f"unix:{tmp_path}/none.sock", f"{tmp_path}/none.sock: no such file or directory"),
        "not a socket": (f"unix:{tmp_path}", f"{tmp_path} is not a socket"),
        "gone": (f"unix:{tmp_path}/gone.sock",
                 f"nothing listens on the socket {tmp_path}/gone.sock (its server is gone)"),
        "refused": (f"127.0.0.1:{port}", f"127.0.0.1:{port} refuses connections (no server on that port)"),
    }


def _jax_devices(target, **env):
    """``jax.devices()`` in a process whose JAX_BACKEND_TARGET is ``target`` (None: unset),
    JAX_PLATFORMS=proxy: the Popen."""
    env = {**{k: v for k, v in os.environ.items()
              if not k.startswith("IFRT_PROXY_") and k != "JAX_BACKEND_TARGET"},
           "JAX_PLATFORMS": "proxy", "IFRTPY_PROXY_CONNECT_TIMEOUT_S": "1", **env}
    if target is not None:
        env["JAX_BACKEND_TARGET"] = target
    return subprocess.Popen([sys.executable, "-c", "import jax; print(len(jax.devices()))"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


START = ("Start one with `python -m ifrtpy serve` and set JAX_BACKEND_TARGET to the address it "
         "prints (docs/proxy.md).")


@pytest.mark.parametrize("form", ["grpc://", "as serve --address takes it"])
@pytest.mark.parametrize("case", ["missing", "not a socket", "gone", "refused"])
def test_a_jax_client_pointed_where_nothing_serves_stops_in_two_lines(tmp_path, case, form):
    """Before jaxlib's client connects (which retries for 30 s, then prints two chained
    tracebacks): the plugin's check names the address, what is wrong, and the command;
    where a server may still be starting, after saying so at once and trying for
    IFRTPY_PROXY_CONNECT_TIMEOUT_S (1 s here)."""
    address, problem = _wrong_addresses(tmp_path)[case]
    target = f"grpc://{address}" if form == "grpc://" else address
    out, err = _jax_devices(target).communicate(timeout=HANG_S)
    waited = ([f"ifrtpy_jax_plugin: no IFRT Proxy server at grpc://{address} yet ({problem}); "
               "waiting up to 1 s for one to start (IFRTPY_PROXY_CONNECT_TIMEOUT_S sets another "
               "number of seconds)"] if case != "not a socket" else [])
    assert err.splitlines() == [
        *waited, f"ifrtpy_jax_plugin: no IFRT Proxy server at grpc://{address}: {problem}.",
        START], err


def test_a_socket_path_alone_is_a_unix_target(tmp_path):
    assert ifrtpy_jax_plugin.normalized_target(f"{tmp_path}/x.sock") == f"grpc://unix:{tmp_path}/x.sock"
    assert ifrtpy_jax_plugin.normalized_target("unix:/a.sock") == "grpc://unix:/a.sock"
    assert ifrtpy_jax_plugin.normalized_target("localhost:5000") == "grpc://localhost:5000"
    out, err = _jax_devices(str(tmp_path)).communicate(timeout=HANG_S)
    assert err.splitlines() == [
        f"ifrtpy_jax_plugin: no IFRT Proxy server at grpc://unix:{tmp_path}: {tmp_path} is not "
        "a socket.", START], err


def test_jax_platforms_proxy_without_a_target_says_what_to_set():
    # the two lines first; then jax, which has no backend ``proxy``, stops with its own error
    jax_run = _jax_devices(None)
    out, err = jax_run.communicate(timeout=HANG_S)
    assert err.splitlines()[:2] == [
        "ifrtpy_jax_plugin: JAX_PLATFORMS names proxy, but JAX_BACKEND_TARGET is not set.",
        START], err
    assert jax_run.returncode != 0 and not out


def test_a_jax_client_started_before_its_server_waits_for_it(tmp_path, pjrt):
    """A job script that starts both: the client says at once that it waits, and uses the
    server once it listens (the wait's bound is far off: what is observed is the order)."""
    address = f"unix:{tmp_path}/later.sock"
    client = _jax_devices(address, IFRTPY_PROXY_CONNECT_TIMEOUT_S=str(HANG_S))
    try:
        said = client.stderr.readline()
        assert said.startswith(f"ifrtpy_jax_plugin: no IFRT Proxy server at grpc://{address} "
                               "yet"), said
        with proxy.serve(pjrt, address):
            out, err = client.communicate(timeout=HANG_S)
    finally:
        client.kill()
        client.wait()
    assert client.returncode == 0 and out == "1\n", err


def test_the_check_passes_a_listening_server_to_jaxlib(tmp_path):
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "up.sock"))
    listening.listen(1)
    with socket.create_server(("127.0.0.1", 0)) as tcp, listening:
        ifrtpy_jax_plugin.check_server(f"grpc://unix:{tmp_path}/up.sock")
        ifrtpy_jax_plugin.check_server(f"grpc://127.0.0.1:{tcp.getsockname()[1]}")
    with pytest.raises(ifrtpy_jax_plugin.NoServer, match="is not found"):
        ifrtpy_jax_plugin.check_server("grpc://nosuchhost.invalid:5000")
