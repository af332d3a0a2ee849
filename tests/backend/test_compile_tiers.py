"""Parallel and tiered compilation (backend/compile.py, backend/native/workers.py).

Tiered: a kernel slow to optimize starts on tier-0 code (no IR optimization) and the optimized
code replaces it in the background; results never change (IEEE arithmetic at every level).
Parallel: the kernels of one program are optimized on the compile workers concurrently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend import compile as bc
from lazymath.backend.native import kernel_cache, workers
from lazymath.backend.npu.kernel_ir import ElementwiseKernel, ReduceKernel, SOp, contiguous_view


@pytest.fixture(autouse=True)
def _scalars_folded(monkeypatch):
    """These tests call single kernels with hand-built argument lists (inputs, outputs), here and
    in their subprocesses: the Python scalars of their graphs are folded into the kernel
    (LAZYMATH_SCALAR_ARGS=0) rather than passed as 0-d inputs. Runtime scalars are
    tests/test_scalar_args.py's."""
    monkeypatch.setenv("LAZYMATH_SCALAR_ARGS", "0")


RNG = np.random.default_rng(2020)


def _chain(f: str, n: int) -> tuple:
    v = contiguous_view(f, (n,))
    expr = [SOp("load", f, (), 0), SOp("load", f, (), 1)]
    for op in ("sin", "tanh", "cos", "sigmoid"):
        expr.append(SOp(op, f, (len(expr) - 1,)))
        expr.append(SOp("mul", f, (len(expr) - 1, 1)))
    expr.append(SOp("pow", f, (len(expr) - 1, 1)))
    ir = ElementwiseKernel((n,), (v, v), (v,), tuple(expr), (len(expr) - 1,))
    x = RNG.uniform(-20, 20, n).astype(f)
    y = RNG.uniform(0.5, 1.5, n).astype(f)
    return ir, (x, y), [np.zeros(n, f)]


def _reduce(f: str, n: int, op: str = "sum") -> tuple:
    v = contiguous_view(f, (n,))
    pro = (SOp("load", f, (), 0), SOp("sin", f, (0,)), SOp("mul", f, (1, 0)))
    ir = ReduceKernel((n,), (0,), op, (v,), pro, 2, f, (), (), (SOp("acc", f),), (0,),
                      (contiguous_view(f, ()),))  # fmt: skip
    return ir, (RNG.uniform(-3, 3, n).astype(f),), [np.zeros(1, f)]


def _ints(n: int) -> tuple:
    v = contiguous_view("int32", (n,))
    expr = (SOp("load", "int32", (), 0), SOp("mul", "int32", (0, 0)),
            SOp("floor_divide", "int32", (1, 0)), SOp("remainder", "int32", (1, 0)),
            SOp("add", "int32", (2, 3)))  # fmt: skip
    ir = ElementwiseKernel((n,), (v,), (v,), expr, (4,))
    return ir, (RNG.integers(-1000, 1000, n).astype(np.int32),), [np.zeros(n, np.int32)]


def _matmul(f: str, m: int, k: int, n: int) -> tuple:
    a = RNG.standard_normal((m, k)).astype(f)
    b = RNG.standard_normal((k, n)).astype(f)
    out = lm.mul(lm.relu(lm.matmul(lm.tensor(a), lm.tensor(b))), 0.5)
    (sk,) = lm.schedule(out).kernels
    return sk.group.ir, (a, b), [np.zeros((m, n), f)]


