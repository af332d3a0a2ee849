"""Regression tests for the defects of issue 13 found by an outside fuzzer (one test per repro)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import lazymath as lm
from lazymath.fusion.memory import plan_memory


@pytest.fixture(params=["ascend910", "ascend910b"])
def spec(request):
    lm.init_device(0, spec=request.param)
    yield request.param
    lm.init_device(0, spec="ascend910")


# ----------------------------------------------------------------------------- defect 3


def test_memory_plan_releases_a_buffer_read_twice_once():
    """A kernel reading one intermediate through two inputs (x - max(x)) released its block
    twice, so two later buffers that are live together got the same arena bytes."""
    kernels = [
        ([], [(1, 20)]),
        ([(1, 20), (1, 20)], [(2, 20)]),  # reads buffer 1 twice; it dies here
        ([], [(3, 4)]),
        ([(3, 4)], [(4, 4)]),
        ([(4, 4), (3, 4)], [(5, 20)]),
    ]
    plan = plan_memory(kernels, {2, 5}, lambda k, i, o: False)
    a, b = plan.buffers[3], plan.buffers[4]
    assert a.offset + 64 <= b.offset or b.offset + 64 <= a.offset, (a, b)


def _log_softmax_and_softmax():
    a = lm.log_softmax(lm.asarray(np.array([20.81, 16.04, 7.70, 4.07, 7.27], np.float32)))
    b = lm.softmax(lm.asarray(np.ones((1, 5), np.float32)), axis=0)
    return a, b


def test_realize_order_does_not_change_log_softmax(backend, spec):
    x = np.array([20.81, 16.04, 7.70, 4.07, 7.27], np.float32)
    want = x - x.max() - np.log(np.exp(x - x.max()).sum())
    for order in itertools.permutations(range(2)):
        ts = _log_softmax_and_softmax()
        lm.realize(*[ts[i] for i in order])
        np.testing.assert_allclose(ts[0].numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ts[1].numpy(), np.ones((1, 5)), rtol=1e-6)


def test_sigmoid_softmax_concat_with_log_softmax(backend):
    """The issue's second instance: sigmoid(softmax(x)) concatenated, realized together with
    a log_softmax over axis 0, in every order."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y = rng.standard_normal((4, 5)).astype(np.float32)

    def np_softmax(v, axis):
        e = np.exp(v - v.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    s = 1 / (1 + np.exp(-np_softmax(x, -1)))
    want_c = np.concatenate([s, s], 0)
    want_l = y - y.max(0) - np.log(np.exp(y - y.max(0)).sum(0))
    for order in itertools.permutations(range(2)):
        sx = lm.sigmoid(lm.softmax(lm.asarray(x)))
        ts = (lm.concatenate([sx, sx], 0), lm.log_softmax(lm.asarray(y), axis=0))
        lm.realize(*[ts[i] for i in order])
        np.testing.assert_allclose(ts[0].numpy(), want_c, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ts[1].numpy(), want_l, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- defect 4


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (0,), (3, 0, 2)])
def test_zero_size_graph_with_a_cast(backend, shape, check):
    x = np.zeros(shape)
    check(lm.asarray(x).astype("float32") * 2, x.astype(np.float32) * 2)
    check(lm.exp(lm.asarray(x).astype("float16")) + 1, np.exp(x.astype(np.float16)) + 1)


# ----------------------------------------------------------------------------- defect 5


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_var_std_of_complex_are_real_like_numpy(backend, dtype, check):
    x = np.array([1 + 1j, -1 - 1j, 1j, -1j], dtype)
    check(lm.var(lm.asarray(x)), np.var(x))
    check(lm.std(lm.asarray(x)), np.std(x))
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((3, 7)) + 1j * rng.standard_normal((3, 7))).astype(dtype)
    for axis in (None, 0, 1):
        check(lm.var(lm.asarray(z), axis=axis, ddof=1), np.var(z, axis=axis, ddof=1))
        check(lm.std(lm.asarray(z), axis=axis, keepdims=True),
              np.std(z, axis=axis, keepdims=True))  # fmt: skip


# ----------------------------------------------------------------------------- defect 2


@pytest.mark.parametrize("shape", [(31, 8), (30, 8), (31, 4), (31, 2), (63, 2), (5, 1)])
@pytest.mark.parametrize("dtype", [np.bool_, np.int8])
def test_flip_of_small_rows_compiles(shape, dtype, spec, monkeypatch):
    """LLVM's loop vectorizer aborted the process (SIGABRT) on the reversed row copy of a flip
    of 2-, 4- or 8-byte rows; the copy loop is now kept away from the vectorizer."""
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    x = (np.arange(np.prod(shape)).reshape(shape) % 3).astype(dtype)
    for axis in (0, 1, (0, 1)):
        np.testing.assert_array_equal(lm.flip(lm.asarray(x), axis).numpy(), np.flip(x, axis))
