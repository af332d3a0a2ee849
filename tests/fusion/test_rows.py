"""Row kernels (issue 15): reductions over the same axes plus the elementwise ops that read
them broadcast back are one kernel, row-resident when a block of rows fits UB, online two-pass
when a row is wider than UB. Counted through lm.schedule; values against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm

RNG = np.random.default_rng(15)


def _softmax(x, a):
    e = np.exp(x - x.max(a, keepdims=True))
    return e / e.sum(a, keepdims=True)


def _log_softmax(x, a):
    z = x - x.max(a, keepdims=True)
    return z - np.log(np.exp(z).sum(a, keepdims=True))


def _layernorm(x, g, a, m):
    """m is lm or np: (x - mean) * rsqrt(var + eps) * g."""
    if m is np:
        return (x - x.mean(a, keepdims=True)) / np.sqrt(x.var(a, keepdims=True) + 1e-5) * g
    mu = lm.mean(x, axis=a, keepdims=True)
    return (x - mu) * lm.rsqrt(lm.var(x, axis=a, keepdims=True) + 1e-5) * g


PATTERNS = {
    "softmax": (lambda x, g, a: lm.softmax(x, axis=a), lambda x, g, a: _softmax(x, a)),
    "log_softmax": (lambda x, g, a: lm.log_softmax(x, axis=a), lambda x, g, a: _log_softmax(x, a)),
    "layernorm": (lambda x, g, a: _layernorm(x, g, a, lm), lambda x, g, a: _layernorm(x, g, a, np)),
    "rmsnorm": (
        lambda x, g, a: x * lm.rsqrt(lm.mean(x * x, axis=a, keepdims=True) + 1e-6) * g,
        lambda x, g, a: x / np.sqrt((x * x).mean(a, keepdims=True) + 1e-6) * g,
    ),
    "var": (lambda x, g, a: lm.var(x, axis=a), lambda x, g, a: x.var(axis=a)),
    "std": (
        lambda x, g, a: lm.std(x, axis=a, keepdims=True),
        lambda x, g, a: x.std(a, keepdims=True),
    ),
    "normalize": (
        lambda x, g, a: x / lm.sqrt(lm.sum(x * x, axis=a, keepdims=True)),
        lambda x, g, a: x / np.sqrt((x * x).sum(a, keepdims=True)),
    ),
}


def _inputs(shape, a, dtype, mean=0.0):
    x = (RNG.standard_normal(shape) * 2 + mean).astype(dtype)
    gshape = tuple(s if d == a % len(shape) else 1 for d, s in enumerate(shape))
    g = RNG.standard_normal(gshape).astype(dtype)
    return x, g


def _check(name, shape, a, dtype, mean=0.0):
    lm_fn, np_fn = PATTERNS[name]
    x, g = _inputs(shape, a, dtype, mean)
    t = lm_fn(lm.tensor(x), lm.tensor(g), a)
    s = lm.schedule(t)
    assert len(s.kernels) == 1 and s.kernels[0].kind == "rows", s
    got = t.numpy()
    assert got.dtype == np.dtype(dtype)
    ref = np_fn(x.astype(np.float64), g.astype(np.float64), a)
    scale = np.abs(ref).max() + 1
    err = np.abs(got.astype(np.float64) - ref).max() / scale
    if dtype == "float16":
        tol = 4e-3
    else:  # numpy's own float32 error on this input (ill-conditioned rows exist), or 2e-6
        with np.errstate(all="ignore"):
            np_err = np.abs(np_fn(x, g, a).astype(np.float64) - ref).max() / scale
        tol = max(2e-6, 4 * np_err)
    assert err < tol, (name, shape, a, dtype, err)
    return s


# ----------------------------------------------------------------------------- kernel counts


def test_the_issue_graphs_are_one_kernel_each():
    x = lm.tensor(np.zeros((4096, 4096), np.float32))
    g = lm.tensor(np.ones(4096, np.float32))
    graphs = {
        "softmax": lm.softmax(x, axis=-1),
        "log_softmax": lm.log_softmax(x, axis=-1),
        "layernorm": _layernorm(x, g, -1, lm),
        "var": lm.var(x, axis=-1),
    }
    for name, t in graphs.items():
        s = lm.schedule(t)
        assert len(s.kernels) == 1, (name, s)
        (entry,) = [e for e in s.fusion_log if e.what == "rows"]
        assert "row-resident" in entry.reason and "UB" in entry.reason, entry
        assert "software-pipelined over 3 rows" in entry.reason, entry


def test_form_follows_the_ub_capacity_and_is_logged():
    wide = lm.tensor(np.zeros((2, 100_003), np.float32))
    s = lm.schedule(lm.softmax(wide, axis=-1))
    assert len(s.kernels) == 1
    (entry,) = [e for e in s.fusion_log if e.what == "rows"]
    assert "online two-pass (softmax)" in entry.reason and "> 256 KiB" in entry.reason
    s = lm.schedule(lm.var(wide, axis=-1), spec="ascend910b")
    assert "online two-pass (welford)" in s.fusion_log[-1].reason
    assert "192 KiB" in s.fusion_log[-1].reason


def test_a_wide_chain_without_online_form_is_refused_with_reason():
    wide = lm.tensor(np.zeros((2, 100_003), np.float32))
    m = wide.max(axis=1, keepdims=True)
    y = lm.exp(wide - m)
    t = y - y.max(axis=1, keepdims=True)  # a max of a max-shifted value: no online merge
    s = lm.schedule(t)
    assert len(s.kernels) >= 2
    text = "\n".join(str(e) for e in s.fusion_log)
    assert "row fusion refused" in text and "online" in text, text
    np.testing.assert_allclose(t.numpy(), np.zeros((2, 100_003), np.float32), atol=0)


def test_prologue_joins_the_row_kernel():
    a, b = (RNG.standard_normal((6, 40)).astype(np.float32) for _ in range(2))
    t = lm.softmax(lm.tensor(a) * 2.0 + lm.tensor(b), axis=-1)
    (k,) = lm.schedule(t).kernels
    assert k.kind == "rows" and k.ops[:2] == ["mul", "add"]
    np.testing.assert_allclose(t.numpy(), _softmax(a * 2.0 + b, -1), rtol=1e-5, atol=1e-7)


def test_several_outputs_of_one_region_are_one_kernel():
    x = RNG.standard_normal((5, 33)).astype(np.float32)
    xt = lm.tensor(x)
    mx = xt.max(axis=1)
    sm = lm.softmax(xt, axis=1)
    s = lm.schedule(mx, sm)
    assert len(s.kernels) == 1
    lm.realize(mx, sm)
    np.testing.assert_array_equal(mx.numpy(), x.max(1))
    np.testing.assert_allclose(sm.numpy(), _softmax(x, 1), rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- values

SHAPES = [((7, 13), -1), ((1, 257), -1), ((37, 1), 0), ((5, 11, 3), 1), ((3, 300), 0)]


@pytest.mark.parametrize("backend", ["llvm", "interp"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_patterns_match_numpy(name, backend, monkeypatch):
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    for dtype in ("float32", "float16"):
        for shape, a in SHAPES:
            _check(name, shape, a, dtype)


# rows of >= 256 elements: one row per step, software-pipelined (stage p of row s - p in step s,
# each row's UB buffers in ring slot row % P); 200 rows give blocks of 7 rows (head, steady
# loop, tail), 1-2 rows only the guarded head/tail, the last blocks fewer rows or none
PIPE_SHAPES = [((1, 300), -1), ((2, 300), -1), ((200, 263), -1), ((300, 3, 4), 0),
               ((3, 401, 5), 1)]  # fmt: skip


def _pipelined(t, spec=None) -> int:
    from lazymath.backend.npu.templates import rows

    (k,) = lm.schedule(t).kernels
    return rows.tiling(k.group.ir, spec or lm.current_device().spec).get("pipelined", 0)


@pytest.mark.parametrize("backend", ["llvm", "interp"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pipelined_rows_match_numpy(name, backend, monkeypatch):
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    for dtype in ("float32", "float16"):
        for shape, a in PIPE_SHAPES:
            if backend == "interp" and dtype == "float16" and shape[0] == 200:
                continue  # the interpreter's float16 path is covered by the smaller shapes
            x, g = _inputs(shape, a, dtype)
            assert _pipelined(PATTERNS[name][0](lm.tensor(x), lm.tensor(g), a)) >= 2, name
            _check(name, shape, a, dtype)


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_fused_max_and_min_propagate_nan(backend, monkeypatch):
    """Fused float max/min reductions fold with maxnum plus a NaN flag: a NaN anywhere in a
    row (first, middle, last element) still gives numpy's NaN, infinities stay exact."""
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    x = RNG.standard_normal((40, 300)).astype(np.float32)
    x[3, 0] = x[4, 151] = x[5, 299] = np.nan
    x[9, :] = -np.inf
    x[10, 4] = np.inf
    x[11, :7] = np.inf
    with np.errstate(invalid="ignore"):
        sm_ref = _softmax(x, 1)
        mn_ref = x - x.min(1, keepdims=True)
    sm = lm.softmax(lm.tensor(x), axis=1)
    assert _pipelined(sm) == 3
    np.testing.assert_allclose(sm.numpy(), sm_ref, rtol=1e-5, atol=1e-7)
    mn = lm.tensor(x) - lm.min(lm.tensor(x), axis=1, keepdims=True)
    np.testing.assert_array_equal(mn.numpy(), mn_ref)
    mx, sm2 = lm.tensor(x).max(axis=1), lm.softmax(lm.tensor(x), axis=1)
    lm.realize(mx, sm2)  # one kernel, a per-row output before the last stage: not pipelined
    np.testing.assert_array_equal(mx.numpy(), x.max(1))
    np.testing.assert_allclose(sm2.numpy(), sm_ref, rtol=1e-5, atol=1e-7)


