"""numpy 2 (NEP 50) answers for an integer tensor against an out-of-range Python int (issue 38).

`lm.greater(u8, -1)` is all True and `lm.equal(u8, 256)` all False, as in numpy 2, instead of an
OverflowError; `lm.clip(u8, -1, 2)` ignores the bound that cannot bind and raises numpy's
OverflowError for one that would bind everything (`clip(u8, -5, -1)`).
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm

CMP = ["greater", "greater_equal", "less", "less_equal", "equal", "not_equal"]
SCALARS = [-1, -129, 3, 256, 2**31, 2**63, 2**64, -(2**63) - 1]


def _inputs(dtype: str):
    """Awkward layouts: 0-d, empty, a prime length, a negative-stride 2-D view."""
    base = np.arange(14, dtype=dtype).reshape(2, 7)
    return [np.array(7, dtype), np.zeros(0, dtype), base[0], base[:, ::-2]]


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int32", "uint64", "int64"])
@pytest.mark.parametrize("name", CMP)
def test_comparison_with_out_of_range_int_equals_numpy(name, dtype):
    for a in _inputs(dtype):
        A = lm.asarray(a)
        for c in SCALARS:
            for got, want in ((getattr(lm, name)(A, c), getattr(np, name)(a, c)),
                              (getattr(lm, name)(c, A), getattr(np, name)(c, a))):  # fmt: skip
                g = np.asarray(got.numpy())
                assert g.dtype == want.dtype and g.shape == want.shape, (name, dtype, c)
                np.testing.assert_array_equal(g, want, err_msg=f"{name}({dtype}, {c})")


@pytest.mark.parametrize("backend", ["llvm", "interp"], indirect=True)
def test_operators_and_fused_use(backend):
    u = np.array([0, 1, 5, 255, 7], np.uint8)
    U = lm.asarray(u)
    got = lm.where(U > -1, U, 0) + (U != -1) + (-1 < U) + (U == 256)
    want = np.where(u > -1, u, 0) + (u != -1) + (-1 < u) + (u == 256)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("backend", ["llvm", "interp"], indirect=True)
@pytest.mark.parametrize("bounds", [(-1, 2), (-1, 300), (3, 300), (-1, None), (None, 300),
                                    (-(2**70), 2**70)])  # fmt: skip
def test_clip_with_out_of_range_ints_equals_numpy(bounds, backend):
    u = np.array([0, 1, 5, 255, 3, 2, 9], np.uint8)[::-2]
    got = lm.clip(lm.asarray(u), *bounds).numpy()
    want = np.clip(u, *bounds)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(lm.asarray(u).clip(*bounds).numpy(), want)


@pytest.mark.parametrize("bounds", [(-5, -1), (300, 400), (2, -1), (None, -1), (256, None)])
def test_clip_bound_that_binds_everything_raises_like_numpy(bounds):
    u = np.array([0, 1, 255], np.uint8)
    with pytest.raises(OverflowError):
        np.clip(u, *bounds)
    with pytest.raises(OverflowError, match="out of bounds for uint8"):
        lm.clip(lm.asarray(u), *bounds)
