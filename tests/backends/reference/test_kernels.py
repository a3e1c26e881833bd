"""The ops jaxlib's StableHLO interpreter lacks, computed by the reference backend between
its stages: FFT, Cholesky, triangular solves, XLA's stateful RNG (tests/builder's random
tests) and jaxlib's LAPACK custom calls as jax emits them. Each against NumPy/SciPy, and
against the PjRt backend running the same program (the StableHLO ops) or jax's CPU client
running the same function (the LAPACK calls: jaxlib's kernels, which newer jaxlibs build
for an XLA FFI the PjRt CPU plugin may not run); such ops inside while, case and if, in
called functions and in a program over replicas; what cannot be cut refused at compile
time."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.linalg

import ifrtpy as ifrt
from ifrtpy.builder import Builder
from ifrtpy.errors import UnimplementedError

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.fixture(scope="module")
def reference():
    return ifrt.get_client("reference", device_count=2)


@pytest.fixture(scope="module")
def pjrt():
    return ifrt.get_client("pjrt", device_count=2)


def run(client, program, *inputs, options=None):
    """The outputs (NumPy) of ``program`` compiled for one device and run on ``inputs``."""
    exe = client.compile(program, options or ifrt.CompileOptions())
    device = client.devices()[0]
    return [np.asarray(o) for o in exe(*[ifrt.device_put(np.asarray(x), device) for x in inputs])]


def agree(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, i
        np.testing.assert_allclose(g, w, **tolerance(w), err_msg=f"output {i}")


def both(reference, pjrt, program, *inputs):
    """The outputs on the reference backend, checked against the PjRt backend's."""
    got = run(reference, program, *inputs)
    agree(got, run(pjrt, program, *inputs))
    return got


def as_jax(reference, fn, *inputs):
    """The outputs of jax's program for ``fn`` on the reference backend, checked against
    jax's CPU client's (the same LAPACK routines: they agree closely)."""
    got = run(reference, lowered(fn, *inputs), *inputs)
    with jax.enable_x64(True):
        agree(got, jax.tree.leaves(jax.jit(fn)(*inputs)))
    return got


def tolerance(x) -> dict:
    single = np.asarray(x).dtype in (np.float32, np.complex64)
    return dict(rtol=1e-4, atol=1e-4) if single else dict(rtol=1e-10, atol=1e-10)


def lowered(fn, *inputs) -> str:
    """The StableHLO jax makes of ``fn`` for CPU (with 64-bit types)."""
    with jax.enable_x64(True):
        return jax.jit(fn).lower(*inputs).as_text()


RNG = np.random.default_rng(7)


def sample(shape, dtype):
    x = RNG.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * RNG.standard_normal(shape)
    return x.astype(dtype)


def hermitian_pd(n, dtype, batch=()):
    a = sample(batch + (n, n), dtype)
    return (a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n)).astype(dtype)


# -- FFT -----------------------------------------------------------------------------------

NUMPY_FFT = {"FFT": np.fft.fftn, "IFFT": np.fft.ifftn, "RFFT": np.fft.rfftn,
             "IRFFT": np.fft.irfftn}