def test_pipelined_strided_rows_and_910b():
    base = RNG.standard_normal((9, 1030)).astype(np.float32)
    t = lm.softmax(lm.tensor(base).T, axis=0)  # rows of 1030 elements with stride 1030
    assert _pipelined(t) == 3
    np.testing.assert_allclose(t.numpy(), _softmax(base.T, 0), rtol=1e-5, atol=1e-7)
    lm.init_device(0, spec="ascend910b")
    try:
        for name in ("softmax", "layernorm", "var"):
            _check(name, (70, 1000), -1, "float32")
        x = lm.tensor(np.zeros((8, 1000), np.float32))
        assert _pipelined(lm.softmax(x, axis=-1)) == 3
        x = lm.tensor(np.zeros((8, 4096), np.float32))  # 3 rows in flight, a ring of 2 slots
        assert _pipelined(lm.softmax(x, axis=-1)) == 3
        x = lm.tensor(np.zeros((8, 6200), np.float32))  # 2 slots x 4 tiles > 192 KiB: plain
        assert _pipelined(lm.softmax(x, axis=-1)) == 0
        np.testing.assert_allclose(lm.softmax(x, axis=-1).numpy(), 1 / 6200, rtol=1e-6)
    finally:
        lm.init_device(0, spec="ascend910")


