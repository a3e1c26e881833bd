"""The builder's custom calls: ``ffi_call`` (typed XLA FFI, attributes as jax encodes
them) with the tests' own handlers, ``host_callback``, and the linear algebra that runs on
jaxlib's LAPACK kernels (qr, eigh, svd, lu), against NumPy, on the jax backend and on the
CPU plugins installed whose XLA runs jaxlib's kernels (refused by name on the others)."""

from __future__ import annotations

import numpy as np
import pytest

import ffi_library
import ifrtpy as ifrt
from cpu_plugins import plugin_params, plugin_path
from ifrtpy.builder import Builder
from ifrtpy.errors import FailedPreconditionError, InternalError, InvalidArgumentError

pytest.importorskip("jax")


def _clients():
    return ["jax", *plugin_params()]


@pytest.fixture(scope="module", params=_clients())
def run(request):
    """``run(program, *arrays)``: the outputs as NumPy arrays, on device 0 of a client."""
    if request.param == "jax":
        client = ifrt.get_client("jax")
        options = ifrt.CompileOptions(devices=ifrt.DeviceList(client.devices()[:1]))
    else:
        client = ifrt.get_client("pjrt", plugin=plugin_path(request.param), device_count=2)
        options = None

    def go(program, *arrays):
        exe = client.compile(program, options)
        return [np.asarray(o) for o in exe(*[ifrt.device_put(a, client.devices()[0]) for a in arrays])]

    go.client = client
    return go


def _runs_jaxlib_kernels(client) -> bool:
    if not isinstance(client, ifrt.get_client("pjrt", device_count=1).__class__):
        return True  # jax's runtime
    from ifrtpy._pjrt import _ffi

    return _ffi.framework_version(client._handle.plugin) >= ffi_library.header_version()


def test_ffi_call_runs_a_registered_handler(run):
    ffi_library.load()
    b = Builder("scale")
    x = b.parameter((2, 3), np.float32)
    program = b.build(b.ffi_call(ffi_library.TARGETS["ScaleAbi"], ((2, 3), np.float32), x,
                                 scale=np.float32(-0.5) * -4))
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run(program, values)[0], 2 * values)


def test_ffi_call_encodes_attributes_as_jax_does():
    jax = pytest.importorskip("jax")
    attributes = dict(f=np.float32(2), i=np.int32(-3), u=np.uint8(76), n=7, x=0.5, flag=True,
                      name="abc", arr=np.arange(3, dtype=np.int64), nested={"k": np.int16(1)},
                      items=(1, 2))
    b = Builder()
    v = b.parameter((4,), np.float32)
    ours = b.build(b.ffi_call("some_target", ((4,), np.float32), v, **attributes)).text
    theirs = jax.jit(lambda t: jax.ffi.ffi_call("some_target", jax.ShapeDtypeStruct((4,), np.float32))(
        t, **attributes)).lower(np.ones(4, np.float32)).as_text()

    def config(text):
        start = text.index("backend_config = {") + len("backend_config = ")
        depth, end = 0, start
        for end, ch in enumerate(text[start:], start):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                break
        return text[start:end + 1]

    assert config(ours) == config(theirs)


def test_host_callback_values(run):
    b = Builder("callbacks")
    x = b.parameter((3,), np.float32)
    y = b.parameter((2, 2), np.int32)
    one = b.host_callback(lambda u: np.cumsum(u).astype(np.float32), [x], ((3,), np.float32))
    two = b.host_callback(lambda u, v: (u.max(keepdims=True), (v.T * 2).astype(np.int32)),
                          [x, y], [((1,), np.float32), ((2, 2), np.int32)])
    seen = []
    b.host_callback(lambda u: seen.append(u.copy()), [x + 1])
    program = b.build(one * 2, *two)
    assert len(program.host_callbacks) == 3
    u, v = np.array([1, 2, 4], np.float32), np.array([[1, 2], [3, 4]], np.int32)
    got = run(program, u, v)
    np.testing.assert_array_equal(got[0], np.cumsum(u) * 2)
    np.testing.assert_array_equal(got[1], [4])
    np.testing.assert_array_equal(got[2], v.T * 2)
    np.testing.assert_array_equal(seen[0], u + 1)


