"""``prefault``: the page faults of a fresh destination taken on several threads, for
kernels without MADV_POPULATE_WRITE (gVisor, where a TPU machine runs)."""

import mmap

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy import _host_memory
from ifrtpy._host_memory import prefault
from ifrtpy.errors import InvalidArgumentError

PAGE = mmap.PAGESIZE


@pytest.mark.parametrize("threads", [1, 3, 8, 16])
@pytest.mark.parametrize("offset, pages", [(0, 1), (100, 10), (7, 257), (0, 64)])
def test_every_page_is_written_once_and_the_rest_is_left(threads, offset, pages):
    backing = np.full(pages * PAGE + 2 * PAGE, 7, np.uint8)
    start = (-backing.ctypes.data) % PAGE + offset  # ``offset`` bytes into a page
    out = backing[start:start + pages * PAGE - offset // 2]
    prefault(out, threads)
    written = out == 0
    assert np.all(out[~written] == 7)  # bytes not written are as they were
    assert np.all(backing[:start] == 7) and np.all(backing[start + out.size:] == 7)
    first = out.ctypes.data // PAGE
    touched = {(out.ctypes.data + i) // PAGE - first for i in np.flatnonzero(written)}
    assert touched == set(range((out.ctypes.data + out.size - 1) // PAGE - first + 1))
    assert written.sum() <= len(touched) + threads  # a page's first byte, and each slice's


def test_threads_and_layout_are_checked():
    with pytest.raises(InvalidArgumentError, match="threads"):
        prefault(np.empty(PAGE, np.uint8), 0)
    with pytest.raises(InvalidArgumentError, match="threads"):
        prefault(np.empty(PAGE, np.uint8), 17)
    with pytest.raises(InvalidArgumentError, match="C-contiguous"):
        prefault(np.empty((4, PAGE), np.uint8)[:, ::2], 2)
    prefault(np.empty(0, np.float32), 4)  # nothing to map


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt")


@pytest.mark.parametrize("threads", [0, 4])
def test_a_fresh_large_read_is_prefaulted_where_pages_cannot_be_mapped(client, monkeypatch, threads):
    """With ``PREFAULT_THREADS`` set (a kernel without MADV_POPULATE_WRITE), a read into a
    fresh destination of 32 MiB or more takes its page faults on that many threads before
    the plugin's copy, and reads the values; a small read or one into ``out`` does not."""
    calls = []
    monkeypatch.setattr(_host_memory, "PREFAULT_THREADS", threads)
    monkeypatch.setattr(_host_memory, "prefault", lambda out, n: calls.append((out.nbytes, n)) or prefault(out, n))
    data = np.random.default_rng(0).random((8 << 20) // 2, dtype=np.float64)  # 32 MiB
    array = ifrt.device_put(data, client.devices()[0])
    np.testing.assert_array_equal(array.copy_to_host_buffer().result(), data)
    np.testing.assert_array_equal(array.copy_to_host_buffer(np.empty_like(data)).result(), data)
    small = ifrt.device_put(data[:1000], client.devices()[0])
    np.testing.assert_array_equal(np.asarray(small), data[:1000])
    assert calls == ([(data.nbytes, threads)] if threads else [])
