"""IFRT's tuple conformance cases (``tuple_impl_test_lib.cc``), written against the ifrtpy
interfaces only, on the arrays of :mod:`~ifrtpy.testing.conformance.arrays` (IFRT's
f32[2,3] holding 0..5 on addressable device 0).

Run them with :func:`~ifrtpy.testing.conformance.case_classes` from a backend's test
module that provides a ``client`` fixture (see :mod:`ifrtpy.testing.conformance`).
"""

from __future__ import annotations

import gc
import re

import numpy as np

from ifrtpy.testing.conformance.arrays import TIMEOUT_S, _host, _iota, _make

def test_nullary_tuple(client):
    t = client.make_tuple([])
    assert t.arity() == 0
    assert t.unpack() == []
    t.ready_future().result(timeout=TIMEOUT_S)
    assert re.fullmatch(r".*Tuple\(\)", t.debug_string())
    assert not t.is_deleted()
    t.delete().result(timeout=TIMEOUT_S)
    assert t.is_deleted()


def test_tuple_of_arrays(client):
    arrays = [_make(client) for _ in range(3)]
    t = client.make_tuple(arrays)
    assert t.arity() == 3
    assert all(a is b for a, b in zip(t.unpack(), arrays))
    assert re.fullmatch(r"Tuple\(.*,.*,.*\)", t.debug_string(), re.DOTALL)
    t.ready_future().result(timeout=TIMEOUT_S)
    assert not t.is_deleted()
    t.delete().result(timeout=TIMEOUT_S)
    assert t.is_deleted()
    assert all(a.is_deleted() for a in arrays)


def test_delete_of_element_deletes_tuple(client):
    a1, a2, a3 = (_make(client) for _ in range(3))
    t = client.make_tuple([a1, a2, a3])
    assert not t.is_deleted()
    a1.delete().result(timeout=TIMEOUT_S)
    assert t.is_deleted()
    assert not a2.is_deleted() and not a3.is_deleted()


def test_nested_tuples(client):
    a1, a2, a3 = (_make(client) for _ in range(3))
    t1 = client.make_tuple([a1, a2])
    t2 = client.make_tuple([])
    outer = client.make_tuple([t1, t2, a3])
    assert outer.arity() == 3
    elements = outer.unpack()
    assert elements[0] is t1 and elements[1] is t2 and elements[2] is a3
    outer.ready_future().result(timeout=TIMEOUT_S)
    del outer, elements
    gc.collect()
    assert t1.arity() == 2
    inner = t1.unpack()
    assert inner[0] is a1 and inner[1] is a2
    np.testing.assert_array_equal(_host(inner[0]), _iota())


__all__ = sorted(name for name in dir() if name.startswith("test_"))
