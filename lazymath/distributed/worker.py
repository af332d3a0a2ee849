"""What runs inside a Dask worker: shard programs, collective combines, slices, counters.

Every function here is a plain function of arrays (Dask pickles the task, the worker imports
this module). A shard program is rebuilt into lazymath graph nodes and realized by the worker's
own lazymath engine: the program cache of the worker process makes every shard after the first
a cache hit (same structure, same shapes), and the kernel cache directory is the worker's own
(set by `LazymathWorker` when the worker starts).
"""

from __future__ import annotations

import os

import numpy as np

from lazymath import settings
from lazymath.api import cache_info, schedule
from lazymath.distributed.plan import Program, rebuild
from lazymath.realize import realize
from lazymath.runtime.stream import DeviceError, KernelLaunchError
from lazymath.tensor import Tensor

# per worker process: tasks run by kind
COUNTS = {"programs_run": 0, "combines": 0, "slices": 0}


class ShardError(DeviceError):
    """A lazymath kernel failed on a Dask worker. Names the kernel, the user's line that created
    it, the shard and the worker; the original error is in the message (and, on the worker, in
    `__cause__`). Picklable, so Dask re-raises it in the client as it is."""

    def __init__(self, message: str, kernel_name: str = "", source_loc: str = "",
                 shard: int = -1, worker: str = ""):  # fmt: skip
        super().__init__(message)
        self.kernel_name = kernel_name
        self.source_loc = source_loc
        self.shard = shard
        self.worker = worker

    def __reduce__(self):
        return (type(self), (self.args[0], self.kernel_name, self.source_loc, self.shard,
                             self.worker))  # fmt: skip


def run_program(prog: Program, shard: int, *inputs):
    """Realize one shard's program; returns its outputs (a tuple of arrays)."""
    COUNTS["programs_run"] += 1
    outs = rebuild(prog, inputs)
    handles = [Tensor(n) for n in outs if n.realized is None]
    try:
        if handles:
            realize(*handles)
    except Exception as e:
        raise _shard_error(e, prog, shard, handles) from e
    return tuple(n.realized for n in outs)


def _shard_error(e: BaseException, prog: Program, shard: int, handles) -> ShardError:
    kernel = getattr(e, "kernel_name", "") or ""
    loc = getattr(e, "source_loc", "") or ""
    if not kernel:  # which kernels the program has (fusion only: nothing runs)
        try:
            ks = schedule(*handles).kernels
        except Exception:
            ks = []
        if len(ks) == 1:
            kernel, loc = ks[0].name, loc or ks[0].source_loc
        elif ks:
            kernel = "one of " + ", ".join(k.name for k in ks)
            loc = loc or "; ".join(f"{k.name} at {k.source_loc}" for k in ks)
    if not loc:  # the user's lines of the program's ops
        locs = [x[6] for x in prog.nodes if x[0] == "op" and x[6] not in ("<unknown>", "")]
        loc = locs[-1] if locs else ""
    cause = e.cause if isinstance(e, KernelLaunchError) and e.cause is not None else e
    where = f" (created at {loc})" if loc else ""
    worker = _worker_address()
    msg = (f"kernel {kernel or '?'}{where} failed in program {prog.name!r} on shard {shard} "
           f"(Dask worker {worker}): {type(cause).__name__}: {cause}")  # fmt: skip
    return ShardError(msg, kernel, loc, shard, worker)


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return f"pid {os.getpid()}"


def output(results: tuple, j: int):
    return results[j]


def take(a: np.ndarray, axis: int, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of `a` along `axis` (scatter, and replicated leaves sliced for a shard)."""
    COUNTS["slices"] += 1
    idx = [slice(None)] * a.ndim
    idx[axis] = slice(lo, hi)
    return np.ascontiguousarray(a[tuple(idx)])


_COMBINE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def combine(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One node of an all-reduce tree. float16 partials are combined in float32 (like the
    NPU's accumulators); `finish` rounds back."""
    COUNTS["combines"] += 1
    if a.dtype == np.float16:
        a = a.astype(np.float32)
    if b.dtype == np.float16:
        b = b.astype(np.float32)
    with np.errstate(all="ignore"):
        return np.asarray(_COMBINE[op](a, b))


def finish(a: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(a).astype(np.dtype(dtype), copy=False)


def gather(parts: list, axis: int) -> np.ndarray:
    """All-gather: the shards concatenated along their axis."""
    COUNTS["combines"] += 1
    return np.concatenate(parts, axis=axis)


def load_npy(path: str, axis: int, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of a .npy file along `axis`, read through a memory map (only these pages
    are touched)."""
    m = np.load(path, mmap_mode="r")
    idx = [slice(None)] * m.ndim
    idx[axis] = slice(lo, hi)
    return np.ascontiguousarray(m[tuple(idx)])


def stats(dask_worker=None) -> dict:
    """This worker process's counters (run with Client.run, which passes `dask_worker`)."""
    info = cache_info()
    return {
        "pid": os.getpid(),
        "compiled": info.get("compiled", 0),
        "programs_built": info.get("program_misses", 0),
        "program_hits": info.get("program_hits", 0),
        "kernel_disk_hits": info.get("disk_hits", 0),
        "cache_dir": info.get("disk_dir", ""),
        **COUNTS,
        **_memory(dask_worker),
    }


def _memory(w) -> dict:
    """The Dask worker's memory limit and what it spilled to disk (0 outside a worker)."""
    out = {"memory_limit": 0, "spilled_keys": 0, "spilled_bytes": 0}
    if w is None:
        return out
    try:
        out["memory_limit"] = int(w.memory_manager.memory_limit or 0)
        data = w.data
        out["spilled_keys"] = len(getattr(data, "disk", ()) or ())
        total = getattr(data, "spilled_total", None)
        out["spilled_bytes"] = int(getattr(total, "disk", 0) or 0)
    except Exception:
        pass
    return out


def setup_worker(cache_base: str, name: str) -> str:
    """Give this worker its own kernel cache directory under `cache_base`."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name))
    d = os.path.join(cache_base, f"dask-worker-{safe}")
    settings.export("LAZYMATH_CACHE_DIR", d)
    return d
