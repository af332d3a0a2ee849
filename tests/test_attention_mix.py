"""The split 910B's fused attention: one MIX kernel (backend/npu/templates/attention.py `_kernel_mix`,
issue 33). The AIC computes Q K^T and P V on the Cube, the two AIVs run the online softmax, and
they hand tiles over through a GM workspace joined by cross-core flags.

Protects: values equal torch's F.scaled_dot_product_attention for float32 (1e-4) and float16 /
bfloat16 inputs (1e-2; float32 accumulation) on sequence 1, 17, 130 and 1023, head dims 64, 80,
128, Dv != D, causal with T_q != T_k, boolean and additive masks (shared, batch-broadcast, per
head, fully masked rows give zeros), on llvm and interp; the call is ONE kernel with two
instruction streams whatever the mask; planned memory grows with T, not T^2 (the composition's
does); the cycle model sees the AIC and the AIVs run concurrently; bad calls raise clearly.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath import nn
from lazymath.backend.compile import build_program
from lazymath.backend.host import gemm_bf16
from lazymath.backend.npu import cost, isa
from lazymath.backend.npu.templates import attention

torch = pytest.importorskip("torch")
F = torch.nn.functional
RNG = np.random.default_rng(3303)
TORCH_DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOL = {"float32": (1e-4, 1e-5), "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 2e-2)}


@pytest.fixture(autouse=True)
def split_device():
    lm.init_device(0, spec="ascend910b")
    yield
    lm.init_device(0, spec="ascend910")


def qkv(B, H, L, S, E, Ev=None):
    Ev = Ev or E
    return (RNG.standard_normal((B, H, L, E)).astype(np.float32),
            RNG.standard_normal((B, H, S, E)).astype(np.float32),
            RNG.standard_normal((B, H, S, Ev)).astype(np.float32))  # fmt: skip


def lm_inputs(arrays, dtype):
    return [lm.asarray(a).astype(getattr(lm, dtype)) for a in arrays]


def torch_sdpa(arrays, dtype, mask=None, **kw):
    """torch in the input dtype (its CPU flash kernel for float16/bfloat16), as float32."""
    t = [torch.from_numpy(a.copy()).to(TORCH_DT[dtype]) for a in arrays]
    if mask is not None:
        mask = torch.from_numpy(mask.copy())
        if mask.dtype != torch.bool:
            mask = mask.to(TORCH_DT[dtype])
    return F.scaled_dot_product_attention(*t, attn_mask=mask, **kw).float().numpy()


def as_f32(t) -> np.ndarray:
    return np.asarray(t.astype(lm.float32).numpy(), np.float32)


def the_kernel(out):
    """The schedule's attention kernel (dtype casts of the inputs are separate kernels)."""
    ks = [k for k in lm.schedule(out).kernels if "attention" in k.ops]
    assert len(ks) == 1
    return ks[0]


@pytest.fixture
def compiled(backend):
    if backend == "reference":
        pytest.skip("the reference executor runs the kernel's numpy definition")
    return backend


