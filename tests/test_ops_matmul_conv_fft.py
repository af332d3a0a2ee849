"""matmul, conv1d and fft against numpy, on every backend.

Protects: numpy's matmul rules (1-D operands, batch broadcasting, 0-size dims, promotion), the
NPU numerics of float16 matmul/conv (float32 accumulation, one rounding at the end),
torch.nn.functional.conv1d semantics (stride, padding, dilation, groups, bias, unbatched input)
and numpy.fft semantics (n, axis, norm, complex64 results for float32 input).
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm

MATMUL_SHAPES = [
    ((3,), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3,)),
    ((7, 13), (13, 5)),
    ((1, 1), (1, 1)),
    ((17, 33), (33, 19)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((5, 3, 4), (4, 2)),
    ((4,), (2, 4, 3)),
    ((2, 3, 4), (4,)),
    ((0, 3), (3, 4)),
    ((3, 0), (0, 4)),
    ((2, 3), (3, 0)),
    ((2, 0, 3), (3, 5)),
]
MATMUL_DTYPES = [
    ("float16", "float16"),
    ("float32", "float32"),
    ("float64", "float64"),
    ("int8", "int8"),
    ("int32", "int32"),
    ("int64", "int64"),
    ("float16", "float32"),
    ("int8", "float32"),
    ("int32", "int64"),
    ("int8", "float16"),
]


def _matmul_expected(a, b):
    """numpy's matmul; float16 x float16 as the NPU computes it: float32 products and
    accumulation, rounded to float16 once (numpy's own float16 matmul rounds every step)."""
    if np.result_type(a, b) == np.float16:
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    return np.matmul(a, b)


def _mm_tol(dtype):
    d = np.dtype(dtype)
    if d == np.float16:
        return dict(rtol=2e-3, atol=2e-3)
    if d == np.float32:
        return dict(rtol=1e-5, atol=1e-5)
    if d == np.float64:
        return dict(rtol=1e-12, atol=1e-12)
    return {}


@pytest.mark.parametrize("da,db", MATMUL_DTYPES, ids=[f"{a}@{b}" for a, b in MATMUL_DTYPES])
def test_matmul_shapes(backend, check, data, da, db):
    cases = []
    for sa, sb in MATMUL_SHAPES:
        a = data.rand(sa, da)
        b = data.rand(sb, db)
        cases.append(((sa, sb), a, b, lm.matmul(lm.tensor(a), lm.tensor(b))))
    lm.realize(*[c[-1] for c in cases])
    for label, a, b, out in cases:
        want = _matmul_expected(a, b)
        try:
            check(out, want, **_mm_tol(want.dtype))
        except AssertionError as e:
            raise AssertionError(f"matmul {da}{label[0]} @ {db}{label[1]}: {e}") from None


@pytest.mark.parametrize("dtype", ["float16", "float32", "int32"])
def test_matmul_layouts(backend, check, data, dtype):
    """Transposed, strided, flipped and broadcast operands (the Cube loads through strides)."""
    b = data.rand((13, 11), dtype)
    for _name, a, t in data.layouts((7, 13), dtype):
        check(t @ lm.tensor(b), _matmul_expected(a, b), **_mm_tol(dtype))
    a = data.rand((7, 13), dtype)
    for name, b, t in data.layouts((13, 11), dtype):
        try:
            check(lm.tensor(a) @ t, _matmul_expected(a, b), **_mm_tol(dtype))
        except AssertionError as e:
            raise AssertionError(f"b {name}: {e}") from None
    bt = data.rand((11, 13), dtype)  # the classic A @ B.T
    check(lm.tensor(a) @ lm.tensor(bt).T, _matmul_expected(a, bt.T), **_mm_tol(dtype))
    check(lm.tensor(a).mT.mT @ lm.tensor(bt).mT, _matmul_expected(a, bt.T), **_mm_tol(dtype))


def test_matmul_operator_forms(backend, check, data):
    a = data.rand((4, 5), "float32")
    b = data.rand((5, 3), "float32")
    ta, tb = lm.tensor(a), lm.tensor(b)
    check(ta @ tb, a @ b, rtol=1e-5, atol=1e-5)
    check(lm.dot(ta, tb), a @ b, rtol=1e-5, atol=1e-5)
    out = a @ tb  # ndarray @ Tensor defers to Tensor.__rmatmul__
    assert isinstance(out, lm.Tensor)
    check(out, a @ b, rtol=1e-5, atol=1e-5)
    check(ta @ b, a @ b, rtol=1e-5, atol=1e-5)
    check(lm.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)  # numpy operands are converted


def test_matmul_float16_accumulates_in_float32(backend, data):
    """A long float16 dot product: per-step float16 rounding would be far off; the NPU's
    float32 accumulation is within one float16 rounding of the float64 answer."""
    k = 4096
    a = np.full((1, k), 0.1, np.float16)
    b = np.ones((k, 1), np.float16)
    got = (lm.tensor(a) @ lm.tensor(b)).numpy()
    exact = a.astype(np.float64).sum()
    assert got.dtype == np.float16
    assert abs(float(got[0, 0]) - exact) <= exact * 1e-3


def test_matmul_nan_inf(backend, check):
    a = np.array([[1.0, np.nan], [np.inf, 1.0], [1.0, 2.0]], np.float32)
    b = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
    with np.errstate(all="ignore"):
        check(lm.tensor(a) @ lm.tensor(b), a @ b)


def test_matmul_errors_at_call():
    a = lm.tensor(np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"matmul.*\(3, 4\).*\(5, 2\)"):
        a @ lm.tensor(np.zeros((5, 2), np.float32))
    with pytest.raises(ValueError, match="matmul.*4 != 3"):
        a @ lm.tensor(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="matmul.*at least 1 dimension"):
        a @ lm.tensor(np.float32(1))
    with pytest.raises(ValueError, match="matmul.*broadcast"):
        lm.tensor(np.zeros((2, 3, 4))) @ lm.tensor(np.zeros((3, 4, 5)))
    with pytest.raises(TypeError, match="matmul.*bool"):
        lm.tensor(np.ones((2, 2), bool)) @ lm.tensor(np.ones((2, 2), bool))


# ----------------------------------------------------------------------------- conv1d


def conv1d_ref(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv1d written out directly, computed in float64."""
    unbatched = x.ndim == 2
    if unbatched:
        x = x[None]
    out_dtype = np.result_type(x, w)
    acc = np.float64 if out_dtype.kind == "f" else np.int64
    xp = np.pad(x.astype(acc), ((0, 0), (0, 0), (padding, padding)))
    n, cin, length = x.shape
    cout, cpg, k = w.shape
    lout = (length + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    out = np.zeros((n, cout, lout), acc)
    opg = cout // groups
    for o in range(cout):
        g = o // opg
        for c in range(cpg):
            for j in range(k):
                start = j * dilation
                seg = xp[:, g * cpg + c, start : start + stride * (lout - 1) + 1 : stride]
                out[:, o, :] += seg * w[o, c, j].astype(acc)
        if bias is not None:
            out[:, o, :] += bias[o].astype(acc)
    out = out.astype(out_dtype)
    return out[0] if unbatched else out


CONV_CASES = [
    # (x shape, w shape, kwargs, with bias)
    ((2, 3, 17), (4, 3, 3), {}, False),
    ((2, 3, 17), (4, 3, 3), {}, True),
    ((1, 4, 13), (6, 2, 5), dict(groups=2), True),
    ((3, 2, 20), (5, 2, 3), dict(stride=2, padding=1), True),
    ((2, 3, 11), (2, 3, 3), dict(dilation=2, padding=2), False),
    ((2, 6, 16), (6, 1, 4), dict(groups=6, stride=3), True),  # depthwise
    ((3, 9), (4, 3, 2), {}, True),  # unbatched
    ((1, 1, 1), (1, 1, 1), {}, False),
    ((2, 3, 5), (3, 3, 5), dict(padding=0), True),  # kernel as long as the input
    ((0, 3, 8), (2, 3, 3), {}, False),  # empty batch
]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32"])
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv1d(backend, check, data, case, dtype):
    xs, ws, kw, with_bias = CONV_CASES[case]
    x = data.rand(xs, dtype, -2, 2)
    w = data.rand(ws, dtype, -2, 2)
    b = data.rand((ws[0],), dtype, -2, 2) if with_bias else None
    got = lm.conv1d(lm.tensor(x), lm.tensor(w), None if b is None else lm.tensor(b), **kw)
    want = conv1d_ref(x, w, b, **kw)
    tol = dict(rtol=3e-3, atol=5e-3) if dtype == "float16" else _mm_tol(dtype)
    check(got, want, **tol)


def test_conv1d_layouts_and_mixed_dtypes(backend, check, data):
    x = data.rand((2, 4, 15), "float32")
    w = data.rand((3, 4, 3), "float32")
    for name, xv, t in data.layouts((2, 4, 15), "float32"):
        try:
            check(lm.conv1d(t, lm.tensor(w), padding=1), conv1d_ref(xv, w, padding=1),
                  rtol=1e-5, atol=1e-5)  # fmt: skip
        except AssertionError as e:
            raise AssertionError(f"conv1d x {name}: {e}") from None
    check(lm.conv1d(lm.tensor(x), lm.tensor(w.astype(np.float16))),
          conv1d_ref(x, w.astype(np.float16)), rtol=1e-5, atol=1e-5)  # fmt: skip
    check(lm.conv1d(x, w, stride=2), conv1d_ref(x, w, stride=2), rtol=1e-5, atol=1e-5)


def test_conv1d_errors_at_call():
    x = lm.tensor(np.zeros((2, 4, 10), np.float32))
    with pytest.raises(ValueError, match="conv1d.*groups"):
        lm.conv1d(x, lm.tensor(np.zeros((3, 4, 3), np.float32)), groups=2)
    with pytest.raises(ValueError, match="conv1d.*channels"):
        lm.conv1d(x, lm.tensor(np.zeros((3, 3, 3), np.float32)))
    with pytest.raises(ValueError, match="conv1d.*shorter"):
        lm.conv1d(x, lm.tensor(np.zeros((3, 4, 11), np.float32)))
    with pytest.raises(ValueError, match="conv1d.*stride"):
        lm.conv1d(x, lm.tensor(np.zeros((3, 4, 3), np.float32)), stride=0)
    with pytest.raises(ValueError, match="conv1d.*bias"):
        lm.conv1d(x, lm.tensor(np.zeros((3, 4, 3), np.float32)), lm.tensor(np.zeros(4)))
    with pytest.raises(ValueError, match="conv1d.*expected"):
        lm.conv1d(lm.tensor(np.zeros(10)), lm.tensor(np.zeros((3, 4, 3))))


# ----------------------------------------------------------------------------- fft


def _fft_tol(dtype, n):
    if np.dtype(dtype) in (np.complex64, np.float32):
        return dict(rtol=1e-4, atol=1e-5 * max(n, 1))
    return dict(rtol=1e-10, atol=1e-12 * max(n, 1))


FFT_INPUT = {  # the first dtype of each kind also runs on llvm
    "fft": ["complex64", "float64", "float32", "float16", "int32"],
    "ifft": ["float32", "complex64", "float64"],
    "rfft": ["float32", "float64", "float16", "int32"],
    "irfft": ["complex64", "float32", "float64"],
}
FFT_CASES = [(kind, d) for kind, ds in FFT_INPUT.items() for d in ds]


@pytest.mark.parametrize("kind,dtype", FFT_CASES, ids=[f"{k}-{d}" for k, d in FFT_CASES])
def test_fft(backend, check, data, kind, dtype):
    npf, lmf = getattr(np.fft, kind), getattr(lm.fft, kind)
    cases = []
    # llvm compiles the Cube FFT's kernels per DFT size, and tests/test_fft.py runs every kind
    # and dtype on llvm: here llvm checks one input dtype per kind on a short sweep
    llvm = backend == "llvm"
    if llvm and dtype != FFT_INPUT[kind][0]:
        pytest.skip("llvm: tests/test_fft.py covers this dtype (compile time)")
    for length in (16,) if llvm else (1, 7, 13, 16):
        a = data.rand((3, length), dtype, -2, 2)
        for n in (None, length + 3) if llvm else (None, length + 3, max(length - 2, 1)):
            for norm in ("forward",) if llvm else (None, "ortho", "forward", "backward"):
                if kind == "irfft" and n is None and length == 1:
                    continue  # default n = 2*(1-1) = 0 is an error (tested below)
                cases.append((f"L={length} n={n} norm={norm}", a, dict(n=n, norm=norm)))
    if llvm:  # axes, batches and views: tests/test_fft.py::test_fft_awkward_inputs on llvm
        cases = cases[:1]
    a = data.rand((8, 3), dtype, -2, 2)
    b = data.rand((5, 23), dtype, -2, 2)
    if not llvm:
        cases.append(("axis=0", a, dict(axis=0)))
        cases.append(("3-d", data.rand((2, 3, 10), dtype, -2, 2), {}))
        cases.append(("strided", b[:, ::2], {}))
    tensors = {id(b): lm.tensor(b)}
    outs = []
    for label, a, kw in cases:
        t = tensors[id(b)][:, ::2] if label == "strided" else lm.tensor(a)
        outs.append(lmf(t, **kw))
    lm.realize(*outs)
    for (label, a, kw), out in zip(cases, outs):
        want = npf(a, **kw)
        tol = _fft_tol(want.dtype, want.shape[-1])
        if dtype == "float16":  # numpy rounds its norm factor to float16; the Cube does not
            tol = dict(rtol=2e-3, atol=2e-3 * max(1.0, float(np.abs(want).max(initial=0))))
        try:
            check(out, want, **tol)
        except AssertionError as e:
            raise AssertionError(f"{kind}({dtype}) {label}: {e}") from None


def test_fft_round_trip(backend, check, data):
    if backend == "llvm":
        pytest.skip("llvm: tests/test_fft.py::test_fft_round_trips (compile time)")
    a = data.rand((4, 12), "float32")
    t = lm.tensor(a)
    check(lm.fft.ifft(lm.fft.fft(t)), a.astype(np.complex64), rtol=1e-5, atol=1e-5)
    check(lm.fft.irfft(lm.fft.rfft(t), n=12), a, rtol=1e-5, atol=1e-5)
    check(lm.fft.rfft(t) * 2, np.fft.rfft(a) * 2, rtol=1e-4, atol=1e-4)  # fft feeds compute


def test_fft_errors_at_call():
    t = lm.tensor(np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="fft.*axis"):
        lm.fft.fft(t, axis=2)
    with pytest.raises(ValueError, match="norm"):
        lm.fft.fft(t, norm="bogus")
    with pytest.raises(ValueError, match="irfft.*invalid number"):
        lm.fft.irfft(lm.tensor(np.zeros((3, 1), np.complex64)))
    with pytest.raises(ValueError, match="fft.*invalid number"):
        lm.fft.fft(t, n=0)
    with pytest.raises(TypeError, match="rfft.*real"):
        lm.fft.rfft(lm.tensor(np.zeros(4, np.complex64)))
    with pytest.raises(ValueError, match="at least one dimension"):
        lm.fft.fft(lm.tensor(np.float32(1)))