@pytest.mark.parametrize("backend", ["llvm", "interp"])
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "var"])
def test_rows_wider_than_ub_take_the_online_path(name, backend, monkeypatch):
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    for dtype in ("float32", "float16"):
        s = _check(name, (3, 70_001), -1, dtype)
        assert "online" in s.fusion_log[-1].reason
    s = _check(name, (40_009, 2), 0, "float32")  # strided rows
    assert "online" in s.fusion_log[-1].reason


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_online_row_values_serve_every_chunk_of_the_second_pass(backend, monkeypatch):
    """A row value computed between the passes (here the mean, sum * 1/n of another kernel's
    sum, and the rsqrt of the variance) is read by every chunk of pass 2: the first chunk's
    last use must not free its tile. It did: the elements past the first chunk of a
    40,000-wide layernorm written with two means were wrong (4.7 off)."""
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    x = RNG.standard_normal((2, 40_000)).astype(np.float32)
    t = lm.tensor(x)
    m = lm.mean(t, axis=-1, keepdims=True)
    y = (t - m) / lm.sqrt(lm.mean((t - m) ** 2, axis=-1, keepdims=True) + 1e-5)
    assert any("online" in e.reason for e in lm.schedule(y).fusion_log)
    got = y.numpy()
    mr = x.mean(-1, keepdims=True)
    ref = (x - mr) / np.sqrt(((x - mr) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_ascend910b(monkeypatch):
    lm.init_device(0, spec="ascend910b")
    try:
        for name in ("softmax", "layernorm", "var"):
            _check(name, (9, 129), -1, "float32")
            _check(name, (9, 129), 0, "float16")
            _check(name, (2, 60_000), -1, "float32")
    finally:
        lm.init_device(0, spec="ascend910")


def test_softmax_keeps_infinities_like_numpy():
    x = RNG.standard_normal((4, 50)).astype(np.float32)
    x[0, :7] = -np.inf
    x[1, 3] = np.inf
    got = lm.softmax(lm.tensor(x), axis=1).numpy()
    with np.errstate(invalid="ignore"):
        ref = _softmax(x, 1)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    wide = np.full((2, 70_001), -np.inf, np.float32)
    wide[:, 40_000:] = RNG.standard_normal((2, 30_001))
    got = lm.softmax(lm.tensor(wide), axis=1).numpy()  # online; the first chunks are all -inf
    np.testing.assert_allclose(got, _softmax(wide.astype(np.float64), 1), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("width", [1000, 70_001])
def test_variance_with_a_large_mean_is_as_accurate_as_numpy(width):
    x = (RNG.standard_normal((4, width)) + 1e4).astype(np.float32)
    truth = x.astype(np.float64).var(axis=1)
    np_err = np.abs(x.var(axis=1) - truth) / truth
    got = lm.var(lm.tensor(x), axis=1).numpy()
    err = np.abs(got - truth) / truth
    assert np.all(err <= np.maximum(2 * np_err, 1e-6)), (err, np_err)


# ----------------------------------------------------------------------------- matmul column sums


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_matmul_column_sum_is_one_kernel(spec, backend, monkeypatch):
    """910: the Cube core's own Vector unit folds the L0C tiles (unit cube); split 910B: a MIX
    kernel, the AIC hands the tiles to the AIVs through a GM workspace (unit mix)."""
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    unit = "cube" if spec == "ascend910" else "mix"
    big = lm.tensor(np.zeros((4096, 4096), np.float32))
    s = lm.schedule(lm.sum(lm.matmul(big, big), axis=0), spec=spec)
    assert [(k.ops, k.unit) for k in s.kernels] == [(["matmul", "sum"], unit)]
    lm.init_device(0, spec=spec)
    try:
        for dt, batch, (m, k, n) in (("float32", (), (37, 19, 130)),
                                     ("float16", (3,), (37, 19, 130)),
                                     ("float32", (), (1, 5, 3)),
                                     ("float32", (), (131, 17, 290))):  # fmt: skip
            a = RNG.standard_normal((*batch, m, k)).astype(dt)
            b = RNG.standard_normal((*batch, k, n)).astype(dt)
            prod = np.matmul(a.astype(np.float32), b.astype(np.float32))
            A, B = lm.tensor(a), lm.tensor(b)
            # an epilogue beyond relu/cast rides along: the 910B's AIVs run it in the MIX kernel
            epi = dt == "float32" or spec == "ascend910"
            t = lm.sum(lm.relu(A @ B) * 2.0 if epi else A @ B, axis=-2)
            both = (A @ B, lm.sum(A @ B, axis=-2))  # the product is also wanted: written too
            for ks in (lm.schedule(t).kernels, lm.schedule(*both).kernels):
                assert [k_.unit for k_ in ks] == [unit]
            lm.realize(t, *both)
            want = (
                (np.maximum(prod, 0).astype(dt).astype(np.float64) * 2).sum(-2)
                if epi
                else (prod.astype(dt).sum(-2, dtype=np.float64))
            )
            tol = 2e-2 if dt == "float16" else 1e-5
            scale = np.abs(want).max() + 1
            assert np.abs(t.numpy() - want).max() / scale < tol
            assert np.abs(both[1].numpy() - prod.astype(dt).sum(-2, dtype=np.float64)).max() < (
                tol * (np.abs(prod).sum(-2).max() + 1)
            )
            np.testing.assert_allclose(both[0].numpy(), prod.astype(dt), rtol=tol, atol=tol)
    finally:
        lm.init_device(0, spec="ascend910")


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_matmul_column_sum_split_over_m_groups(spec, backend, monkeypatch):
    """Few N panels: the M groups of a panel each sum their rows, publish the partial in the
    GM workspace and the last to arrive combines them (all cores busy, not one per panel)."""
    from lazymath.backend.npu.templates.matmul import tile_matmul

    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    a = RNG.standard_normal((1000, 48)).astype(np.float32)
    b = RNG.standard_normal((48, 40)).astype(np.float32)
    lm.init_device(0, spec=spec)
    try:
        A, B = lm.tensor(a), lm.tensor(b)
        (k,) = lm.schedule(lm.sum(A @ B, axis=0)).kernels
        assert tile_matmul(k.group.ir, lm.current_device().spec).m_groups > 1
        want = (a.astype(np.float64) @ b).sum(0)
        for _ in range(2):  # the second run replays the cached program: counters re-armed
            got = lm.sum(A @ B, axis=0).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    finally:
        lm.init_device(0, spec="ascend910")


def test_matmul_column_sum_on_910b_is_a_mix_kernel_with_cross_core_flags():
    from lazymath.backend import compile_kernel
    from lazymath.backend.npu import interp, isa

    a = RNG.standard_normal((300, 40)).astype(np.float32)
    b = RNG.standard_normal((40, 24)).astype(np.float32)
    s = lm.schedule(lm.sum(lm.matmul(lm.tensor(a), lm.tensor(b)), axis=0), spec="ascend910b")
    (k,) = s.kernels
    assert "AIC + AIV" in lm.explain(lm.sum(lm.matmul(lm.tensor(a), lm.tensor(b)), axis=0),
                                     spec="ascend910b")  # fmt: skip
    ck = compile_kernel(k.group.ir, "ascend910b", backend="interp")
    prog = ck.program
    assert prog.unit == "mix" and prog.workspace > 0
    kinds = [type(i) for i in prog.instructions()]
    assert isa.CrossCoreSetFlag in kinds and isa.CrossCoreWaitFlag in kinds
    assert "cross_core_wait_flag" in ck.isa_text and "fixpipe_l0c_to_gm" in ck.isa_text
    assert ck.cost.total > 0 and ck.cost.pipes["AIV.Vector"] > 0 and not ck.cost.unknown
    out = np.zeros(24, np.float32)
    ck(a, b, out)  # the interpreter runs the race checker on the flags
    np.testing.assert_allclose(out, (a @ b).sum(0), rtol=1e-4, atol=1e-4)
    # without the "tile in GM" flags the AIV's read of the workspace races FixPipe's write
    # (the AIV's barriers do not reach the AIC's pipes)
    from lazymath.backend.npu.races import RaceError

    body = _drop(prog.body, lambda i: type(i) in (isa.CrossCoreSetFlag, isa.CrossCoreWaitFlag)
                 and isinstance(i.flag, isa.Var))  # fmt: skip
    with pytest.raises(RaceError, match="ws_tiles"):
        interp.run(isa.Program(prog.name, prog.args, prog.buffers, body, prog.blocks,
                               prog.device_blocks, "mix", prog.workspace),
                   [a.ravel(), b.ravel(), np.zeros(24, np.float32),
                    np.zeros(prog.workspace, np.uint8)], 0, 1)  # fmt: skip
    with pytest.raises(ValueError, match="cross-core"):  # no MIX kernels on the coupled 910
        isa.Program(prog.name, prog.args, (), (isa.CrossCoreSetFlag("FIX", 0),), 1, 1,
                    "mix").check(lm.current_device().spec)  # fmt: skip


def _drop(body, pred):
    from lazymath.backend.npu import isa

    out = []
    for i in body:
        if pred(i):
            continue
        if isinstance(i, isa.Loop):
            i = isa.Loop(i.var, i.start, i.stop, i.step, _drop(i.body, pred))
        out.append(i)
    return tuple(out)


# ----------------------------------------------------------------------------- matmul row reductions

ROW_REDS = {
    "sum": (lambda p: lm.sum(p, axis=-1), lambda p: p.sum(-1)),
    "max": (lambda p: lm.max(p, axis=-1), lambda p: p.max(-1)),
    "min": (lambda p: lm.min(p, axis=-1), lambda p: p.min(-1)),
    "relu_sum": (lambda p: lm.sum(lm.relu(p), axis=-1), lambda p: np.maximum(p, 0).sum(-1)),
    "relu2_sum": (lambda p: lm.sum(lm.relu(p) * 2.0, axis=-1),
                  lambda p: (np.maximum(p, 0) * 2).sum(-1)),
    # the reduction's own epilogue (scale and cast, sqrt, ...) is applied to the row values
    "mean": (lambda p: lm.mean(p, axis=-1), lambda p: p.mean(-1)),
    "norm": (lambda p: lm.sqrt(lm.sum(lm.square(p * 0.25), axis=-1)),  # (no float16 overflow)
             lambda p: np.sqrt((p * p / 16).sum(-1))),
    "max2": (lambda p: lm.max(p, axis=-1) * 2.0 + 1.0, lambda p: p.max(-1) * 2 + 1),
}  # fmt: skip


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_matmul_row_reductions_are_one_kernel(spec):
    """sum / max / min over n of a product (and of an elementwise epilogue) join the matmul
    kernel: counted through lm.schedule without running; the log says how."""
    unit = "cube" if spec == "ascend910" else "mix"
    big = lm.tensor(np.zeros((4096, 4096), np.float32))
    for name, (f, _) in ROW_REDS.items():
        s = lm.schedule(f(lm.matmul(big, big)), spec=spec)
        assert [k.unit for k in s.kernels] == [unit], (name, s)
        assert s.kernels[0].ops[0] == "matmul", s
        assert not [e for e in s.fusion_log if e.what == "refuse"], s.fusion_log
        assert [e for e in s.fusion_log if "in the matmul epilogue" in e.reason], s.fusion_log
    both = lm.schedule(lm.matmul(big, big), lm.sum(lm.matmul(big, big), axis=-1),
                       lm.sum(lm.matmul(big, big), axis=0), spec=spec)  # fmt: skip
    assert [k.unit for k in both.kernels] == [unit]
    if spec == "ascend910b":
        assert "reduce the product's rows" in lm.explain(lm.sum(big @ big, axis=-1), spec=spec)


# (dtype, batch of A, batch of B, (m, k, n)): a row of 1, primes, K tails, one N panel and
# several, batched and broadcast batch -- the products the row-epilogue tests reduce
_PRODUCT_CASES = (("float32", (), (), (37, 19, 130)),
                  ("float16", (3,), (3,), (37, 19, 290)),
                  ("float32", (), (), (1, 5, 3)),
                  ("float32", (2,), (), (131, 17, 293)),
                  ("float16", (), (), (67, 33, 1031)))  # fmt: skip


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_matmul_row_reductions_match_numpy(spec, backend, monkeypatch):
    """Awkward shapes: a row of 1, primes, K tails, one N panel and several (the panels'
    partials meet in the GM workspace), batched and broadcast batch, float16 and float32."""
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    lm.init_device(0, spec=spec)
    try:
        for dt, ba, bb, (m, k, n) in _PRODUCT_CASES:
            a = RNG.standard_normal((*ba, m, k)).astype(dt)
            b = RNG.standard_normal((*bb, k, n)).astype(dt)
            prod = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(dt)
            prod = prod.astype(np.float64)
            A, B = lm.tensor(a), lm.tensor(b)
            for name, (f, _) in ROW_REDS.items():
                assert len(lm.schedule(f(A @ B)).kernels) == 1, (name, lm.schedule(f(A @ B)))
            P = A @ B  # all five reductions of one product: one kernel (one compile)
            ts = {name: f(P) for name, (f, _) in ROW_REDS.items()}
            assert len(lm.schedule(*ts.values()).kernels) == 1
            lm.realize(*ts.values())
            scale = np.abs(prod).sum(-1).max() + 1
            tol = 3e-3 if dt == "float16" else 1e-5
            for name, t in ts.items():
                got = t.numpy()
                assert got.dtype == np.dtype(dt) and got.shape == prod.shape[:-1]
                err = np.abs(got.astype(np.float64) - ROW_REDS[name][1](prod)).max() / scale
                assert err < tol, (name, dt, (m, k, n), err)
    finally:
        lm.init_device(0, spec="ascend910")


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_matmul_row_and_column_reductions_over_m_groups_and_n_panels(spec):
    """M groups x N panels: every panel of a row block publishes its partial row values and
    the last to arrive combines them (counters re-armed: realized twice); the product, its
    row sums, row maxima (NaN propagates like numpy), column sums and the softmax in one kernel."""
    from lazymath.backend import compile_kernel
    from lazymath.backend.npu.templates.matmul import tile_matmul

    lm.init_device(0, spec=spec)
    try:
        a = RNG.standard_normal((1000, 48)).astype(np.float32)
        a[3, 5] = np.nan
        b = RNG.standard_normal((48, 600)).astype(np.float32)
        A, B = lm.tensor(a), lm.tensor(b)
        # (a row max of its own: softmax's max, the same node, would be a second row output)
        (k,) = lm.schedule(A @ B, lm.sum(A @ B, axis=-1), lm.max(A @ B * 1.0, axis=1),
                           lm.sum(A @ B, axis=0), lm.softmax(A @ B, axis=-1)).kernels  # fmt: skip
        t = tile_matmul(k.group.ir, lm.current_device().spec)
        assert t.m_groups > 1 and t.n_panels > 1
        ck = compile_kernel(k.group.ir, spec, backend="interp")
        assert ck.cost.total > 0 and not ck.cost.unknown
        assert "ws_rowred" in ck.isa_text
        p = a.astype(np.float64) @ b
        with np.errstate(invalid="ignore"):
            sm = np.exp(p - p.max(-1, keepdims=True))
            sm /= sm.sum(-1, keepdims=True)
        for _ in range(2):  # the second run replays the cached program: counters re-armed
            outs = (A @ B, lm.sum(A @ B, axis=-1), lm.max(A @ B * 1.0, axis=1),
                    lm.sum(A @ B, axis=0), lm.softmax(A @ B, axis=-1))  # fmt: skip
            lm.realize(*outs)
            for o, w in zip(outs, (p, p.sum(-1), p.max(1), p.sum(0), sm)):
                np.testing.assert_allclose(o.numpy(), w, rtol=1e-4, atol=1e-3)
    finally:
        lm.init_device(0, spec="ascend910")


# ----------------------------------------------------------------------------- softmax(A @ B)


def _softmax64(p):
    e = np.exp(p - p.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_softmax_of_a_matmul_is_one_kernel(spec):
    """softmax(A @ B, -1) (also of a scaled product, also with the product wanted) is the
    matmul kernel in the online form; log_softmax and other axes are refused with a reason."""
    unit = "cube" if spec == "ascend910" else "mix"
    big = lm.tensor(np.zeros((4096, 4096), np.float32))
    for outs in ((lm.softmax(big @ big, axis=-1),), (lm.softmax((big @ big) * 0.125, axis=-1),),
                 (big @ big, lm.softmax(big @ big, axis=-1))):  # fmt: skip
        s = lm.schedule(*outs, spec=spec)
        assert [k.unit for k in s.kernels] == [unit], s
        assert any("softmax over the last axis in the matmul epilogue" in e.reason
                   for e in s.fusion_log)  # fmt: skip
        assert not [e for e in s.fusion_log if e.what == "refuse"], s.fusion_log
    for t in (lm.log_softmax(big @ big, axis=-1), lm.softmax(big @ big, axis=0)):
        s = lm.schedule(t, spec=spec)
        assert len(s.kernels) == 2
        assert any("row kernel over a matmul product" in e.reason for e in s.fusion_log)


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_softmax_of_a_matmul_matches_numpy(spec, backend, monkeypatch):
    """One N panel (normalised in the tile) and several (rows rescaled by the last panel),
    a row of 1, primes, K tails, batch and broadcast batch, float16 / float32."""
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    lm.init_device(0, spec=spec)
    try:
        for dt, ba, bb, (m, k, n) in _PRODUCT_CASES:
            a = (RNG.standard_normal((*ba, m, k)) * 2).astype(dt)
            b = RNG.standard_normal((*bb, k, n)).astype(dt)
            prod = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(dt)
            A, B = lm.tensor(a), lm.tensor(b)
            t = lm.softmax((A @ B) * 0.5, axis=-1)
            assert len(lm.schedule(t).kernels) == 1
            got = t.numpy()
            assert got.dtype == np.dtype(dt) and got.shape == prod.shape
            want = _softmax64(prod.astype(np.float64) * 0.5)
            if dt == "float16":
                tol = 1e-3
            else:  # numpy's own float32 error on this input, or 1e-6
                np_err = np.abs(_softmax64(prod * np.float32(0.5)).astype(np.float64) - want)
                tol = max(1e-6, 4 * np_err.max())
            err = np.abs(got.astype(np.float64) - want).max()
            assert err < tol, (dt, (m, k, n), err, tol)
    finally:
        lm.init_device(0, spec="ascend910")