CASES = [  # B, H, L, S, E, Ev, causal
    (1, 1, 1, 1, 64, 64, False),
    (2, 3, 17, 17, 80, 80, True),
    (2, 1, 130, 70, 80, 80, True),  # T_q > T_k: rows past S see every key
    (1, 2, 5, 140, 128, 128, True),  # T_q < T_k: query i sees keys 0..i only
    (1, 2, 17, 33, 64, 80, False),  # Dv != D, partial K/V tile
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("B, H, L, S, E, Ev, causal", CASES)
def test_mix_attention_matches_torch(compiled, dtype, B, H, L, S, E, Ev, causal):
    arrays = qkv(B, H, L, S, E, Ev)
    out = nn.scaled_dot_product_attention(*lm_inputs(arrays, dtype), is_causal=causal)
    kern = the_kernel(out)
    assert kern.unit == "mix" and out.dtype == getattr(lm, dtype)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(as_f32(out), torch_sdpa(arrays, dtype, is_causal=causal),
                               rtol=rtol, atol=atol)  # fmt: skip


MASKS = {  # name: mask shape for B=2, H=3, L=17, S=33 (bool unless "add")
    "shared_bool": (17, 33),
    "batch_bool": (2, 1, 17, 33),
    "head_add": (3, 17, 33),
    "full_add": (2, 3, 17, 33),
    "row_bool": (1, 33),  # broadcast over queries too
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(MASKS))
def test_mix_attention_masks(compiled, dtype, name):
    arrays = qkv(2, 3, 17, 33, 64)
    shape = MASKS[name]
    if name.endswith("bool"):
        mask = RNG.random(shape) > 0.4
        mask[..., 0] = True
        if len(shape) >= 2 and shape[-2] > 3:
            mask[..., 3, :] = False  # a fully masked row: zeros, as torch
    else:
        mask = RNG.standard_normal(shape).astype(np.float32)
        mask[..., 5, 7:] = -np.inf
    out = nn.scaled_dot_product_attention(*lm_inputs(arrays, dtype), attn_mask=mask)
    kern = the_kernel(out)
    assert kern.unit == "mix"
    rtol, atol = TOL[dtype]
    want = torch_sdpa(arrays, dtype, mask)
    np.testing.assert_allclose(as_f32(out), want, rtol=rtol, atol=atol)


def test_batch_broadcast_mask_is_not_copied_per_head():
    """A (B, 1, L, S) mask enters the kernel as (B, L, S) (batch index bh // H): the MIX
    kernel's mask argument is B * L * S floats, not B * H * L * S."""
    arrays = qkv(2, 3, 17, 33, 64)
    mask = RNG.random((2, 1, 17, 33)) > 0.5
    out = nn.scaled_dot_product_attention(*lm_inputs(arrays, "float32"), attn_mask=mask)
    ir = the_kernel(out).group.ir
    assert ir.inputs[3].shape == (2, 17, 33)
    assert dict(ir.params)["mdiv"] == 3 and dict(ir.params)["mmod"] == 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mix_attention_long_sequence(dtype):
    """Sequence 1023 (llvm): eight Q tiles, the last partial, causal, against torch."""
    arrays = qkv(1, 2, 1023, 1023, 64)
    out = nn.scaled_dot_product_attention(*lm_inputs(arrays, dtype), is_causal=True)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(as_f32(out), torch_sdpa(arrays, dtype, is_causal=True),
                               rtol=rtol, atol=atol)  # fmt: skip


def test_one_mix_kernel_with_two_streams():
    """The program is a MIX kernel: AIC and AIV streams joined by cross-core flags, the AIVs'
    rows split by a sub-block loop, scores handed over through the workspace."""
    q = lm.zeros((1, 2, 256, 64), dtype=lm.bfloat16)
    s = lm.schedule(nn.scaled_dot_product_attention(q, q, q, is_causal=True))
    (k,) = [k for k in s.kernels if "attention" in k.ops]
    assert k.unit == "mix" and k.ops == ["attention"]
    prog = build_program(k.group.ir, s.spec, k.name)
    assert isa.is_mix(prog) and isa.mix_aivs(prog) == 2 and prog.workspace > 0
    streams = isa.mix_streams(prog)
    aic = {type(i).__name__ for i, _ in isa.walk(streams["AIC"].body)}
    aiv = {type(i).__name__ for i, _ in isa.walk(streams["AIV"].body)}
    assert {"Mmad", "FixPipe", "LoadNz"} <= aic and "VUnary" not in aic
    assert {"VUnary", "VReduce", "CopyIn", "CopyOut"} <= aiv and "Mmad" not in aiv


def test_planned_memory_does_not_grow_with_t_squared(monkeypatch):
    """Planned peak bytes at T = 256 and 1024 (bfloat16, causal): the MIX kernel's is its
    output's (x4 for x4 T; the workspace is per core, independent of T); the composition
    writes the T x T scores (x16)."""

    def peak(T):
        q = lm.zeros((1, 2, T, 64), dtype=lm.bfloat16)
        return lm.schedule(
            nn.scaled_dot_product_attention(q, q, q, is_causal=True)
        ).memory.planned_peak_bytes

    fused = peak(1024) / peak(256)
    assert peak(1024) <= 2 * (2 * 1024 * 64 * 2)  # the bf16 input and output
    monkeypatch.setattr(nn, "_FUSED_ATTENTION", False)
    composed = peak(1024) / peak(256)
    assert fused == 4 and composed == 16


def _estimate(dtype, D, causal, T=1024):
    q = lm.zeros((1, 4, T, D), dtype=getattr(lm, dtype))
    s = lm.schedule(nn.scaled_dot_product_attention(q, q, q, is_causal=causal))
    (k,) = [k for k in s.kernels if "attention" in k.ops]
    return cost.estimate(build_program(k.group.ir, s.spec, k.name), s.spec)


def test_cycle_model_runs_the_cores_concurrently():
    """The AIC and the AIVs work at the same time (the AIC two K/V tiles ahead): the AIVs'
    busy time hides under the AIC's stream (the kernel ends little after the AIC does), and
    causal skips about half of the Cube work."""
    full = _estimate("bfloat16", 64, False)
    aiv = sum(c for p, c in full.pipes.items() if p.startswith("AIV0."))
    assert aiv > 0.2 * full.total
    assert full.total - full.streams["AIC"] < 0.1 * aiv
    causal = _estimate("bfloat16", 64, True)
    assert causal.pipes["AIC.Cube"] < 0.65 * full.pipes["AIC.Cube"]


def _program(dtype, D, causal, B=1, H=4, T=1024):
    q = lm.zeros((B, H, T, D), dtype=getattr(lm, dtype))
    s = lm.schedule(nn.scaled_dot_product_attention(q, q, q, is_causal=causal))
    (k,) = [k for k in s.kernels if "attention" in k.ops]
    return build_program(k.group.ir, s.spec, k.name), s.spec


def test_stages_are_joined_by_flags_not_barriers():
    """Inside the K/V loop neither core waits for all its pipes (no pipe_barrier): each stage
    waits for its input and for its slot by set/wait flags, K^T and P have two L1 slots, V
    NS (loaded three iterations before P V reads it), S / P have NS GM hand-off slots, and
    the AIV's S / P UB slots are two (ping-pong). The race checker proves the flags when the
    program is built (a removed wait raises RaceError there)."""
    prog, _ = _program("bfloat16", 64, True)

    def has_mmad(loop):
        return any(type(x).__name__ == "Mmad" for x, _ in isa.walk(loop.body))

    loops = [i for i, _ in isa.walk(prog.body) if isinstance(i, isa.Loop) and has_mmad(i)]
    (kv_loop,) = [i for i in loops  # the innermost loop holding the Mmads: the K/V loop
                  if not any(x in loops for x, _ in isa.walk(i.body) if x is not i)]  # fmt: skip
    kinds = {type(i).__name__ for i, _ in isa.walk(kv_loop.body)}
    assert "PipeBarrier" not in kinds and {"SetFlag", "WaitFlag"} <= kinds
    bufs = {b.name: b for b in prog.buffers}
    tq, tk, _ = attention.tiles_mix(lm.init_device(0, spec="ascend910b").spec, 64, 64,
                                    "bfloat16", False)  # fmt: skip
    assert bufs["k_l1"].size == 2 * 64 * tk and bufs["p_l1"].size == 2 * tq * tk
    assert bufs["v_l1"].size == attention.NS * tk * 64
    assert bufs["s"].size == 2 * (tq // 2) * tk


def test_hand_off_slots_are_charged_at_l2_rates():
    """The GM workspace (the S / P / P V hand-off slots, a few hundred KiB per launch) is
    written and read back within microseconds: the cost model serves it from L2 (86 B/cycle
    write, 110 read per core) and the inputs from HBM."""
    prog, spec = _program("bfloat16", 64, True)
    ctx = cost.CostCtx(prog, spec, prog.blocks)
    fix = [i for i, _ in isa.walk(prog.body) if type(i).__name__ == "FixPipe"]
    loads = [i for i, _ in isa.walk(prog.body) if type(i).__name__ == "LoadNz"]
    assert fix and all(cost.in_l2(ctx, i.dst) for i in fix)
    assert {cost.in_l2(ctx, i.src) for i in loads} == {True, False}  # P from L2; q, k, v not
    assert not any(cost.in_l2(ctx, r) for r in (i.src for i in loads)
                   if r.buf.name in ("in0", "in1", "in2"))  # fmt: skip


@pytest.mark.parametrize("dtype, D, floor", [("bfloat16", 64, 0.12), ("bfloat16", 128, 0.18),
                                             ("float32", 64, 0.30)])  # fmt: skip
def test_predicted_cube_utilization(dtype, D, floor):
    """Issue 33's workload on ascend910b, B=4 H=12 T=2048 (non-causal: every tile full). The
    pipelined kernel keeps its bound pipe busy -- the AIVs' Vector units in bf16 (the softmax
    is about nine 256-byte passes per 128-key row tile against the Cube's 512 cycles per
    128 x 128 x 64 tile pair), the AIC's MTE2 in float32 -- and the Cube runs at least
    `floor` of the kernel's time (13.4 / 20.8 / 35.4 % when written; the serialised kernel
    before: 4.9 % for bf16 D=64, and the model then undercounted the causal items). Issue 33's
    60 % is out of reach at this Vector rate for bf16: Cube / Vector busy caps it (21.6 % at
    D=64, 37 % at D=128)."""
    q = lm.zeros((4, 12, 2048, D), dtype=getattr(lm, dtype))
    s = lm.schedule(nn.scaled_dot_product_attention(q, q, q))
    (k,) = [k for k in s.kernels if "attention" in k.ops]
    c = cost.estimate(build_program(k.group.ir, s.spec, k.name), s.spec)
    util = c.utilization()
    assert util["AIC.Cube"] >= floor
    busiest = max(c.pipes.values())
    assert busiest / c.total >= 0.45  # the bound pipe busy about half the time or more
    assert util["AIC.Cube"] >= 0.45 * c.pipes["AIC.Cube"] / busiest


def test_tiles_fit_the_split_device():
    spec = lm.init_device(0, spec="ascend910b").spec
    for dtype in ("float32", "bfloat16"):
        for d in (64, 80, 128):
            for masked in (False, True):
                tq, tk, aivs = attention.tiles_mix(spec, d, d, dtype, masked)
                assert tq % 16 == 0 and tk % 16 == 0 and tq >= 16 and tk >= 16 and aivs == 2


def test_bad_calls_raise():
    arrays = qkv(1, 2, 17, 17, 64)
    q, k, v = lm_inputs(arrays, "float32")
    with pytest.raises(ValueError, match="does not broadcast"):
        nn.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((5, 17), bool))
    with pytest.raises(ValueError, match="attn_mask must be None"):
        nn.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((17, 17), bool),
                                        is_causal=True)  # fmt: skip
    (kern,) = lm.schedule(nn.scaled_dot_product_attention(q, k, v)).kernels
    spec910 = lm.init_device(0, spec="ascend910").spec
    with pytest.raises(ValueError, match="split devices"):
        attention.AttentionMix(attention.MIX_KEY).build(kern.group.ir, spec910, "k0")


