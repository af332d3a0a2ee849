"""The compile watchdog: an LLVM optimization that never returns (LLVM 22's loop vectorizer has
spun forever on rare kernels) is abandoned after LAZYMATH_COMPILE_TIMEOUT seconds; the kernel is
compiled again with the vectorizers off, with a warning, and the process keeps compiling later
kernels normally. Two places optimize: the compile workers (every kernel of a realize, see
backend/native/workers.py) and the MCJIT engine (reports such as `asm`, `jit.Jit.compile`).

Runs in subprocesses: the simulated hang leaves an abandoned thread behind.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("llvmlite.binding")

_CHILD = r"""
import os, threading, warnings
import numpy as np
import lazymath as lm
from lazymath.backend.native import jit

release = threading.Event()
orig = jit._Optimizer.run
hung = []


def run(self, ir, name, quick):
    if not hung and self.context is None:  # the first run on the global context "hangs"
        hung.append(name)
        with self.lock:
            release.wait()
    return orig(self, ir, name, quick)


jit._Optimizer.run = run
from lazymath.backend.host.lower_llvm import lower_program
from lazymath.backend.compile import build_program
from lazymath.backend.npu.kernel_ir import ElementwiseKernel, SOp, contiguous_view
from lazymath.runtime.device import get_spec


def kernel_ir(op, n=1001):
    v = contiguous_view("float32", (n,))
    expr = (SOp("load", "float32", (), 0), SOp(op, "float32", (0,)))
    return ElementwiseKernel((n,), (v,), (v,), expr, (1,))


def compile_direct(op, symbol):
    prog = build_program(kernel_ir(op), get_spec("ascend910"), symbol)
    addr, _ = jit.get_jit().compile(str(lower_program(prog, symbol=symbol)), symbol, symbol)
    return addr


x = np.linspace(-3, 3, 1001).astype(np.float32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert compile_direct("exp", "wd_exp")
msgs = [str(m.message) for m in caught]
assert hung, "the simulated hang did not happen"
assert any("did not finish optimizing" in m and "vectorizers off" in m for m in msgs), msgs
j = jit.get_jit()
assert j._optimizer.context is not None, "later compiles use a fresh optimizer"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert compile_direct("sin", "wd_sin")
assert not [m for m in caught if "did not finish" in str(m.message)]
release.set()
print("ok")
"""

# the same through a realize: the compile workers' watchdog
_CHILD_WORKERS = r"""
import os, threading, warnings
import numpy as np
import lazymath as lm
from lazymath.backend.native import workers

release = threading.Event()
orig = workers.Compiler.compile
hung = []


def compile(self, ir, name, level, vectorize=True, **kw):
    if not hung:  # the first worker compile "hangs"
        hung.append(name)
        release.wait()
    return orig(self, ir, name, level, vectorize, **kw)


workers.Compiler.compile = compile
x = np.linspace(-3, 3, 1001).astype(np.float32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = (lm.exp(lm.tensor(x)) * 2.0).numpy()
msgs = [str(m.message) for m in caught]
assert hung, "the simulated hang did not happen"
assert any("did not finish optimizing" in m and "vectorizers off" in m for m in msgs), msgs
np.testing.assert_allclose(got, np.exp(x) * 2, rtol=1e-6)
assert workers._abandoned == 1, "the stuck worker was replaced"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got2 = (lm.sin(lm.tensor(x)) + 1.0).numpy()
assert not [m for m in caught if "did not finish" in str(m.message)]
np.testing.assert_allclose(got2, np.sin(x) + 1, rtol=1e-5, atol=1e-6)
release.set()
print("ok")
"""

# a background tier-up that hangs: the kernel runs on its tier-0 code meanwhile; after the
# timeout the optimized compile is redone with the vectorizers off and replaces it
_CHILD_TIER_UP = r"""
import threading, warnings
import numpy as np
import lazymath as lm
from lazymath.backend import compile as bc
from lazymath.backend.native import workers

release = threading.Event()
orig = workers.Compiler.compile
hung = []


def compile(self, ir, name, level, vectorize=True, **kw):
    if level == 3 and not hung:  # the first optimized compile (the tier-up) "hangs"
        hung.append(name)
        release.wait()
    return orig(self, ir, name, level, vectorize, **kw)


workers.Compiler.compile = compile
rng = np.random.default_rng(0)
a = rng.standard_normal((70, 90)).astype(np.float32)
b = rng.standard_normal((90, 50)).astype(np.float32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = (lm.relu(lm.tensor(a) @ lm.tensor(b)) * 0.5).numpy()
    assert bc.TIER_STATS["tiered"] == 1, bc.TIER_STATS
    assert bc.wait_tiering(60), "the tier-up never finished"
msgs = [str(m.message) for m in caught]
assert hung, "the simulated hang did not happen"
assert any("in the background" in m and "vectorizers off" in m for m in msgs), msgs
assert bc.TIER_STATS["tiered_up"] == 1 and workers._abandoned >= 1, bc.TIER_STATS
again = (lm.relu(lm.tensor(a) @ lm.tensor(b)) * 0.5).numpy()
assert np.array_equal(first, again)
np.testing.assert_allclose(first, np.maximum(a @ b, 0) * 0.5, rtol=1e-5, atol=1e-5)
release.set()
print("ok")
"""


@pytest.mark.parametrize("where", ["mcjit", "workers", "tier_up"])
def test_a_hung_llvm_optimization_is_abandoned_and_retried(tmp_path, where):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root, LAZYMATH_BACKEND="llvm", LAZYMATH_CACHE="0",
               LAZYMATH_CACHE_DIR=str(tmp_path),
               # the tier-up's retry is a whole O3 compile: room for it on a loaded machine
               LAZYMATH_COMPILE_TIMEOUT="8" if where == "tier_up" else "2",
               # the in-process watchdog (the compile server kills a hang instead: see
               # test_compile_isolation)
               LAZYMATH_COMPILE_ISOLATE="auto")  # fmt: skip
    env.pop("LAZYMATH_DEBUG", None)
    child = {"mcjit": _CHILD, "workers": _CHILD_WORKERS, "tier_up": _CHILD_TIER_UP}[where]
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
