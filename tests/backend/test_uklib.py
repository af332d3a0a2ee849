"""The GEMM microkernel library (backend/host/uklib.py): tier-0 matmul kernels call out-of-line
microkernels, compiled once per host target and kept in the disk cache.

The library's microkernel (written as IR text) computes the same bits as the one gemm generates
with llvmlite; a tier-0 kernel calling it, the same kernel with its microkernels inside, its
optimized tier-up (definitions pasted back in) and the untiered kernel give the same bits; a
second process loads the library from disk, a forced target never loads another target's code.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from llvmlite import ir

import lazymath as lm
from lazymath.backend import compile as bc
from lazymath.backend.host import gemm, uklib
from lazymath.backend.native import jit, kernel_cache, workers


@pytest.fixture(autouse=True)
def _scalars_folded(monkeypatch):
    """These tests call single kernels with hand-built argument lists (inputs, outputs), here and
    in their subprocesses: the Python scalars of their graphs are folded into the kernel
    (LAZYMATH_SCALAR_ARGS=0) rather than passed as 0-d inputs. Runtime scalars are
    tests/test_scalar_args.py's."""
    monkeypatch.setenv("LAZYMATH_SCALAR_ARGS", "0")


RNG = np.random.default_rng(2011)


def _symbol(uk, pf, nr, rows, nd=False) -> str:
    token = gemm.UK_LIBRARY.set(lambda _s: None)
    try:
        return gemm.get_ukernel(ir.Module(), uk, pf, nr, rows, nd=nd).name
    finally:
        gemm.UK_LIBRARY.reset(token)


def _aligned(a: np.ndarray) -> np.ndarray:
    buf = np.empty(a.size + 16, np.float32)
    off = (-buf.ctypes.data % 64) // 4
    out = buf[off : off + a.size]
    out[:] = a
    return out


UK_FN = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, *[ctypes.c_int64] * 4, ctypes.c_int32,
                         ctypes.c_void_p, ctypes.c_void_p)  # fmt: skip


@pytest.mark.parametrize(
    "nr,vw,fma,pf,rows,nd",
    [(64, 16, True, 1, None, False), (64, 16, True, 3, 2, False), (32, 16, True, 16, 5, False),
     (16, 8, True, 1, None, False), (16, 8, False, 2, 4, False), (16, 4, True, 1, None, False),
     (48, 16, False, 1, 1, False), (64, 16, True, 1, None, True), (64, 16, True, 2, 2, True),
     (16, 8, True, 1, None, True), (16, 8, True, 1, 5, True)],
)  # fmt: skip
def test_text_microkernel_matches_gemms_bit_for_bit(nr, vw, fma, pf, rows, nd):
    """(`nd`: the variant that reads A row-major in place, `astr` = its row stride.)"""
    uk = gemm.Microkernel(gemm.MR, nr, vw, fma)
    sym = _symbol(uk, pf, nr, rows, nd)
    assert uklib.parse(sym) is not None and sym.startswith(uklib.PREFIX)
    assert uklib.parse(sym)[0][-1] == nd
    mod = ir.Module()
    gemm.get_ukernel(mod, uk, pf, nr, rows, symbol=sym + "_ref", nd=nd)
    fns = []
    for name, text in ((sym, uklib.library_ir(sym)), (sym + "_ref", str(mod))):
        module = f"uktest_{name}"
        obj = workers.submit(text, module, 0).result(timeout=300)
        fns.append(UK_FN(jit.load_cached(obj, name, module)[0]))
    nfc, nf = 3, nr // 16
    astr, bstr, cstr = 6 * 16, nfc * 256 + 32, 6 * 16 + 16
    if nd:  # 6 rows of nfc * 16 floats, 8 floats of gap between rows
        astr = nfc * 16 + 8
    a = _aligned(RNG.standard_normal(max(nfc, 6) * astr + 64).astype(np.float32))
    b = _aligned(RNG.standard_normal(nf * bstr + 64).astype(np.float32))
    c0 = RNG.standard_normal(nf * cstr + 64).astype(np.float32)
    for acc in (0, 1):
        got = []
        for fn in fns:
            c = _aligned(c0)
            fn(a.ctypes.data, b.ctypes.data, c.ctypes.data, nfc, astr, bstr, cstr, acc,
               b.ctypes.data, c.ctypes.data)  # fmt: skip
            got.append(c.tobytes())
        assert got[0] == got[1]
        assert got[0] != c0.tobytes()