def test_mixed_dtypes_keep_the_composition():
    """q, k, v of different dtypes are promoted by the composition (torch refuses them)."""
    a = qkv(1, 1, 17, 17, 64)
    q, k = lm_inputs(a[:2], "bfloat16")
    v = lm.asarray(a[2])
    out = nn.scaled_dot_product_attention(q, k, v)
    assert all("attention" not in kk.ops for kk in lm.schedule(out).kernels)


@pytest.mark.parametrize("target", ["znver3", "x86-64"])
def test_bf16_attention_without_avx512_bf16(target, monkeypatch, tmp_path):
    """The MIX kernel's bfloat16 Mmads on a target without AVX512_BF16 (float32 FMAs on
    widened panels) agree with this host's native mapping (vdpbf16ps where it has it) and
    with torch: both paths accumulate exact bf16 products in float32, so they differ only by
    summation order (and the rare P element that rounds the other way to bf16)."""
    from lazymath.backend.native import host

    try:
        host.make_target(target)
    except Exception:  # noqa: BLE001 - a host that cannot run that target's code
        pytest.skip(f"this host cannot run {target} code")
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    arrays = qkv(1, 2, 130, 70, 64)

    def run():
        lm.clear_cache()  # programs compiled for another target must not be reused
        out = nn.scaled_dot_product_attention(*lm_inputs(arrays, "bfloat16"), is_causal=True)
        return as_f32(out)

    native = run()
    monkeypatch.setenv(host.ENV_TARGET, target)
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path))
    forced = run()
    assert not gemm_bf16.bf16_dot_available()  # the converted-FMA path ran
    monkeypatch.delenv(host.ENV_TARGET)
    lm.clear_cache()
    np.testing.assert_allclose(forced, native, rtol=1e-2, atol=4e-3)
    np.testing.assert_allclose(forced, torch_sdpa(arrays, "bfloat16", is_causal=True),
                               rtol=1e-2, atol=2e-2)  # fmt: skip
