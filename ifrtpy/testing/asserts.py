"""Assertion helpers for ifrtpy arrays: per-shard data checked against NumPy.

Work with any backend (they use only the interfaces). Values are compared byte-wise by
default (float dtypes may hold NaNs with payloads, which ``==`` never equates); pass
``nan_equal=True`` to take any two NaNs as equal (the values a device declares for an
inexact dtype promise no payloads: ``Client.inexact_dtypes``), or ``rtol``/``atol`` to
compare floats with a tolerance instead.

* :func:`assert_array_matches`: dtype, shape, the whole value, and every shard;
* :func:`assert_per_shard_data`: each addressable shard is the slice of the expected
  global value that its index domain names, on the right device and memory kind;
* :func:`assert_shards`: IFRT's ``AssertPerShardData`` (explicit per-shard values);
* :func:`assert_same_values`: two host arrays are equal (byte-wise or within tolerance).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ifrtpy.array import ArrayCopySemantics
from ifrtpy.dtypes import DType
from ifrtpy.shape import IndexDomain, Shape
from ifrtpy.sharding import OpaqueSharding, SingleDeviceShardSemantics

__all__ = ["assert_same_values", "host_value", "assert_array_matches", "assert_per_shard_data",
           "assert_shards"]

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
#: How long to wait for an array's data before failing.
TIMEOUT_S = 10.0


def _bytes(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8).tobytes()


def _with_nans_of(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """``actual`` with ``expected``'s NaN wherever both hold one (complex: part by part)."""
    a, e = np.ascontiguousarray(actual).reshape(-1), np.ascontiguousarray(expected).reshape(-1)
    if a.dtype.kind == "c":
        a, e = a.view(a.real.dtype), e.view(e.real.dtype)
    try:
        both = np.isnan(a) & np.isnan(e)
    except TypeError:  # no NaNs in this dtype
        return actual
    if not both.any():
        return actual
    a = a.copy()
    a[both] = e[both]
    return a.view(actual.dtype).reshape(actual.shape)


