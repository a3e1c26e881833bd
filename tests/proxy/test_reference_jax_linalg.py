"""jax's FFT and linear algebra through ``python -m ifrtpy serve --backend reference``: an
unmodified jax process (``JAX_PLATFORMS=proxy,cpu``) runs jnp.fft and jnp.linalg on the
server's devices and on its own CPU client, and the two agree within jax's own test
tolerances (the reference backend runs jaxlib's LAPACK routines through SciPy, and
NumPy's FFT)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("grpc")
pytest.importorskip("jax")

#: A bound on a hang, not a timing assertion (the server and jax start in seconds).
HANG_S = 240

#: Runs in the jax process: each function on the proxy's device and on the CPU's, printed.
SCRIPT = """
import json
import jax, jax.numpy as jnp, numpy as np
proxy, cpu = jax.devices("proxy")[0], jax.devices("cpu")[0]
rng = np.random.default_rng(0)
a = rng.standard_normal((4, 4)).astype(np.float32)
spd = a @ a.T + 4 * np.eye(4, dtype=np.float32)
z = (a + 1j * rng.standard_normal((4, 4))).astype(np.complex64)
b = rng.standard_normal((4, 2)).astype(np.float32)
cases = {
    "fft": (jnp.fft.fft, z), "rfft2": (jnp.fft.rfft2, a), "irfft": (jnp.fft.irfft, z),
    "cholesky": (jnp.linalg.cholesky, spd), "solve": (lambda m: jnp.linalg.solve(m, b), a),
    "qr": (jnp.linalg.qr, a), "svd": (jnp.linalg.svd, a), "svd complex": (jnp.linalg.svd, z),
    "eigh": (jnp.linalg.eigh, spd), "lu": (jax.scipy.linalg.lu, a), "det": (jnp.linalg.det, a),
    "inv": (jnp.linalg.inv, a),
}
out = {}
for name, (fn, x) in cases.items():
    f = jax.jit(fn)
    pair = [[np.asarray(v) for v in jax.tree.leaves(f(jax.device_put(x, d)))] for d in (proxy, cpu)]
    out[name] = [[[v.real.tolist(), v.imag.tolist()] for v in side] for side in pair]
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def server():
    """``python -m ifrtpy serve --backend reference`` and its address."""
    proc = subprocess.Popen([sys.executable, "-m", "ifrtpy", "serve", "--backend", "reference",
                             "--device-count", "1"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert " at grpc://" in line, line
    yield line.split(" at ", 1)[1].strip()
    proc.terminate()
    proc.wait(timeout=HANG_S)


def test_jax_fft_and_linalg_through_the_reference_backend(server):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env.update(JAX_PLATFORMS="proxy,cpu", JAX_BACKEND_TARGET=server)
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=HANG_S, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"rc {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    result = json.loads(lines[0][len("RESULT "):])
    assert len(result) == 12
    for name, (through_proxy, direct) in result.items():
        assert len(through_proxy) == len(direct), name
        for i, (got, want) in enumerate(zip(through_proxy, direct)):
            got, want = (np.asarray(v[0]) + 1j * np.asarray(v[1]) for v in (got, want))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} {i}")
