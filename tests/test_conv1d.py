"""conv1d against torch.nn.functional.conv1d (a numpy reference where torch is absent), and the
form it takes on the AI Core.

Protects: torch's semantics (stride, padding int/'same'/'valid', dilation, groups, bias,
unbatched input, errors at the call); every non-depthwise float convolution as ONE Cube kernel
(implicit GEMM: im2col and the zero padding inside the GM -> L1 packing, no im2col or padded
buffer) with bias and elementwise consumers in its epilogue and an elementwise producer of x in
its prologue; depthwise as one Vector kernel. tests/test_ops_matmul_conv_fft.py holds the older per-dtype sweep.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm

torch = pytest.importorskip("torch")
F = torch.nn.functional

# (x shape, w shape, kwargs, bias)
CASES = [
    ((2, 5, 19), (4, 5, 3), dict(padding="same"), True),
    ((2, 5, 19), (4, 5, 4), dict(padding="same"), False),  # even K: the extra pad on the right
    ((3, 4, 23), (6, 4, 5), dict(stride=3, padding=2), True),
    ((1, 3, 7), (2, 3, 7), dict(padding="valid"), True),  # K == L
    ((2, 6, 17), (6, 1, 3), dict(groups=6, dilation=2, padding="same"), True),  # depthwise
    ((2, 6, 16), (6, 1, 4), dict(groups=6, stride=2, padding=3), False),
    ((2, 6, 13), (4, 3, 3), dict(groups=2, dilation=2, padding=1), True),  # grouped, dilated
    ((3, 11), (2, 3, 2), dict(stride=2), True),  # unbatched
    ((1, 1, 1), (1, 1, 1), {}, False),
    ((0, 3, 8), (2, 3, 3), dict(padding=1), True),  # empty batch
    ((2, 3, 1), (5, 3, 3), dict(padding=1), True),  # L = 1
    ((2, 7, 5), (3, 7, 9), dict(padding=4, dilation=1), True),  # K > L, all taps padded somewhere
    ((1, 13, 37), (17, 13, 5), dict(stride=3, dilation=2, padding=5), True),  # primes
    ((2, 8, 29), (6, 4, 3), dict(groups=2, stride=2, padding="valid"), False),
    ((2, 6, 20), (12, 1, 3), dict(groups=6, padding=1), True),  # channel multiplier 2
    ((2, 5, 3), (5, 1, 7), dict(groups=5, stride=2, dilation=2, padding=7), True),  # depthwise
]


def _torch(x, w, b, kw):
    t = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return F.conv1d(t(x), t(w), t(b), **kw).numpy()


def _tol(dtype):
    return dict(rtol=3e-3, atol=3e-3) if dtype == "float16" else dict(rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_conv1d_against_torch(backend, check, data, dtype):
    outs = []
    cases = CASES
    if backend == "llvm":  # llvm compiles kernels per shape: dense, strided, depthwise, AI CPU
        cases = [CASES[i] for i in ((0, 2, 4, 5, 6, 9, 11, 12, 15) if dtype == "float32"
                                    else (0, 4, 15))]  # fmt: skip
    for xs, ws, kw, with_bias in cases:
        x, w = data.rand(xs, dtype, -1, 1), data.rand(ws, dtype, -1, 1)
        b = data.rand((ws[0],), dtype, -1, 1) if with_bias else None
        got = lm.conv1d(lm.tensor(x), lm.tensor(w), None if b is None else lm.tensor(b), **kw)
        # torch's CPU float16 conv is the float32 one rounded (the NPU's float32 accumulation)
        f32 = [None if a is None else a.astype(np.float32) for a in (x, w, b)]
        want = _torch(*f32, kw).astype(dtype)
        outs.append((f"{dtype} x{xs} w{ws} {kw} bias={with_bias}", got, want))
    lm.realize(*[o for _, o, _ in outs])
    for label, got, want in outs:
        try:
            check(got, want, **_tol(dtype))
        except AssertionError as e:
            raise AssertionError(f"{label}: {e}") from None


def test_conv1d_layouts_and_epilogue(backend, preset, check, data):
    """Strided/flipped/transposed inputs, and relu(conv1d(x, w, b)) * s (one Cube kernel on the
    910; on the 910B one MIX kernel: the AIVs run the epilogue the split Cube core cannot)."""
    w = data.rand((3, 4, 3), "float32", -1, 1)
    b = data.rand((3,), "float32", -1, 1)
    outs = []
    for name, xv, t in data.layouts((2, 4, 15), "float32"):
        got = lm.relu(lm.conv1d(t, lm.tensor(w), lm.tensor(b), padding=1)) * 0.5
        want = np.maximum(_torch(xv, w, b, dict(padding=1)), 0) * 0.5
        outs.append((name, got, want))
    lm.realize(*[o for _, o, _ in outs])
    for name, got, want in outs:
        try:
            check(got, want, rtol=2e-5, atol=2e-5)
        except AssertionError as e:
            raise AssertionError(f"x {name}: {e}") from None


def test_conv1d_is_one_cube_kernel_with_its_epilogue():
    """relu(conv1d(x, w, b)) * s: im2col (padding included), the matmul, bias, relu and scale
    are ONE Cube kernel on the 910 (counted, not executed): no copy, no pad, no im2col buffer;
    an elementwise producer of x is its prologue; depthwise is one Vector kernel."""
    x = lm.tensor(np.ones((4, 16, 64), np.float32))
    w = lm.tensor(np.ones((8, 16, 5), np.float32))
    b = lm.tensor(np.ones(8, np.float32))
    s = lm.schedule(lm.relu(lm.conv1d(x, w, b, padding="same")) * 2.0)
    (k,) = s.kernels
    assert k.unit == "cube" and {"im2col", "matmul", "add", "relu", "mul"} <= set(k.ops), s
    assert k.flops >= 2 * 4 * 8 * 64 * 16 * 5
    # the prologue: x * 0.5 + 1 is computed in the packing
    s = lm.schedule(lm.relu(lm.conv1d(x * 0.5 + 1.0, w, b, stride=2, padding=3)) * 2.0)
    (k,) = s.kernels
    assert k.unit == "mix" and {"im2col", "matmul", "mul", "add"} <= set(k.ops), s  # Cube+Vector
    # grouped, dilated, strided, transposed x: still one Cube kernel plus nothing else
    xt = lm.tensor(np.ones((4, 64, 16), np.float32))  # read through .mT, in place
    g = lm.relu(lm.conv1d(xt.mT, lm.tensor(np.ones((8, 8, 3), np.float32)), b, groups=2,
                          dilation=2, stride=3, padding=4))  # fmt: skip
    (k,) = lm.schedule(g).kernels
    assert k.unit == "cube" and {"im2col", "matmul", "add", "relu"} <= set(k.ops), k
    # depthwise: one Vector kernel, the padding in its loads (no pad kernel), the elementwise
    # consumers in its epilogue slot, on both presets
    dw = lm.tensor(np.ones((16, 1, 5), np.float32))
    for spec in ("ascend910", "ascend910b"):
        for stride in (1, 2):
            y = lm.relu(lm.conv1d(x, dw, lm.tensor(np.ones(16, np.float32)), groups=16,
                                  padding=2, stride=stride)) * 2.0  # fmt: skip
            (k,) = lm.schedule(y, spec=spec).kernels
            assert k.unit == "vector" and k.ops[-2:] == ["relu", "mul"], k
    # float64 stays on the AI CPU, which reports its flops
    g = lm.conv1d(lm.tensor(np.ones((4, 16, 64))), lm.tensor(np.ones((8, 8, 3))), groups=2,
                  dilation=2)  # fmt: skip
    (k,) = lm.schedule(g).kernels
    assert k.unit == "aicpu" and k.flops == 4 * 8 * 60 * 2 * 8 * 3


def test_conv1d_epilogue_on_910b_is_one_mix_kernel():
    """ascend910b has no L0C -> UB path: relu(conv1d(x, w, b)) * s is ONE MIX kernel (AIC +
    AIV): FixPipe writes each L0C tile to a GM workspace slot, cross-core flags hand it to the
    Vector cores, which add the bias, apply relu and the scale and write the result (counted
    and compiled, not run). A relu-only epilogue stays on FixPipe (a Cube kernel)."""
    from lazymath.backend import compile_kernel
    from lazymath.backend.npu import isa

    x = lm.tensor(np.ones((4, 16, 64), np.float32))
    w = lm.tensor(np.ones((8, 16, 5), np.float32))
    b = lm.tensor(np.ones(8, np.float32))
    y = lm.relu(lm.conv1d(x, w, b, padding="same")) * 2.0
    (k,) = lm.schedule(y, spec="ascend910b").kernels
    assert k.unit == "mix" and {"im2col", "matmul", "add", "relu", "mul"} <= set(k.ops), k
    text = str(lm.explain(y, spec="ascend910b"))
    assert "AIC + AIV" in text and "implicit GEMM" in text, text
    assert "Cube core has no UB" not in text, text  # no refusal: nothing left for a Vector kernel
    ck = compile_kernel(k.group.ir, "ascend910b", backend="interp")
    prog = ck.program
    assert prog.unit == "mix" and prog.workspace > 0
    kinds = {type(i) for i in prog.instructions()}
    assert {isa.CrossCoreSetFlag, isa.CrossCoreWaitFlag} <= kinds
    assert "fixpipe_l0c_to_gm" in ck.isa_text
    assert ck.cost.pipes["AIV0.Vector"] > 0  # (MIX_AIC_1_2: AIV 0 and 1 split the tile rows)
    assert not ck.cost.unknown
    (k,) = lm.schedule(lm.relu(lm.conv1d(x, w, padding=2)), spec="ascend910b").kernels
    assert k.unit == "cube", k  # relu rides on FixPipe
    (k,) = lm.schedule(y, spec="ascend910").kernels
    assert k.unit == "cube", k  # the coupled 910: L0C -> UB in the Cube kernel itself


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_conv1d_epilogue_values_on_910b(backend, check, data, dtype):
    """The MIX kernel's values against torch on awkward shapes (odd lengths, K > L, L = 1,
    grouped + dilated, strided, an empty batch, primes), bias + relu * s, both backends."""
    cases = [CASES[i] for i in (0, 2, 6, 9, 10, 11, 12, 13)]
    if backend == "llvm":
        cases = [CASES[i] for i in ((0, 12, 13) if dtype == "float32" else (2,))]
    lm.init_device(0, spec="ascend910b")
    try:
        outs = []
        for xs, ws, kw, with_bias in cases:
            x, w = data.rand(xs, dtype, -1, 1), data.rand(ws, dtype, -1, 1)
            b = data.rand((ws[0],), dtype, -1, 1) if with_bias else None
            bt = None if b is None else lm.tensor(b)  # (no name for the conv: a held one is an
            got = lm.relu(lm.conv1d(lm.tensor(x), lm.tensor(w), bt, **kw)) * 1.5 - 0.25  # output)
            f32 = [None if a is None else a.astype(np.float32) for a in (x, w, b)]
            want = (np.maximum(_torch(*f32, kw), 0) * 1.5 - 0.25).astype(dtype)
            if xs[0] and len(xs) == 3:
                ks = lm.schedule(got).kernels
                assert [k.unit for k in ks] == ["mix"], (xs, ws, kw)
            outs.append((f"{dtype} x{xs} w{ws} {kw} bias={with_bias}", got, want))
        lm.realize(*[o for _, o, _ in outs])
        for label, got, want in outs:
            try:
                check(got, want, **_tol(dtype))
            except AssertionError as e:
                raise AssertionError(f"{label}: {e}") from None
    finally:
        lm.init_device(0, spec="ascend910")


def test_conv1d_prologue_values(backend, preset, check, data):
    """An elementwise producer of x fused into the Cube's packing: the padding stays zero (it
    pads the producer's result, not x), float16 x with a float32 weight (the cast is in it)."""
    x = data.rand((2, 5, 23), "float16", -1, 1)
    w = data.rand((4, 5, 3), "float32", -1, 1)
    b = data.rand((4,), "float32", -1, 1)
    got = lm.relu(lm.conv1d(lm.tensor(x) * 0.5 + 1.0, lm.tensor(w), lm.tensor(b), stride=2,
                            padding=3, dilation=2)) * 3.0  # fmt: skip
    xp = (x * np.float16(0.5) + np.float16(1)).astype(np.float32)  # float16 like lazymath's
    want = np.maximum(_torch(xp, w, b, dict(stride=2, padding=3, dilation=2)), 0) * 3
    check(got, want, rtol=2e-5, atol=2e-5)


def test_conv1d_padding_errors_at_call():
    x = lm.tensor(np.zeros((2, 4, 10), np.float32))
    w = lm.tensor(np.zeros((3, 4, 3), np.float32))
    with pytest.raises(ValueError, match="conv1d: padding='same' is not supported for strided"):
        lm.conv1d(x, w, padding="same", stride=2)
    with pytest.raises(ValueError, match="conv1d: padding must be an int, 'same' or 'valid'"):
        lm.conv1d(x, w, padding="full")
    with pytest.raises(ValueError, match="conv1d: padding must be an int >= 0"):
        lm.conv1d(x, w, padding=-1)
    with pytest.raises(ValueError, match="conv1d: stride must be an int"):
        lm.conv1d(x, w, stride=True)
