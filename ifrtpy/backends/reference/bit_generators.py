"""XLA's bit generators in NumPy: what ``stablehlo.rng_bit_generator`` gives on XLA's CPU
compiler, bit for bit (Philox4x32-10 and ThreeFry2x32-20, as XLA builds them from its ops).

Each takes the op's state (u64: the key, then the counter: one word, or two for Philox's
128-bit counter) and the shape and unsigned type of the bits, and returns the new state
and the bits. Types narrower than 32 bits take the low bits of 32-bit values, as XLA's do.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["philox", "three_fry"]

_U32 = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def _words(u64: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The low and high 32 bits of each of ``u64``."""
    return (u64 & _U32).astype(np.uint32), (u64 >> _32).astype(np.uint32)


def _joined(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return low.astype(np.uint64) | (high.astype(np.uint64) << _32)


def _rounds_philox(x: list[np.ndarray], k0: Any, k1: Any) -> list[np.ndarray]:
    """Philox4x32 with 10 rounds on the counters ``x`` (four u32 arrays)."""
    for _ in range(10):
        p0 = x[0].astype(np.uint64) * np.uint64(0xD2511F53)
        p1 = x[2].astype(np.uint64) * np.uint64(0xCD9E8D57)
        (lo0, hi0), (lo1, hi1) = _words(p0), _words(p1)
        x = [hi1 ^ x[1] ^ k0, lo1, hi0 ^ x[3] ^ k1, lo0]
        k0, k1 = k0 + np.uint32(0x9E3779B9), k1 + np.uint32(0xBB67AE85)
    return x


def philox(state: np.ndarray, shape: tuple[int, ...], dtype: np.dtype
           ) -> tuple[np.ndarray, np.ndarray]:
    """Philox: the key is ``state[0]``; the counter ``state[1:3]`` (low word first), or,
    for a state of two words, ``state[1]`` over ``state[0]``. Each counter value gives
    four u32 (two u64), taken in turn; the counter advances by the values used."""
    state = np.asarray(state, np.uint64)
    n = math.prod(shape)
    wide = np.dtype(dtype).itemsize == 8
    blocks = -(-(2 * n if wide else n) // 4)
    low, high = state[1], state[2] if state.size >= 3 else state[0]
    with np.errstate(over="ignore"):
        counter_low = low + np.arange(blocks, dtype=np.uint64)
        counter_high = np.where(counter_low < low, high + np.uint64(1), high).astype(np.uint64)
        k0, k1 = _words(state[0])
        bits = _rounds_philox([*_words(counter_low), *_words(counter_high)], k0, k1)
        new_low = low + np.uint64(blocks)
        new_high = high + np.uint64(1) if new_low < low else high
    if wide:
        values = np.stack([_joined(bits[0], bits[1]), _joined(bits[2], bits[3])], axis=1)
    else:
        values = np.stack(bits, axis=1)
    out = values.reshape(-1)[:n].astype(dtype).reshape(shape)
    new = [state[0], new_low] + ([new_high] if state.size >= 3 else [])
    return np.array(new, np.uint64), out


def _three_fry_2x32(x0: np.ndarray, x1: np.ndarray, k0: Any, k1: Any
                    ) -> tuple[np.ndarray, np.ndarray]:
    """ThreeFry2x32 with 20 rounds."""
    k2 = np.uint32(0x1BD11BDA) ^ k0 ^ k1
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    x0, x1 = x0 + k0, x1 + k1
    for i, (a, b) in enumerate(((k1, k2), (k2, k0), (k0, k1), (k1, k2), (k2, k0))):
        for r in rotations[i % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
            x1 = x0 ^ x1
        x0, x1 = x0 + a, x1 + b + np.uint32(i + 1)
    return x0, x1


def three_fry(state: np.ndarray, shape: tuple[int, ...], dtype: np.dtype
              ) -> tuple[np.ndarray, np.ndarray]:
    """ThreeFry: the key is ``state[0]``, the counter ``state[1]``. 64-bit values take one
    counter value each (its two words of output); 32-bit ones half as many, the two
    words of each going to the two halves of the shape split along its first even
    dimension (else its longest)."""
    state = np.asarray(state, np.uint64)
    k0, k1 = _words(state[0])
    wide = np.dtype(dtype).itemsize == 8
    shape = tuple(shape)
    if wide:
        counted = shape
    elif not shape:
        counted = (1,)
    else:
        split = next((i for i, d in enumerate(shape) if d % 2 == 0),
                     int(np.argmax(shape)))
        counted = shape[:split] + (-(-shape[split] // 2), 1) + shape[split + 1:]
    n = math.prod(counted)
    with np.errstate(over="ignore"):
        counter = state[1] + np.arange(n, dtype=np.uint64)
        x0, x1 = _three_fry_2x32(*_words(counter), k0, k1)
        new = np.array([state[0], state[1] + np.uint64(n)], np.uint64)
    if wide:
        return new, _joined(x0, x1).reshape(shape)
    if not shape:
        return new, x0.reshape(()).astype(dtype)
    pair = np.concatenate([x0.reshape(counted), x1.reshape(counted)], axis=split + 1)
    whole = pair.reshape(shape[:split] + (2 * counted[split],) + shape[split + 1:])
    return new, whole[tuple(slice(0, d) for d in shape)].astype(dtype)