def test_symbols_parse_and_carry_the_target(monkeypatch):
    assert uklib.parse("lazymath_uk_6x64v16_pf1_u4") == ((6, 64, 16, True, 1, 4, False), "")
    assert uklib.parse("lazymath_uk_2x16v8m_pf3.haswell") == (
        (2, 16, 8, False, 3, 0, False), "haswell")  # fmt: skip
    assert uklib.parse("lazymath_uk_6x64v16_pf1_u4_nd") == ((6, 64, 16, True, 1, 4, True), "")
    for bad in ("lazymath_uk_6x64", "lazymath_vm_sin_float32", "lazymath_uk_6x64v16_pf1.a b"):
        assert uklib.parse(bad) is None
    monkeypatch.setenv("LAZYMATH_TARGET_CPU", "x86-64")
    assert gemm.uk_symbol("lm_ukernel_6x16v4_pf1") == "lazymath_uk_6x16v4_pf1.x86-64"
    monkeypatch.setenv("LAZYMATH_TARGET_CPU", "native")
    assert gemm.uk_symbol("lm_ukernel_6x16v4_pf1") == "lazymath_uk_6x16v4_pf1"
    with pytest.raises(ValueError):  # a shape gemm does not generate this way
        uklib.library_ir("lazymath_uk_6x64v16_pf1")


def _matmul_ir(f: str, m: int, k: int, n: int, scale: float = 0.5):
    a = RNG.standard_normal((m, k)).astype(f)
    b = RNG.standard_normal((k, n)).astype(f)
    out = lm.mul(lm.relu(lm.matmul(lm.tensor(a), lm.tensor(b))), scale)
    (sk,) = lm.schedule(out).kernels
    return sk.group.ir, (a, b), np.zeros((m, n), f)


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("f,m,k,n", [("float16", 67, 45, 33), ("float32", 130, 97, 61),
                                     ("float32", 1, 1, 1), ("float16", 7, 300, 129)])  # fmt: skip
def test_library_calls_inside_and_tier_up_are_bit_identical(f, m, k, n, spec, monkeypatch):
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    monkeypatch.delenv("LAZYMATH_TIERED", raising=False)
    ir_, ins, out = _matmul_ir(f, m, k, n)
    results = []
    for enabled in (True, False):
        monkeypatch.setattr(uklib, "ENABLED", enabled)
        kernel_cache.clear_cache(disk=False)
        (kern,) = bc.compile_kernels([(ir_, "k")], spec, "llvm", tiered=True)
        assert kern.tier == 0
        o = np.full_like(out, 7)
        kern(*ins, o)
        results.append(o.tobytes())
        assert bc.wait_tiering(120) and kern.tier == 2
        text = kern.llvm_ir
        assert 'declare void @"lazymath_uk_' not in text
        assert ('define internal void @"lazymath_uk_' in text) == enabled
        o = np.full_like(out, 9)
        kern(*ins, o)  # the optimized code, the microkernels inlined
        results.append(o.tobytes())
    kernel_cache.clear_cache(disk=False)
    monkeypatch.setenv("LAZYMATH_TIERED", "0")
    (plain,) = bc.compile_kernels([(ir_, "k")], spec, "llvm", tiered=True)
    o = np.full_like(out, 3)
    plain(*ins, o)
    assert all(r == o.tobytes() for r in results)
    ref = np.maximum(ins[0].astype(np.float32) @ ins[1].astype(np.float32), 0) * 0.5
    np.testing.assert_allclose(o.astype(np.float32), ref, rtol=2e-2, atol=2e-2)
    kernel_cache.clear_cache(disk=False)


