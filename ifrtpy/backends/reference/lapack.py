"""jaxlib's LAPACK custom calls, as the reference backend runs them between the
interpreter's stages (:mod:`.stages`): the ``lapack_{s,d,c,z}<routine>_ffi`` targets jax
emits on CPU for its linear algebra, and ``tridiagonal_solve_perturbed_ffi``.

Each target is jaxlib's FFI kernel: the LAPACK routine of its name run on each matrix of
a batch (the leading dimensions), with the operands, results, attributes and ``info``
outputs jaxlib's kernels define (pivots 1-based, as LAPACK writes them; ``info`` as
LAPACK returns it, -4 where ``geev`` is given a non-finite matrix). The routines are
SciPy's LAPACK wrappers (``scipy.linalg.lapack``, ``scipy.linalg.blas.?trsm``): the same
routines jaxlib's kernels call (jaxlib takes them from SciPy, which it requires), with the
same workspace sizes, so the results are those of jax's CPU client.
``tridiagonal_solve_perturbed_ffi`` is jaxlib's own solver (Gaussian elimination with
partial pivoting, tiny pivots perturbed by about ``eps * max|U|``), written here in NumPy.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import numpy as np

from ifrtpy.errors import UnimplementedError

__all__ = ["TARGETS", "is_target", "kernel"]

#: A LAPACK target's name: its type letter and routine.
_NAME = re.compile(r"lapack_([sdcz])([a-z0-9]+)_ffi")
_PERTURBED = "tridiagonal_solve_perturbed_ffi"

Shapes = Sequence[tuple[tuple[int, ...], np.dtype]]


def _lwork(work: Any) -> int:
    """The workspace size a LAPACK query (``lwork=-1``) answered."""
    return max(1, int(np.asarray(work).reshape(-1)[0].real))


# Each routine: one matrix (or one set of operands) in, the target's results out, in
# the target's order; None leaves a result zero (LAPACK leaves it unset).

def _trsm(f, attrs, a, b):
    trans = {"N": 0, "T": 1, "C": 2}[attrs["trans_x"]]
    return (f(1, a, b, side=int(attrs["side"] == "R"), lower=int(attrs["uplo"] == "L"),
              trans_a=trans, diag=int(attrs["diag"] == "U")),)


def _getrf(f, attrs, a):
    lu, pivots, info = f(a)
    return lu, pivots + 1, info


def _geqrf(f, attrs, a):
    work = f(a, lwork=-1)[2]
    qr, tau, _, _ = f(a, lwork=_lwork(work))
    return qr, tau


def _geqp3(f, attrs, a, jpvt):
    if np.any(jpvt != 0):
        raise UnimplementedError("the reference backend runs geqp3 with free pivots only "
                                 "(jpvt all zero, as jax's qr passes it)")
    work = f(a, lwork=-1)[3]
    qr, pivots, tau, _, _ = f(a, lwork=_lwork(work))
    return qr, pivots, tau


def _orgqr(f, attrs, a, tau):
    if tau.size == 0:  # no reflectors: the identity's first columns
        return (np.eye(*a.shape, dtype=a.dtype),)
    work = f(a, tau, lwork=-1)[1]
    return (f(a, tau, lwork=_lwork(work))[0],)


def _ormqr(f, attrs, a, tau, c):
    k = tau.shape[0]
    if k == 0:
        return (c,)
    side = "L" if attrs["left"] else "R"
    trans = ("C" if np.iscomplexobj(c) else "T") if attrs["transpose"] else "N"
    work = f(side, trans, a[:, :k], tau, c, -1)[1]
    return (f(side, trans, a[:, :k], tau, c, _lwork(work))[0],)


def _potrf(f, attrs, a):
    return f(a, lower=int(attrs["uplo"] == "L"), clean=0)


def _svd(f, attrs, a, *, query):
    mode = attrs["mode"]
    if mode not in "ASN":
        raise UnimplementedError(f"the reference backend runs SVD modes A, S and N, not {mode}")
    uv, full = int(mode != "N"), int(mode == "A")
    work, _ = query(*a.shape, compute_uv=uv, full_matrices=full)
    u, s, vt, info = f(a, compute_uv=uv, full_matrices=full, lwork=_lwork(work))
    return a, s, (u if uv else None), (vt if uv else None), info


def _evd(f, attrs, a):
    w, v, info = f(a, compute_v=int(attrs["mode"] == "V"), lower=int(attrs["uplo"] == "L"))
    return v, w, info


def _geev(f, attrs, a, *, query):
    left, right = int(attrs["compute_left"] == "V"), int(attrs["compute_right"] == "V")
    if not np.all(np.isfinite(a)):  # (w, vl, vr) or (wr, wi, vl, vr) unset, then info
        return (None,) * (3 if np.iscomplexobj(a) else 4) + (-4,)
    work, _ = query(a.shape[0], compute_vl=left, compute_vr=right)
    out = f(a, compute_vl=left, compute_vr=right, lwork=_lwork(work))
    if np.iscomplexobj(a):
        w, vl, vr, info = out
        return w, (vl if left else None), (vr if right else None), info
    wr, wi, vl, vr, info = out
    return (wr, wi, _unpacked(wi, vl) if left else None,
            _unpacked(wi, vr) if right else None, info)


def _unpacked(imag: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Real geev's eigenvectors as complex ones: a complex pair (imag[j] > 0) is
    v[:, j] +- i v[:, j + 1]."""
    out = vectors.astype(np.result_type(vectors, np.complex64))
    j = 0
    while j < len(imag):
        if imag[j] != 0 and j + 1 < len(imag):
            out[:, j] = vectors[:, j] + 1j * vectors[:, j + 1]
            out[:, j + 1] = vectors[:, j] - 1j * vectors[:, j + 1]
            j += 2
        else:
            j += 1
    return out


