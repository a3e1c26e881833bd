"""jax's own test files, on jax's CPU client and through ifrtpy's IFRT Proxy server, side by side.

Takes the ``tests/`` folder of a jax checkout at the installed jax's tag (nothing of jax's
is part of this project), e.g.::

    git clone --depth 1 --branch jax-v0.10.2 https://github.com/jax-ml/jax /tmp/jax
    pip install absl-py
    python benchmarks/jax_tests_through_proxy.py /tmp/jax/tests lax_numpy_operators_test.py \\
        [lax_test.py ...] [--backend pjrt] [--device-count 8] [-k EXPR] [--timeout 1800]
    # the reference backend (the StableHLO interpreter), jax's CPU client beside the proxy
    python benchmarks/jax_tests_through_proxy.py /tmp/jax/tests fft_test.py linalg_test.py \\
        --backend reference --proxy-platforms proxy,cpu
    # on a TPU (one process holds the chip: jax's direct runs come first, then the server)
    python benchmarks/jax_tests_through_proxy.py /tmp/jax/tests lax_numpy_operators_test.py \\
        --backend tpu --platform tpu --address unix:/tmp/ifrtpy-proxy.sock

Runs each file with pytest twice: directly on jax's ``--platform`` clients
(``JAX_PLATFORMS=cpu`` with ``--device-count`` devices by default; a list such as
``tpu,cpu`` goes to jax as it is), then, once ``python -m ifrtpy serve --backend BACKEND``
has started, with ``JAX_PLATFORMS=proxy JAX_BACKEND_TARGET=grpc://...`` (jax's proxy
client, the server's devices; ``--proxy-platforms`` gives another list, e.g. ``proxy,cpu``
for tests that need jax's CPU client beside it). Prints a table: per file and run, the
tests passed, failed (errors included) and skipped, and the tests that pass directly but
not through the server (their ids follow the table). A run cut short by ``--timeout``
counts the tests it finished and is marked ``(timeout)``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

#: One result line of ``pytest -v -rN``: ``path::test PASSED [ 12%]``.
RESULT = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.MULTILINE)


def start_server(backend, device_count, address):
    """A ``python -m ifrtpy serve`` process and its ``grpc://`` address, once it is ready."""
    command = [sys.executable, "-m", "ifrtpy", "serve", "--backend", backend]
    if device_count is not None:
        command += ["--device-count", str(device_count)]
    if address is not None:
        command += ["--address", address]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline()
    match = re.fullmatch(r"ifrtpy proxy: serving .* at (grpc://\S+)\n", line)
    if not match:
        server.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return server, match.group(1)


def run_file(tests_dir, name, env, keyword, timeout_s):
    """``{test id: outcome}`` of one pytest run of ``name``, and whether it timed out."""
    command = [sys.executable, "-m", "pytest", "-v", "-rN", "--tb=no", "-p", "no:cacheprovider",
               "--import-mode=importlib", os.path.join(tests_dir, name)]
    if keyword:
        command += ["-k", keyword]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=tests_dir, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            timed_out = True
        log.seek(0)
        output = log.read()
    outcomes = {test: outcome for test, outcome in RESULT.findall(output)}
    if not outcomes and not timed_out:
        print(output[-3000:], file=sys.stderr)
    return outcomes, timed_out


def counts(outcomes):
    passed = sum(o in ("PASSED", "XFAIL") for o in outcomes.values())
    failed = sum(o in ("FAILED", "ERROR", "XPASS") for o in outcomes.values())
    skipped = sum(o == "SKIPPED" for o in outcomes.values())
    return passed, failed, skipped


def cell(outcomes, timed_out, seconds):
    passed, failed, skipped = counts(outcomes)
    mark = " (timeout)" if timed_out else ""
    return f"{passed}/{failed}/{skipped} in {seconds:.0f} s{mark}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests_dir", help="the tests/ folder of a jax checkout")
    parser.add_argument("files", nargs="+", help="test files in it, e.g. lax_numpy_operators_test.py")
    parser.add_argument("--backend", default="pjrt", help="the server's backend (default pjrt)")
    parser.add_argument("--device-count", type=int, default=8,
                        help="devices of the server and of jax's CPU client (default 8; "
                             "not given to other platforms)")
    parser.add_argument("--platform", default="cpu",
                        help="jax's platforms for the direct runs (JAX_PLATFORMS; default cpu)")
    parser.add_argument("--proxy-platforms", default="proxy",
                        help="JAX_PLATFORMS for the runs through the server (default proxy)")
    parser.add_argument("--address",
                        help="the server's address (default: serve's own, a private unix socket)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression for every file")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run")
    parser.add_argument("--proxy-only", action="store_true",
                        help="skip the direct runs (their figures known from before): the "
                             "last column then lists every test failing through the server")
    args = parser.parse_args()
    tests_dir = os.path.abspath(args.tests_dir)

    cpu = args.platform.split(",")[0] == "cpu"
    cpu_flags = f"--xla_force_host_platform_device_count={args.device_count}"
    direct_env = dict(os.environ, JAX_PLATFORMS=args.platform)
    if cpu:
        direct_env["XLA_FLAGS"] = cpu_flags
    direct = {}
    for name in args.files:  # first: an accelerator is held by one process at a time
        if args.proxy_only:
            direct[name] = {}, "not run"
            continue
        start = time.perf_counter()
        outcomes, timed_out = run_file(tests_dir, name, direct_env, args.keyword, args.timeout)
        direct[name] = outcomes, cell(outcomes, timed_out, time.perf_counter() - start)
        print(f"done directly: {name} {direct[name][1]}", file=sys.stderr, flush=True)
    virtual = cpu or args.backend == "reference"  # devices made to the count asked
    server, target = start_server(args.backend, args.device_count if virtual else None, args.address)
    proxy_env = dict(os.environ, JAX_PLATFORMS=args.proxy_platforms, JAX_BACKEND_TARGET=target)
    if "cpu" in args.proxy_platforms.split(","):
        proxy_env["XLA_FLAGS"] = cpu_flags
    rows, regressions = [], {}
    try:
        for name in args.files:
            start = time.perf_counter()
            proxy, timed_out = run_file(tests_dir, name, proxy_env, args.keyword, args.timeout)
            row = [name, direct[name][1], cell(proxy, timed_out, time.perf_counter() - start)]
            if args.proxy_only:
                lost = sorted(t for t, o in proxy.items() if o in ("FAILED", "ERROR"))
            else:
                lost = sorted(t for t, o in direct[name][0].items()
                              if o == "PASSED" and t in proxy and proxy[t] != "PASSED")
            row.append(str(len(lost)))
            regressions[name] = lost
            rows.append(row)
            print(f"done: {' | '.join(row)}", file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)

    devices = f"{args.device_count} devices" if virtual else args.platform
    print(f"jax's tests, passed/failed/skipped: JAX_PLATFORMS={args.platform} vs "
          f"{args.proxy_platforms} through `ifrtpy serve --backend {args.backend}` ({devices})"
          + (f", -k {args.keyword!r}" if args.keyword else ""))
    header = ["file", f"jax {args.platform}", f"proxy ({args.backend})",
              "fail through proxy" if args.proxy_only else "pass directly, not through proxy"]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    for name, lost in regressions.items():
        for test in lost:
            print(f"  {name}: {test.split('::', 1)[1]}")


if __name__ == "__main__":
    main()