def test_microkernels_compile_while_the_driver_is_lowered(monkeypatch):
    """Each microkernel is requested the moment the lowering meets it (its compile starts
    before the kernel's own code is submitted), and the tier-0 driver -- packing, loops,
    fix-pipe -- is compiled after the IR clean-up with the -O0 code generator (the bits are
    compared with every other way in the test above)."""
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    monkeypatch.delenv("LAZYMATH_TIERED", raising=False)
    monkeypatch.setattr(uklib, "_fns", {})  # nothing compiled yet in this process
    seen = []
    real = workers.submit

    def spy(text, module, level=3, *a, **kw):
        seen.append((module, level, kw))
        return real(text, module, level, *a, **kw)

    monkeypatch.setattr(workers, "submit", spy)
    ir_, ins, out = _matmul_ir("float16", 130, 97, 61)
    kernel_cache.clear_cache(disk=False)
    (kern,) = bc.compile_kernels([(ir_, "k")], "ascend910", "llvm", tiered=True)
    assert kern.tier == 0
    mods = [m for m, _, _ in seen]
    t0 = next(i for i, m in enumerate(mods) if m.endswith("_t0"))
    assert [m for m in mods[:t0] if m.startswith("lmuk_")]
    assert seen[t0][1:] == (0, {"marker": seen[t0][2]["marker"], "codegen": 0, "cleanup": True})
    kern(*ins, out)
    ref = np.maximum(ins[0].astype(np.float32) @ ins[1].astype(np.float32), 0) * 0.5
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2e-2, atol=2e-2)
    assert bc.wait_tiering(120)
    kernel_cache.clear_cache(disk=False)


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("f,m,k,n", [("float16", 67, 45, 33), ("float32", 130, 97, 61),
                                     ("float32", 1, 1, 1), ("float16", 7, 300, 129),
                                     ("float32", 300, 64, 200), ("float16", 640, 96, 130)])  # fmt: skip
def test_predicted_main_microkernels_are_ones_the_lowering_calls(f, m, k, n, spec):
    """`lower_cube.main_ukernels` (via `lower_llvm.predicted_calls`) names, before the lowering
    runs, microkernels the lowering then calls (a wrong guess would only cost a needless
    compile): every Mmad's full-size one."""
    from lazymath.backend.host import lower_llvm
    from lazymath.runtime.device import get_spec

    ir_, _, _ = _matmul_ir(f, m, k, n)
    sp = get_spec(spec)
    with gemm.plan_override(gemm.model_plan()):
        program = bc.build_program(ir_, sp, "k")
        predicted = lower_llvm.predicted_calls(program)
        met: list[str] = []
        bc._lower_with_uk_library(program, sp, "lm_k", met, request=False)
    assert predicted and set(predicted) <= set(met), (predicted, met)


def test_main_microkernel_is_requested_before_the_lowering(monkeypatch):
    """A cold tier-0 matmul requests its predicted main microkernel before the kernel is
    lowered (its compile overlaps the lowering), and the lowering's own requests follow."""
    from lazymath.backend.host import lower_llvm

    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    monkeypatch.delenv("LAZYMATH_TIERED", raising=False)
    monkeypatch.setattr(uklib, "_fns", {})  # nothing compiled yet in this process
    events: list[str] = []
    real_request, real_lower = uklib.request, lower_llvm.lower_program

    def request(symbol):
        events.append(symbol)
        return real_request(symbol)

    def lower(*a, **kw):
        events.append("lower")
        return real_lower(*a, **kw)

    monkeypatch.setattr(uklib, "request", request)
    monkeypatch.setattr(lower_llvm, "lower_program", lower)
    ir_, ins, out = _matmul_ir("float32", 200, 64, 130)
    kernel_cache.clear_cache(disk=False)
    (kern,) = bc.compile_kernels([(ir_, "k")], "ascend910", "llvm", tiered=True)
    assert kern.tier == 0 and "lower" in events
    first = events.index("lower")
    assert first >= 1 and all(e.startswith(uklib.PREFIX) for e in events[:first])
    assert set(events[:first]) <= set(events[first + 1 :])  # the lowering met them too
    kern(*ins, out)
    np.testing.assert_allclose(out, np.maximum(ins[0] @ ins[1], 0) * 0.5, rtol=1e-4, atol=1e-4)
    assert bc.wait_tiering(120)
    kernel_cache.clear_cache(disk=False)


