"""The fused attention kernels (backend/npu/templates/attention.py, issue 33): one Cube kernel on the
coupled 910 whose scores never reach GM; one MIX kernel (AIC + AIVs, cross-core flags) on the split
910B, see tests/test_attention_mix.py.

Protects: values equal torch's F.scaled_dot_product_attention (causal top-left alignment with
T_q != T_k, partial Q and K/V tiles, head dims 64/80/128, sequence 1 and 1023) on llvm and
interp; the planned memory grows with T, not T^2 (the composition's does); the cycle model
skips the causal tiles above the diagonal; calls the kernel does not take (masks, dropout,
float16, the split 910B) keep the composition.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath import nn
from lazymath.backend.compile import build_program
from lazymath.backend.npu import cost
from lazymath.backend.npu.isa_cube import cube_cycles
from lazymath.backend.npu.templates import attention

torch = pytest.importorskip("torch")
F = torch.nn.functional
RNG = np.random.default_rng(3302)


def qkv(B, H, L, S, E, Ev=None):
    Ev = Ev or E
    return (RNG.standard_normal((B, H, L, E)).astype(np.float32),
            RNG.standard_normal((B, H, S, E)).astype(np.float32),
            RNG.standard_normal((B, H, S, Ev)).astype(np.float32))  # fmt: skip


def sdpa(q, k, v, **kw):
    return lm.nn.scaled_dot_product_attention(q, k, v, **kw)


def torch_sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), **kw).numpy()


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


@pytest.mark.parametrize("B, H, L, S, E, Ev, causal", CASES)
def test_fused_attention_matches_torch(compiled, B, H, L, S, E, Ev, causal):
    q, k, v = qkv(B, H, L, S, E, Ev)
    out = sdpa(q, k, v, is_causal=causal)
    (kern,) = lm.schedule(out).kernels
    assert kern.unit == "cube" and kern.ops == ["attention"]
    np.testing.assert_allclose(out.numpy(), torch_sdpa(q, k, v, is_causal=causal),
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    got = sdpa(q, k, v, is_causal=causal, scale=0.05).numpy()
    np.testing.assert_allclose(got, torch_sdpa(q, k, v, is_causal=causal, scale=0.05),
                               rtol=1e-4, atol=1e-5)  # fmt: skip


def test_fused_attention_long_sequence():
    """Sequence 1023 (llvm): eight Q tiles, the last partial, against torch."""
    q, k, v = qkv(1, 2, 1023, 1023, 64)
    np.testing.assert_allclose(sdpa(q, k, v, is_causal=True).numpy(),
                               torch_sdpa(q, k, v, is_causal=True), rtol=1e-4, atol=1e-5)  # fmt: skip


def test_planned_memory_does_not_grow_with_t_squared(monkeypatch):
    """Planned peak bytes at T = 256 and 1024: the fused kernel's is its output (x4 for x4
    T); the composition writes the T x T scores (x16)."""

    def peak(T):
        q = lm.tensor(np.zeros((1, 2, T, 64), np.float32))
        return lm.schedule(sdpa(q, q, q, is_causal=True)).memory.planned_peak_bytes

    fused = peak(1024) / peak(256)
    assert peak(1024) <= 2 * 1024 * 64 * 4  # at most the output's bytes
    monkeypatch.setattr(nn, "_FUSED_ATTENTION", False)
    composed = peak(1024) / peak(256)
    assert fused == 4 and composed == 16


def test_cycle_model_skips_causal_tiles():
    """Causal attention loads about half of the K/V tiles: the modelled time and Cube cycles
    are well under the full attention's (T = 1024, tiles of 128 keys)."""

    def estimate(causal):
        q = lm.tensor(np.zeros((1, 4, 1024, 64), np.float32))
        s = lm.schedule(sdpa(q, q, q, is_causal=causal))
        (k,) = s.kernels
        return cost.estimate(build_program(k.group.ir, s.spec, k.name), s.spec)

    full, causal = estimate(False), estimate(True)
    assert causal.pipes["Cube"] < 0.65 * full.pipes["Cube"]
    assert causal.seconds < 0.65 * full.seconds


def test_cycle_model_counts_every_causal_tile():
    """A causal item streams more K/V tiles the later its Q tile, so the item loop has no
    steady state: the model walks it instead of repeating its first period (which counted
    0.14 of the full attention's Cube cycles at T=2048). Block 0's Cube cycles are then
    exactly its tiles': 39 Q tiles of 80 rows, the (i+1)-th seeing ceil(80 (i+1) / 128) key
    tiles of its head, each Mmad pair rounded to 16-row fractals."""
    q = lm.tensor(np.zeros((4, 12, 2048, 64), np.float32))
    s = lm.schedule(sdpa(q, q, q, is_causal=True))
    (k,) = s.kernels
    c = cost.estimate(build_program(k.group.ir, s.spec, k.name), s.spec)
    tq, tk = attention.tiles(s.spec, 64, 64)
    nq = -(-2048 // tq)
    items = -(-4 * 12 * nq // c.blocks)
    want = 0
    for it in range(items):
        q0 = (it % nq) * tq
        qv = min(tq, 2048 - q0)
        for k0 in range(0, min(2048, q0 + qv), tk):
            kvn = min(tk, q0 + qv - k0)
            want += cube_cycles(qv, kvn, 64, "float32", s.spec)  # S = Q K^T
            want += cube_cycles(qv, 64, kvn, "float32", s.spec)  # O += P V
    assert c.pipes["Cube"] == want


def test_tiles_fit_the_device():
    spec = lm.init_device(0, spec="ascend910").spec
    for d in (64, 80, 128):
        tq, tk = attention.tiles(spec, d, d)
        assert tq % 16 == 0 and tk % 16 == 0 and tq >= 16 and tk >= 16
        assert max(-(-d // 16) * 16, d) * tk * 4 <= spec.l0b_bytes


def test_other_calls_keep_the_composition():
    q, k, v = qkv(1, 2, 17, 17, 64)
    mask = np.tril(np.ones((17, 17), bool))
    for out in (sdpa(q, k, v, attn_mask=mask), sdpa(q, k, v, dropout_p=0.1, seed=1),
                sdpa(*(a.astype(np.float16) for a in (q, k, v)))):  # fmt: skip
        assert "attention" not in [o for kk in lm.schedule(out).kernels for o in kk.ops]


def test_kernel_refuses_the_split_device():
    q, k, v = qkv(1, 1, 16, 16, 64)
    (kern,) = lm.schedule(sdpa(q, k, v)).kernels
    spec910b = lm.init_device(0, spec="ascend910b").spec
    lm.init_device(0, spec="ascend910")
    with pytest.raises(ValueError, match="UB on the Cube core"):
        attention.Attention(attention.KEY).build(kern.group.ir, spec910b, "k0")
