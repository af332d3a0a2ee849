"""Device memory: a caching allocator.

The emulated device memory is host memory, but only the runtime hands it out, through a
caching pool in the spirit of the CUDA/CANN caching allocators: a freed block is kept in a bin
and handed to the next request it fits (best fit, by rounded size), so a steady-state program
never goes back to the system allocator. `MemoryPool.stats()` proves it (hits vs misses).

The host threads that run kernel blocks are `lazymath._threads` (one pool per process, below
every layer: the backend, the runtime and the engine all run blocks on it).
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

import numpy as np

GM_ALIGN = 64  # bytes; every DeviceBuffer address is 64-byte aligned (covers the spec's 32 B)
ROUND = 512  # bytes; allocation granularity, so nearby sizes share one bin
MAX_SLACK = 2  # a cached block serves a request only if block <= MAX_SLACK * request (+ROUND)


def _round_up(nbytes: int) -> int:
    return max(ROUND, -(-nbytes // ROUND) * ROUND)


class DeviceBuffer:
    """One allocation of emulated device (GM) memory.

    Mirrors the `void *devPtr` an `aclrtMalloc` returns: a raw `address` (an int, cached once,
    because `ndarray.ctypes.data` costs ~2.5 us) plus `nbytes`. `as_array(dtype, shape)` gives a
    numpy view of the same bytes so host code and tests can look at device memory without a copy.
    """

    __slots__ = ("nbytes", "capacity", "address", "raw", "_views", "_pool", "freed", "__weakref__")

    def __init__(self, raw: np.ndarray, nbytes: int, pool: MemoryPool | None,
                 address: int | None = None) -> None:  # fmt: skip
        self.raw = raw  # uint8 array of `capacity` bytes, 64-byte aligned
        self.nbytes = nbytes  # bytes requested
        self.capacity = raw.nbytes  # bytes reserved (rounded)
        self.address = raw.__array_interface__["data"][0] if address is None else address
        self._views: dict = {}
        self._pool = pool
        self.freed = False

    def as_array(self, dtype=np.uint8, shape: tuple[int, ...] | int | None = None) -> np.ndarray:
        """A numpy view of the buffer as `dtype` with `shape` (default: 1-D over nbytes)."""
        key = (dtype, shape)
        view = self._views.get(key)
        if view is not None:
            return view
        dt = np.dtype(dtype)
        if shape is None:
            shape = (self.nbytes // dt.itemsize,)
        elif isinstance(shape, int):
            shape = (shape,)
        need = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if need > self.capacity:
            raise ValueError(
                f"view of {need} bytes ({dt}{list(shape)}) exceeds the buffer's {self.capacity}"
            )
        view = np.ndarray(shape, dtype=dt, buffer=self.raw.data, offset=0)
        if len(self._views) < 16:  # a small cache: realize paths ask for the same view again
            self._views[key] = view
        return view

    @property
    def array(self) -> np.ndarray:
        """The raw bytes (uint8, length nbytes): what kernels' `make_argv` receives."""
        return self.as_array(np.uint8, None)

    def __repr__(self) -> str:
        state = " freed" if self.freed else ""
        return f"<DeviceBuffer 0x{self.address:x} {self.nbytes} B{state}>"


@dataclass(frozen=True)
class MemoryStats:
    """Snapshot of the caching pool (bytes unless named otherwise)."""

    allocated: int  # bytes handed out and not yet freed (rounded sizes)
    reserved: int  # bytes held from the system: allocated + cached free blocks
    peak: int  # high-water mark of `allocated`
    peak_reserved: int
    hits: int  # malloc served from a cached block
    misses: int  # malloc that had to allocate fresh memory
    frees: int
    cached_blocks: int

    def __str__(self) -> str:
        mib = 1 / (1 << 20)
        return (
            f"allocated {self.allocated * mib:.2f} MiB, reserved {self.reserved * mib:.2f} MiB, "
            f"peak {self.peak * mib:.2f} MiB, hits {self.hits}, misses {self.misses}"
        )


