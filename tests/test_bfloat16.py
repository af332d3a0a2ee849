"""bfloat16 (issue 33): the dtype, numpy/torch interop, promotion, casts, math and the presets.

lm.bfloat16 is ml_dtypes' numpy dtype, so numpy with ml_dtypes is the oracle: casts must equal
it bit for bit (round to nearest even, NaN/inf kept), elementwise math and reductions compute in
float32 and round once per op (within one bfloat16 ulp of numpy's float32-then-round answer,
since vmath's float32 functions are within a few float32 ulps), and torch's result_type is the
promotion oracle. The ascend910 preset has no bfloat16 on its AI Core and must say so.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lazymath as lm
from lazymath.backend.host import gemm, gemm_bf16
from lazymath.backend.native import host

BF16 = np.dtype(ml_dtypes.bfloat16)
ULP = 2.0**-7  # bfloat16's relative spacing at 1.0 (7 stored mantissa bits)


@pytest.fixture
def b910(monkeypatch):
    """The ascend910b device (bfloat16 on the AI Core) for one test."""
    lm.init_device(0, spec="ascend910b")
    yield "ascend910b"
    lm.init_device(0, spec="ascend910")


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _same_bits(got, want) -> None:
    """bfloat16 results equal bit for bit (NaN == NaN, -0 != +0)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype == BF16, (got.dtype, want.dtype)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def _close(got, want, ulps: float = 2.0) -> None:
    """bfloat16 results within `ulps` bfloat16 ulps (relative), NaN/inf in the same places."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(_f64(got), _f64(want), rtol=ulps * ULP, atol=1e-30,
                               equal_nan=True)  # fmt: skip


def _rand(shape, seed=0, lo=-3.0, hi=3.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(BF16)


# ----------------------------------------------------------------------------- the dtype


def test_bfloat16_is_ml_dtypes_dtype_and_round_trips_through_numpy():
    assert lm.bfloat16 == BF16 and lm.dtypes.bfloat16 == BF16
    a = np.array([1.5, -2.25, np.nan, np.inf, -0.0, 3.0e38], BF16)
    t = lm.asarray(a)
    assert t.dtype == BF16 and t.shape == (6,)
    _same_bits(np.asarray(t), a)
    _same_bits(lm.tensor(a).numpy(), a)
    assert lm.asarray([1.0, 2.5], dtype="bfloat16").dtype == BF16
    assert lm.finfo(lm.bfloat16).eps == 2.0**-7 and lm.finfo(lm.bfloat16).bits == 16
    assert lm.isdtype(lm.bfloat16, "real floating") and lm.isdtype(lm.bfloat16, "numeric")
    assert lm.can_cast(lm.bfloat16, lm.float32) and not lm.can_cast(lm.float32, lm.bfloat16)


def test_torch_bfloat16_tensors_convert_through_dlpack():
    torch = pytest.importorskip("torch")
    src = torch.tensor([[1.5, -2.0, float("nan")], [float("inf"), 0.1, -0.0]], dtype=torch.bfloat16)
    want = src.view(torch.int16).numpy().view(BF16)
    for got in (lm.asarray(src), lm.from_dlpack(src), lm.tensor(src), lm.from_dlpack(src.T)):
        assert got.dtype == BF16
    _same_bits(lm.asarray(src).numpy(), want)
    _same_bits(lm.from_dlpack(src.T).numpy(), want.T)  # non-contiguous: copied
    # lazymath -> torch: lazymath's own capsule (kDLBfloat, 16 bits; numpy's exporter has none)
    t = lm.asarray(src)
    back = torch.from_dlpack(t)
    assert back.dtype == torch.bfloat16 and back.shape == src.shape
    assert torch.equal(back.view(torch.int16), src.view(torch.int16))  # bit for bit (NaN too)


def test_bfloat16_dlpack_export_round_trips_with_torch():
    """torch.from_dlpack of bf16 tensors: versioned capsules are zero-copy and flagged
    read-only, legacy ones are copies (the legacy protocol cannot say read-only), views keep
    their strides (reversed, sliced), an empty tensor exports, and every capsule's memory is
    released once torch drops it or nobody consumed it."""
    import gc

    from lazymath import _dlpack

    torch = pytest.importorskip("torch")
    x = np.random.default_rng(4).standard_normal((3, 5, 7)).astype(BF16)
    t = lm.asarray(x)
    buf = np.asarray(t)
    v = torch.utils.dlpack.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    assert v.data_ptr() == buf.ctypes.data  # zero-copy
    legacy = torch.utils.dlpack.from_dlpack(t.__dlpack__())
    assert legacy.data_ptr() != buf.ctypes.data
    for got in (v, legacy):
        _same_bits(got.view(torch.int16).numpy().view(BF16), x)
    view = t[:, ::-1, 2:]
    _same_bits(torch.from_dlpack(view).view(torch.int16).numpy().view(BF16), x[:, ::-1, 2:])
    assert tuple(torch.from_dlpack(lm.asarray(np.zeros((0, 4), BF16))).shape) == (0, 4)
    unused = t.__dlpack__(max_version=(1, 0))
    del unused, v, legacy, view, got
    gc.collect()
    assert not _dlpack._LIVE
    _same_bits(lm.from_dlpack(torch.from_dlpack(t)).numpy(), x)  # and back


def test_jax_bfloat16_arrays_convert():
    jnp = pytest.importorskip("jax.numpy")
    src = jnp.array([1.5, -3.0, 0.1], dtype=jnp.bfloat16)
    got = lm.asarray(src)
    assert got.dtype == BF16
    _same_bits(got.numpy(), np.asarray(src))


# ----------------------------------------------------------------------------- promotion

PROMOTIONS = [  # (left, right, result) as torch.result_type gives it for two tensors
    ("bfloat16", "bfloat16", "bfloat16"),
    ("bfloat16", "float16", "float32"),
    ("bfloat16", "float32", "float32"),
    ("bfloat16", "float64", "float64"),
    ("bfloat16", "int8", "bfloat16"),
    ("bfloat16", "int32", "bfloat16"),
    ("bfloat16", "int64", "bfloat16"),
    ("bfloat16", "uint8", "bfloat16"),
    ("bfloat16", "bool", "bfloat16"),
    ("bfloat16", "complex64", "complex64"),
]


@pytest.mark.parametrize("a,b,want", PROMOTIONS)
def test_promotion_follows_torch(a, b, want):
    x = lm.zeros((3,), dtype=a)
    y = lm.zeros((3,), dtype=b)
    assert (x + y).dtype == np.dtype(want) and (y * x).dtype == np.dtype(want)
    assert lm.result_type(np.dtype(a), np.dtype(b)) == np.dtype(want)
    torch = pytest.importorskip("torch")
    tt = {n: getattr(torch, n) for n in ("bfloat16", "float16", "float32", "float64", "int8",
                                         "int32", "int64", "uint8", "bool", "complex64")}  # fmt: skip
    assert str(torch.result_type(torch.zeros(1, dtype=tt[a]), torch.zeros(1, dtype=tt[b]))) == (
        f"torch.{want}"
    )


def test_python_scalars_are_weak():
    x = lm.zeros((2,), dtype=lm.bfloat16)
    assert (x + 1.5).dtype == BF16 and (2 * x).dtype == BF16 and (x / 3).dtype == BF16
    assert (x > 0.5).dtype == np.bool_
    assert lm.sqrt(lm.zeros((2,), dtype=lm.int32) + x).dtype == BF16


# ----------------------------------------------------------------------------- casts

F32_SPECIALS = np.array([
    0.0, -0.0, 1.0, -1.0, np.nan, -np.nan, np.inf, -np.inf,
    1.00390625,                      # exactly halfway 1 -> 1 + 2^-7: ties to even (1.0)
    1.01171875,                      # halfway 1+2^-7 -> 1+2^-6: ties to even (up)
    1.0 + 2.0**-8 + 2.0**-20,        # just above halfway: up
    3.3895313892515355e38,           # bfloat16 max
    3.4e38,                          # above max: rounds to inf
    1.0e-40, -1.0e-40, 1.1754943508222875e-38,  # subnormal, normal min
    65504.0, 0.1, -7.3e-5,
], dtype=np.float32)  # fmt: skip


def test_casts_round_to_nearest_even_and_keep_nan_inf(backend, b910):
    f32 = F32_SPECIALS
    f64 = np.array([1.0 + 2.0**-8 + 2.0**-30, -(1.0 + 2.0**-8), 1e300, 5e-324, np.nan], np.float64)
    f16 = np.array([65504.0, 6e-8, -0.0, np.inf, np.nan, 1.00048828125], np.float16)
    i32 = np.array([0, 1, -1, 2**24 + 2**16 + 1, 257, -(2**31), 2**31 - 1], np.int32)
    i64 = np.array([2**40 + 2**32, 3, -(2**50) - 1], np.int64)
    u8 = np.array([0, 255, 129], np.uint8)
    bo = np.array([True, False, True])
    ins = [f32, f64, f16, i32, i64, u8, bo]
    to_bf = [lm.asarray(a).astype(lm.bfloat16) for a in ins]
    bf = F32_SPECIALS.astype(BF16)
    finite = np.array([1.5, -2.5, 3.0, 0.0, -0.0, 100.75, -127.0, 255.0], np.float32).astype(BF16)
    from_bf = [lm.asarray(bf).astype(d) for d in ("float32", "float64", "float16", "bool")]
    from_bf += [lm.asarray(finite).astype(d) for d in ("int32", "int64", "uint8", "int8")]
    lm.realize(*to_bf, *from_bf)
    with np.errstate(all="ignore"):
        for t, a in zip(to_bf, ins):
            _same_bits(t.numpy(), a.astype(BF16))  # one rounding, as ml_dtypes (float64 too)
        wants = [bf.astype(d) for d in (np.float32, np.float64, np.float16, np.bool_)]
        wants += [finite.astype(np.float32).astype(d) for d in (np.int32, np.int64, np.uint8,
                                                                np.int8)]  # fmt: skip
    for t, w in zip(from_bf, wants):
        got = t.numpy()
        assert got.dtype == w.dtype
        np.testing.assert_array_equal(got, w)


# ----------------------------------------------------------------------------- math

SHAPES = [(0,), (1,), (7,), (13, 17), (3, 1, 5)]


@pytest.mark.filterwarnings("ignore:Mean of empty slice")
@pytest.mark.parametrize("shape", SHAPES)
def test_elementwise_and_reductions_match_ml_dtypes(backend, b910, shape):
    a = _rand(shape, 1)
    b = _rand(shape[-1:], 2, 0.5, 4.0)  # broadcast along the leading axes, positive
    with np.errstate(all="ignore"):
        _check_math(a, b)


def _check_math(a: np.ndarray, b: np.ndarray) -> None:
    x, y = lm.asarray(a), lm.asarray(b)
    f = np.float32
    outs = {
        "exp": (lm.exp(x), np.exp(a)),
        "sin": (lm.sin(x), np.sin(a)),
        "tanh": (lm.tanh(x), np.tanh(a)),
        "sqrt": (lm.sqrt(y), np.sqrt(b)),
        "add": (x + y, a + b),
        "mul_scalar": (x * 1.5 - 0.25, a * BF16.type(1.5) - BF16.type(0.25)),
        "div": (x / y, a / b),
        "maximum": (lm.maximum(x, y), np.maximum(a, b)),
        "chain": (lm.exp(x) * y + 1, np.exp(a) * b + BF16.type(1)),  # rounds after each op
        "where": (lm.where(x > 0, x, y), np.where(a > 0, a, b)),
        "neg_view": (x[..., ::-1] * 2, a[..., ::-1] * BF16.type(2)),
        "sum": (lm.sum(x, axis=-1), a.astype(f).sum(axis=-1).astype(BF16)),
        "sum_all": (lm.sum(x), np.asarray(a.astype(f).sum()).astype(BF16)),
        "mean": (lm.mean(x, axis=0), a.astype(f).mean(axis=0).astype(BF16)),
    }
    if a.size:
        outs["max"] = (lm.max(x, axis=-1), a.max(axis=-1))
        outs["argmax"] = (lm.argmax(x, axis=-1), np.argmax(a, axis=-1))
    cmp = (x < y, a < b)
    lm.realize(*[o for o, _ in outs.values()], cmp[0])
    for name, (got, want) in outs.items():
        if want.dtype == BF16:
            try:
                _close(got.numpy(), want, ulps=2.0 if name != "mean" else 3.0)
            except AssertionError as e:
                raise AssertionError(f"{name}: {e}") from None
        else:
            np.testing.assert_array_equal(got.numpy(), want, err_msg=name)
    np.testing.assert_array_equal(cmp[0].numpy(), cmp[1])


def test_bfloat16_sums_accumulate_in_float32(backend, b910):
    # 4096 ones: a bfloat16 accumulator would stop at 256 (256 + 1 rounds back to 256)
    x = lm.ones((4096,), dtype=lm.bfloat16)
    assert float(lm.sum(x).numpy()) == 4096.0
    assert lm.sum(x).dtype == BF16 and lm.mean(x).dtype == BF16 and lm.var(x).dtype == BF16


def test_elementwise_ops_on_bfloat16_fuse_into_one_vector_kernel(b910):
    x = lm.asarray(_rand((64, 33)))
    (k,) = lm.schedule(lm.exp(x) * 2 + x).kernels
    assert k.unit == "vector" and k.ops.count("exp") == 1 and "cast" in k.ops


@pytest.mark.parametrize("mkn", [(1, 1, 1), (17, 31, 13), (64, 128, 97), (0, 5, 3), (4, 0, 6)])
def test_matmul_accumulates_in_float32(backend, b910, mkn):
    m, k, n = mkn
    a, b = _rand((m, k), 3), _rand((k, n), 4)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(BF16)
    got = lm.asarray(a) @ lm.asarray(b)
    assert got.dtype == BF16
    # float32 sums in another order may round to a neighbouring bfloat16: one ulp of the largest
    np.testing.assert_allclose(_f64(got.numpy()), _f64(want),
                               atol=ULP * max(1.0, float(np.abs(_f64(want)).max(initial=0))))  # fmt: skip
    bt = lm.asarray(np.ascontiguousarray(b.T)).T  # a transposed (non-contiguous) operand
    np.testing.assert_allclose(_f64((lm.asarray(a) @ bt).numpy()), _f64(want),
                               atol=ULP * max(1.0, float(np.abs(_f64(want)).max(initial=0))))  # fmt: skip


# ----------------------------------------------------------------------------- presets


def test_ascend910_refuses_bfloat16_compute_with_a_clear_error(backend):
    if backend == "reference":
        pytest.skip("the reference executor plans no kernels")
    lm.init_device(0, spec="ascend910")
    x = lm.asarray(_rand((5, 5)))
    for bad in (x + 1, x @ x, x.astype(lm.float32), lm.asarray(np.ones(3, np.float32)).astype(
            lm.bfloat16)):  # fmt: skip
        with pytest.raises(TypeError, match=r"bfloat16 .*ascend910 preset.*ascend910b"):
            bad.numpy()
    # moving bfloat16 bytes needs no bfloat16 unit: views, broadcasts, fills still work
    _same_bits(x.T[::-1].numpy(), np.asarray(x.numpy()).T[::-1])
    _same_bits(lm.full((3,), 2.5, dtype=lm.bfloat16).numpy(), np.full(3, 2.5, BF16))


def test_schedule_names_the_preset_that_refuses():
    x = lm.asarray(_rand((8, 8)))
    with pytest.raises(TypeError, match="ascend910 preset"):
        lm.schedule(x @ x, spec="ascend910")
    (k,) = [k for k in lm.schedule(x @ x, spec="ascend910b").kernels if k.unit == "cube"]
    assert "matmul" in k.ops


# ----------------------------------------------------------------------------- host targets


def _targets() -> list[str]:
    """Targets this host executes, plus znver3 (AVX2, no AVX512_BF16) and the x86-64 baseline
    where it can run them."""
    out = list(host.executable_targets())
    for name in ("znver3", "x86-64"):
        try:
            host.make_target(name)
            out.append(name)
        except Exception:  # noqa: BLE001 - a host that cannot run that target's code
            pass
    return list(dict.fromkeys(out))


@pytest.fixture(params=_targets(), ids=lambda t: t or "native")
def target_cpu(request, monkeypatch, tmp_path):
    """Each target the host can execute, plus the x86-64 baseline (no AVX, no F16C, no
    AVX512_BF16): bfloat16 conversions are integer code and need no compiler-runtime call."""
    if request.param:
        monkeypatch.setenv(host.ENV_TARGET, request.param)
    else:
        monkeypatch.delenv(host.ENV_TARGET, raising=False)
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path))
    lm.clear_cache()  # programs compiled for another target must not be reused
    yield request.param
    lm.clear_cache()


def test_casts_and_matmul_on_every_target(target_cpu, b910, monkeypatch):
    """Both host mappings of the bfloat16 Mmad equal the reference: vdpbf16ps where the target
    has AVX512_BF16 (the spy sees the dot-product microkernel built), float32 FMAs on the
    widened panels elsewhere (haswell, znver3, x86-64); edges in every dimension, a batch and a
    transposed B."""
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    built = []
    orig = gemm_bf16.get_ukernel_bf16

    def spy(*args, **kw):
        built.append(args[1:3])
        return orig(*args, **kw)

    monkeypatch.setattr(gemm_bf16, "get_ukernel_bf16", spy)
    x = F32_SPECIALS
    a, b = _rand((3, 37, 29), 5), _rand((29, 83), 6)
    bt = _rand((83, 29), 7)
    c = lm.asarray(x).astype(lm.bfloat16)
    d = lm.asarray(a) @ lm.asarray(b)
    d2 = lm.asarray(a[0]) @ lm.asarray(bt).T
    e = lm.asarray(a).astype(lm.float32) * 3
    lm.realize(c, d, d2, e)
    _same_bits(c.numpy(), x.astype(BF16))
    f = np.float32
    for got, want in ((d, (a.astype(f) @ b.astype(f)).astype(BF16)),
                      (d2, (a[0].astype(f) @ bt.T.astype(f)).astype(BF16))):  # fmt: skip
        np.testing.assert_allclose(_f64(got.numpy()), _f64(want),
                                   atol=ULP * float(np.abs(_f64(want)).max()))  # fmt: skip
    np.testing.assert_array_equal(e.numpy(), a.astype(np.float32) * 3)
    t = host.target()
    assert gemm_bf16.bf16_dot_available() == (t.bf16 and t.vector_regs >= 32)
    assert bool(built) == gemm_bf16.bf16_dot_available()


@pytest.mark.parametrize("view", ["contiguous", "odd_row_stride", "reversed_rows", "k_tail"])
def test_dot_product_mmad_reads_whole_a_panels_in_place(b910, monkeypatch, tmp_path, view):
    """On an AVX512_BF16 host the vdpbf16ps Mmad reads a whole bfloat16 A panel row-major in
    GM (the `_nd` dot-product microkernels: no float32 widening, no per-Mmad narrowing), also
    at an odd row stride (2-byte aligned pair loads) and a negative one; a panel that is not
    whole (K not a multiple of 16) is packed as before. Values equal the packed lowering
    (gemm.ND_A off) and float32 matmul rounded once (a float32 reference: same products, sums
    in another order)."""
    if not gemm_bf16.bf16_dot_available():
        pytest.skip("host without AVX512_BF16: the float32 FMA mapping (tested above)")
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path))
    k = 29 if view == "k_tail" else 160
    big = _rand((131, k + 1), 8)
    a = {"odd_row_stride": big[:, :k], "reversed_rows": big[::-1, :k]}.get(view, big[:, :k])
    if view in ("contiguous", "k_tail"):
        a = np.ascontiguousarray(a)
    b = _rand((k, 83), 9)
    built = []
    orig = gemm_bf16.get_ukernel_bf16

    def spy(*args, **kw):
        built.append(kw.get("nd", args[4] if len(args) > 4 else False))
        return orig(*args, **kw)

    monkeypatch.setattr(gemm_bf16, "get_ukernel_bf16", spy)
    got = {}
    for nd in (True, False):
        monkeypatch.setattr(gemm, "ND_A", nd)
        lm.clear_cache()
        got[nd] = (lm.asarray(a) @ lm.asarray(b)).numpy()
    lm.clear_cache()
    assert any(built) == (view != "k_tail")
    f = np.float32
    want = (a.astype(f) @ b.astype(f)).astype(BF16)
    _same_bits(got[True], got[False])
    np.testing.assert_allclose(_f64(got[True]), _f64(want),
                               atol=ULP * float(np.abs(_f64(want)).max()))  # fmt: skip


@pytest.mark.parametrize("shape", [(300, 160, 83), (257, 29, 40), (1, 16, 1)])
def test_dot_product_mmad_reads_b_narrowed_once_per_panel_fill(b910, monkeypatch, tmp_path, shape):
    """On an AVX512_BF16 host the vdpbf16ps Mmad reads its B operand from the pair twin that
    lower_cube narrows when the L1 panel (or its memo slot) is filled, not narrowed per Mmad
    (lower_cube.pair_panels; spy: every bfloat16 Mmad lowered with b_pairs). Values equal float32
    matmul rounded once, also through a transposed B and with a K tail."""
    if not gemm_bf16.bf16_dot_available():
        pytest.skip("host without AVX512_BF16: the float32 FMA mapping (tested above)")
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path))
    lm.clear_cache()
    seen = []
    orig = gemm_bf16.emit_mmad_bf16

    def spy(*args, **kw):
        seen.append(kw.get("b_pairs", False))
        return orig(*args, **kw)

    monkeypatch.setattr(gemm_bf16, "emit_mmad_bf16", spy)
    m, k, n = shape
    a, b = _rand((m, k), 10), _rand((k, n), 11)
    f = np.float32
    want = (a.astype(f) @ b.astype(f)).astype(BF16)
    tol = ULP * max(1.0, float(np.abs(_f64(want)).max()))
    for bb in (lm.asarray(b), lm.asarray(np.ascontiguousarray(b.T)).T):
        got = (lm.asarray(a) @ bb).numpy()
        np.testing.assert_allclose(_f64(got), _f64(want), atol=tol)
    lm.clear_cache()
    assert seen and all(seen)


@pytest.mark.parametrize("mkn", [(1, 1, 1), (17, 31, 13), (300, 160, 83), (129, 257, 67)])
def test_bfloat16_matmul_is_a_cube_kernel_whose_fixpipe_rounds(backend, b910, monkeypatch, mkn):
    """The 910B FixPipe casts L0C's float32 to bfloat16 on the way to GM (NPU_FACTS: fp32 ->
    fp16/bf16): a bfloat16 matmul is one Cube program with no GM workspace and no AIV pass
    (it was a MIX kernel whose AIVs converted each tile: 0.91 -> 0.99x torch at 2048^3).
    Values equal float32 matmul rounded once to nearest even, through contiguous, transposed
    and reversed-row operands."""
    if backend == "reference":
        pytest.skip("the reference executor plans no kernels")
    from lazymath.backend.npu.templates import matmul as mt

    built = []
    orig = mt.build

    def spy(*args, **kw):
        built.append(orig(*args, **kw))
        return built[-1]

    monkeypatch.setattr(mt, "build", spy)
    lm.clear_cache()
    m, k, n = mkn
    a, b = _rand((m, k), 12), _rand((k, n), 13)
    f = np.float32
    want = (a.astype(f) @ b.astype(f)).astype(BF16)
    tol = ULP * max(1.0, float(np.abs(_f64(want)).max()))
    views = (
        (lm.asarray(a), lm.asarray(b)),
        (lm.asarray(a), lm.asarray(np.ascontiguousarray(b.T)).T),
        (lm.asarray(np.ascontiguousarray(a[::-1]))[::-1], lm.asarray(b)),
    )
    for x, y in views:
        got = (x @ y).numpy()
        assert got.dtype == BF16
        np.testing.assert_allclose(_f64(got), _f64(want), atol=tol)
    lm.clear_cache()
    assert built and all(p.unit == "cube" for p in built)
    assert not any(buf.name.startswith("ws") for p in built for buf in p.args)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_matmul_rounded_then_widened_keeps_its_rounding(backend, b910, dtype):
    """A half-precision matmul widened again (`(a @ b).astype(float32)`, what a bf16 linear
    feeding a float32 bias add looks like) rounds to the half type first: FixPipe casts once,
    so that chain is not a FixPipe-only epilogue (it used to skip the rounding: float32 sums
    written unrounded)."""
    dt = BF16 if dtype == "bfloat16" else np.dtype(np.float16)
    rng = np.random.default_rng(14)
    a, b = (rng.standard_normal(s).astype(dt) for s in ((67, 45), (45, 70)))
    f = np.float32
    want = (a.astype(f) @ b.astype(f)).astype(dt).astype(f)
    got = (lm.asarray(a) @ lm.asarray(b)).astype(lm.float32).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.astype(dt).astype(f), got)  # on the half type's grid
    np.testing.assert_allclose(got, want, atol=ULP * float(np.abs(want).max()))


@pytest.mark.parametrize("mkn", [(1, 1, 1), (17, 31, 13), (129, 257, 67), (64, 512, 256)])
@pytest.mark.parametrize(
    "view", ["row_major", "transposed", "reversed_rows", "sliced_t", "strided"]
)
def test_b_pairs_packed_straight_from_bfloat16(b910, monkeypatch, tmp_path, mkn, view):
    """On an AVX512_BF16 host a B panel read only through its pair twin (cube_proofs.
    pair_only_panels) is packed from bfloat16 GM straight into the pair layout
    (gemm_bf16.emit_pack_pairs: no float32 panel, no narrowing) when B is row-major or
    transposed (a linear layer's weight.T). Results are bit for bit those of pack + narrow
    (pack_pairs_direct off) on K and column tails (odd K: a half-filled last pair), negative
    and sliced strides, and close to float32 matmul."""
    if not gemm_bf16.bf16_dot_available():
        pytest.skip("host without AVX512_BF16: the float32 FMA mapping (tested above)")
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path))
    m, k, n = mkn
    rng = np.random.default_rng(15)
    a = rng.standard_normal((m, k)).astype(BF16)
    w = rng.standard_normal((n + 2, 2 * k + 3)).astype(BF16)  # a weight, (out, in) + margins
    if view == "row_major":
        bb = rng.standard_normal((k, n)).astype(BF16)
        B = lm.asarray(bb)
    elif view == "transposed":
        bb = w[:n, :k].T
        B = lm.asarray(np.ascontiguousarray(w[:n, :k])).T
    elif view == "reversed_rows":
        bb = w[:n, :k].T[::-1]
        B = lm.asarray(np.ascontiguousarray(w[:n, :k].T))[::-1]
    elif view == "sliced_t":
        bb = w[:n, 1 : k + 1].T
        B = lm.asarray(w)[:n, 1 : k + 1].T
    else:  # every other input feature
        bb = w[:n, : 2 * k : 2].T
        B = lm.asarray(w)[:n, : 2 * k : 2].T
    built = []
    orig = gemm_bf16.emit_pack_pairs

    def spy(*args, **kw):
        built.append(args[4:6])
        return orig(*args, **kw)

    monkeypatch.setattr(gemm_bf16, "emit_pack_pairs", spy)
    got = {}
    for direct in (True, False):
        if not direct:
            monkeypatch.setattr(gemm_bf16, "pack_pairs_direct", lambda sr, sc: False)
        lm.clear_cache()
        got[direct] = (lm.asarray(a) @ B).numpy()
    lm.clear_cache()
    # a strided B may reach the kernel as it is (neither stride 1: pack + narrow) or copied
    assert built or view == "strided"
    _same_bits(got[True], got[False])
    f = np.float32
    want = (a.astype(f) @ bb.astype(f)).astype(BF16)
    np.testing.assert_allclose(_f64(got[True]), _f64(want),
                               atol=ULP * max(1.0, float(np.abs(_f64(want)).max())))  # fmt: skip