_CHILD = r"""
import json, sys
import numpy as np
import lazymath as lm
from lazymath.backend import compile as bc
from lazymath.backend.native import kernel_cache
from lazymath.backend.host import uklib
scale = float(sys.argv[1])
rng = np.random.default_rng(5)
a = rng.standard_normal((150, 70)).astype(np.float16)
b = rng.standard_normal((70, 90)).astype(np.float16)
r = lm.mul(lm.relu(lm.matmul(lm.tensor(a), lm.tensor(b))), scale).numpy()
bc.wait_tiering()
info = {**kernel_cache.cache_info(), **uklib.stats()}
print(json.dumps({"info": {k: v for k, v in info.items() if isinstance(v, int)},
                  "symbols": sorted(uklib._fns), "r": r.view(np.uint16).tolist()}))
"""


def _child(cache: str, scale: float, **env) -> dict:
    e = {**os.environ, "LAZYMATH_CACHE_DIR": cache, "LAZYMATH_CACHE": "1", **env}
    for k in ("LAZYMATH_TIERED", "LAZYMATH_TARGET_CPU"):
        if k not in env:
            e.pop(k, None)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(scale)], env=e, capture_output=True,
                         text=True, timeout=600, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_library_from_disk_per_target(tmp_path):
    from lazymath.backend.native import host

    cache = str(tmp_path / "cache")
    first = _child(cache, 0.5)
    assert first["info"]["uklib_compiled"] >= 1 and first["info"]["uklib_disk_hits"] == 0
    assert first["symbols"] and all("." not in s for s in first["symbols"])
    # another kernel (its epilogue differs) with the same tiles: its tier-0 code links the
    # library from disk, nothing of the library compiles
    second = _child(cache, 0.25)
    assert second["info"]["compiled"] == 1 and second["info"]["uklib_compiled"] == 0
    assert second["info"]["uklib_disk_hits"] == len(second["symbols"]) >= 1
    assert second["symbols"] == first["symbols"]
    assert np.array_equal(np.array(second["r"], np.uint16).view(np.float16),
                          np.array(first["r"], np.uint16).view(np.float16) / 2)  # fmt: skip
    forced = [t for t in host.executable_targets() if t]
    if forced:  # a forced target compiles (and keys) its own library code
        third = _child(cache, 0.25, LAZYMATH_TARGET_CPU=forced[0])
        assert third["info"]["uklib_compiled"] >= 1 and third["info"]["uklib_disk_hits"] == 0
        assert all(s.endswith("." + forced[0]) for s in third["symbols"])
        assert third["r"] == second["r"]


def test_a_failing_microkernel_prediction_only_loses_the_head_start(monkeypatch):
    """The early microkernel request is an optimization: a predictor that raises leaves the
    kernel to the lowering's own requests (same code, same values)."""
    from lazymath.backend.host import lower_llvm
    from lazymath.backend.npu import isa_cube

    def boom(program, instrs):
        raise RuntimeError("predictor failed")

    monkeypatch.setitem(lower_llvm.PREDICT_CALLS, isa_cube.Mmad, boom)
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    monkeypatch.delenv("LAZYMATH_TIERED", raising=False)
    ir_, ins, out = _matmul_ir("float32", 70, 33, 40)
    kernel_cache.clear_cache(disk=False)
    (kern,) = bc.compile_kernels([(ir_, "k")], "ascend910", "llvm", tiered=True)
    kern(*ins, out)
    np.testing.assert_allclose(out, np.maximum(ins[0] @ ins[1], 0) * 0.5, rtol=1e-4, atol=1e-4)
    assert bc.wait_tiering(120)
    kernel_cache.clear_cache(disk=False)