def _gees(f, attrs, a):
    if attrs["sort"] != "N":
        raise UnimplementedError("gees: ordering eigenvalues is not implemented (as in jaxlib)")
    vectors = int(attrs["mode"] == "V")

    def select(*_):
        return 0
    work = f(select, a, compute_v=vectors, lwork=-1)[-2]
    out = f(select, a, compute_v=vectors, lwork=_lwork(work))
    if np.iscomplexobj(a):
        t, sdim, w, vs, _, info = out
        return t, (vs if vectors else None), w, sdim, info
    t, sdim, wr, wi, vs, _, info = out
    return t, (vs if vectors else None), wr, wi, sdim, info


def _gehrd(f, attrs, a, *, query):
    low, high = attrs["low"] - 1, attrs["high"] - 1  # SciPy counts from 0
    work, _ = query(a.shape[0], lo=low, hi=high)
    return f(a, lo=low, hi=high, lwork=_lwork(work))


def _sytrd(f, attrs, a, *, query):
    lower = int(attrs["uplo"] == "L")
    work, _ = query(a.shape[0], lower=lower)
    return f(a, lower=lower, lwork=_lwork(work))


def _gtsv(f, attrs, dl, d, du, b):
    # jaxlib's dl[0] and du[n-1] are outside the matrix (zero by jax's convention)
    dl2, d_out, du_out, x, info = f(dl[1:], d, du[:-1], b)
    return (np.concatenate([dl[:1], dl2]), d_out, np.concatenate([du_out, du[-1:]]), x, info)


