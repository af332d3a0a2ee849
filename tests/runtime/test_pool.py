"""The caching device-memory pool and host<->device copies."""

from __future__ import annotations

import numpy as np
import pytest

from lazymath.runtime import Device, MemoryPool
from lazymath.runtime.pool import GM_ALIGN, ROUND


def test_freed_block_is_reused():
    pool = MemoryPool()
    a = pool.malloc(10_000)
    addr = a.address
    pool.free(a)
    b = pool.malloc(9_000)  # same size class after rounding -> the cached block
    s = pool.stats()
    assert b.address == addr
    assert (s.hits, s.misses) == (1, 1)
    assert s.reserved == a.capacity and s.allocated == b.capacity


def test_steady_state_loop_never_misses():
    pool = MemoryPool()
    sizes = [4096, 100_000, 7, 65_536, 1 << 20]
    for _ in range(50):
        bufs = [pool.malloc(n) for n in sizes]
        for b in bufs:
            pool.free(b)
    s = pool.stats()
    assert s.misses == len(sizes) and s.hits == 49 * len(sizes)
    assert s.allocated == 0 and s.cached_blocks == len(sizes)
    assert s.peak == s.reserved == sum(max(ROUND, -(-n // ROUND) * ROUND) for n in sizes)


def test_best_fit_and_no_huge_block_for_tiny_request():
    pool = MemoryPool()
    big, mid = pool.malloc(1 << 20), pool.malloc(8192)
    big_addr, mid_addr = big.address, mid.address
    pool.free(big)
    pool.free(mid)
    c = pool.malloc(6000)  # fits both; best fit is the 8 KiB block
    assert c.address == mid_addr
    d = pool.malloc(100)  # the 1 MiB block is too wasteful for 100 B
    assert d.address != big_addr
    assert pool.stats().misses == 3


def test_peak_allocated_and_empty_cache():
    pool = MemoryPool()
    a, b = pool.malloc(4096), pool.malloc(4096)
    pool.free(a)
    pool.free(b)
    assert pool.stats().peak == 8192 and pool.stats().allocated == 0
    assert pool.stats().reserved == 8192
    pool.empty_cache()
    s = pool.stats()
    assert s.reserved == 0 and s.cached_blocks == 0 and s.peak == 8192
    pool.reset_peak()
    assert pool.stats().peak == 0


def test_limit_releases_cache_then_raises():
    pool = MemoryPool(limit_bytes=16384)
    a = pool.malloc(8192)
    pool.free(a)
    b = pool.malloc(12_000)  # does not fit next to the cached 8 KiB: cache is released
    assert pool.stats().reserved == b.capacity
    with pytest.raises(MemoryError, match="out of memory"):
        pool.malloc(8192)


def test_double_free_and_foreign_free():
    pool, other = MemoryPool(), MemoryPool()
    a = pool.malloc(10)
    pool.free(a)
    with pytest.raises(ValueError, match="double free"):
        pool.free(a)
    with pytest.raises(ValueError, match="not allocated by this pool"):
        other.free(pool.malloc(10))
    with pytest.raises(ValueError, match="negative"):
        pool.malloc(-1)


@pytest.mark.parametrize("n", [0, 1, 7, 33, 4099])
def test_buffers_are_aligned_with_cached_address(n):
    pool = MemoryPool()
    b = pool.malloc(n)
    assert b.address % GM_ALIGN == 0
    assert b.address == b.raw.ctypes.data
    assert b.nbytes == n and b.array.nbytes == n


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int32, np.bool_])
def test_as_array_views_device_memory(dtype):
    pool = MemoryPool()
    shape = (3, 5)
    b = pool.malloc(15 * np.dtype(dtype).itemsize)
    v = b.as_array(dtype, shape)
    assert v.shape == shape and v.dtype == dtype and v.ctypes.data == b.address
    v[...] = np.ones(shape, dtype)
    assert np.shares_memory(v, b.raw)
    assert b.as_array(dtype, shape) is v  # cached view
    with pytest.raises(ValueError, match="exceeds"):
        b.as_array(dtype, (100, 100))


def test_copies_round_trip(scheduler):
    dev = Device()
    src = (np.arange(31, dtype=np.float32) - 7.5)[::-1].copy()
    buf = dev.to_device(src)
    back = np.empty_like(src)
    from lazymath.runtime import memcpy_d2h, memcpy_h2d

    memcpy_d2h(back, buf)
    np.testing.assert_array_equal(back, src)
    # async copies are ordered with the stream's work
    st = dev.create_stream()
    out = np.zeros_like(src)
    dev.memcpy_async(buf, src * 2, st)
    dev.memcpy_async(out, buf, st)
    st.synchronize()
    np.testing.assert_array_equal(out, src * 2)
    with pytest.raises(ValueError, match="destination"):
        memcpy_h2d(buf, np.zeros(100, np.float32))  # destMax check
    with pytest.raises(ValueError, match="C-contiguous"):
        memcpy_d2h(np.zeros((4, 8), np.float32)[:, ::2], buf)
    dev.free(buf)
    assert dev.memory_stats().allocated == 0
    dev.empty_cache()
    assert dev.memory_stats().reserved == 0
    dev.close()