def test_host_callback_errors(run):
    b = Builder()
    x = b.parameter((3,), np.float32)
    program = b.build(b.host_callback(lambda u: 1 / 0, [x], ((3,), np.float32)))
    with pytest.raises(InternalError, match="ZeroDivisionError"):
        run(program, np.ones(3, np.float32))
    with pytest.raises(InvalidArgumentError, match="fn must be callable"):
        b.host_callback(5, [x], ((3,), np.float32))


def _linalg_program(dtype, shape):
    b = Builder("linalg")
    a = b.parameter(shape, dtype)
    square = b.parameter(shape[:-2] + (shape[-1], shape[-1]), dtype)
    hermitian = square + b.transpose(b.conj(square) if np.iscomplexobj(np.zeros(1, dtype)) else square,
                                     tuple(range(len(shape) - 2)) + (len(shape) - 1, len(shape) - 2))
    return b.build(*b.qr(a), *b.qr(a, full_matrices=True), *b.svd(a), *b.eigh(hermitian),
                   *b.lu(square), *b.svd(a, full_matrices=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 4)])
def test_linear_algebra_matches_numpy(run, dtype, shape):
    rng = np.random.default_rng(len(shape))

    def sample(s):
        x = rng.standard_normal(s)
        if np.iscomplexobj(np.zeros(1, dtype)):
            x = x + 1j * rng.standard_normal(s)
        return x.astype(dtype)

    a, square = sample(shape), sample(shape[:-2] + (shape[-1], shape[-1]))
    program = _linalg_program(dtype, shape)
    if not _runs_jaxlib_kernels(run.client):
        with pytest.raises(FailedPreconditionError, match="jaxlib's kernel 'lapack_"):
            run(program, a, square)
        return
    q, r, qf, rf, u, s, vh, v, w, lu, pivots, perm, uf, sf, vhf = run(program, a, square)
    tol = dict(rtol=1e-3, atol=1e-3) if dtype in (np.float32, np.complex64) else dict(rtol=1e-9, atol=1e-9)
    m, n = shape[-2:]
    k = min(m, n)
    eye = np.eye(k)
    assert q.shape == shape[:-2] + (m, k) and r.shape == shape[:-2] + (k, n)
    np.testing.assert_allclose(q @ r, a, **tol)
    np.testing.assert_allclose(np.conj(np.swapaxes(q, -1, -2)) @ q, np.broadcast_to(eye, q.shape[:-2] + (k, k)), **tol)
    assert np.allclose(np.tril(r, -1), 0)
    np.testing.assert_allclose(qf @ rf, a, **tol)
    assert qf.shape[-2:] == (m, m)
    np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), **tol)
    np.testing.assert_allclose((u * s[..., None, :]) @ vh, a, **tol)
    np.testing.assert_allclose(sf, s, **tol)
    assert uf.shape[-2:] == (m, m) and vhf.shape[-2:] == (n, n)
    h = square + np.conj(np.swapaxes(square, -1, -2))
    np.testing.assert_allclose(w, np.linalg.eigvalsh(h), **tol)
    np.testing.assert_allclose(h @ v, v * w[..., None, :], **tol)
    lower = np.tril(lu, -1) + np.eye(n)
    rows = np.take_along_axis(square, perm[..., None].astype(np.int64), axis=-2)
    np.testing.assert_allclose(rows, lower @ np.triu(lu), **tol)
    assert pivots.dtype == np.int32 and pivots.min() >= 0


def test_linear_algebra_refuses_other_types():
    b = Builder()
    with pytest.raises(InvalidArgumentError, match="qr: needs a .*matrices"):
        b.qr(b.parameter((4, 4), np.int32))
    with pytest.raises(InvalidArgumentError, match="eigh: needs square matrices"):
        b.eigh(b.parameter((4, 3), np.float32))


def test_the_reference_backend_refuses_host_callbacks_by_name():
    client = ifrt.get_client("reference", device_count=1)
    b = Builder("refused")
    x = b.parameter((3,), np.float32)
    with pytest.raises(ifrt.errors.UnimplementedError, match="'xla_ffi_python_cpu_callback'.*host callback"):
        client.compile(b.build(b.host_callback(np.sin, [x], ((3,), np.float32))))
