"""lm.nn against torch.nn.functional (issue 33): values on awkward shapes, both presets, every
backend (the `backend` fixture: reference, llvm, interp), torch's errors as Python exceptions,
and the counter-based dropout mask bit for bit against a numpy model of its hash.

Protects: torch semantics where they are subtle (causal masks with T_q != T_k aligned at the
top-left, bool vs float masks, batch-broadcast masks, fully masked rows giving zeros, GQA head
grouping, rms_norm's default eps, linear's weight layout) and that the compositions fuse
(gelu as a Cube epilogue, layer_norm as one row kernel, dropout's hash inside one kernel).
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm

torch = pytest.importorskip("torch")
F = torch.nn.functional

RNG = np.random.default_rng(33)
TOL = {"float32": dict(rtol=1e-4, atol=1e-5), "float64": dict(rtol=1e-10, atol=1e-12),
       "float16": dict(rtol=1e-2, atol=1e-2)}  # fmt: skip


def rand(*shape, dtype="float32", scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def torch_of(a):
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a))


def close(got, want, dtype="float32"):
    got = got.numpy() if isinstance(got, lm.Tensor) else np.asarray(got)
    want = want.numpy() if hasattr(want, "numpy") else np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **TOL[dtype])


# ----------------------------------------------------------------------------- activations

ACT_SHAPES = [(0,), (1,), (7, 13), (3, 1, 17)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("shape", ACT_SHAPES)
def test_gelu_silu_match_torch(backend, dtype, shape):
    x = rand(*shape, dtype=dtype, scale=3.0)
    tx = torch_of(x).float() if dtype == "float16" else torch_of(x)  # torch's half: in float
    for approximate in ("none", "tanh"):
        want = F.gelu(tx, approximate=approximate).numpy().astype(dtype)
        close(lm.nn.gelu(lm.tensor(x), approximate=approximate), want, dtype)
    close(lm.nn.silu(x), F.silu(tx).numpy().astype(dtype), dtype)


def test_activations_on_views_and_specials(backend):
    """Transposed and negative-stride views; zeros, tiny and saturated arguments and NaN give
    torch's values (gelu(-50) underflows to -0.0, silu(50) = 50)."""
    x = rand(13, 7, scale=4.0)
    v = lm.tensor(x).T[::-1]
    close(lm.nn.gelu(v), F.gelu(torch_of(np.ascontiguousarray(x.T[::-1]))))
    sp = np.float32([0.0, -0.0, 1e-30, -50.0, 50.0, np.nan])
    for fn in ("gelu", "silu"):
        got = getattr(lm.nn, fn)(sp).numpy()
        want = getattr(F, fn)(torch_of(sp)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
        assert np.array_equal(np.isnan(got), np.isnan(want))


def test_gelu_is_a_cube_epilogue(preset):
    """linear + gelu is one kernel: Cube on the coupled 910, MIX on the split 910B (its AIVs
    run the epilogue, rules.MATMUL_MIX_EPILOGUE)."""
    x, w, b = lm.tensor(rand(32, 48)), lm.tensor(rand(64, 48)), lm.tensor(rand(64))
    (k,) = lm.schedule(lm.nn.gelu(lm.nn.linear(x, w, b))).kernels
    assert k.unit == ("cube" if preset == "ascend910" else "mix")
    assert k.ops[0] == "matmul" and "erf" in k.ops


def test_gelu_rejects_bad_arguments():
    with pytest.raises(ValueError, match="approximate"):
        lm.nn.gelu(rand(3), approximate="exact")
    with pytest.raises(TypeError, match="floating"):
        lm.nn.silu(np.arange(3))
    with pytest.raises(TypeError, match="tensor"):
        lm.nn.gelu("x")


# ----------------------------------------------------------------------------- normalization

NORM_CASES = [((1, 1), (1,)), ((17, 80), (80,)), ((3, 5, 7), (5, 7)), ((2, 1023), (1023,))]


@pytest.mark.parametrize("shape, ns", NORM_CASES)
def test_layer_norm_rms_norm_match_torch(backend, preset, shape, ns):
    x, w, b = rand(*shape, scale=2.0) + 0.5, rand(*ns), rand(*ns)
    tx, tw, tb = torch_of(x), torch_of(w), torch_of(b)
    close(lm.nn.layer_norm(x, ns, w, b), F.layer_norm(tx, ns, tw, tb))
    close(lm.nn.layer_norm(x, ns, eps=1e-3), F.layer_norm(tx, ns, eps=1e-3))
    close(lm.nn.rms_norm(x, ns, w), F.rms_norm(tx, ns, tw))  # eps None: finfo(f32).eps
    close(lm.nn.rms_norm(x, ns, eps=1e-6), F.rms_norm(tx, ns, eps=1e-6))


def test_norms_are_one_row_kernel():
    x, w, b = lm.tensor(rand(64, 768)), lm.tensor(rand(768)), lm.tensor(rand(768))
    for y in (lm.nn.layer_norm(x, (768,), w, b), lm.nn.rms_norm(x, 768, w)):
        (k,) = lm.schedule(y).kernels
        assert k.unit == "vector"


def test_norms_reject_bad_shapes():
    x = rand(4, 6)
    with pytest.raises(ValueError, match="trailing"):
        lm.nn.layer_norm(x, (4,))
    with pytest.raises(ValueError, match="weight"):
        lm.nn.layer_norm(x, (6,), rand(5))
    with pytest.raises(ValueError, match="trailing"):
        lm.nn.rms_norm(x, (3, 4, 6))
    with pytest.raises(TypeError, match="ints"):
        lm.nn.rms_norm(x, (6.0,))


# ----------------------------------------------------------------------------- layers


@pytest.mark.parametrize("xshape, out", [((5,), 3), ((17, 80), 1), ((2, 3, 64), 128)])
def test_linear_matches_torch(backend, preset, xshape, out):
    x, w, b = rand(*xshape), rand(out, xshape[-1]), rand(out)
    close(lm.nn.linear(x, w, b), F.linear(torch_of(x), torch_of(w), torch_of(b)))
    close(lm.nn.linear(x, w), F.linear(torch_of(x), torch_of(w)))
    w1 = rand(xshape[-1])  # a 1-D weight: a dot product over the last axis
    close(lm.nn.linear(x, w1), F.linear(torch_of(x), torch_of(w1)))
    with pytest.raises(ValueError, match="in_features"):
        lm.nn.linear(x, rand(out, xshape[-1] + 1))


def test_embedding_matches_torch(backend):
    w = rand(11, 80)
    for idx in (np.array([3]), np.array([[0, 10, 3], [3, 3, 7]]), np.zeros((0, 2), np.int64)):
        close(lm.nn.embedding(idx, w), F.embedding(torch_of(idx), torch_of(w)))
    close(lm.nn.embedding(np.int32([1, 0]), w, padding_idx=0),
          F.embedding(torch.tensor([1, 0]), torch_of(w), padding_idx=0))  # fmt: skip
    with pytest.raises(IndexError, match="out of range"):
        lm.nn.embedding(np.array([11]), w)
    with pytest.raises(TypeError, match="integers"):
        lm.nn.embedding(np.array([1.0]), w)
    with pytest.raises(ValueError, match="padding_idx"):
        lm.nn.embedding(np.array([1]), w, padding_idx=11)


# ----------------------------------------------------------------------------- dropout


def _fmix32_np(h):
    h = h.astype(np.uint32)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def _keep_np(shape, p, seed):
    """numpy model of lm.nn.keep_mask: fmix32(i * 0x9E3779B9 + k), top 24 bits >= p * 2^24."""
    from lazymath.nn import _i32

    s = seed & (2**64 - 1)
    k = np.uint32(_i32((s ^ (s >> 32)) * 0x2545F491 + 0x6A09E667) & 0xFFFFFFFF)
    with np.errstate(over="ignore"):
        i = np.arange(int(np.prod(shape)), dtype=np.uint32) * np.uint32(0x9E3779B9) + k
    return ((_fmix32_np(i) >> np.uint32(8)) >= round(p * 2**24)).reshape(shape)


@pytest.mark.parametrize("shape", [(1,), (17, 13), (2, 3, 1023)])
def test_dropout_mask_is_the_counter_hash(backend, shape):
    """The kernel's mask equals the numpy model bit for bit on every backend (so the same seed
    gives the same mask everywhere), kept values are scaled by 1/(1-p)."""
    x = rand(*shape) + 3.0
    got = lm.nn.dropout(x, 0.25, seed=12345).numpy()
    keep = _keep_np(shape, 0.25, 12345)
    np.testing.assert_array_equal(got != 0, keep)
    np.testing.assert_allclose(got[keep], x[keep] / 0.75, rtol=1e-6)


def test_dropout_statistics_seeds_and_modes():
    x = np.ones((400, 250), np.float32)
    a = lm.nn.dropout(x, 0.3, seed=1).numpy()
    b = lm.nn.dropout(x, 0.3, seed=2).numpy()
    assert abs((a == 0).mean() - 0.3) < 0.01  # 100k draws: 0.3 +- 4.5 sigma
    assert abs(((a == 0) & (b == 0)).mean() - 0.09) < 0.01  # seeds give independent masks
    np.testing.assert_array_equal(a, lm.nn.dropout(x, 0.3, seed=1).numpy())
    assert not np.array_equal(lm.nn.dropout(x, 0.3).numpy(), lm.nn.dropout(x, 0.3).numpy())
    np.testing.assert_array_equal(lm.nn.dropout(x, 0.3, training=False).numpy(), x)
    np.testing.assert_array_equal(lm.nn.dropout(x, 0.0).numpy(), x)
    np.testing.assert_array_equal(lm.nn.dropout(x, 1.0).numpy(), 0 * x)
    (k,) = lm.schedule(lm.nn.dropout(lm.tensor(x), 0.5, seed=3)).kernels
    assert k.unit == "vector"  # the hash, the compare and the scale in one kernel
    for bad in (-0.1, 1.5, "0.5"):
        with pytest.raises(ValueError, match="probability"):
            lm.nn.dropout(x, bad)


def test_dropout_seed_is_a_kernel_input():
    """A new seed replays the compiled program (the key is an input buffer, not a constant)."""
    x = lm.tensor(rand(64, 64))
    lm.nn.dropout(x, 0.5, seed=10).numpy()
    before = lm.cache_info()
    lm.nn.dropout(x, 0.5, seed=11).numpy()
    after = lm.cache_info()
    assert after["program_misses"] == before["program_misses"]
    assert after["program_hits"] == before["program_hits"] + 1


# ----------------------------------------------------------------------------- attention


def _sdpa(q, k, v, mask=None, **kw):
    got = lm.nn.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    want = F.scaled_dot_product_attention(torch_of(q), torch_of(k), torch_of(v),
                                          attn_mask=torch_of(mask), **kw)  # fmt: skip
    close(got, want)


SDPA_CASES = [  # (B, H, L, S, E, causal)
    (1, 1, 1, 1, 64, False),
    (2, 3, 17, 17, 80, True),
    (1, 2, 17, 5, 128, True),  # T_q > T_k: rows past S see every key (top-left aligned)
    (2, 1, 5, 17, 64, True),  # T_q < T_k: query i sees keys 0..i only
    (1, 2, 1, 17, 128, False),
]


@pytest.mark.parametrize("B, H, L, S, E, causal", SDPA_CASES)
def test_sdpa_matches_torch(backend, preset, B, H, L, S, E, causal):
    q, k, v = rand(B, H, L, E), rand(B, H, S, E), rand(B, H, S, E)
    _sdpa(q, k, v, is_causal=causal)
    _sdpa(q, k, v, scale=0.3, is_causal=causal)


def test_sdpa_long_sequence(preset):
    """Sequence 1023 (llvm, the default backend): a prime-free awkward length past every
    tile size."""
    q, k, v = rand(1, 2, 1023, 64), rand(1, 2, 1023, 64), rand(1, 2, 1023, 64)
    _sdpa(q, k, v, is_causal=True)


def test_sdpa_masks(backend, preset):
    """bool (True = attend) and float (added) masks broadcast over batch and heads; a row
    with nothing to attend to gives zeros, as torch's CPU kernels."""
    B, H, L, S, E = 2, 3, 17, 23, 80
    q, k, v = rand(B, H, L, E), rand(B, H, S, E), rand(B, H, S, E)
    m = RNG.random((B, 1, L, S)) > 0.4
    m[1, 0, 3] = False  # fully masked row
    _sdpa(q, k, v, m)
    _sdpa(q, k, v, m[0, 0])  # (L, S)
    _sdpa(q, k, v, rand(H, 1, S))  # float, broadcast over batch and queries
    _sdpa(q, k, v, np.where(m, 0.0, -np.inf).astype(np.float32))  # -inf float mask


def test_sdpa_gqa_and_value_dim(backend):
    q, k, v = rand(2, 6, 17, 64), rand(2, 2, 9, 64), rand(2, 2, 9, 80)
    _sdpa(q, k, v, enable_gqa=True)
    _sdpa(q, k, v, enable_gqa=True, is_causal=True)
    with pytest.raises(ValueError, match="multiple"):
        lm.nn.scaled_dot_product_attention(rand(1, 5, 3, 8), rand(1, 2, 3, 8), rand(1, 2, 3, 8),
                                           enable_gqa=True)  # fmt: skip


def test_sdpa_dropout_is_seeded():
    q, k, v = rand(1, 2, 17, 64), rand(1, 2, 17, 64), rand(1, 2, 17, 64)
    a = lm.nn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=7).numpy()
    b = lm.nn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=7).numpy()
    np.testing.assert_array_equal(a, b)
    p = torch.softmax(torch_of(q) @ torch_of(k).transpose(-1, -2) / 8.0, -1).numpy()
    keep = _keep_np(p.shape, 0.5, 7)
    np.testing.assert_allclose(a, (np.where(keep, p / 0.5, 0) @ v), rtol=1e-4, atol=1e-5)


def test_sdpa_rejects_bad_input():
    q = rand(1, 2, 4, 8)
    f = lm.nn.scaled_dot_product_attention
    with pytest.raises(ValueError, match="is_causal"):
        f(q, q, q, attn_mask=np.ones((4, 4), bool), is_causal=True)
    with pytest.raises(ValueError, match="last dimension"):
        f(q, rand(1, 2, 4, 9), q)
    with pytest.raises(ValueError, match="positions"):
        f(q, q, rand(1, 2, 5, 8))
    with pytest.raises(ValueError, match="broadcast"):
        f(q, q, q, attn_mask=np.ones((3, 4), bool))
    with pytest.raises(ValueError, match="dropout_p"):
        f(q, q, q, dropout_p=2.0)
    with pytest.raises(TypeError, match="floating"):
        f(np.ones((2, 2), np.int32), q, q)
