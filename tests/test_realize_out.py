"""`Tensor.realize(out=...)`: compute into the caller's array (issue 34), with clear errors."""

import importlib

import numpy as np
import pytest

import lazymath as lm
from lazymath import settings

RNG = np.random.default_rng(3434)


@pytest.fixture(params=["llvm", "interp"])
def backend(request):
    with settings.override(LAZYMATH_BACKEND=request.param):
        yield request.param


def _x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


CASES = {
    "elementwise": (lambda a, b: lm.relu(a * 2.0 + b), lambda a, b: np.maximum(a * 2 + b, 0),
                    (_x(7, 13), _x(13))),
    "reduce": (lambda a, b: lm.sum(a * b, axis=1), lambda a, b: (a * b).sum(1),
               (_x(11, 17), _x(17))),
    "matmul": (lambda a, b: a @ b + 1.0, lambda a, b: a @ b + 1, (_x(19, 23), _x(23, 5))),
    "view": (lambda a, b: (a + b).T[::-1], lambda a, b: (a + b).T[::-1], (_x(3, 4), _x(4))),
    "empty": (lambda a, b: a + b, lambda a, b: a + b, (_x(0, 3), _x(3))),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_realize_into_a_contiguous_array_writes_it_directly(case, preset, backend):
    fn, ref, arrays = CASES[case]
    ts = [lm.asarray(a) for a in arrays]
    want = ref(*arrays)
    out = np.full(want.shape, np.nan, want.dtype)
    t = fn(*ts)
    assert t.realize(out=out) is t
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-5, atol=1e-5)
    assert out.flags.writeable and not t.numpy().flags.writeable
    for _ in range(2):  # a loop reusing one buffer: same memory, new values
        ts = [lm.asarray(a * 3) for a in arrays]
        fn(*ts).realize(out=out)
        np.testing.assert_allclose(out, ref(*[a * 3 for a in arrays]), rtol=1e-5, atol=1e-4)


def test_strided_out_and_realized_tensors_are_copied_in():
    a = _x(6, 5)
    t = lm.asarray(a) * 2.0
    strided = np.zeros((6, 10), np.float32)[:, ::2]
    t.realize(out=strided)
    np.testing.assert_allclose(strided, a * 2, rtol=1e-6)
    again = np.zeros((6, 5), np.float32)
    t.realize(out=again)  # already realized: a copy, t keeps its buffer
    np.testing.assert_allclose(again, a * 2, rtol=1e-6)
    assert not np.shares_memory(again, t.numpy())


def test_direct_out_is_shared_with_the_tensor_like_torch_out():
    x = lm.asarray(_x(8))
    out = np.empty(8, np.float32)
    t = (x + 1.0).realize(out=out)
    assert np.shares_memory(t.numpy(), out)
    t.realize(out=out)  # into its own memory again: nothing to do
    np.testing.assert_allclose(out, x.numpy() + 1, rtol=1e-6)


def test_bad_out_arrays_are_clear_errors():
    x = lm.asarray(_x(4, 3))
    with pytest.raises(TypeError, match="must be a numpy array"):
        (x + 1.0).realize(out=[0.0] * 12)
    with pytest.raises(ValueError, match=r"out has shape \(3, 4\), the tensor \(4, 3\)"):
        (x + 1.0).realize(out=np.empty((3, 4), np.float32))
    with pytest.raises(TypeError, match="out has dtype float64, the tensor float32"):
        (x + 1.0).realize(out=np.empty((4, 3), np.float64))
    ro = np.empty((4, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        (x + 1.0).realize(out=ro)
    a = _x(4, 3)
    xa = lm.asarray(a, copy=False)
    with pytest.raises(ValueError, match="overlaps an input of the computation"):
        (xa.T.T * 2.0).realize(out=a)
    o = np.empty((4, 3), np.float32)
    t = (x * 2.0).realize(out=o)  # t now views o
    with pytest.raises(ValueError, match="overlaps the tensor's own"):
        t.realize(out=o[::-1])  # another view of the same memory: would scramble t


def test_out_stays_direct_once_the_distributed_hook_is_installed(monkeypatch):
    """lazymath.distributed installs its realize hook for the rest of the process when the first
    sharded tensor is made; graphs that read no shards keep writing straight into `out` (found
    when a distributed test ran earlier in the same pytest worker and this file's tests saw a
    copy instead of shared memory)."""
    from lazymath.distributed import api as dist_api

    realize_mod = importlib.import_module("lazymath.realize")  # the attribute is the function
    monkeypatch.setattr(realize_mod, "SHARDED", dist_api._Hooks())
    x = lm.asarray(_x(8))
    out = np.empty(8, np.float32)
    t = (x + 1.0).realize(out=out)
    assert np.shares_memory(t.numpy(), out)
    np.testing.assert_allclose(out, x.numpy() + 1, rtol=1e-6)
