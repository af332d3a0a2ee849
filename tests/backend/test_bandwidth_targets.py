"""The bandwidth kernels of issue 35 (row softmax, layernorm, the chain exp(sin(x)*0.5+1)*x)
give numpy's values with the code generated for every x86 target this host can run.

Their speed is tuned on the native AVX-512 target; the forced targets (LAZYMATH_TARGET_CPU =
znver3 / haswell: AVX2, 256-bit vectors; x86-64: SSE2) take other vector widths, other
reductions splits and other vmath instruction selections through the same lowering. A speed
regression there is measured in benchmarks/ (rows.py, elementwise.py under the forced target),
never asserted; what this file protects is that the forced code computes the right thing, on
shapes that exercise the row-resident pipeline's prologue/steady/tail stages, row tails that
are not a multiple of any vector width, several host blocks, views with negative strides, and
both device presets (the 910's and the 910B's UB sizes give different row rings).
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend.native import host, jit


def _targets() -> list[str]:
    """Native, every smaller target the host can execute, and znver3 (the Zen 3/4 AVX2 class
    the issue names) when the host can run it."""
    out = list(host.executable_targets())
    if "haswell" in out:  # znver3 = AVX2 + the same features haswell needs
        try:
            host.make_target("znver3")
        except (ValueError, RuntimeError):
            pass
        else:
            out.insert(1, "znver3")
    return out


@pytest.fixture(params=_targets(), ids=lambda t: t or "native")
def target(request, monkeypatch):
    if request.param:
        monkeypatch.setenv(host.ENV_TARGET, request.param)
    else:
        monkeypatch.delenv(host.ENV_TARGET, raising=False)
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    lm.clear_cache()  # programs compiled for another target must not be reused
    yield request.param
    lm.clear_cache()


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layernorm_ref(x, w, b, eps=1e-5):
    x = x.astype(np.float64)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


ROW_SHAPES = [(1, 1), (3, 17), (7, 4099), (64, 1024), (130, 257)]


@pytest.mark.parametrize("shape", ROW_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_softmax_and_layernorm_on_forced_targets(target, preset, shape):
    assert jit.get_jit().cpu_name == (target or host.target().llvm_cpu)
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    got = np.asarray(lm.softmax(lm.tensor(x), axis=-1).realize())
    np.testing.assert_allclose(got, _softmax_ref(x), rtol=2e-5, atol=1e-7)
    ln = lm.nn.layer_norm(lm.tensor(x), (shape[-1],), weight=lm.tensor(w), bias=lm.tensor(b))
    np.testing.assert_allclose(np.asarray(ln.realize()), _layernorm_ref(x, w, b),
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_softmax_of_a_negative_stride_view_on_forced_targets(target):
    rng = np.random.default_rng(5)
    base = rng.standard_normal((41, 515)).astype(np.float32)
    view = lm.tensor(base)[::-2, ::-1]  # negative strides in both axes, odd row count
    got = np.asarray(lm.softmax(view, axis=-1).realize())
    np.testing.assert_allclose(got, _softmax_ref(base[::-2, ::-1]), rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_chain_on_forced_targets(target, preset, dtype):
    """exp(sin(x)*0.5+1)*x over 600,011 elements: a big Vector kernel (several host blocks,
    a tail that is no multiple of any vector width) through vmath's sin and exp."""
    x = np.random.default_rng(7).uniform(-6, 6, 600_011).astype(dtype)
    t = lm.tensor(x)
    got = np.asarray((lm.exp(lm.sin(t) * 0.5 + 1.0) * t).realize())
    xf = x.astype(np.float64)
    want = np.exp(np.sin(xf) * 0.5 + 1.0) * xf
    tol = 1e-5 if dtype == "float32" else 4e-3
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(5, 1031), (64, 1024)], ids=lambda s: "x".join(map(str, s)))
def test_softmax_and_layernorm_interp(monkeypatch, preset, shape):
    """The same kernels on the ISA interpreter (target-independent: the NPU semantics the
    compiled code must match)."""
    monkeypatch.setenv("LAZYMATH_BACKEND", "interp")
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    got = np.asarray(lm.softmax(lm.tensor(x), axis=-1).realize())
    np.testing.assert_allclose(got, _softmax_ref(x), rtol=2e-5, atol=1e-7)
    w = np.ones(shape[-1], np.float32)
    b = np.zeros(shape[-1], np.float32)
    ln = lm.nn.layer_norm(lm.tensor(x), (shape[-1],))
    np.testing.assert_allclose(np.asarray(ln.realize()), _layernorm_ref(x, w, b),
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_an_unknown_target_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(host.ENV_TARGET, "no-such-cpu")
    lm.clear_cache()
    try:
        with pytest.raises((ValueError, RuntimeError), match="no-such-cpu"):
            lm.softmax(lm.tensor(np.ones((2, 3), np.float32)), axis=-1).realize()
    finally:
        monkeypatch.delenv(host.ENV_TARGET)
        lm.clear_cache()