class MemoryPool:
    """Caching allocator: size-rounded bins searched best fit.

    Free blocks stay reserved; `empty_cache()` returns them to the system. A cached block serves
    a request when it is at least as big and at most `MAX_SLACK` times bigger, so one huge free
    block is not wasted on a tiny request. Thread safe (one lock; the critical sections are a
    bisect and a list pop).
    """

    def __init__(self, limit_bytes: int | None = None) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[tuple]] = {}  # capacity -> (raw array, its address)
        self._sizes: list[int] = []  # sorted capacities that have free blocks
        self.limit_bytes = limit_bytes
        self._allocated = self._reserved = self._peak = self._peak_reserved = 0
        self._hits = self._misses = self._frees = 0

    def malloc(self, nbytes: int) -> DeviceBuffer:
        """aclrtMalloc: a 64-byte aligned block of at least `nbytes` bytes."""
        if nbytes < 0:
            raise ValueError(f"malloc of a negative size ({nbytes})")
        size = _round_up(nbytes)
        with self._lock:
            block = self._take(size)
            if block is None:
                self._misses += 1
                if self.limit_bytes is not None and self._reserved + size > self.limit_bytes:
                    self._release_cached()
                    if self._reserved + size > self.limit_bytes:
                        raise MemoryError(
                            f"device out of memory: {size} B requested, {self._reserved} B "
                            f"reserved of a {self.limit_bytes} B limit"
                        )
                raw = aligned(size)
                block = (raw, raw.__array_interface__["data"][0])
                self._reserved += size
                self._peak_reserved = max(self._peak_reserved, self._reserved)
            else:
                self._hits += 1
            self._allocated += block[0].nbytes
            self._peak = max(self._peak, self._allocated)
        return DeviceBuffer(block[0], nbytes, self, block[1])

    def free(self, buf: DeviceBuffer) -> None:
        """aclrtFree: the block goes back to its bin (not to the system)."""
        if buf._pool is not self:
            raise ValueError(f"{buf!r} was not allocated by this pool")
        with self._lock:
            if buf.freed:
                raise ValueError(f"double free of {buf!r}")
            buf.freed = True
            raw = buf.raw
            self._allocated -= raw.nbytes
            self._frees += 1
            size = raw.nbytes
            bin_ = self._free.get(size)
            if bin_ is None:
                self._free[size] = bin_ = []
                bisect.insort(self._sizes, size)
            bin_.append((raw, buf.address))

    def _take(self, size: int) -> tuple | None:
        i = bisect.bisect_left(self._sizes, size)
        if i == len(self._sizes) or self._sizes[i] > MAX_SLACK * size + ROUND:
            return None
        cap = self._sizes[i]
        bin_ = self._free[cap]
        raw = bin_.pop()
        if not bin_:
            del self._free[cap]
            del self._sizes[i]
        return raw

    def _release_cached(self) -> None:
        for cap, bin_ in self._free.items():
            self._reserved -= cap * len(bin_)
        self._free.clear()
        self._sizes.clear()

    def empty_cache(self) -> None:
        """Return every cached free block to the system (like torch.cuda.empty_cache)."""
        with self._lock:
            self._release_cached()

    def stats(self) -> MemoryStats:
        with self._lock:
            return MemoryStats(
                allocated=self._allocated,
                reserved=self._reserved,
                peak=self._peak,
                peak_reserved=self._peak_reserved,
                hits=self._hits,
                misses=self._misses,
                frees=self._frees,
                cached_blocks=sum(len(b) for b in self._free.values()),
            )

    def reset_peak(self) -> None:
        with self._lock:
            self._peak = self._allocated
            self._peak_reserved = self._reserved


def aligned(nbytes: int) -> np.ndarray:
    """A uint8 array of exactly `nbytes` whose data pointer is GM_ALIGN-aligned."""
    base = np.empty(nbytes + GM_ALIGN, dtype=np.uint8)
    shift = (-base.ctypes.data) % GM_ALIGN
    return base[shift : shift + nbytes]