_KERNELS = {
    "matmul_f16": lambda: _matmul("float16", 67, 45, 33),
    "matmul_f32": lambda: _matmul("float32", 130, 97, 61),
    "chain_f32": lambda: _chain("float32", 5003),
    "chain_f16": lambda: _chain("float16", 1031),
    "reduce_f32": lambda: _reduce("float32", 100_003),
    "reduce_max": lambda: _reduce("float32", 30_011, "max"),
    "ints": lambda: _ints(4099),
}


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("name", list(_KERNELS))
def test_tiered_replacement_never_changes_a_result(name, spec, monkeypatch):
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    monkeypatch.setattr(bc, "TIER_IR_CHARS", 0)  # tier every kernel
    ir, ins, outs = _KERNELS[name]()
    kernel_cache.clear_cache(disk=False)
    (k,) = bc.compile_kernels([(ir, "k")], spec, "llvm", tiered=True)
    copy = bc.compile_kernel(ir, spec, "llvm", name="k_copy")  # a memory-cache hit
    # a float sum is never tiered: O3 vectorizes it into lanes (reassoc), tier 0 would not
    want = 2 if name == "reduce_f32" else 0
    assert k.tier == want and copy.tier == want
    k(*ins, *outs)
    tier0 = [o.copy() for o in outs]
    assert bc.wait_tiering(120)
    assert k.tier == 2 and copy.tier == 2  # the copy got the optimized code too
    outs2 = [np.full_like(o, 3) for o in outs]
    copy(*ins, *outs2)
    kernel_cache.clear_cache(disk=False)
    monkeypatch.setenv("LAZYMATH_TIERED", "0")
    (plain,) = bc.compile_kernels([(ir, "k")], spec, "llvm", tiered=True)
    assert plain.tier == 2
    outs3 = [np.full_like(o, 5) for o in outs]
    plain(*ins, *outs3)
    for a, b, c in zip(tier0, outs2, outs3):
        assert a.tobytes() == b.tobytes() == c.tobytes(), name
    kernel_cache.clear_cache(disk=False)


def test_replays_pick_up_the_optimized_code(monkeypatch):
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    monkeypatch.setattr(bc, "TIER_IR_CHARS", 0)
    lm.clear_cache()
    a = RNG.uniform(-5, 5, (37, 41)).astype(np.float32)

    def f(t):
        return lm.tanh(lm.sin(t) * 1.5 + lm.cos(t[::-1])) - lm.sigmoid(t)

    x = lm.tensor(a)
    first = f(x).numpy()
    assert bc.wait_tiering(120)
    again = f(x).numpy()  # a program-cache hit: replays the replaced code
    assert first.tobytes() == again.tobytes()
    with np.errstate(all="ignore"):
        ref = np.tanh(np.sin(a) * np.float32(1.5) + np.cos(a[::-1])) - 1 / (1 + np.exp(-a))
    np.testing.assert_allclose(first, ref, rtol=1e-5, atol=2e-6)
    lm.clear_cache()


def test_compile_kernels_batch_with_duplicates(monkeypatch):
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    kernel_cache.clear_cache(disk=False)
    ir1, ins1, _ = _chain("float32", 3001)
    ir2, ins2, _ = _ints(999)
    ks = bc.compile_kernels([(ir1, "a"), (ir2, "b"), (ir1, "c")], "ascend910", "llvm")
    assert [k.name for k in ks] == ["a", "b", "c"]
    assert ks[0]._cfunc is ks[2]._cfunc  # one compile for both
    o1, o2 = np.zeros(3001, np.float32), np.zeros(3001, np.float32)
    ks[0](*ins1, o1)
    ks[2](*ins1, o2)
    assert o1.tobytes() == o2.tobytes()
    o3 = np.zeros(999, np.int32)
    ks[1](*ins2, o3)
    x = ins2[0].astype(np.int64)
    with np.errstate(divide="ignore"):  # x == 0: numpy gives 0, like the kernel
        np.testing.assert_array_equal(o3, (x * x) // x + (x * x) % x)
    kernel_cache.clear_cache(disk=False)


def test_program_of_independent_kernels(monkeypatch):
    """Several kernels of one program (reductions over different axes do not fuse) compiled
    on the workers in parallel: the right results, each kernel in its place."""
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    lm.clear_cache()
    a = RNG.uniform(-2, 2, (29, 31)).astype(np.float32)
    x = lm.tensor(a)
    outs = [lm.sum(lm.sin(x), axis=0), lm.max(lm.cos(x) * 2, axis=1), lm.exp(x)[::-1] + 1,
            lm.tanh(x).T * 3]  # fmt: skip
    assert len(lm.schedule(*outs).kernels) >= 3
    lm.realize(*outs)
    got = [o.numpy() for o in outs]
    refs = [np.sin(a).sum(0), (np.cos(a) * 2).max(1), np.exp(a)[::-1] + 1, np.tanh(a).T * 3]
    for g, r in zip(got, refs):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5)
    assert workers.n_workers() >= 1
    lm.clear_cache()


