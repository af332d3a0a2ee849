"""fork() while another thread holds the compiler's and llvmlite's locks (issue 13, defect 6):
the child realizes at once instead of waiting forever on a lock no thread of it will release.

Runs in a subprocess (it forks, and leaves locks held by a parked thread in that process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llvmlite.binding")

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import os, sys, threading, time
import numpy as np
import lazymath as lm
from concurrent.futures import Future
from lazymath import _threads
from lazymath.backend.native import jit, kernel_cache, workers

from lazymath.backend.host import vmlib

x = np.linspace(-2, 2, 3001).astype(np.float32)
(lm.exp(lm.tensor(x)) + 1.0).numpy()  # LLVM loaded, pools and streams running
j = jit.get_jit()
held, release = threading.Event(), threading.Event()


parked = Future()  # a compile worker busy at fork time
workers._queue.put((parked, release.wait, ()))


pool = _threads.block_pool()


def hold():  # what a thread compiling (or starting block threads) at fork time holds
    with j._optimizer.lock, jit._native_lock, kernel_cache._lock, _threads._POOL_LOCK, \
            pool._start_lock, workers._threads_lock, vmlib._lock:
        with jit._binding().ffi.lib._lock:
            held.set()
            release.wait()


t = threading.Thread(target=hold, daemon=True)
t.start()
held.wait()
pids = []
for k in range(3):
    pid = os.fork()
    if pid == 0:
        try:
            got = (lm.sin(lm.tensor(x)) * (3.0 + k)).numpy()  # a new kernel: compiles
            got2 = (lm.exp(lm.tensor(x)) + 1.0).numpy()  # a cached program
            big = np.ones((64, 4096), np.float32)
            got3 = lm.sum(lm.tensor(big) * 2.0, axis=1).numpy()  # several blocks
            seen = []  # the block pool in the child is a new one, with threads of its own
            _threads.block_pool().run(lambda argv, i, n: argv.append(i), seen, 8, 2)
            ok = (np.allclose(got, np.sin(x) * (3.0 + k), rtol=1e-5, atol=1e-6)
                  and np.allclose(got2, np.exp(x) + 1, rtol=1e-6)
                  and np.allclose(got3, 8192.0)
                  and _threads.block_pool() is not pool and sorted(seen) == list(range(8))
                  # the device keeps the parent's block thread count, on the child's pool
                  and lm.current_device().block_pool.n_threads == pool.n_threads)
            os._exit(0 if ok else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(2)
    pids.append(pid)
deadline = time.monotonic() + 120
status = {}
while len(status) < len(pids) and time.monotonic() < deadline:
    for pid in pids:
        if pid not in status:
            r, st = os.waitpid(pid, os.WNOHANG)
            if r:
                status[pid] = os.waitstatus_to_exitcode(st)
    time.sleep(0.05)
for pid in pids:
    if pid not in status:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status[pid] = "hung"
release.set()
print(sorted(status.values(), key=str))
sys.exit(0 if all(v == 0 for v in status.values()) else 1)
"""


def test_forked_children_realize_while_the_parent_holds_compiler_locks(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAZYMATH_CACHE_DIR": str(tmp_path / "kc"),
           "LAZYMATH_BACKEND": "llvm"}  # fmt: skip
    p = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
