"""The AscendCL-like runtime surface: device, streams, events, device memory, copies, launches.

Each call names the AscendCL call it mirrors. The emulated device memory is host memory handed
out only by the device's caching pool; streams are real worker threads (see stream.py); kernel
blocks spread over the process's one host thread pool (lazymath/_threads.py).

Kernels are duck-typed so this layer imports nothing above it: a kernel needs
`run_block(argv, block_idx, block_num)` (for native kernels a ctypes call, which releases the
GIL) and optionally `name`, `make_argv(arrays)`, `source_loc` ("file:line" of the user code that
created it, quoted in errors), `unit`, `bound`, `cores` and `cost` (read by the profiler).

`LAZYMATH_SCHEDULER=sync` (read when a Device is created) gives a device whose streams have no
threads: every launch runs inline on the caller's thread, in order, and events complete as soon
as they are recorded.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lazymath import settings
from lazymath._threads import SERIAL, Threads, block_pool
from lazymath.runtime import profiler as _prof
from lazymath.runtime import stream as _stream_module
from lazymath.runtime.device import DeviceSpec, get_spec
from lazymath.runtime.pool import DeviceBuffer, MemoryPool, MemoryStats
from lazymath.runtime.stream import _CALL, _KERNEL, Event, Stream, raise_pending

_SCHEDULERS = settings.SCHEDULER.choices  # accepted names -> "threads" or "sync"


def scheduler_from_env() -> str:
    """ "threads" (default) or "sync", from $LAZYMATH_SCHEDULER."""
    return settings.SCHEDULER.get()


@dataclass(frozen=True, slots=True)
class Launch:
    """One step of a prepared program (what `Device.execute` replays).

    `stream` indexes `Device.stream(i)`; `waits`/`record` index the `events` list passed to
    `execute`: waits happen on the stream before the launch, the record right after it.
    """

    kernel: object
    blocks: int = 1
    stream: int = 0
    waits: tuple[int, ...] = ()
    record: int | None = None
    unit: str | None = None
    bound: str | None = None
    source_loc: str | None = None


_DEVICES: weakref.WeakSet = weakref.WeakSet()  # for the fork handler


def _after_fork_in_child() -> None:
    """Stream worker threads do not survive fork(): the child's devices run in sync mode (the
    block pool starts afresh in the child, see lazymath/_threads.py)."""
    global _CURRENT_LOCK
    _CURRENT_LOCK = threading.Lock()
    for dev in list(_DEVICES):
        dev._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Device:
    """aclrtSetDevice: one emulated NPU with its memory pool and streams.

    Stream 0 is the default stream (aclrtSetDevice creates it). `stream(i)` returns the i-th
    persistent stream, creating it on first use, which is how compiled programs address streams.
    """

    def __init__(
        self,
        device_id: int = 0,
        spec: str | DeviceSpec = "ascend910",
        *,
        scheduler: str | None = None,
        host_assist: bool = True,
        memory_limit: int | None = None,
        block_threads: int | None = None,
    ) -> None:
        self.id = device_id
        self.spec = get_spec(spec)
        mode = scheduler or scheduler_from_env()
        if mode not in _SCHEDULERS:
            raise ValueError(f"scheduler {mode!r} is not one of {sorted(_SCHEDULERS)}")
        self.scheduler = _SCHEDULERS[mode]
        self.threaded = self.scheduler == "threads"
        self.host_assist = host_assist
        self.memory = MemoryPool(memory_limit)
        # how this device's launches run their blocks: the shared pool, or a thread count on it
        # (`block_threads`; the sync scheduler runs blocks on the calling thread)
        if not self.threaded:
            self.block_pool = SERIAL
        elif block_threads is None:
            self.block_pool = block_pool()
        else:
            self.block_pool = Threads(block_threads)
        self._streams: list[Stream] = []
        self._lock = threading.Lock()
        self.closed = False
        self.stream(0)
        _DEVICES.add(self)

    def __str__(self) -> str:
        return f"npu:{self.id}"

    def __repr__(self) -> str:
        return (
            f"<Device {self.id} {self.spec.name} scheduler={self.scheduler} "
            f"streams={len(self._streams)}>"
        )

    # -- streams and events ------------------------------------------------------------------

    @property
    def default_stream(self) -> Stream:
        return self._streams[0]

    @property
    def streams(self) -> tuple[Stream, ...]:
        return tuple(self._streams)

    def stream(self, index: int) -> Stream:
        """The index-th stream of this device (0 = default), created on first use."""
        streams = self._streams
        if index < len(streams):
            return streams[index]
        with self._lock:
            while len(streams) <= index:
                streams.append(self._new_stream(len(streams)))
        return streams[index]

    def _new_stream(self, index: int) -> Stream:
        return Stream(self, index, threaded=self.threaded, pool=self.block_pool)

    def create_stream(self) -> Stream:
        """aclrtCreateStream: a new stream with the next free index."""
        with self._lock:
            s = self._new_stream(len(self._streams))
            self._streams.append(s)
        return s

    def create_event(self, name: str | None = None) -> Event:
        """aclrtCreateEvent."""
        return Event(name)

    def synchronize(self) -> None:
        """aclrtSynchronizeDevice: wait for every stream; raise the first unreported error."""
        streams = self._streams
        for s in streams:
            s._quiesce()
        errors = [e for s in streams for e in s._take_errors()]
        if errors:
            raise_pending(errors)

    # -- memory -----------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> DeviceBuffer:
        """aclrtMalloc: device memory from the caching pool."""
        return self.memory.malloc(nbytes)

    def free(self, buf: DeviceBuffer, stream: Stream | None = None) -> None:
        """aclrtFree. With `stream`, the block returns to the pool only once the work queued on
        that stream so far is done (stream-ordered free), so a kernel still reading it is safe."""
        if stream is None:
            self.memory.free(buf)
        else:
            stream._enqueue((_CALL, lambda: self.memory.free(buf), "free", None))

    def memory_stats(self) -> MemoryStats:
        """Pool statistics: allocated, reserved, peak, hits, misses."""
        return self.memory.stats()

    def empty_cache(self) -> None:
        """Return cached free blocks to the system."""
        self.memory.empty_cache()

    def to_device(self, array: np.ndarray) -> DeviceBuffer:
        """malloc + memcpy_h2d in one call."""
        src = np.ascontiguousarray(array)
        buf = self.malloc(src.nbytes)
        memcpy_h2d(buf, src)
        return buf

    def memcpy_async(self, dst, src, stream: Stream | None = None, nbytes: int | None = None):
        """aclrtMemcpyAsync: copy in order with `stream`'s work (either side may be device or
        host memory)."""
        d, s = _copy_views(dst, src, nbytes)
        stream = stream or self.default_stream
        stream._enqueue((_CALL, lambda: np.copyto(d, s), "memcpy_async", None))

    # -- launches -------------------------------------------------------------------------------

    def launch(
        self,
        kernel,
        blocks: int | None,
        args: Sequence,
        stream: Stream | None = None,
        *,
        unit: str | None = None,
        bound: str | None = None,
        source_loc: str | None = None,
    ) -> None:
        """aclrtLaunchKernel(func, numBlocks, args, argsSize, stream).

        `args` are DeviceBuffers and/or numpy arrays; the argument vector is built once here
        (`kernel.make_argv(arrays)` when the kernel has it) and the launch is enqueued.
        `blocks=None` takes `kernel.blocks`.
        """
        self.launch_argv(
            kernel, blocks, make_argv(kernel, args), stream,
            unit=unit, bound=bound, source_loc=source_loc,
        )  # fmt: skip

    def launch_argv(
        self,
        kernel,
        blocks: int | None,
        argv,
        stream: Stream | None = None,
        *,
        unit: str | None = None,
        bound: str | None = None,
        source_loc: str | None = None,
    ) -> None:
        """`launch` with a prebuilt argument vector (what a cached program replays)."""
        if stream is None:
            stream = self._streams[0]
        if blocks is None:
            blocks = getattr(kernel, "blocks", 1)
        loc = source_loc or getattr(kernel, "source_loc", None)
        prof = _prof._ACTIVE
        trace = prof._on_launch(kernel, blocks, stream, unit, bound, loc) if prof else None
        stream._enqueue((_KERNEL, kernel, argv, blocks, trace, loc))

    def execute(
        self,
        program: Sequence[Launch],
        argvs: Sequence,
        events: Sequence[Event] | None = None,
        *,
        synchronize: bool = True,
    ) -> None:
        """Replay a stream-assigned program: per step, waits, launch, record; then synchronize.

        The one stream loop: a cached program on several streams (`runtime.replay.Program`)
        and a hand-scheduled low-level program both run through here.

        `argvs[i]` is the argument vector of step i (from `make_argv`; any iterable, read in
        step order). `events` must hold at least max(event id)+1 Events (reusable across
        replays: each record is a new mark).
        """
        events = events or ()
        stream_of = self.stream
        for step, argv in zip(program, argvs):
            st = stream_of(step.stream)
            for w in step.waits:
                st.wait_event(events[w])
            self.launch_argv(
                step.kernel, step.blocks, argv, st,
                unit=step.unit, bound=step.bound, source_loc=step.source_loc,
            )  # fmt: skip
            if step.record is not None:
                events[step.record].record(st)
        if synchronize:
            self.synchronize()

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """aclrtResetDevice: finish queued work and stop the stream workers. The device stays
        usable in sync mode (later launches run inline)."""
        if self.closed:
            return
        for s in self._streams:
            s._close()
            s.threaded = False
        self.block_pool = SERIAL
        for s in self._streams:
            s._pool = self.block_pool
        self.closed = True

    reset = close

    def _after_fork(self) -> None:
        """The streams lose their workers (commands run inline); kernel blocks keep the
        parent's thread count, on the child's own block pool (created on first use)."""
        for s in self._streams:
            s._after_fork()
        n = self.block_pool.n_threads
        self.block_pool = SERIAL if n == 1 else Threads(n)
        for s in self._streams:
            s._pool = self.block_pool
        self._lock = threading.Lock()
        self.scheduler = "sync"
        self.threaded = False

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_argv(kernel, args: Sequence):
    """The argument vector a launch passes to every `run_block` call.

    DeviceBuffers become their byte arrays; a kernel with `make_argv` builds its ctypes vector
    from the arrays; a kernel without it receives the arguments as a tuple.
    """
    arrays = [a.array if isinstance(a, DeviceBuffer) else a for a in args]
    build = getattr(kernel, "make_argv", None)
    return build(arrays) if build is not None else tuple(arrays)


def _as_bytes(x, nbytes: int | None) -> np.ndarray:
    if isinstance(x, DeviceBuffer):
        arr = x.raw
        limit = x.nbytes  # the size asked of malloc, not the rounded capacity
    else:
        if not isinstance(x, np.ndarray):
            raise TypeError(f"copy operand must be a DeviceBuffer or numpy array, not {type(x)}")
        if not x.flags.c_contiguous:
            raise ValueError("host array for a device copy must be C-contiguous")
        arr = x.reshape(-1).view(np.uint8)
        limit = arr.nbytes
    n = limit if nbytes is None else nbytes
    if n > limit:
        raise ValueError(f"copy of {n} bytes exceeds the {limit}-byte operand")
    return arr[:n]


def _copy_views(dst, src, nbytes: int | None) -> tuple[np.ndarray, np.ndarray]:
    if nbytes is None:
        nbytes = src.nbytes
    s = _as_bytes(src, nbytes)
    d = _as_bytes(dst, None)
    if nbytes > d.nbytes:  # aclrtMemcpy's destMax check
        raise ValueError(f"copy of {nbytes} bytes into a {d.nbytes}-byte destination")
    if not d.flags.writeable:
        raise ValueError("copy destination is read-only")
    return d[:nbytes], s


def memcpy_h2d(dst: DeviceBuffer, src: np.ndarray, nbytes: int | None = None) -> None:
    """aclrtMemcpy(..., ACL_MEMCPY_HOST_TO_DEVICE): immediate, on the calling thread. Like
    aclrtMemcpy it does not wait for streams: synchronize first if a kernel may still use `dst`."""
    d, s = _copy_views(dst, np.ascontiguousarray(src), nbytes)
    np.copyto(d, s)


def memcpy_d2h(dst: np.ndarray, src: DeviceBuffer, nbytes: int | None = None) -> np.ndarray:
    """aclrtMemcpy(..., ACL_MEMCPY_DEVICE_TO_HOST) into the C-contiguous array `dst`."""
    d, s = _copy_views(dst, src, nbytes if nbytes is not None else min(src.nbytes, dst.nbytes))
    np.copyto(d, s)
    return dst


# -- the current device (module-level calls act on it) ----------------------------------------

_CURRENT: Device | None = None
_CURRENT_LOCK = threading.Lock()


_BY_CONFIG: dict[tuple, Device] = {}  # (id, spec key, scheduler) -> device made by init_device


def init_device(device_id: int = 0, spec: str | DeviceSpec = "ascend910", **kwargs) -> Device:
    """aclInit + aclrtSetDevice: make a device current and return it (exposed as
    `lm.init_device`).

    Asking again for the same id, spec and scheduler returns the same Device object (so tensors
    made before a switch to another spec and back still share a device); other keyword
    arguments (memory_limit, host_assist, block_threads) always make a new device.
    """
    global _CURRENT
    spec = get_spec(spec)
    scheduler = kwargs.get("scheduler") or scheduler_from_env()
    if scheduler not in _SCHEDULERS:
        raise ValueError(f"scheduler {scheduler!r} is not one of {sorted(_SCHEDULERS)}")
    key = (device_id, spec.key(), _SCHEDULERS[scheduler])
    with _CURRENT_LOCK:
        dev = None if kwargs.keys() - {"scheduler"} else _BY_CONFIG.get(key)
        if dev is None or dev.closed:
            dev = Device(device_id, spec, **kwargs)
            if not kwargs.keys() - {"scheduler"}:
                _BY_CONFIG[key] = dev
        _CURRENT = dev
    return dev


def set_device(device: Device) -> Device:
    """Make an existing Device current (aclrtSetDevice on an initialized device)."""
    global _CURRENT
    _CURRENT = device
    return device


def current_device() -> Device:
    """The current device (an `ascend910` one is initialized on first use)."""
    dev = _CURRENT
    if dev is None:
        return init_device()
    return dev


def synchronize() -> None:
    """aclrtSynchronizeDevice on the current device."""
    current_device().synchronize()


def default_stream() -> Stream:
    return current_device().default_stream


_stream_module.default_stream_hook = default_stream


def create_stream() -> Stream:
    """aclrtCreateStream on the current device."""
    return current_device().create_stream()


def create_event(name: str | None = None) -> Event:
    """aclrtCreateEvent."""
    return Event(name)


def malloc(nbytes: int) -> DeviceBuffer:
    """aclrtMalloc on the current device."""
    return current_device().malloc(nbytes)


def free(buf: DeviceBuffer, stream: Stream | None = None) -> None:
    """aclrtFree on the current device."""
    current_device().free(buf, stream)


def memory_stats() -> MemoryStats:
    return current_device().memory_stats()


def empty_cache() -> None:
    current_device().empty_cache()


def memcpy_async(dst, src, stream: Stream | None = None, nbytes: int | None = None) -> None:
    """aclrtMemcpyAsync on `stream` (default: the current device's default stream)."""
    dev = stream.device if stream is not None else current_device()
    dev.memcpy_async(dst, src, stream, nbytes)


def launch(kernel, blocks: int | None, args: Sequence, stream: Stream | None = None, **kw) -> None:
    """aclrtLaunchKernel on `stream` (default: the current device's default stream)."""
    dev = stream.device if stream is not None else current_device()
    dev.launch(kernel, blocks, args, stream, **kw)