_CHILD = r"""
import json, sys
import numpy as np
import lazymath as lm
from lazymath.backend import compile as bc
from lazymath.backend.native import kernel_cache
from lazymath.backend.host import vmlib
bc.TIER_IR_CHARS = 0
x = lm.tensor(np.linspace(-3, 3, 999, dtype=np.float32))
t = x
for i in range(9):
    t = lm.sin(t) * 1.01 if i % 2 == 0 else lm.tanh(t + 0.5)
r = t.numpy()
info = {**kernel_cache.cache_info(), **vmlib.stats(), **bc.TIER_STATS}
print(json.dumps({"info": {k: v for k, v in info.items() if isinstance(v, int)},
                  "r": r.view(np.uint32).tolist()}))
"""


def test_a_tiered_kernel_reaches_the_disk_cache(tmp_path):
    """The process waits at exit for the optimized code and stores it: the next process
    compiles nothing and computes the same bits."""
    env = {**os.environ, "LAZYMATH_CACHE_DIR": str(tmp_path / "c"), "LAZYMATH_CACHE": "1"}
    env.pop("LAZYMATH_TIERED", None)

    def run() -> dict:
        out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                             text=True, timeout=600, check=True)  # fmt: skip
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run()
    assert first["info"]["tiered"] >= 1
    second = run()
    assert second["info"]["compiled"] == 0 and second["info"]["vmlib_compiled"] == 0
    assert second["info"]["tiered"] == 0
    assert second["r"] == first["r"]


def _loaded(symbol: str) -> tuple[int, bool]:
    """(kernels' functions holding `symbol`'s code, is it mapped)"""
    from lazymath.backend.native import jit

    with jit._native_lock:
        return jit._users.get(symbol, 0), symbol in jit._native


def test_tier_up_releases_the_tier0_code_once_and_holds_the_new(monkeypatch):
    """The O3 code replaces the tier-0 code in the kernel and its memory-cache copy: the
    tier-0 code is unmapped (its one user released exactly once), the O3 code has one user
    (the function object the copies share), and dropping every copy unmaps it too."""
    import gc

    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    monkeypatch.setattr(bc, "TIER_IR_CHARS", 0)
    ir, ins, outs = _chain("float32", 1013)
    kernel_cache.clear_cache(disk=False)
    (k,) = bc.compile_kernels([(ir, "k")], "ascend910b", "llvm", tiered=True)
    copy = bc.compile_kernel(ir, "ascend910b", "llvm", name="k_copy")
    assert k.tier == 0
    sym0 = f"{k.symbol}_t0"
    assert _loaded(sym0)[1] and k._cfunc is copy._cfunc
    assert bc.wait_tiering(120)
    assert k.tier == 2 and copy.tier == 2 and k._cfunc is copy._cfunc
    gc.collect()
    assert _loaded(sym0) == (0, False)  # released once: not negative, not mapped
    assert _loaded(k.symbol) == (1, True)
    k(*ins, *outs)
    want = [np.zeros_like(o) for o in outs]
    bc.compile_kernel(ir, "ascend910b", "interp", name="ref")(*ins, *want)
    np.testing.assert_allclose(outs[0], want[0], rtol=1e-5, atol=1e-6)  # runs the O3 code
    symbol = k.symbol
    kernel_cache.clear_cache(disk=False)
    del k, copy
    gc.collect()
    assert _loaded(symbol) == (0, False)


