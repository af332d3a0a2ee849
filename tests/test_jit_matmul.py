"""lm.jit's dynamic batch through a matmul: M is a run-time size (issue 34).

A batch in a matmul's M used to run the program traced at `chunk` rows chunk by chunk on the
host (4096 rows: 64 launches, the tail through padded copies). `DynamicMatmulKernel` reads M
from the tiling word at launch: its M groups, tails and block range follow the row count, so
any batch of 0..bound rows is one launch on exact row views. These tests build the dynamic
kernels from real schedules (every epilogue form: FixPipe relu, a UB/FixPipe epilogue, row
reductions and a softmax over N, several N and K panels, float16 operands, an A prologue),
check the first n rows against numpy and that rows past n are never written, and run jitted
functions over sizes 1..4096 (primes too) counting traces, programs and kernel compiles.
"""

import numpy as np
import pytest

import lazymath as lm
from lazymath import engine, settings, staging_batch
from lazymath.backend import compile as lm_compile
from lazymath.backend.compile import compile_kernel
from lazymath.backend.npu import cost
from lazymath.backend.npu.kernel_ir import DYNAMIC_KINDS, DynamicMatmulKernel, MatmulKernel
from lazymath.runtime.device import get_spec

RNG = np.random.default_rng(3434)


@pytest.fixture(params=["llvm", "interp"])
def backend(request):
    with settings.override(LAZYMATH_BACKEND=request.param):
        yield request.param


