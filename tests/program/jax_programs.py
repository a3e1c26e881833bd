"""A corpus of jax programs, written as jax users write them: training steps of an MLP and
a CNN, attention, a ``lax.scan`` RNN, random numbers, FFTs, sorting, linear algebra, host
callbacks, and data-parallel and ``shard_map`` programs over 8 devices.

Each :class:`Program` is a function and its example arguments (NumPy arrays; a sharded
program gives the PartitionSpec of each argument over an 8-device mesh). ``kinds`` says
what a program needs: "linalg" (jaxlib's LAPACK kernels), "math" (jaxlib's CPU kernels of
``lgamma``/``digamma``, which jax 0.12.1 lowers a Lowered stage's calls to; its exports
keep the inline expansion), "callback" (host callbacks: only a Lowered stage carries their
callables, and jax.export refuses them), "spmd".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import io_callback

P = jax.sharding.PartitionSpec
#: jax 0.12.1 and later lower lgamma and digamma on CPU to jaxlib's kernels (jaxlib.cpu._math).
_LOWERED_TO_JAXLIB_MATH = frozenset(
    {"math"} if tuple(int(p) for p in jax.__version_info__[:3]) >= (0, 12, 1) else ())


@dataclasses.dataclass(frozen=True)
class Program:
    name: str
    fn: Callable
    args: tuple
    kinds: frozenset = frozenset()
    specs: tuple | None = None  # PartitionSpec per argument (8-device mesh "x") or None
    tolerance: float = 2e-5

    def mesh(self) -> Any:
        return jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))

    def jitted(self) -> Any:
        if self.specs is None:
            return jax.jit(self.fn)
        mesh = self.mesh()
        return jax.jit(self.fn, in_shardings=tuple(jax.sharding.NamedSharding(mesh, s) for s in self.specs))

    def shapes(self) -> list[Any]:
        """The arguments as ShapeDtypeStructs (with shardings for jax.export)."""
        if self.specs is None:
            return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.args]
        mesh = self.mesh()
        return [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.NamedSharding(mesh, s))
                for a, s in zip(self.args, self.specs)]


_rng = np.random.default_rng(2024)


def _f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (scale * _rng.standard_normal(shape)).astype(np.float32)


def _spd(n: int) -> np.ndarray:
    a = _f32(n, n)
    return (a @ a.T + n * np.eye(n)).astype(np.float32)


# -- models ------------------------------------------------------------------------------------

def _mlp_params():
    return (_f32(16, 32, scale=0.3), _f32(32), _f32(32, 4, scale=0.3), _f32(4))


def mlp(params, x):
    w1, b1, w2, b2 = params
    h = jax.nn.relu(x @ w1 + b1)
    return jax.nn.log_softmax(h @ w2 + b2)


def mlp_train_step(w1, b1, w2, b2, x, y):
    def loss(params):
        logits = mlp(params, x)
        return -jnp.mean(jnp.sum(jax.nn.one_hot(y, 4) * logits, axis=-1))

    value, grads = jax.value_and_grad(loss)((w1, b1, w2, b2))
    new = [p - 0.1 * g for p, g in zip((w1, b1, w2, b2), grads)]
    return value, *new


def cnn(kernel, bias, dense, images):
    h = lax.conv_general_dilated(images, kernel, (1, 1), "SAME",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    h = jax.nn.gelu(h + bias)
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return h.reshape(h.shape[0], -1) @ dense


def cnn_train_step(kernel, bias, dense, images, labels):
    def loss(k, b, d):
        logits = cnn(k, b, d, images)
        return optax_like_xent(logits, labels)

    value, (gk, gb, gd) = jax.value_and_grad(loss, argnums=(0, 1, 2))(kernel, bias, dense)
    return value, kernel - 0.05 * gk, bias - 0.05 * gb, dense - 0.05 * gd


def optax_like_xent(logits, labels):
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])


def attention(q, k, v):
    heads = 4
    b, t, d = q.shape

    def split(x):
        return x.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)

    scores = jnp.einsum("bhqd,bhkd->bhqk", split(q), split(k)) / jnp.sqrt(d // heads)
    mask = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    out = jnp.einsum("bhqk,bhkd->bhqd", weights, split(v))
    return out.transpose(0, 2, 1, 3).reshape(b, t, d)


def layer_norm(x, gamma, beta):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * gamma + beta


def scan_rnn(w_xh, w_hh, xs):
    def cell(h, x):
        h = jnp.tanh(x @ w_xh + h @ w_hh)
        return h, h.sum()

    h, sums = lax.scan(cell, jnp.zeros(w_hh.shape[0], xs.dtype), xs)
    return h, sums


def power_iteration(a):
    def body(_, v):
        v = a @ v
        return v / jnp.linalg.norm(v)

    v = lax.fori_loop(0, 30, body, jnp.ones(a.shape[0], a.dtype))
    return v @ a @ v


def newton_sqrt(x):
    def cond(state):
        y, i = state
        return i < 20

    def body(state):
        y, i = state
        return 0.5 * (y + x / y), i + 1

    return lax.while_loop(cond, body, (jnp.ones_like(x), 0))[0]


def random_numbers(key):
    k1, k2, k3 = jax.random.split(jax.random.wrap_key_data(key), 3)
    return (jax.random.normal(k1, (4, 3)), jax.random.uniform(k2, (5,)),
            jax.random.randint(k3, (6,), 0, 10))


def dropout(key, x):
    keep = jax.random.bernoulli(jax.random.wrap_key_data(key), 0.7, x.shape)
    return jnp.where(keep, x / 0.7, 0)


def ffts(x):
    spectrum = jnp.fft.fft(x)
    real = jnp.fft.irfft(jnp.fft.rfft(x.real), n=x.shape[-1])
    return jnp.abs(spectrum), real, jnp.fft.fft2(x.reshape(4, 4)).real


def sorting(x, keys):
    order = jnp.argsort(keys)
    values, indices = lax.top_k(x, 3)
    return jnp.sort(x), x[order], values, indices, jnp.cumsum(x), jnp.cumprod(1 + x / 10)


def scatter_gather(x, idx, updates):
    y = x.at[idx].add(updates)
    seg = jax.ops.segment_sum(updates, idx, num_segments=x.shape[0])
    return y[idx[::-1]], seg


def control_flow(x, n):
    branch = lax.switch(n % 3, [jnp.sin, jnp.cos, lambda t: t * t], x)
    return lax.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, branch)


def vmapped(a, b):
    return jax.vmap(lambda u, v: jnp.dot(u, v) * jnp.tanh(u))(a, b)


def integers(a, b):
    return (a // b, a % b, a & b, a | b, a ^ b, jnp.left_shift(a, 2), jnp.clip(a, -3, 3),
            jnp.maximum(a, b))


def special(x):
    return (jax.scipy.special.erf(x), jax.scipy.special.logsumexp(x), jnp.arctan2(x, 1 + x ** 2),
            jax.scipy.special.gammaln(1 + x ** 2), jnp.where(jnp.isnan(jnp.log(x)), -1.0, x))


def einsums(a, b):
    return jnp.einsum("bij,bjk->bik", a, b), jnp.einsum("bii->b", a)


# -- linear algebra ------------------------------------------------------------------------------

def solve(a, b):
    return jnp.linalg.solve(a, b)


def inverse(a):
    return jnp.linalg.inv(a)


def cholesky_solve(a, b):
    lower = jnp.linalg.cholesky(a)
    y = jax.scipy.linalg.solve_triangular(lower, b, lower=True)
    return jax.scipy.linalg.solve_triangular(lower.T, y, lower=False)


def eigh(a):
    w, v = jnp.linalg.eigh(a)
    return w, jnp.abs(v)  # eigenvectors up to sign


def svd(a):
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    return s, (u * s) @ vh


def qr(a):
    q, r = jnp.linalg.qr(a)
    return q @ r, jnp.abs(jnp.diag(r))


def determinants(a):
    sign, logdet = jnp.linalg.slogdet(a)
    return sign, logdet, jnp.linalg.det(a)


def least_squares(a, b):
    return jnp.linalg.lstsq(a, b)[0], jnp.linalg.pinv(a) @ b


# -- host callbacks -------------------------------------------------------------------------------

def pure_callback(x):
    host = jax.pure_callback(lambda t: np.sinc(t).astype(t.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return host * 2 + 1


def ordered_io_callback(x):
    total = io_callback(lambda t: np.asarray(t.sum() * 3, t.dtype), jax.ShapeDtypeStruct((), x.dtype),
                        x, ordered=True)
    return x / total


def debug_print(x):
    jax.debug.print("corpus: mean {m}", m=x.mean())
    return x - x.mean()


# -- SPMD over 8 devices ------------------------------------------------------------------------------

def data_parallel_step(w, b, x, y):
    def loss(w, b):
        return jnp.mean((jnp.tanh(x @ w + b) - y) ** 2)

    value, (gw, gb) = jax.value_and_grad(loss, argnums=(0, 1))(w, b)
    return value, w - 0.1 * gw, b - 0.1 * gb


def _mesh8():
    return jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))


def shard_map_psum(x):
    body = jax.shard_map(lambda t: t - lax.psum(t.sum(), "x") / t.size / 8, mesh=_mesh8(),
                         in_specs=P("x"), out_specs=P("x"))
    return body(x)


def shard_map_ring(x):
    def body(t):
        shifted = lax.ppermute(t, "x", [(i, (i + 1) % 8) for i in range(8)])
        gathered = lax.all_gather(t.sum(keepdims=True), "x", tiled=True)
        return shifted * 2 + gathered.mean()

    return jax.shard_map(body, mesh=_mesh8(), in_specs=P("x"), out_specs=P("x"))(x)


def model_parallel(x, w):
    mesh = _mesh8()
    h = jax.lax.with_sharding_constraint(x @ w, jax.sharding.NamedSharding(mesh, P(None, "x")))
    return jax.nn.relu(h).sum(-1)


def sharded_callback(x):
    return jax.pure_callback(lambda t: np.sqrt(np.abs(t)), jax.ShapeDtypeStruct(x.shape, x.dtype), x) + x


# -- the corpus ------------------------------------------------------------------------------------

def corpus() -> list[Program]:
    """Every program, with fresh example arguments."""
    w1, b1, w2, b2 = _mlp_params()
    x16 = _f32(8, 16)
    labels = np.array([0, 1, 2, 3, 3, 2, 1, 0], np.int32)
    kernel, bias, dense = _f32(3, 3, 2, 4, scale=0.3), _f32(4), _f32(64, 3, scale=0.2)
    images = _f32(2, 8, 8, 2)
    linalg = frozenset({"linalg"})
    callback = frozenset({"callback"})
    spmd = frozenset({"spmd"})
    key = np.asarray(jax.random.key_data(jax.random.key(7)))
    programs = [
        Program("mlp_forward", lambda w1, b1, w2, b2, x: mlp((w1, b1, w2, b2), x), (w1, b1, w2, b2, x16)),
        Program("mlp_train_step", mlp_train_step, (w1, b1, w2, b2, x16, labels)),
        Program("cnn_forward", cnn, (kernel, bias, dense, images), tolerance=1e-4),
        Program("cnn_train_step", cnn_train_step, (kernel, bias, dense, images, labels[:2] % 3),
                tolerance=1e-4),
        Program("attention", attention, (_f32(2, 6, 16), _f32(2, 6, 16), _f32(2, 6, 16)), tolerance=1e-4),
        Program("layer_norm", layer_norm, (_f32(4, 10), _f32(10), _f32(10)), tolerance=1e-4),
        Program("scan_rnn", scan_rnn, (_f32(3, 5, scale=0.5), _f32(5, 5, scale=0.5), _f32(7, 3)),
                tolerance=1e-4),
        Program("power_iteration", power_iteration, (_spd(6),), tolerance=1e-4),
        Program("newton_sqrt", newton_sqrt, (np.linspace(0.5, 9, 6, dtype=np.float32),)),
        Program("random_numbers", random_numbers, (key,)),
        Program("dropout", dropout, (key, _f32(4, 5))),
        Program("ffts", ffts, (_f32(16) + 1j * _f32(16),), tolerance=1e-4),
        Program("sorting", sorting, (_f32(9), _rng.permutation(9).astype(np.int32))),
        Program("scatter_gather", scatter_gather, (_f32(6), np.array([0, 2, 2, 5], np.int32), _f32(4))),
        Program("control_flow", control_flow, (_f32(5), np.int32(7))),
        Program("vmap", vmapped, (_f32(4, 3), _f32(4, 3))),
        Program("integers", integers, (np.array([-7, 5, 9, 12], np.int32), np.array([2, -3, 4, 5], np.int32))),
        Program("special_functions", special, (np.linspace(-2, 2, 7, dtype=np.float32),),
                _LOWERED_TO_JAXLIB_MATH, tolerance=1e-4),
        Program("einsum", einsums, (_f32(2, 3, 3), _f32(2, 3, 4))),
        Program("linalg_solve", solve, (_spd(5), _f32(5, 2)), linalg, tolerance=1e-4),
        Program("linalg_inv", inverse, (_spd(4),), linalg, tolerance=1e-4),
        Program("cholesky_solve", cholesky_solve, (_spd(5), _f32(5, 3)), linalg, tolerance=1e-4),
        Program("linalg_eigh", eigh, (_spd(5),), linalg, tolerance=1e-4),
        Program("linalg_svd", svd, (_f32(6, 4),), linalg, tolerance=1e-4),
        Program("linalg_qr", qr, (_f32(5, 3),), linalg, tolerance=1e-4),
        Program("linalg_det", determinants, (_spd(4) - 2 * np.eye(4, dtype=np.float32),), linalg,
                tolerance=1e-4),
        Program("linalg_lstsq", least_squares, (_f32(6, 3), _f32(6)), linalg, tolerance=1e-3),
        Program("pure_callback", pure_callback, (_f32(5),), callback),
        Program("ordered_io_callback", ordered_io_callback, (np.abs(_f32(4)) + 1,), callback),
        Program("debug_print", debug_print, (_f32(3),), callback),
        Program("data_parallel_step", data_parallel_step,
                (_f32(8, 4, scale=0.3), _f32(4), _f32(32, 8), _f32(32, 4)), spmd,
                specs=(P(), P(), P("x"), P("x")), tolerance=1e-4),
        Program("shard_map_psum", shard_map_psum, (_f32(16),), spmd, specs=(P("x"),)),
        Program("shard_map_ring", shard_map_ring, (_f32(16),), spmd, specs=(P("x"),)),
        Program("model_parallel", model_parallel, (_f32(4, 6), _f32(6, 16)), spmd,
                specs=(P(), P(None, "x")), tolerance=1e-4),
        Program("sharded_callback", sharded_callback, (_f32(16),), spmd | callback, specs=(P("x"),)),
    ]
    return programs