def test_kernel_evicted_during_its_tier_up_leaves_no_code_mapped(monkeypatch, tmp_path):
    """Every copy of a tier-0 kernel is dropped while its optimizing compile still runs: the
    tier-0 code is unmapped at once, the optimized code is stored on disk but never mapped,
    and nothing crashes."""
    import gc
    import threading

    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path / "kc"))
    monkeypatch.delenv("LAZYMATH_CACHE", raising=False)
    monkeypatch.setattr(bc, "TIER_IR_CHARS", 0)
    go = threading.Event()
    tier_up = bc._Job._tier_up

    def slow_tier_up(self, family, fut):  # the background compile "still running"
        go.wait(60)
        tier_up(self, family, fut)

    monkeypatch.setattr(bc._Job, "_tier_up", slow_tier_up)
    ir, ins, outs = _chain("float32", 1019)
    kernel_cache.clear_cache(disk=False)
    (k,) = bc.compile_kernels([(ir, "k")], "ascend910", "llvm", tiered=True)
    assert k.tier == 0
    k(*ins, *outs)
    symbol, sym0 = k.symbol, f"{k.symbol}_t0"
    kernel_cache.clear_cache(disk=False)  # evicted ...
    del k
    gc.collect()
    assert _loaded(sym0) == (0, False)  # ... and its tier-0 code unmapped
    go.set()
    assert bc.wait_tiering(120)
    gc.collect()
    assert _loaded(symbol) == (0, False)  # the optimized code was never mapped
    assert kernel_cache.cache_info()["disk_files"] >= 1  # but it reached the disk cache
    (k2,) = bc.compile_kernels([(ir, "k")], "ascend910", "llvm", tiered=True)  # a disk hit
    assert k2.tier == 2 and _loaded(symbol) == (1, True)
    got = [np.zeros_like(o) for o in outs]
    k2(*ins, *got)
    np.testing.assert_array_equal(got[0], outs[0])


def test_work_elements_counts_every_vector_kind():
    """A big kernel of any vector kind must not start on (slower) tier-0 code: user kernels
    (a Stockham FFT is one) and row kernels count their largest array, like elementwise."""
    from lazymath.backend.npu.kernel_ir import CustomKernel, RowKernel

    big, small = contiguous_view("float32", (512, 1024)), contiguous_view("float32", (512,))
    fft = CustomKernel("k", "fft", "vector", (big,), (big,))
    assert bc._work_elements(fft) == 512 * 1024 > bc.TIER_MAX_ELEMENTS
    assert bc._work_elements(CustomKernel("k", "f", "vector", (small,), (small,))) == 512
    rows = RowKernel((512, 1024), (1,), (big,), (SOp("load", "float32", (), 0),), (0,),
                     (big,), (False,), (512,))  # fmt: skip
    assert bc._work_elements(rows) == 512 * 1024
    assert bc._work_elements(_KERNELS["matmul_f32"]()[0]) == 0  # its microkernels: explicit


_UNROLL_CHILD = r"""
import hashlib, json, sys
import numpy as np
import lazymath as lm
from lazymath.backend import compile as bc
from lazymath.backend.native import jit
jit.QUICK_LOOP_UNROLLING = sys.argv[1] == "1"
out = {}
for k, shape in ((4, (64, 64)), (1, (37, 129)), (2, (5, 1000))):
    x = np.random.default_rng(k).standard_normal(shape).astype(np.float32)
    t = lm.tensor(x)
    for _ in range(k):
        t = lm.softmax(t * 1.1, axis=-1)
    r = t.numpy()
    s = (lm.tensor(x) * 0.5).sum(axis=0).numpy()
    m = lm.tensor(x.astype(np.float16)).max(axis=-1).numpy()
    np.testing.assert_allclose(r.sum(axis=-1), 1.0, rtol=1e-5)
    out[str(k)] = [hashlib.sha256(a.tobytes()).hexdigest() for a in (r, s, m)]
print(json.dumps(out))
"""


def test_quick_pipeline_unrolling_changes_no_bits(tmp_path):
    """The quick (speed level 1) pipeline of tiny kernels runs without LoopUnrollPass
    (jit.QUICK_LOOP_UNROLLING): float reductions (softmax rows, column sums, float16 max) give
    the same bits as with it, each way compiled from scratch in a fresh process."""
    pytest.importorskip("llvmlite.binding")
    got = []
    for flag in ("0", "1"):
        cache = tmp_path / flag
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "LAZYMATH_CACHE_DIR": str(cache), "LAZYMATH_BACKEND": "llvm",
               "PYTHONPATH": root}  # fmt: skip
        env.pop("LAZYMATH_CACHE", None)
        out = subprocess.run([sys.executable, "-c", _UNROLL_CHILD, flag], env=env, text=True,
                             capture_output=True, timeout=600, check=True)  # fmt: skip
        got.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert got[0] == got[1]
