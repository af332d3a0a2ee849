"""Layer 5, the runtime: an AscendCL-like surface over an emulated NPU with real host concurrency.

Owns the device spec (`device`), device memory through a caching pool (`pool`; kernel blocks run on
the process's one host thread pool, `lazymath._threads`, below every layer), streams and events on
worker threads (`stream`), the device, copies and launches (`api`), the simulated NPU timeline
(`timeline`) and the profiler with Chrome trace export (`profiler`). Imports nothing above the
backend; kernels and costs are duck-typed.
"""

from lazymath.runtime.api import (
    Device,
    Launch,
    create_event,
    create_stream,
    current_device,
    default_stream,
    empty_cache,
    free,
    init_device,
    launch,
    make_argv,
    malloc,
    memcpy_async,
    memcpy_d2h,
    memcpy_h2d,
    memory_stats,
    scheduler_from_env,
    set_device,
    synchronize,
)
from lazymath.runtime.device import ASCEND910, ASCEND910B, PRESETS, DeviceSpec, get_spec
from lazymath.runtime.pool import DeviceBuffer, MemoryPool, MemoryStats
from lazymath.runtime.profiler import KernelRecord, Profiler, profile
from lazymath.runtime.stream import DeviceError, Event, KernelLaunchError, Stream, elapsed_time
from lazymath.runtime.timeline import SimKernel, Timeline, simulate

__all__ = [
    "ASCEND910",
    "ASCEND910B",
    "PRESETS",
    "Device",
    "DeviceBuffer",
    "DeviceError",
    "DeviceSpec",
    "Event",
    "KernelLaunchError",
    "KernelRecord",
    "Launch",
    "MemoryPool",
    "MemoryStats",
    "Profiler",
    "SimKernel",
    "Stream",
    "Timeline",
    "create_event",
    "create_stream",
    "current_device",
    "default_stream",
    "elapsed_time",
    "empty_cache",
    "free",
    "get_spec",
    "init_device",
    "launch",
    "make_argv",
    "malloc",
    "memcpy_async",
    "memcpy_d2h",
    "memcpy_h2d",
    "memory_stats",
    "profile",
    "scheduler_from_env",
    "set_device",
    "simulate",
    "synchronize",
]