def _x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# name -> (k, n, dtype, fn(x, w, b) lazy, ref(x, w, b) numpy float64)
CASES = {
    "bias_tanh": (64, 32, np.float32, lambda x, w, b: lm.tanh(x @ w + b) * 0.5,
                  lambda x, w, b: np.tanh(x @ w + b) * 0.5),
    "relu": (40, 48, np.float32, lambda x, w, b: lm.relu(x @ w),
             lambda x, w, b: np.maximum(x @ w, 0)),
    "wide_deep": (700, 300, np.float32, lambda x, w, b: x @ w, lambda x, w, b: x @ w),
    "row_sum": (24, 300, np.float32, lambda x, w, b: lm.sum(x @ w + b, axis=-1),
                lambda x, w, b: (x @ w + b).sum(-1)),
    "softmax": (24, 40, np.float32, lambda x, w, b: lm.softmax(x @ w, axis=-1),
                lambda x, w, b: _softmax(x @ w)),
    "float16": (33, 20, np.float16, lambda x, w, b: lm.relu(x @ w),
                lambda x, w, b: np.maximum(x @ w, 0)),
    "prologue": (17, 16, np.float32, lambda x, w, b: lm.relu(x * 2.0) @ w,
                 lambda x, w, b: np.maximum(x * 2.0, 0) @ w),
}  # fmt: skip


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("kb", ["llvm", "interp"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_dynamic_matmul_kernel_takes_m_at_run_time(case, kb, spec):
    """The kernel built at `cap` rows serves every n in 0..cap read from the tiling word: the
    first n rows equal numpy (float64), rows past n are never written, the cost follows n."""
    kk, nn, dt, fn, ref = CASES[case]
    cap = 331 if kb == "llvm" else 37  # a prime bound: the M groups' last one is a tail
    x = lm.asarray(_x(cap, kk, dtype=dt))
    w, b = _x(kk, nn, dtype=dt), _x(nn, dtype=dt)
    sched = lm.schedule(fn(x, lm.asarray(w), lm.asarray(b)), spec=spec)
    if spec == "ascend910b" and case == "prologue":  # its AIC has no UB: no prologue fusion
        assert len(sched.kernels) == 2
        return
    assert len(sched.kernels) == 1 and type(sched.kernels[0].ir) is MatmulKernel
    ir = staging_batch._dynamic_ir(sched.kernels[0].ir, cap)
    assert type(ir) is DynamicMatmulKernel and ir.m == cap
    k = compile_kernel(ir, get_spec(spec), kb)
    assert "get_value tiling" in k.isa_text
    row_out = case == "row_sum"
    sizes = (0, 1, 2, 15, 16, 17, 64, 65, 127, 128, 129, cap) if kb == "llvm" else (0, 1, 17, cap)
    cycles = []
    for n in sizes:
        xs = _x(cap, kk, dtype=dt)
        out = np.full((cap,) if row_out else (cap, nn), np.nan, np.float32 if row_out else dt)
        arrays = [xs, w, *[b] * (len(ir.epi_inputs) if case != "softmax" else 0)]
        if case == "bias_tanh":  # the epilogue reads the 0.5 as a run-time scalar too
            loads = [op for op in ir.epilogue if op.op == "load"]
            arrays = [xs, w, *(np.float32([0.5]) if v.strides == (0, 0) else b
                               for v, _ in zip(ir.epi_inputs, loads))]  # fmt: skip
        k(*arrays, out, np.array([n], np.int64))
        want = ref(xs[:n].astype(np.float64), w.astype(np.float64), b.astype(np.float64))
        tol = 2e-2 if dt == np.float16 else 2e-5 * max(1.0, np.sqrt(kk) / 4)  # (K terms)
        np.testing.assert_allclose(out[:n].astype(np.float64), want, rtol=tol, atol=tol)
        assert np.isnan(out[n:]).all(), f"rows past {n} were written"
        cycles.append(cost.estimate(k.program, get_spec(spec), values={"rows": n}).total)
    # the cost takes the size (block 0's share: not monotonic, the M groups change with n)
    assert cycles[0] < min(cycles[1:]) and max(cycles) > cycles[1]


def _mm(x, w, b):
    return lm.tanh(x @ w + b) * 0.5


def _mm_ref(x, w, b):
    return np.tanh(x @ w + b) * 0.5


def _relu_mm(x, w, b):
    return lm.relu(x @ w), lm.softmax(x @ w + b, axis=-1)


def _relu_mm_ref(x, w, b):
    return np.maximum(x @ w, 0), _softmax(x @ w + b)


def _count_compiles(monkeypatch) -> list:
    """Every kernel IR handed to the compiler (engine and staging call compile_kernels)."""
    seen: list = []
    real = lm_compile.compile_kernels

    def counting(items, *a, **kw):
        seen.extend(ir for ir, _name in items)
        return real(items, *a, **kw)

    monkeypatch.setattr(lm_compile, "compile_kernels", counting)
    return seen


@pytest.mark.parametrize("fn", ["bias_tanh", "relu_softmax"])
def test_a_matmul_batch_is_one_program_with_m_at_run_time(fn, preset, backend, capsys,
                                                          monkeypatch):  # fmt: skip
    """Sizes 1..4096 (primes, powers of two and their neighbours, 0, a strided batch) of a
    matmul with its epilogue through lm.jit(dynamic=0): one trace, at most one program per
    dtype, each matmul compiled once, taking M at run time (also the split 910B's MIX
    epilogues: both of its cores read the tiling word); equal to numpy."""
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    f_lazy, f_ref = {"bias_tanh": (_mm, _mm_ref), "relu_softmax": (_relu_mm, _relu_mm_ref)}[fn]
    sizes = ([*range(1, 70), 127, 128, 129, 331, 511, 1000, 4093, 4096] if backend == "llvm"
             else [1, 2, 63, 64, 65, 130])  # fmt: skip
    compiles = _count_compiles(monkeypatch)
    for dtype in (np.float32, np.float16):
        w, b = _x(24, 40, dtype=dtype), _x(40, dtype=dtype)
        wt, bt = lm.asarray(w), lm.asarray(b)
        tol = 2e-5 if dtype == np.float32 else 2e-2
        f = lm.jit(f_lazy, dynamic=0)
        programs = engine.PROGRAMS.misses
        strided = _x(2 * 77, 24, dtype=dtype)[::2]
        for x in [*(_x(n, 24, dtype=dtype) for n in sizes), _x(0, 24, dtype=dtype), strided]:
            got = f(lm.asarray(x), wt, bt)
            want = f_ref(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64))
            for g, r in zip(got if isinstance(got, tuple) else (got,),
                            want if isinstance(want, tuple) else (want,)):  # fmt: skip
                assert g.shape == r.shape and g.dtype == dtype
                np.testing.assert_allclose(g.numpy().astype(np.float64), r, rtol=tol, atol=tol)
        assert f.traces == 1 and engine.PROGRAMS.misses - programs <= 1
    err = capsys.readouterr().err
    assert "the row count a kernel argument" in err and "host chunks" not in err
    # compiled once: only the dynamic kernels, one per kernel and dtype (never the traced
    # static kernels at `chunk` rows first)
    assert compiles and all(isinstance(ir, DYNAMIC_KINDS) for ir in compiles)
    assert sum(type(ir) is DynamicMatmulKernel for ir in compiles) == 2  # (x @ w is shared)


def test_a_stacked_batch_matmul_keeps_host_chunks_and_says_why(capsys, monkeypatch):
    """The batch in a matmul's stacked axis (x[n, 3, 9] @ w) is not its M: host chunks."""
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    w = _x(9, 5)
    f = lm.jit(lambda x, w: lm.relu(x @ w), dynamic=0)
    for n in (3, 70):
        x = _x(n, 3, 9)
        np.testing.assert_allclose(f(lm.asarray(x), lm.asarray(w)).numpy(),
                                   np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)  # fmt: skip
    assert "dynamic batch by host chunks of 64 rows (kernel" in capsys.readouterr().err