#: routine: (its function, the LAPACK query of its workspace where it has one apart)
_ROUTINES: dict[str, tuple[Callable, str | None]] = {
    "trsm": (_trsm, None), "getrf": (_getrf, None), "geqrf": (_geqrf, None),
    "geqp3": (_geqp3, None), "orgqr": (_orgqr, None), "ungqr": (_orgqr, None),
    "ormqr": (_ormqr, None), "unmqr": (_ormqr, None), "potrf": (_potrf, None),
    "gesdd": (_svd, "gesdd_lwork"), "gesvd": (_svd, "gesvd_lwork"),
    "syevd": (_evd, None), "heevd": (_evd, None), "geev": (_geev, "geev_lwork"),
    "gees": (_gees, None), "gehrd": (_gehrd, "gehrd_lwork"),
    "sytrd": (_sytrd, "sytrd_lwork"), "hetrd": (_sytrd, "hetrd_lwork"), "gtsv": (_gtsv, None),
}
#: Results that are an operand, changed in place (what an empty matrix leaves them).
_ALIASES = {"trsm": {0: 1}, "getrf": {0: 0}, "geqrf": {0: 0}, "geqp3": {0: 0, 1: 1},
            "orgqr": {0: 0}, "ungqr": {0: 0}, "ormqr": {0: 2}, "unmqr": {0: 2},
            "potrf": {0: 0}, "gesdd": {0: 0}, "gesvd": {0: 0}, "syevd": {0: 0},
            "heevd": {0: 0}, "gehrd": {0: 0}, "sytrd": {0: 0}, "hetrd": {0: 0},
            "gtsv": {0: 0, 1: 1, 2: 2, 3: 3}, "gees": {0: 0}}
#: Every target the reference backend runs, for the messages.
TARGETS = frozenset(f"lapack_{p}{r}_ffi" for r in _ROUTINES for p in "sdcz"
                    if not (r in ("orgqr", "ormqr", "syevd", "sytrd") and p in "cz")
                    and not (r in ("ungqr", "unmqr", "heevd", "hetrd") and p in "sd")
                    ) | {_PERTURBED}


def is_target(target: str) -> bool:
    """Whether ``target`` is a custom call this module runs."""
    return target in TARGETS


def kernel(target: str, attrs: dict[str, Any], operands: Shapes, results: Shapes,
           batch_rank: int) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """The function computing custom call ``target``'s results from its operands'
    values (``attrs``: its backend_config, enums as letters; the shapes and dtypes of its
    operands and results; how many leading dimensions are a batch)."""
    if target == _PERTURBED:
        return lambda values: _batched(_perturbed, values, results, batch_rank, {0: 3})
    match = _NAME.fullmatch(target)
    assert match is not None and target in TARGETS, target
    letter, routine = match.groups()
    from scipy.linalg import blas, lapack  # type: ignore[import-untyped]  # jaxlib requires SciPy
    library = blas if routine == "trsm" else lapack
    body, query = _ROUTINES[routine]
    function = getattr(library, letter + routine)
    extra = {"query": getattr(library, letter + query)} if query else {}

    def per_matrix(*values):
        return body(function, attrs, *values, **extra)
    aliases = _ALIASES.get(routine, {})
    return lambda values: _batched(per_matrix, values, results, batch_rank, aliases)


def _batched(per_matrix: Callable, values: list[np.ndarray], results: Shapes,
             batch_rank: int, aliases: dict[int, int]) -> list[np.ndarray]:
    """``per_matrix`` run on each batch element of ``values``: the results, zero where
    it leaves them unset, its operands' values where a matrix is empty."""
    outs = [np.zeros(shape, dtype) for shape, dtype in results]
    batch = values[-1].shape[:batch_rank] if values else ()
    for index in np.ndindex(*batch):
        items = [np.asarray(v[index]) for v in values]
        if any(item.size == 0 for item in items if item.ndim >= 1) and len(items[0].shape) > 0:
            got: Sequence[Any] = [items[aliases[i]] if i in aliases else None
                                  for i in range(len(outs))]
        else:
            got = per_matrix(*items)
        for out, value in zip(outs, got):
            if value is not None:
                out[index] = value
    return outs


# -- jaxlib's perturbed tridiagonal solver -----------------------------------------------