@pytest.mark.parametrize("kind", list(NUMPY_FFT))
@pytest.mark.parametrize("lengths", [(8,), (4, 6), (2, 3, 4)], ids=["1d", "2d", "3d"])
def test_fft(reference, pjrt, kind, lengths):
    wide = len(lengths) > 1  # c128 and f64 there, c64 and f32 in 1d
    real, cplx = (np.float64, np.complex128) if wide else (np.float32, np.complex64)
    shape = (2,) + lengths
    if kind == "RFFT":
        x = sample(shape, real)
    elif kind == "IRFFT":
        x = sample(shape[:-1] + (lengths[-1] // 2 + 1,), cplx)
    else:
        x = sample(shape, cplx)
    b = Builder("fft")
    program = b.build(b.fft(b.parameter(x.shape, x.dtype), kind, lengths))
    (got,) = both(reference, pjrt, program, x)
    axes = tuple(range(-len(lengths), 0))
    want = NUMPY_FFT[kind](x, s=lengths, axes=axes)
    assert got.dtype == (real if kind == "IRFFT" else cplx)
    np.testing.assert_allclose(got, want, **tolerance(got))


# -- Cholesky and triangular solves (StableHLO ops) ------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
def test_cholesky(reference, pjrt, dtype):
    a = hermitian_pd(4, dtype, batch=(3,))
    b = Builder("cholesky")
    x = b.parameter(a.shape, dtype)
    lower, upper = run(reference, b.build(b.cholesky(x, lower=True), b.cholesky(x, lower=False)), a)
    want = np.linalg.cholesky(a)
    np.testing.assert_allclose(np.tril(lower), want, **tolerance(a))
    np.testing.assert_allclose(np.triu(upper), np.conj(np.swapaxes(want, -1, -2)), **tolerance(a))
    pl, pu = run(pjrt, b.build(b.cholesky(x, lower=True), b.cholesky(x, lower=False)), a)
    np.testing.assert_allclose(np.tril(lower), np.tril(pl), **tolerance(a))
    np.testing.assert_allclose(np.triu(upper), np.triu(pu), **tolerance(a))


def test_cholesky_of_a_matrix_not_positive_definite_is_nan(reference):
    a = np.stack([np.eye(3), -np.eye(3)]).astype(np.float32)
    b = Builder("cholesky")
    (got,) = run(reference, b.build(b.cholesky(b.parameter(a.shape, np.float32))), a)
    np.testing.assert_array_equal(got[0], np.eye(3))
    assert np.isnan(got[1]).all()


def test_triangular_solve_every_form(reference, pjrt):
    """Every side, triangle, transpose and diagonal of XLA's TriangularSolve in one
    program, against SciPy's solve_triangular."""
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((2, 4, 4)) + 4 * np.eye(4)).astype(np.float64)
    bl = rng.standard_normal((2, 4, 3))
    br = rng.standard_normal((2, 3, 4))
    forms = list(itertools.product([True, False], [True, False], ["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"],
                                   [False, True]))
    b = Builder("trsm")
    pa, pl, pr = (b.parameter(v.shape, np.float64) for v in (a, bl, br))
    outs = [b.triangular_solve(pa, pl if left else pr, left, lower, unit, trans)
            for left, lower, trans, unit in forms]
    got = both(reference, pjrt, b.build(*outs), a, bl, br)
    for (left, lower, trans, unit), x in zip(forms, got):
        tri = np.tril(a, -1 if unit else 0) if lower else np.triu(a, 1 if unit else 0)
        tri = tri + (np.eye(4) if unit else 0)
        op = tri if trans == "NO_TRANSPOSE" else np.swapaxes(tri, -1, -2)
        if left:
            np.testing.assert_allclose(op @ x, bl, rtol=1e-10, atol=1e-10)
        else:
            np.testing.assert_allclose(x @ op, br, rtol=1e-10, atol=1e-10)


# -- jaxlib's LAPACK custom calls, as jax emits them -------------------------------------------

def _unitary(q):
    eye = np.eye(q.shape[-1])
    return np.allclose(np.conj(np.swapaxes(q, -1, -2)) @ q, eye, atol=1e-4)


def _check_qr(a, q, r):
    np.testing.assert_allclose(q @ r, a, **tolerance(a))
    assert _unitary(q) and np.allclose(np.tril(r, -1), 0)


def _check_svd(a, u, s, vh):
    np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), **tolerance(a))
    np.testing.assert_allclose((u[..., :s.shape[-1]] * s[..., None, :]) @ vh[..., :s.shape[-1], :],
                               a, **tolerance(a))


def _check_eig(a, w, v):
    np.testing.assert_allclose(a @ v, v * w[..., None, :], **tolerance(a))
    np.testing.assert_allclose(np.sort_complex(w), np.sort_complex(np.linalg.eigvals(a)), **tolerance(a))


def _check_lu(a, p, lower, upper):
    want_p, want_l, want_u = scipy.linalg.lu(a)
    for got, want in ((p, want_p), (lower, want_l), (upper, want_u)):
        np.testing.assert_allclose(got, want, **tolerance(a))


def _check_schur(a, t, z):
    np.testing.assert_allclose(z @ t @ np.conj(z.T), a, **tolerance(a))
    assert np.allclose(np.tril(t, -2), 0)


def _check_hessenberg(a, h, q):
    np.testing.assert_allclose(q @ h @ np.conj(q.T), a, **tolerance(a))
    assert np.allclose(np.tril(h, -2), 0)


def _tridiagonal_solve(a, b, perturb_singular=False):
    zero = jnp.zeros(1, a.dtype)
    dl, d, du = jnp.r_[zero, jnp.diag(a, -1)], jnp.diag(a), jnp.r_[jnp.diag(a, 1), zero]
    return jax.lax.linalg.tridiagonal_solve(dl, d, du, b, perturb_singular=perturb_singular)


