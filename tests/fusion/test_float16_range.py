"""Issue 38's float16 case: layernorm -> softmax -> mean -> sqrt -> log over 2**20 elements.

Triage: not a lost value but float16's range. The softmax denominator of 2**20 terms is about
1.7e6, far above float16's largest finite value (65504). A softmax that sums its exponentials
in float16 (numpy's `np.exp(x).sum()` on a float16 array, or the same composite written with
`lm.exp`/`lm.sum`) overflows to inf, every probability becomes 0 and the chain ends at
log(0) = -inf. lazymath's fused softmax, like torch's, accumulates the row in float32 and
rounds once on store, so the probabilities are the float16 subnormals they should be, their
mean is 2**-20 and the chain ends at log(sqrt(2**-20)) = -10 ln 2 = -6.93. Both answers are
"right" for the program that produced them; these tests pin which program lazymath runs for
each spelling, so a change of accumulation dtype cannot slip in silently.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm

N = 1 << 20


@pytest.fixture(params=["ascend910", "ascend910b"])
def spec(request):
    lm.init_device(0, spec=request.param)
    yield request.param
    lm.init_device(0, spec="ascend910")


def _x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(N).astype(np.float16)


def _layernorm(x):
    return (x - lm.mean(x)) / lm.sqrt(lm.var(x) + 1e-5)


def test_fused_softmax_accumulates_in_float32(backend, spec):
    x = _x()
    out = lm.log(lm.sqrt(lm.mean(lm.softmax(_layernorm(lm.asarray(x))))))
    got = np.asarray(out)
    assert got.dtype == np.float16
    # the float32-accumulating reference, rounded to float16 once per op as lazymath stores
    x32 = x.astype(np.float32)
    ln = ((x32 - x32.mean()) / np.sqrt(x32.var() + 1e-5)).astype(np.float16).astype(np.float32)
    e = np.exp(ln - ln.max())
    probs = (e / e.sum()).astype(np.float16)
    want = np.log(np.sqrt(probs.astype(np.float32).mean().astype(np.float16)))
    assert np.isfinite(got)
    np.testing.assert_allclose(got.astype(np.float64), float(want), rtol=1e-2)
    np.testing.assert_allclose(got.astype(np.float64), -10 * np.log(2.0), rtol=1e-2)


def test_float16_sum_of_exponentials_overflows_like_numpy(backend, spec):
    x = _x()
    e = lm.exp(lm.asarray(x))
    probs = e / lm.sum(e)
    # the reference backend runs numpy, which warns about the overflow it is asked to make
    with np.errstate(over="ignore", divide="ignore"):
        got = np.asarray(lm.log(lm.sqrt(lm.mean(probs))))
        total = np.asarray(lm.sum(e))
        en = np.exp(x)
        en_total = en.sum()
        want = np.log(np.sqrt((en / en_total).mean()))
    assert np.isinf(total) and np.isinf(en_total)
    assert got == want == -np.inf