def _perturbed(dl: np.ndarray, d: np.ndarray, du: np.ndarray, b: np.ndarray
               ) -> tuple[np.ndarray]:
    """x with A x = b, A tridiagonal (``dl[i] = A[i, i-1]``, ``d[i] = A[i, i]``,
    ``du[i] = A[i, i+1]``): elimination with partial pivoting (each row scaled by its
    magnitude), then back substitution where a pivot under 1 is pushed away from zero
    (by ``eps * max|U|``, doubled until the row's quotient cannot overflow) or the row
    scaled up."""
    n = d.shape[0]
    x = np.array(b, dtype=b.dtype)
    if n == 0:
        return (x,)
    real = np.finfo(b.dtype).dtype.type
    eps = np.finfo(real).eps
    if n == 1:
        pivot, row = _perturb_pivot(real(eps * abs(d[0])), d[0], x[0].copy())
        x[0] = row / pivot
        return (x,)
    u = np.zeros((n, 3), b.dtype)  # U's diagonal and two superdiagonals
    u[0, 0], u[0, 1] = d[0], du[0]
    max_u = max(abs(u[0, 0]), abs(u[0, 1]))
    scale1 = abs(u[0, 0]) + abs(u[0, 1])
    for k in range(n - 1):
        u[k + 1, 0] = d[k + 1]
        scale2 = abs(dl[k + 1]) + abs(u[k + 1, 0]) + (abs(du[k + 1]) if k < n - 2 else 0)
        if dl[k + 1] == 0:
            scale1 = scale2
            u[k + 1, 1], u[k, 2] = du[k + 1], 0
            x[k + 1] = b[k + 1]
        else:
            piv1 = 0 if u[k, 0] == 0 else abs(u[k, 0]) / scale1
            if abs(dl[k + 1]) / scale2 <= piv1:  # no row exchange
                scale1 = scale2
                factor = dl[k + 1] / u[k, 0]
                u[k + 1, 0] -= factor * u[k, 1]
                u[k + 1, 1], u[k, 2] = du[k + 1], 0
                x[k + 1] = b[k + 1] - factor * x[k]
            else:  # rows k and k + 1 exchanged
                factor = u[k, 0] / dl[k + 1]
                above = u[k, 1]
                u[k, 0] = dl[k + 1]
                u[k + 1, 0] = above - factor * d[k + 1]
                u[k, 1] = d[k + 1]
                if k < n - 2:
                    u[k, 2] = du[k + 1]
                    u[k + 1, 1] = -factor * du[k + 1]
                x[k + 1] = x[k] - factor * b[k + 1]
                x[k] = b[k + 1]
                scale1 = abs(u[k + 1, 0]) + abs(u[k + 1, 1])
        if k < n - 2:
            max_u = max(max_u, *np.abs(u[k]))
    max_u = max(max_u, abs(u[n - 1, 0]))
    perturb = real(eps * max_u)
    for k in range(n - 1, -1, -1):
        row = x[k].copy()
        if k + 1 < n:
            row -= u[k, 1] * x[k + 1]
        if k + 2 < n:
            row -= u[k, 2] * x[k + 2]
        pivot, row = _perturb_pivot(perturb, u[k, 0], row)
        x[k] = row * (1 / pivot)
    return (x,)


def _perturb_pivot(perturb, pivot, row):
    """The pivot pushed away from zero (or the row scaled up) as jaxlib's solver does."""
    real = type(perturb)
    tiny = np.finfo(real).tiny
    small = real(1) / np.finfo(real).max
    safemin = tiny if small < tiny else small * (1 + np.finfo(real).eps)
    bignum = real(1) / safemin
    size = abs(pivot)
    if size >= 1:
        return pivot, row
    perturb = np.copysign(max(abs(perturb), safemin), np.real(pivot))
    biggest = np.max(np.abs(row), initial=0)
    while size < 1:
        if size < safemin:
            if size == 0 or biggest * safemin > size:
                pivot, perturb = pivot + perturb, perturb * 2
            else:
                return pivot * bignum, row * bignum
        elif biggest > size * bignum:
            pivot, perturb = pivot + perturb, perturb * 2
        else:
            break
        size = abs(pivot)
    return pivot, row
