"""The fused attention kernels read q, k and v through strided views (issue 32's peak memory).

Protects: a view chain (slice, reshape, permute, expand) between a buffer and the attention
kernel composes into one strided GM operand the kernel addresses in place
(`Attention.strided_input`, `attention._base`), instead of a dense copy kernel per input: the
GPT block's qkv split and head transposes cost 3 x B*T*C of copies and of memory. Views the
kernel cannot address (a negative stride, a strided last dimension) are still copied dense.
Plans are checked without running (kernel counts); values against torch on odd shapes (T 17,
head dim 24, one query row), offsets, batch broadcast (stride 0), flips, on both presets and on
llvm and interp.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lazymath as lm

F = torch.nn.functional
RNG = np.random.default_rng(3232)


@pytest.fixture
def compiled(backend):
    if backend == "reference":
        pytest.skip("the reference executor runs the kernel's numpy definition")
    return backend


def heads(qkv, B, T, H, D):
    """nanoGPT's split: (B, T, 3C) -> q, k, v of (B, H, T, D), all views."""
    C = H * D
    return [qkv[:, :, i * C : (i + 1) * C].reshape(B, T, H, D).permute(0, 2, 1, 3)
            for i in range(3)]  # fmt: skip


def torch_sdpa(q, k, v, **kw) -> np.ndarray:
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v)]
    return F.scaled_dot_product_attention(*t, **kw).numpy()


def kernels(out) -> list[str]:
    return [k.name for k in lm.schedule(out).kernels]


def test_heads_of_a_qkv_matmul_are_read_in_place(preset):
    """x @ w + b, split into heads by views: the matmul's kernel(s) and the attention kernel,
    no copy; the attention reads the matmul's output with row stride 3C and offsets 0, C, 2C."""
    B, T, H, D = 2, 17, 3, 24
    x = lm.asarray(RNG.standard_normal((B, T, H * D)).astype(np.float32))
    w = lm.asarray(RNG.standard_normal((H * D, 3 * H * D)).astype(np.float32))
    b = lm.asarray(RNG.standard_normal(3 * H * D).astype(np.float32))
    # (no Python name for q, k, v: a live lazy tensor is a program output of its own)
    out = lm.nn.scaled_dot_product_attention(*heads(lm.matmul(x, w) + b, B, T, H, D),
                                             is_causal=True)  # fmt: skip
    sched = lm.schedule(out)
    # (the split 910B adds the bias in a Vector kernel: its Cube core keeps FixPipe ops only)
    want = ["matmul", "custom"] if preset == "ascend910" else ["matmul", "elementwise", "custom"]
    assert [k.kind for k in sched.kernels] == want, kernels(out)
    assert not any(k.ops == ["copy"] for k in sched.kernels)
    att = sched.kernels[-1].ir
    C = H * D
    assert [a.offset for a in att.inputs] == [0, C, 2 * C]
    assert all(a.strides == (T * 3 * C, D, 3 * C, 1) for a in att.inputs)


def test_unaddressable_views_are_copied(preset):
    """A flipped sequence (negative row stride) or a transposed last dimension is made dense
    first (a copy kernel, or the plan's contiguous copy of a user array); the attention kernel
    only ever gets views with a dense last dimension and no negative stride."""
    q, k, v = (lm.asarray(RNG.standard_normal((2, 3, 9, 16)).astype(np.float32)) for _ in "qkv")
    vt = lm.asarray(RNG.standard_normal((2, 3, 16, 9)).astype(np.float32))
    pending = lm.exp(k)  # a kernel's output, flipped
    for args in ((q, lm.flip(k, axis=2), v), (q, k, vt.permute(0, 1, 3, 2)),
                 (q, lm.flip(pending, axis=2), v)):  # fmt: skip
        out = lm.nn.scaled_dot_product_attention(*args)
        sched = lm.schedule(out)
        (att,) = [x.ir for x in sched.kernels if x.kind == "custom"]
        assert all(min(a.strides) >= 0 and a.strides[-1] == 1 for a in att.inputs), att.inputs


def test_realized_strided_inputs_need_no_kernel_but_attention(preset):
    """Views of a user array (a slice at an offset, heads by a permute, k and v broadcast over
    the heads with stride 0) are read where they are: the program is the attention alone."""
    base = lm.asarray(RNG.standard_normal((2, 20, 3 * 48)).astype(np.float32))
    kv = lm.asarray(RNG.standard_normal((2, 1, 17, 24)).astype(np.float32))
    out = lm.nn.scaled_dot_product_attention(heads(base[:, 3:, :], 2, 17, 2, 24)[0],
                                             lm.broadcast_to(kv, (2, 2, 17, 24)),
                                             lm.broadcast_to(kv, (2, 2, 17, 24)))  # fmt: skip
    assert len(kernels(out)) == 1


CASES = [  # B, T, H, D, causal
    (2, 17, 3, 24, True),
    (1, 1, 2, 16, False),  # one query row
    (3, 33, 1, 20, True),  # two K/V tiles on the 910's TK, a partial last one
]


@pytest.mark.parametrize("B, T, H, D, causal", CASES)
def test_strided_attention_values(compiled, preset, B, T, H, D, causal):
    """Through views of a realized qkv array with a leading offset, and of a pending matmul
    output, against torch on the same numbers."""
    C = H * D
    raw = RNG.standard_normal((B, T + 2, 3 * C)).astype(np.float32)
    qn, kn, vn = (raw[:, 2:, i * C : (i + 1) * C].reshape(B, T, H, D).transpose(0, 2, 1, 3)
                  for i in range(3))  # fmt: skip
    want = torch_sdpa(qn, kn, vn, is_causal=causal)
    out = lm.nn.scaled_dot_product_attention(*heads(lm.asarray(raw)[:, 2:, :], B, T, H, D),
                                             is_causal=causal)  # fmt: skip
    assert len(kernels(out)) == 1
    got = out.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # the same numbers as the output of a pending kernel (an identity matmul)
    eye = np.eye(3 * C, dtype=np.float32)
    qkv = heads(lm.matmul(lm.asarray(raw)[:, 2:, :], lm.asarray(eye)), B, T, H, D)
    out = lm.nn.scaled_dot_product_attention(*qkv, is_causal=causal)
    del qkv
    assert len(kernels(out)) == 2
    got = out.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_broadcast_and_flipped_values(compiled, preset):
    """k/v broadcast over heads (stride 0) and a flipped k (copied) against torch."""
    q = RNG.standard_normal((2, 3, 11, 16)).astype(np.float32)
    kv = RNG.standard_normal((2, 1, 11, 16)).astype(np.float32)
    kb = np.broadcast_to(kv, (2, 3, 11, 16))
    got = lm.nn.scaled_dot_product_attention(
        lm.asarray(q), lm.broadcast_to(lm.asarray(kv), kb.shape), lm.asarray(kv)
    ).numpy()
    np.testing.assert_allclose(got, torch_sdpa(q, kb, kb), rtol=1e-4, atol=1e-5)
    got = lm.nn.scaled_dot_product_attention(
        lm.asarray(q), lm.flip(lm.asarray(kb), axis=2), lm.asarray(kb), is_causal=True
    ).numpy()
    want = torch_sdpa(q, kb[:, :, ::-1], kb, is_causal=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