def _attention_ir(bh: int, t: int, d: int):
    """The fused attention kernel (causal) of (bh, t, d) float32 inputs on the current device."""
    q, k, v = (RNG.standard_normal((bh, t, d)).astype(np.float32) for _ in range(3))
    out = lm.nn.scaled_dot_product_attention(lm.tensor(q), lm.tensor(k), lm.tensor(v),
                                             is_causal=True)  # fmt: skip
    (sk,) = lm.schedule(out).kernels
    assert sk.group.ir.kind == "custom"
    s = q @ k.transpose(0, 2, 1) / np.sqrt(d) + np.triu(np.full((t, t), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    return sk.group.ir, (q, k, v), (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_attention_final_code_calls_the_library_with_the_same_bits(spec, monkeypatch):
    """A kernel that cannot start on tier-0 code (the fused attention: its softmax sums carry
    `reassoc`) compiles its final code with its GEMM microkernels left as `uklib` calls
    (`compile.UK_OUT_OF_LINE`: ~85 % of its IR, shared with the matmuls, the cold path's
    longest compile otherwise): no tier-up, the same bits as the kernel compiled with the
    microkernels inside and as the untiered compile."""
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    monkeypatch.delenv("LAZYMATH_TIERED", raising=False)
    lm.init_device(0, spec=spec)
    try:
        ir_, ins, ref = _attention_ir(3, 37, 64)
    finally:
        lm.init_device(0, spec="ascend910")
    results = []
    for out_of_line in (True, False):
        monkeypatch.setattr(bc, "UK_OUT_OF_LINE", out_of_line)
        kernel_cache.clear_cache(disk=False)
        (kern,) = bc.compile_kernels([(ir_, "att")], spec, "llvm", tiered=True)
        assert kern.tier != 0
        text = kern.llvm_ir
        assert ('declare void @"lazymath_uk_' in text) == out_of_line
        assert ('define internal void @"lazymath_uk_' in text) != out_of_line
        o = np.full(ref.shape, 7, np.float32)
        kern(*ins, o)
        results.append(o.tobytes())
    kernel_cache.clear_cache(disk=False)
    (plain,) = bc.compile_kernels([(ir_, "att")], spec, "llvm", tiered=False)
    o = np.full(ref.shape, 3, np.float32)
    plain(*ins, o)
    assert all(r == o.tobytes() for r in results)
    np.testing.assert_allclose(o, ref, rtol=1e-4, atol=1e-5)
    kernel_cache.clear_cache(disk=False)


_ATT_CHILD = r"""
import json, sys
import numpy as np
import lazymath as lm
from lazymath.backend import compile as bc
from lazymath.backend.host import uklib
from lazymath.backend.native import kernel_cache

rng = np.random.default_rng(5)
q, k, v = (rng.standard_normal((2, 29, 64)).astype(np.float32) for _ in range(3))
out = lm.nn.scaled_dot_product_attention(lm.tensor(q), lm.tensor(k), lm.tensor(v),
                                         is_causal=True)
(sk,) = lm.schedule(out).kernels
origins = []
(kern,) = bc.compile_kernels([(sk.group.ir, "att")], "ascend910", "llvm", tiered=True,
                             origins=origins)
o = np.zeros((2, 29, 64), np.float32)
kern(q, k, v, o)
print(json.dumps({"origin": origins[0], "calls": 'declare void @"lazymath_uk_' in kern.llvm_ir,
                  "loaded": sorted(uklib._fns), "r": o.view(np.uint32).tolist()}))
"""


def test_attention_with_library_calls_loads_from_disk_in_a_new_process(tmp_path):
    """The stored object of a kernel calling the library names its `uklib` functions in the
    cache header: a second process loads it from disk, links those functions (from disk too)
    and computes the same bits."""
    e = {**os.environ, "LAZYMATH_CACHE_DIR": str(tmp_path / "c"), "LAZYMATH_CACHE": "1"}
    for k in ("LAZYMATH_TIERED", "LAZYMATH_TARGET_CPU"):
        e.pop(k, None)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _ATT_CHILD], env=e, capture_output=True,
                             text=True, timeout=600, check=True)  # fmt: skip
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["origin"] == "compiled" and first["calls"]
    assert second["origin"] == "disk" and second["loaded"] == first["loaded"] != []
    assert second["r"] == first["r"]
