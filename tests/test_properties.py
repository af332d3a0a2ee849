"""Hypothesis property tests: broadcasting, type promotion, reduction shapes, basic indexing.

Protects: for *any* shapes and dtypes (not just the hand-picked ones of the op tests), lazymath
agrees with numpy on the result shape (or raises ValueError exactly when numpy does), on the
result dtype of every binary op (tensor/tensor and tensor/weak Python scalar, or TypeError
exactly when numpy refuses), on reduction shapes, and on basic indexing values.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lazymath as lm
from lazymath.graph.ops import BINARY as BINARY_OPS
from lazymath.graph.ops import ELEMENTWISE

DTYPES = ["float16", "float32", "float64", "int8", "int32", "int64", "bool"]
# every binary op of the registry -> the numpy ufunc that defines it (the oracle is numpy)
BINARY = {k: ELEMENTWISE[k].info.dtypes.ufunc for k in sorted(BINARY_OPS)}

# fixtures only set an env var / return helpers, so sharing them across examples is safe
SETTINGS = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)


@SETTINGS
@given(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=5))
def test_broadcast_shapes_match_numpy(bshapes):
    sa, sb = bshapes.input_shapes
    out = lm.add(lm.zeros(sa), lm.zeros(sb, dtype="int8"))
    assert out.shape == np.broadcast_shapes(sa, sb) == bshapes.result_shape
    assert lm.where(lm.zeros(sa, dtype="bool"), lm.zeros(sb), 1.0).shape == out.shape
    assert lm.broadcast_to(lm.zeros(sa), out.shape).shape == out.shape


@SETTINGS
@given(shapes, shapes)
def test_non_broadcastable_shapes_raise_value_error(sa, sb):
    try:
        want = np.broadcast_shapes(sa, sb)
    except ValueError:
        with pytest.raises(ValueError, match="broadcast"):
            lm.mul(lm.ones(sa), lm.ones(sb))
        return
    assert lm.mul(lm.ones(sa), lm.ones(sb)).shape == want


@SETTINGS
@given(
    hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4),
    st.sampled_from(["add", "sub", "mul", "maximum", "lt"]),
    st.sampled_from(["float32", "int32", "float16"]),
    st.integers(0, 2**32 - 1),
)
def test_broadcast_values_match_numpy(backend, check, bshapes, op, dtype, seed):
    rng = np.random.default_rng(seed)
    sa, sb = bshapes.input_shapes
    a = rng.integers(-5, 6, size=sa).astype(dtype)
    b = rng.integers(-5, 6, size=sb).astype(dtype)
    check(getattr(lm, op)(lm.tensor(a), lm.tensor(b)), BINARY[op](a, b))


@SETTINGS
@given(st.sampled_from(sorted(BINARY)), st.sampled_from(DTYPES), st.sampled_from(DTYPES))
def test_binary_result_dtype_matches_numpy(op, da, db):
    a, b = np.zeros((2,), da), np.ones((2,), db)
    try:
        with np.errstate(all="ignore"):
            want = BINARY[op](a, b).dtype
    except TypeError:
        with pytest.raises(TypeError):
            getattr(lm, op)(lm.tensor(a), lm.tensor(b))
        return
    assert getattr(lm, op)(lm.tensor(a), lm.tensor(b)).dtype == want


@SETTINGS
@given(
    st.sampled_from(sorted(BINARY)),
    st.sampled_from(DTYPES),
    st.one_of(st.integers(-100, 100), st.floats(-10, 10, allow_nan=False), st.booleans()),
    st.booleans(),
)
def test_weak_scalar_result_dtype_matches_numpy(op, dtype, scalar, scalar_first):
    """NEP 50: a Python scalar adopts the tensor's dtype when it fits the kind."""
    a = np.ones((2,), dtype)
    args = (scalar, a) if scalar_first else (a, scalar)
    t = lm.tensor(a)
    targs = (scalar, t) if scalar_first else (t, scalar)
    try:
        with np.errstate(all="ignore"):
            want = BINARY[op](*args)
    except (TypeError, OverflowError) as e:
        with pytest.raises(type(e)):
            getattr(lm, op)(*targs)
        return
    except ValueError:
        assume(False)  # integer to a negative power: numpy fails at compute time
    assert getattr(lm, op)(*targs).dtype == want.dtype


@SETTINGS
@given(st.sampled_from(DTYPES), st.sampled_from(DTYPES))
def test_where_and_concat_promotion(da, db):
    c = np.ones(2, bool)
    a, b = np.zeros(2, da), np.zeros(2, db)
    assert lm.where(lm.tensor(c), lm.tensor(a), lm.tensor(b)).dtype == np.where(c, a, b).dtype
    assert lm.concat([lm.tensor(a), lm.tensor(b)]).dtype == np.concatenate([a, b]).dtype


@st.composite
def shape_and_axes(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    axes = draw(
        st.lists(st.integers(-len(shape), len(shape) - 1), unique_by=lambda a: a % len(shape))
    )
    return shape, tuple(axes)


@SETTINGS
@given(shape_and_axes(), st.booleans(), st.sampled_from(["sum", "mean", "max", "prod", "var"]),
       st.sampled_from(DTYPES))  # fmt: skip
def test_reduction_shapes_and_dtypes_match_numpy(sa, keepdims, op, dtype):
    shape, axes = sa
    a = np.ones(shape, dtype)
    want = getattr(np, op)(a, axis=axes, keepdims=keepdims)
    got = getattr(lm, op)(lm.tensor(a), axis=axes, keepdims=keepdims)
    assert got.shape == np.shape(want)
    assert got.dtype == np.asarray(want).dtype


@st.composite
def array_and_index(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    idx = draw(hnp.basic_indices(shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True))
    return shape, idx


@SETTINGS
@given(array_and_index())
def test_basic_indexing_matches_numpy(backend, check, case):
    shape, idx = case
    a = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    check(lm.tensor(a)[idx], a[idx])
    b = a[::-1] if a.ndim else a  # indexing a negative-stride view
    check(lm.tensor(a)[::-1][idx] if a.ndim else lm.tensor(a)[idx], b[idx])


@SETTINGS
@given(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4), st.randoms())
def test_permute_then_reshape_matches_numpy(backend, check, shape, rnd):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    check(lm.tensor(a).transpose(perm).reshape(-1), a.transpose(perm).reshape(-1))