TRIDIAGONAL = hermitian_pd(5, np.float64) * np.tri(5, k=1) * np.tri(5, k=1).T
#: Tridiagonal with its first two rows equal.
SINGULAR = np.diag([1.0, 0, 1, 1], 1) + np.diag([1.0, 1, 1, 1], -1) + np.diag([1.0, 1, 4, 4, 1])


#: name: (jax function, its inputs, a check of its outputs against NumPy/SciPy)
LAPACK_CASES = {
    "potrf": (jnp.linalg.cholesky, [hermitian_pd(4, np.float32, (2,))],
              lambda a, c: np.testing.assert_allclose(c, np.linalg.cholesky(a), **tolerance(a))),
    "getrf solve": (jnp.linalg.solve, [sample((4, 4), np.float64), sample((4, 2), np.float64)],
                    lambda a, b, x: np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-10)),
    "getrf lu": (jax.scipy.linalg.lu, [sample((5, 5), np.complex64)], _check_lu),
    "getrf det": (jnp.linalg.det, [sample((4, 4), np.float64)],  # a scalar result
                  lambda a, d: np.testing.assert_allclose(d, np.linalg.det(a), rtol=1e-10)),
    "geqrf orgqr": (jnp.linalg.qr, [sample((5, 3), np.float32)], _check_qr),
    "geqrf ungqr complete": (lambda a: jnp.linalg.qr(a, mode="complete"), [sample((2, 3, 4), np.complex128)],
                             _check_qr),
    "geqp3": (lambda a: jax.scipy.linalg.qr(a, pivoting=True), [sample((4, 4), np.float64)],
              lambda a, q, r, p: np.testing.assert_allclose(q @ r, a[:, p], rtol=1e-10, atol=1e-10)),
    "gesdd": (jnp.linalg.svd, [sample((3, 4, 6), np.float32)], _check_svd),
    "gesdd complex": (lambda a: jnp.linalg.svd(a, full_matrices=False), [sample((6, 4), np.complex128)],
                      _check_svd),
    "gesvd": (lambda a: jax.lax.linalg.svd(a, full_matrices=False, algorithm=jax.lax.linalg.SvdAlgorithm.QR),
              [sample((4, 3), np.float64)], _check_svd),
    "syevd": (jnp.linalg.eigh, [hermitian_pd(5, np.float64)],
              lambda a, w, v: np.testing.assert_allclose(w, np.linalg.eigvalsh(a), rtol=1e-10)),
    "heevd": (jnp.linalg.eigh, [hermitian_pd(4, np.complex64, (2,))],
              lambda a, w, v: np.testing.assert_allclose(w, np.linalg.eigvalsh(a), **tolerance(a))),
    "geev": (jnp.linalg.eig, [sample((5, 5), np.float64)], _check_eig),
    "geev complex": (jnp.linalg.eig, [sample((4, 4), np.complex64)], _check_eig),
    "geev of inf": (jnp.linalg.eigvals, [np.array([[np.inf]], np.float32)],
                    lambda a, w: np.isnan(w).all()),
    "geev complex of nan": (jnp.linalg.eig, [np.full((2, 2), np.nan, np.complex128)],
                            lambda a, w, v: np.isnan(w).all() and np.isnan(v).all()),
    "gees": (jax.scipy.linalg.schur, [sample((4, 4), np.float64)], _check_schur),
    "gehrd": (lambda a: jax.scipy.linalg.hessenberg(a, calc_q=True), [sample((5, 5), np.float64)],
              _check_hessenberg),
    "sytrd": (jax.lax.linalg.tridiagonal, [hermitian_pd(4, np.float64)],
              lambda a, t, d, e, tau: np.testing.assert_allclose(
                  np.linalg.eigvalsh(np.diag(d) + np.diag(e, 1) + np.diag(e, -1)),
                  np.linalg.eigvalsh(a), rtol=1e-10)),
    "trsm": (lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True),
             [hermitian_pd(4, np.float32), sample((4, 2), np.float32)],
             lambda a, b, x: np.testing.assert_allclose(
                 x, scipy.linalg.solve_triangular(a, b, lower=True), **tolerance(a))),
    "gtsv": (_tridiagonal_solve, [TRIDIAGONAL, sample((5, 2), np.float64)],
             lambda a, b, x: np.testing.assert_allclose(a @ x, b, rtol=1e-10, atol=1e-10)),
    "perturbed tridiagonal solve": (
        lambda a, b: _tridiagonal_solve(a, b, perturb_singular=True),
        [TRIDIAGONAL, sample((5, 2), np.float64)],
        lambda a, b, x: np.testing.assert_allclose(a @ x, b, rtol=1e-10, atol=1e-10)),
    "perturbed tridiagonal solve, singular": (
        lambda a, b: _tridiagonal_solve(a, b, perturb_singular=True),
        [SINGULAR, sample((5, 1), np.float64)], lambda a, b, x: np.isfinite(x).all()),
    "empty": (jnp.linalg.qr, [np.zeros((0, 3), np.float32)],
              lambda a, q, r: q.shape == (0, 0) and r.shape == (0, 3)),
}