def assert_same_values(actual: Any, expected: Any, what: str = "", *, rtol: float | None = None,
                       atol: float | None = None, nan_equal: bool = False) -> None:
    """``actual`` and ``expected`` (host arrays) have the same dtype and shape and the
    same bytes, where ``nan_equal`` any NaN equal to any NaN (payloads and signs aside);
    or, with ``rtol``/``atol``, values within that tolerance (NaNs equal)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    prefix = f"{what}: " if what else ""
    assert actual.dtype == expected.dtype, f"{prefix}dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{prefix}shape {actual.shape} != {expected.shape}"
    if nan_equal:
        actual = _with_nans_of(actual, expected)
    if rtol is None and atol is None:
        if _bytes(actual) != _bytes(expected):
            np.testing.assert_array_equal(actual, expected, err_msg=prefix + "values differ")
            raise AssertionError(f"{prefix}values differ in their bytes (NaN payloads or -0?):"
                                 f"\n{actual!r}\n!=\n{expected!r}")
    else:
        np.testing.assert_allclose(actual.astype(np.float64) if actual.dtype.kind not in "c"
                                   else actual, expected.astype(actual.dtype), rtol=rtol or 0,
                                   atol=atol or 0, equal_nan=True, err_msg=prefix)


def host_value(array, timeout: float = TIMEOUT_S) -> np.ndarray:
    """The array's whole value on the host (waits; raises the array's error)."""
    return array.copy_to_host_buffer().result(timeout=timeout)


def _addressable_domains(sharding, shape) -> list[IndexDomain]:
    count = len(sharding.devices.addressable_device_list())
    if sharding.is_fully_replicated:
        return [IndexDomain(Shape(shape))] * count
    return list(sharding.index_domains(Shape(shape), ADDRESSABLE))


def assert_per_shard_data(array, expected_global: Any, *, rtol: float | None = None,
                          atol: float | None = None, nan_equal: bool = False) -> None:
    """Every addressable shard of ``array`` (disassembled with REUSE_INPUT) is on the
    sharding's device, in its memory kind, of the array's dtype, and holds
    ``expected_global[domain]`` for its index domain (the whole value where the sharding
    replicates), compared as :func:`assert_same_values` does. Shardings without index
    domains (opaque) cannot be checked this way."""
    expected_global = np.asarray(expected_global)
    sharding = array.sharding
    if isinstance(sharding, OpaqueSharding):
        raise AssertionError(f"{sharding!r} has no index domains to check shards against")
    domains = _addressable_domains(sharding, expected_global.shape)
    devices = sharding.devices.addressable_device_list()
    shards = array.disassemble_into_single_device_arrays(ArrayCopySemantics.REUSE_INPUT,
                                                         ADDRESSABLE)
    assert len(shards) == len(devices) == len(domains), (
        f"{len(shards)} shards, {len(devices)} addressable devices, {len(domains)} domains")
    for i, (shard, device, domain) in enumerate(zip(shards, devices, domains)):
        what = f"shard {i} (device {device}, domain {domain})"
        assert list(shard.sharding.devices) == [device], f"{what}: on {shard.sharding.devices}"
        assert shard.sharding.memory_kind == sharding.memory_kind, (
            f"{what}: memory kind {shard.sharding.memory_kind} != {sharding.memory_kind}")
        assert shard.dtype == array.dtype, f"{what}: dtype {shard.dtype} != {array.dtype}"
        assert shard.shape == domain.shape, f"{what}: shape {shard.shape} != {domain.shape}"
        assert_same_values(host_value(shard), expected_global[(*domain.slices(), ...)], what,
                           rtol=rtol, atol=atol, nan_equal=nan_equal)


def assert_array_matches(array, expected: Any, *, dtype: Any = None, sharding: Any = None,
                         per_shard: bool = True, rtol: float | None = None,
                         atol: float | None = None) -> None:
    """``array`` holds ``expected`` (a host array): its dtype (``dtype`` if given, else
    ``expected``'s) and shape match, its whole value copied to the host is ``expected``,
    and (``per_shard``, when the sharding has index domains) so is every shard. With
    ``sharding``, the array's sharding must equal it."""
    expected = np.asarray(expected)
    want = DType.from_numpy(expected.dtype if dtype is None else dtype)
    assert array.dtype == want, f"dtype {array.dtype} != {want}"
    assert array.shape == Shape(expected.shape), f"shape {array.shape} != {list(expected.shape)}"
    if sharding is not None:
        assert array.sharding == sharding, f"sharding {array.sharding!r} != {sharding!r}"
    assert not array.is_deleted(), "the array is deleted"
    assert_same_values(host_value(array), expected.astype(want.to_numpy(), copy=False),
                       "global value", rtol=rtol, atol=atol)
    if per_shard and not isinstance(array.sharding, OpaqueSharding):
        assert_per_shard_data(array, expected.astype(want.to_numpy(), copy=False),
                              rtol=rtol, atol=atol)


def assert_shards(array, dtype: Any, shard_shape: Sequence[int], per_shard: Sequence[Any],
                  devices: Sequence[Any]) -> None:
    """IFRT's ``AssertPerShardData``: the i-th addressable shard is on ``devices[i]``, of
    ``dtype`` and ``shard_shape``, and holds ``per_shard[i]``."""
    dtype = dtype if isinstance(dtype, DType) else DType.from_numpy(dtype)
    shards = array.disassemble_into_single_device_arrays(ArrayCopySemantics.REUSE_INPUT,
                                                         ADDRESSABLE)
    assert len(shards) == len(devices) == len(per_shard), (
        f"{len(shards)} shards, {len(devices)} devices, {len(per_shard)} expected values")
    for i, (shard, device, expected) in enumerate(zip(shards, devices, per_shard)):
        assert list(shard.sharding.devices) == [device], f"shard {i}: on {shard.sharding.devices}"
        assert shard.dtype == dtype, f"shard {i}: dtype {shard.dtype} != {dtype}"
        assert shard.shape == Shape(shard_shape), f"shard {i}: shape {shard.shape}"
        assert_same_values(host_value(shard), np.asarray(expected, dtype.to_numpy()),
                           f"shard {i}")
