"""Host GEMM building blocks (gemm.py) on their own: NZ packing, the 6x16 microkernel, FixPipe.

Protects the pieces the Cube lowering is made of, independently of the template: the packers
zero-pad edges and absorb strides, the microkernel accumulates in fp32 with vector FMAs, and the
compiled code really uses AVX2 FMAs and F16C conversions.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from llvmlite import ir

from lazymath.backend.host import gemm as G
from lazymath.backend.native import host
from lazymath.backend.native.jit import get_jit

_N = [0]


def _compile(build, nargs: int):
    """Module with `void f(ptr x nargs)` built by `build(b, args)`; returns (cfunc, ir text)."""
    _N[0] += 1
    name = f"gemm_test_{_N[0]}"
    mod = ir.Module(name=name)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [G.PTR] * nargs), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    build(b, fn.args)
    b.ret_void()
    text = str(mod)
    addr, _ = get_jit().compile(text, name, name)
    return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * nargs)(addr), text


def _nz_to_dense(buf: np.ndarray, rows: int, cols: int, rows_p: int) -> np.ndarray:
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    return buf[((c // 16) * rows_p + r) * 16 + c % 16]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("transpose", [False, True])
def test_pack_nz_pads_and_absorbs_strides(dtype, transpose):
    rows, cols, rows_p, pad = 29, 37, 30, 6  # 3 blocks of 8 rows + a tail of 5
    src = np.random.default_rng(0).uniform(-1, 1, (cols, rows) if transpose else (rows, cols))
    src = src.astype(dtype)
    sr, sc = (1, rows) if transpose else (cols, 1)
    n_nz = rows_p * 48

    def build(b, args):
        G.emit_pack_nz(b, args[0], rows_p, args[1], dtype, 0, sr, sc, rows, cols, pad)

    f, _ = _compile(build, 2)
    raw = np.full(n_nz + 16, np.nan, np.float32)
    dst = raw[(-raw.ctypes.data % 64) // 4 :][:n_nz]  # L1 panels are 64-byte aligned
    f(dst.ctypes.data, src.ctypes.data)
    dense = src.T if transpose else src
    np.testing.assert_array_equal(_nz_to_dense(dst, rows, cols, rows_p), dense.astype(np.float32))
    padded = _nz_to_dense(dst, rows_p, 48, rows_p)  # rows padded to 6, cols to 16: zeros
    assert np.all(padded[rows:, :] == 0) and np.all(padded[:, cols:] == 0)


def _plans() -> list:
    """(target, plan) for every target the host can execute and every plan candidate of it."""
    out = []
    for name in host.executable_targets():
        for plan in G.candidate_plans(host.target(name)):
            out.append(pytest.param(name, plan, id=f"{name or 'native'}-{plan.uk.name}-{plan.kc}"))
    return out


@pytest.mark.parametrize(("target_cpu", "plan"), _plans())
def test_microkernel_tile_matches_numpy_and_uses_fma(target_cpu, plan, monkeypatch):
    """Every GEMM plan of every executable target (native, forced AVX2) against numpy, with
    edge columns (n not a multiple of the microkernel width) and a K longer than its panel;
    the assembly uses FMAs on the target's register class."""
    if target_cpu:
        monkeypatch.setenv(host.ENV_TARGET, target_cpu)
    else:
        monkeypatch.delenv(host.ENV_TARGET, raising=False)
    t = host.target()
    m, n, k = 12, 80, 160  # 2 A micro-panels, 5 fractal columns of N, 10 of K
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    bm = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    a_nz = np.zeros(m * k, np.float32)
    b_nz = np.zeros(k * n, np.float32)
    r, c = np.meshgrid(np.arange(m), np.arange(k), indexing="ij")
    a_nz[((c // 16) * m + r) * 16 + c % 16] = a
    r, c = np.meshgrid(np.arange(k), np.arange(n), indexing="ij")
    b_nz[((c // 16) * k + r) * 16 + c % 16] = bm
    c_nz = np.zeros(m * n + 16, np.float32)
    c0 = c_nz[(-c_nz.ctypes.data % 64) // 4 :]  # 64-byte aligned L0C view
    plan = G.GemmPlan(plan.uk, 32 if plan.kc else 0)  # host K panels of 32: 5 panels

    def build(b, args):
        G.emit_mmad(b, args[0], m, args[1], m, args[2], k, m, n, k, 0, plan)
        G.emit_mmad(b, args[0], m, args[1], m, args[2], k, m, n, k, 1, plan)  # 2 A@B

    a0 = np.zeros(m * k + 16, np.float32)
    a0 = a0[(-a0.ctypes.data % 64) // 4 :]
    a0[: m * k] = a_nz
    b0 = np.zeros(k * n + 16, np.float32)
    b0 = b0[(-b0.ctypes.data % 64) // 4 :]
    b0[: k * n] = b_nz
    f, text = _compile(build, 3)
    f(c0.ctypes.data, a0.ctypes.data, b0.ctypes.data)
    got = _nz_to_dense(c0, m, n, m)
    np.testing.assert_allclose(got, 2 * (a.astype(np.float64) @ bm), rtol=1e-5, atol=1e-5)
    if plan.uk.fma:
        assert f"llvm.fma.v{plan.uk.vw}f32" in text
    asm = get_jit().assembly(text)
    if t.arch in ("x86_64", "amd64"):
        assert "vfmadd231ps" in asm or not t.fma
        assert re.search(rf"%{t.reg_class}\d", asm) if plan.uk.vw * 32 == t.vector_bits else True
        if not t.avx512:
            assert "zmm" not in asm  # a forced AVX2 target never emits AVX-512


def test_model_plan_fits_the_register_file():
    for name in host.executable_targets() + ["x86-64-v3", "skylake-avx512", "x86-64"]:
        try:
            t = host.target(name)
        except host.TargetError:
            continue
        plan = G.model_plan(t)
        assert plan.uk.vw <= t.lanes("float32") or t.vector_bits < 128
        assert plan.uk.regs <= t.vector_regs or t.vector_bits == 128  # SSE: 6x16 spills
        assert plan.origin == "model" and plan.uk.name in plan.describe()


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_fixpipe_relu_cast_strided(dtype):
    rows, cols, rows_p = 7, 21, 12
    raw = np.random.default_rng(2).uniform(-2, 2, rows_p * 32 + 16).astype(np.float32)
    l0c = raw[(-raw.ctypes.data % 64) // 4 :]
    out = np.zeros((cols, rows), dtype)  # written transposed: strides (1, rows)

    def build(b, args):
        G.emit_fixpipe(b, args[0], dtype, 1, rows, args[1], rows_p, rows, cols, relu=True)

    f, text = _compile(build, 2)
    f(out.ctypes.data, l0c.ctypes.data)
    expect = np.maximum(_nz_to_dense(l0c, rows, cols, rows_p), 0).astype(dtype)
    np.testing.assert_array_equal(out.T, expect)
    if dtype == "float16":
        asm = get_jit().assembly(text)
        if host.target().f16c:
            # F16C (vcvtps2ph) or AVX512-FP16 (vcvtss2sh / vcvtps2phx), whichever the target has
            assert re.search(r"vcvt(ps2ph|ss2sh)", asm)
        else:  # e.g. LAZYMATH_TARGET_CPU=x86-64: the compiler-runtime call (from libgcc_s)
            assert "__truncsfhf2" in asm


def test_thread_workspace_is_per_thread_aligned_and_grows():
    """Memoised panels live in a per-thread heap buffer (not on the 8 MiB stack): each host
    thread gets its own 64-byte aligned buffer, reused while large enough, grown when asked."""
    import threading

    def build(b, args):
        ws = b.call(G.get_thread_workspace(b.module), [b.load(args[0], typ=G.I64)])
        b.store(ws, args[1])

    f, _ = _compile(build, 2)

    def ask(nbytes: int) -> int:
        req = np.array([nbytes], np.int64)
        out = np.zeros(1, np.uint64)
        f(req.ctypes.data, out.ctypes.data)
        return int(out[0])

    small, again, big = ask(1000), ask(500), ask(64 << 20)
    assert small % 64 == 0 and again == small and big % 64 == 0
    ctypes.memset(big, 1, 64 << 20)  # the whole grown buffer is writable
    other: list[int] = []
    t = threading.Thread(target=lambda: other.append(ask(1000)))
    t.start()
    t.join()
    assert other[0] not in (0, small, big)


def test_microkernel_prefetches_next_b_panel():
    """The Mmad lowering prefetches the next B micro-panel (L2) and the next L0C tile (L1)."""

    def build(b, args):
        G.emit_mmad(b, args[0], 96, args[1], 96, args[2], 160, 96, 32, 160, 1)

    _, text = _compile(build, 3)
    asm = get_jit().assembly(text)
    assert "llvm.prefetch" in text and "prefetcht1" in asm and "prefetcht0" in asm


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_l0b_slice_loop_lowers_to_one_full_width_mmad(dtype):
    """On the host L0B is a pointer into L1B: the template's loop of n0-column L0B slices is
    lowered as one Mmad over the tile, so the microkernel runs its full width."""
    from lazymath.backend.compile import build_program
    from lazymath.backend.host import lower_cube
    from lazymath.backend.host.lower_llvm import lower_program
    from lazymath.backend.npu import isa
    from lazymath.backend.npu.kernel_ir import ArgView, MatmulKernel, SOp
    from lazymath.runtime.device import get_spec

    n = 512
    v = ArgView(dtype, (n, n), (n, 1))
    out = ArgView("float32", (n, n), (n, 1))
    ir_ = MatmulKernel((), n, n, n, v, v, None, None, dtype, (), (SOp("acc", "float32"),), (0,),
                       (out,))  # fmt: skip
    spec = get_spec("ascend910")
    program = build_program(ir_, spec, "k")
    loops = []

    def walk(body):
        for instr in body:
            if isinstance(instr, isa.Loop):
                if any(type(x).__name__ == "Mmad" for x in instr.body):
                    loops.append(instr)
                walk(instr.body)

    walk(program.body)
    assert loops and all(lower_cube.merge_l0b_slices(lp) is not None for lp in loops)
    text = str(lower_program(program, spec, symbol="k"))
    plan = G.host_gemm()
    assert f"lm_ukernel_{plan.uk.mr}x{plan.uk.nr}v{plan.uk.vw}" in text


@pytest.mark.parametrize("preset", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_l0_k_steps_lower_to_one_mmad_per_l1_panel(preset, dtype, monkeypatch):
    """The template's loop over the L0 K steps of an L1 panel (fp32: 64 deep on the 910) is one
    host Mmad over the panel (L0A/L0B are aliases into L1): the merge applies to the template's
    loop, and the result is bit-identical to the step-by-step lowering and matches numpy (K not a
    multiple of the step, edge rows and columns, a transposed operand)."""
    from lazymath.backend import compile as lmc
    from lazymath.backend.host import lower_cube
    from lazymath.backend.npu import isa
    from lazymath.backend.npu.kernel_ir import ArgView, MatmulKernel, SOp
    from lazymath.runtime.device import get_spec

    spec = get_spec(preset)
    rng = np.random.default_rng(5)
    for m, n, k in ((130, 300, 700),):
        a_v = ArgView(dtype, (m, k), (k, 1))
        b_v = ArgView(dtype, (n, k), (1, k))  # a transposed operand: packing absorbs it
        out = ArgView("float32", (m, n), (n, 1))
        ir_ = MatmulKernel((), m, n, k, a_v, b_v, None, None, dtype, (),
                           (SOp("acc", "float32"),), (0,), (out,))  # fmt: skip
        program = lmc.build_program(ir_, spec, "k")
        alias = lower_cube.aliasable_l0(program)
        merged = [lp for lp, _ in isa.walk(program.body) if isinstance(lp, isa.Loop)
                  and lower_cube.merge_k_steps(lp, program, alias) is not None]  # fmt: skip
        assert len(merged) == 1
        a = rng.standard_normal((m, k)).astype(dtype)
        bt = rng.standard_normal((n, k)).astype(dtype)
        res = []
        for flag in (True, False):
            monkeypatch.setattr(G, "K_STEP_MERGE", flag)
            ck = lmc._compile_llvm(ir_, spec, f"ks{int(flag)}_{m}_{n}_{k}")
            c = np.full((m, n), np.nan, np.float32)
            ck(a.reshape(-1), bt.reshape(-1), c.reshape(-1))
            res.append(c)
        assert np.array_equal(res[0], res[1])
        ref = a.astype(np.float64) @ bt.astype(np.float64).T
        np.testing.assert_allclose(res[0], ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("preset", ["ascend910", "ascend910b"])
def test_fp32_a_panels_are_read_in_place_with_the_packed_results(preset, monkeypatch):
    """A float32 A with unit column stride is not packed: the Mmad's `_nd` microkernels read
    its rows in place when a panel is whole, and pack it as before when it is not (the last M
    tile of 300 rows, the K tail of 700). Bit-identical to the packed lowering, numpy's values,
    for a plain, a wider (row stride > K, offset), a reversed (negative row stride) and a
    batch-broadcast A; float16 and a transposed A keep the packer."""
    from lazymath.backend import compile as lmc
    from lazymath.backend.host import lower_cube
    from lazymath.backend.npu.kernel_ir import ArgView, MatmulKernel, SOp
    from lazymath.runtime.device import get_spec

    spec = get_spec(preset)
    rng = np.random.default_rng(11)
    cases = [("plain", (), 300, 200, 700, "float32"), ("wide", (), 130, 70, 512, "float32"),
             ("reversed", (), 257, 33, 200, "float32"), ("bcast", (3,), 129, 40, 96, "float32"),
             ("plain", (), 300, 200, 700, "float16"), ("transposed", (), 140, 50, 300, "float32")]  # fmt: skip
    for kind, batch, m, n, k, dtype in cases:
        if kind == "wide":  # columns 3 .. 3 + k of a (m, 2k + 5) array
            src = rng.standard_normal((m, 2 * k + 5)).astype(dtype)
            a_v, a = ArgView(dtype, (m, k), (2 * k + 5, 1), 3), src[:, 3 : 3 + k]
        elif kind == "reversed":
            src = rng.standard_normal((m, k)).astype(dtype)
            a_v, a = ArgView(dtype, (m, k), (-k, 1), (m - 1) * k), src[::-1]
        elif kind == "bcast":
            src = rng.standard_normal((m, k)).astype(dtype)
            a_v, a = ArgView(dtype, (*batch, m, k), (0, k, 1)), np.broadcast_to(src, (*batch, m, k))
        elif kind == "transposed":
            src = rng.standard_normal((k, m)).astype(dtype)
            a_v, a = ArgView(dtype, (m, k), (1, m)), src.T
        else:
            src = rng.standard_normal((m, k)).astype(dtype)
            a_v, a = ArgView(dtype, (m, k), (k, 1)), src
        bsz = int(np.prod(batch))
        bm = rng.standard_normal((bsz * k * n,)).astype(dtype)
        b_v = ArgView(dtype, (*batch, k, n), ((k * n,) if batch else ()) + (n, 1))
        out = ArgView("float32", (*batch, m, n), ((m * n,) if batch else ()) + (n, 1))
        ir_ = MatmulKernel(batch, m, n, k, a_v, b_v, None, None, dtype, (),
                           (SOp("acc", "float32"),), (0,), (out,))  # fmt: skip
        program = lmc.build_program(ir_, spec, "k")
        in_place = lower_cube.nd_panels(program, lower_cube.aliasable_l0(program))
        assert bool(in_place) == (dtype == "float32" and kind != "transposed"), kind
        res = []
        for flag in (True, False):
            monkeypatch.setattr(G, "ND_A", flag)
            ck = lmc._compile_llvm(ir_, spec, f"nd{int(flag)}_{kind}_{dtype}_{m}_{n}_{k}")
            c = np.full((*batch, m, n), np.nan, np.float32)
            ck(src.reshape(-1), bm, c.reshape(-1))
            res.append(c)
        assert np.array_equal(res[0], res[1]), kind
        ref = a.astype(np.float64) @ bm.reshape(*batch, k, n).astype(np.float64)
        np.testing.assert_allclose(res[0], ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("target_cpu", host.executable_targets())
@pytest.mark.parametrize("preset", ["ascend910", "ascend910b"])
def test_fp16_a_panels_widen_row_major_with_the_nz_results(preset, target_cpu, monkeypatch):
    """A float16 A with unit column stride is widened into a row-major fp32 copy
    (gemm.emit_pack_nd, padded rows) that the `_nd` microkernels read, when a panel is whole
    (the NZ packer otherwise: the last M tile of 300 rows, a K of 700). Bit-identical to
    the NZ lowering and numpy's values, for a plain, a wider (row stride > K, offset) and a
    reversed A; a transposed A keeps the NZ packer. Every executable target (forced AVX2)."""
    from lazymath.backend import compile as lmc
    from lazymath.backend.host import lower_cube
    from lazymath.backend.npu.kernel_ir import ArgView, MatmulKernel, SOp
    from lazymath.runtime.device import get_spec

    if target_cpu:
        monkeypatch.setenv(host.ENV_TARGET, target_cpu)
    else:
        monkeypatch.delenv(host.ENV_TARGET, raising=False)
    spec = get_spec(preset)
    rng = np.random.default_rng(12)
    cases = [("plain", 300, 200, 700), ("plain", 300, 200, 704), ("wide", 130, 70, 512),
             ("reversed", 257, 33, 208), ("plain", 256, 128, 1024),
             ("transposed", 140, 50, 300)]  # fmt: skip
    for kind, m, n, k in cases:
        if kind == "wide":
            src = rng.standard_normal((m, 2 * k + 5)).astype(np.float16)
            a_v, a = ArgView("float16", (m, k), (2 * k + 5, 1), 3), src[:, 3 : 3 + k]
        elif kind == "reversed":
            src = rng.standard_normal((m, k)).astype(np.float16)
            a_v, a = ArgView("float16", (m, k), (-k, 1), (m - 1) * k), src[::-1]
        elif kind == "transposed":
            src = rng.standard_normal((k, m)).astype(np.float16)
            a_v, a = ArgView("float16", (m, k), (1, m)), src.T
        else:
            src = rng.standard_normal((m, k)).astype(np.float16)
            a_v, a = ArgView("float16", (m, k), (k, 1)), src
        bm = rng.standard_normal((k * n,)).astype(np.float16)
        b_v = ArgView("float16", (k, n), (n, 1))
        out = ArgView("float32", (m, n), (n, 1))
        ir_ = MatmulKernel((), m, n, k, a_v, b_v, None, None, "float16", (),
                           (SOp("acc", "float32"),), (0,), (out,))  # fmt: skip
        program = lmc.build_program(ir_, spec, "k")
        alias = lower_cube.aliasable_l0(program)
        assert not lower_cube.nd_panels(program, alias)  # never read in place
        widened = lower_cube.nd_panels(program, alias, ("float16",))
        assert bool(widened) == (kind != "transposed"), kind
        res = []
        for flag in (True, False):
            monkeypatch.setattr(G, "ND_PACK", flag)
            name = f"ndp{int(flag)}_{kind}_{m}_{n}_{k}_{target_cpu or 'native'}"
            ck = lmc._compile_llvm(ir_, spec, name)
            if flag and widened and k % 16 == 0:
                assert "_nd" in ck.llvm_ir  # the in-place microkernels read the copy
            c = np.full((m, n), np.nan, np.float32)
            ck(src.reshape(-1), bm, c.reshape(-1))
            res.append(c)
        assert np.array_equal(res[0], res[1]), kind
        ref = a.astype(np.float64) @ bm.reshape(k, n).astype(np.float64)
        np.testing.assert_allclose(res[0], ref, rtol=1e-3, atol=1e-3 * np.sqrt(k))