@pytest.mark.parametrize("case", list(LAPACK_CASES))
def test_lapack_custom_calls_as_jax_emits_them(reference, case):
    fn, inputs, check = LAPACK_CASES[case]
    outputs = as_jax(reference, fn, *inputs)
    assert check(*inputs, *outputs) is not False


# -- control flow, calls, replicas ---------------------------------------------------------------

def test_fft_and_lapack_inside_while_case_and_if(reference):
    """An FFT in a fori_loop's body (reading a value from outside the loop), a Cholesky in
    one branch of a cond and an eigh in one of a switch, against jax's CPU client."""
    def fn(x, spd, n, which):
        scale = jnp.float32(0.5)

        def body(i, carry):
            return jnp.fft.ifft(jnp.fft.fft(carry) * scale) + i

        looped = jax.lax.fori_loop(0, n, body, x.astype(jnp.complex64))
        chosen = jax.lax.cond(which > 0, jnp.linalg.cholesky, lambda m: m * 2, spd)
        switched = jax.lax.switch(which, [lambda m: m, lambda m: jnp.linalg.eigh(m)[1],
                                          lambda m: -m], spd)
        return looped, chosen, switched

    x, spd = sample((8,), np.float32), hermitian_pd(3, np.float32)
    for n, which in ((3, 1), (0, 0), (2, 7)):  # an index out of range takes the last branch
        as_jax(reference, fn, x, spd, np.int32(n), np.int32(which))


def test_kernels_in_a_program_over_replicas(reference, pjrt):
    program = """module @r { func.func @main(%a: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {
      %0 = stablehlo.fft %a, type = FFT, length = [4] : (tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>>
      %1 = "stablehlo.all_reduce"(%0) ({
        ^bb0(%x: tensor<complex<f32>>, %y: tensor<complex<f32>>):
          %s = stablehlo.add %x, %y : tensor<complex<f32>>
          stablehlo.return %s : tensor<complex<f32>>
      }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>>
      %2 = stablehlo.fft %1, type = IFFT, length = [4] : (tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>>
      return %2 : tensor<4xcomplex<f32>> } }"""
    values = [sample((4,), np.complex64) for _ in range(2)]
    results = []
    for client in (reference, pjrt):
        exe = client.compile(program, ifrt.CompileOptions(num_replicas=2))
        devices = list(exe.devices())
        arg = client.assemble_array_from_single_device_arrays(
            (4,), exe.parameter_shardings()[0], [ifrt.device_put(v, d) for v, d in zip(values, devices)])
        (out,) = exe(arg)
        results.append([np.asarray(s) for s in out.disassemble_into_single_device_arrays()])
    for got in results:
        for replica in got:
            np.testing.assert_allclose(replica, values[0] + values[1], rtol=1e-5, atol=1e-5)


RNG_IN_REDUCE = """module @m { func.func @main(%a: tensor<4xf32>) -> tensor<f32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%a init: %z) across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
    reducer(%x: tensor<f32>, %y: tensor<f32>) {
      %s = stablehlo.constant dense<> : tensor<0xi64>
      %r = stablehlo.rng %x, %y, %s, distribution = UNIFORM : (tensor<f32>, tensor<f32>, tensor<0xi64>) -> tensor<f32>
      stablehlo.return %r : tensor<f32>
    }
  return %0 : tensor<f32> } }"""

RECURSIVE_FFT = """module @m {
  func.func private @f(%a: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {
    %0 = stablehlo.fft %a, type = FFT, length = [4] : (tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>>
    %1 = func.call @f(%0) : (tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>>
    return %1 : tensor<4xcomplex<f32>> }
  func.func @main(%a: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {
    %0 = func.call @f(%a) : (tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>>
    return %0 : tensor<4xcomplex<f32>> } }"""


@pytest.mark.parametrize("program,message", [
    (RNG_IN_REDUCE, "runs stablehlo.rng inside while, case and if, not inside stablehlo.reduce"),
    (RECURSIVE_FFT, "function @f, which calls itself"),
], ids=["in a reduction", "recursion"])
def test_what_cannot_be_cut_is_refused_at_compile_time(reference, program, message):
    with pytest.raises(UnimplementedError, match=message):
        reference.compile(program)
