"""Differential test: random graphs realized through fusion vs the reference executor.

Hypothesis builds a recipe (a list of ops over a pool of tensors: elementwise, reductions,
views, matmuls with epilogues), the recipe is built twice on fresh input buffers, once realized
through the fused/compiled path and once on the numpy reference, and the results are compared.
LAZYMATH_DIFF_EXAMPLES raises the example count (default keeps CI fast).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazymath as lm

N_EXAMPLES = int(os.environ.get("LAZYMATH_DIFF_EXAMPLES", "60"))

UNARY = ["neg", "abs", "sin", "tanh", "relu", "sigmoid", "exp_small", "sqrt_abs", "cast16"]
BINARY = ["add", "sub", "mul", "maximum", "minimum", "where_gt"]
# row patterns (issue 15): reductions whose results are read broadcast back over the rows
ROWS = ["softmax", "log_softmax", "layernorm", "rmsnorm", "var", "std", "normalize", "center"]


def _rows(name, t, axis):
    if name == "softmax":
        return lm.softmax(t, axis=axis)
    if name == "log_softmax":
        return lm.log_softmax(t, axis=axis)
    if name == "layernorm":
        mu = lm.mean(t, axis=axis, keepdims=True)
        return (t - mu) * lm.rsqrt(lm.var(t, axis=axis, keepdims=True) + 1e-5)
    if name == "rmsnorm":
        return t * lm.rsqrt(lm.mean(t * t, axis=axis, keepdims=True) + 1e-6)
    if name == "var":
        return lm.var(t, axis=axis)
    if name == "std":
        return lm.std(t, axis=axis, keepdims=True)
    if name == "normalize":
        return t / (lm.sqrt(lm.sum(t * t, axis=axis, keepdims=True)) + 1.0)
    return t - lm.max(t, axis=axis, keepdims=True)


def _unary(name, t):
    if name == "exp_small":
        return lm.exp(lm.tanh(t))
    if name == "sqrt_abs":
        return lm.sqrt(lm.abs(t))
    if name == "cast16":
        return lm.astype(lm.astype(t, "float16"), "float32")
    return getattr(lm, name)(t)


def _binary(name, a, b):
    if name == "where_gt":
        return lm.where(a > b, a, b * 0.5)
    return getattr(lm, name)(a, b)


def _broadcastable(a, b):
    try:
        np.broadcast_shapes(a.shape, b.shape)
        return True
    except ValueError:
        return False


def recipe_strategy():
    shapes = st.sampled_from([(4, 6), (6,), (4, 1), (1, 6), (3, 4, 6), (1,), (7, 5)])
    step = st.one_of(
        st.tuples(st.just("u"), st.sampled_from(UNARY), st.integers(0, 99)),
        st.tuples(st.just("b"), st.sampled_from(BINARY), st.integers(0, 99), st.integers(0, 99)),
        st.tuples(
            st.just("r"),
            st.sampled_from(["sum", "max", "mean", "min"]),
            st.integers(0, 99),
            st.integers(-1, 2),
            st.booleans(),
        ),
        st.tuples(
            st.just("v"),
            st.sampled_from(["T", "flip", "slice", "flat", "unsq"]),
            st.integers(0, 99),
        ),
        st.tuples(
            st.just("m"),
            st.integers(0, 99),
            st.integers(0, 99),
            st.sampled_from(
                ["none", "relu", "scale", "bias", "colsum", "rowsum", "rowmax", "softmax"]
            ),
        ),
        st.tuples(st.just("c"), st.integers(0, 99), st.floats(-2, 2)),
        st.tuples(st.just("w"), st.sampled_from(ROWS), st.integers(0, 99), st.integers(0, 2)),
    )
    return st.tuples(
        st.lists(shapes, min_size=1, max_size=3),
        st.lists(step, min_size=1, max_size=8),
        st.integers(1, 2),
    )


def build(recipe, seed):
    shapes, steps, n_out = recipe
    rng = np.random.default_rng(seed)
    pool = [lm.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    for st_ in steps:
        kind = st_[0]
        pick = lambda i: pool[i % len(pool)]  # noqa: E731
        if kind == "u":
            pool.append(_unary(st_[1], pick(st_[2])))
        elif kind == "b":
            a, b = pick(st_[2]), pick(st_[3])
            if _broadcastable(a, b):
                pool.append(_binary(st_[1], a, b))
        elif kind == "r":
            t = pick(st_[2])
            if t.ndim == 0:
                continue
            axis = None if st_[3] < 0 else st_[3] % t.ndim
            pool.append(getattr(lm, st_[1])(t, axis=axis, keepdims=st_[4]))
        elif kind == "v":
            t = pick(st_[2])
            if t.ndim == 0:
                continue
            if st_[1] == "T":
                pool.append(t.T)
            elif st_[1] == "flip":
                pool.append(lm.flip(t, 0))
            elif st_[1] == "slice":
                pool.append(t[::2] if t.shape[0] > 1 else t[0:1])
            elif st_[1] == "flat":
                pool.append(t.reshape(-1))
            else:
                pool.append(lm.expand_dims(t, 0))
        elif kind == "m":
            a, b = pick(st_[1]), pick(st_[2])
            if a.ndim < 2:
                a = a.reshape(1, -1) if a.ndim == 1 else a
            if (
                a.ndim >= 1
                and b.ndim >= 1
                and a.shape[-1] == (b.shape[-2] if b.ndim >= 2 else b.shape[0])
            ):
                try:
                    r = a @ b
                except ValueError:
                    continue
                if st_[3] == "relu":
                    r = lm.relu(r)
                elif st_[3] == "scale":
                    r = r * 0.25
                elif st_[3] == "bias" and r.ndim >= 1:
                    r = r + lm.ones(r.shape[-1:]) * 0.5
                elif st_[3] == "colsum" and r.ndim >= 2:  # in the matmul kernel (910B: MIX)
                    r = lm.sum(r, axis=-2)
                elif st_[3] == "rowsum" and r.ndim >= 2:  # row sums: partials over N panels
                    r = lm.sum(lm.relu(r), axis=-1)
                elif st_[3] == "rowmax" and r.ndim >= 2 and r.shape[-1]:
                    r = lm.max(r, axis=-1)
                elif st_[3] == "softmax" and r.ndim >= 2:  # online softmax over N panels
                    r = lm.softmax(r * 0.5, axis=-1)
                pool.append(r)
        elif kind == "c":
            pool.append(pick(st_[1]) * float(st_[2]) + 1.0)
        elif kind == "w":
            t = pick(st_[2])
            if t.ndim == 0:
                continue
            pool.append(_rows(st_[1], t, st_[3] % t.ndim))
    return pool[-n_out:] if len(pool) >= n_out else pool


def _realize_with(backend, recipe, seed, monkeypatch):
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    outs = build(recipe, seed)
    lm.realize(*outs)
    return [np.asarray(o) for o in outs]


BACKENDS = [b for b in os.environ.get("LAZYMATH_DIFF_BACKENDS", "irref,llvm").split(",") if b]


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("backend", BACKENDS)
@settings(
    max_examples=N_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(recipe=recipe_strategy(), seed=st.integers(0, 2**16))
def test_fused_equals_reference(recipe, seed, backend, spec, monkeypatch):
    if backend == "llvm":
        pytest.importorskip("lazymath.backend.compile")
    lm.init_device(0, spec=spec)
    try:
        got = _realize_with(backend, recipe, seed, monkeypatch)
        want = _realize_with("reference", recipe, seed, monkeypatch)
    finally:
        lm.init_device(0, spec="ascend910")
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4, equal_nan=True)
