"""Creation functions, dtype handling and devices.

Protects: tensor/asarray from every kind of input (numpy arrays of each supported dtype, nested
lists, Python scalars, numpy scalars, __dlpack__ producers), numpy's default dtypes for each
creation function, deterministic seeded random numbers, clear TypeErrors for unsupported dtypes
and non-numeric data, and device placement (`.device`, mismatched devices rejected at the call).
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath import dtypes as dt

CONST_BUG = (
    "realizing a broadcast constant with no buffer input (lm.zeros/full/ones) fails: "
    "'kernel k0_copy: unbound variable pp' (llvm), KeyError Var('pp') (interp)"
)
SUPPORTED = ["float16", "float32", "float64", "int8", "int32", "int64", "bool", "complex64"]


@pytest.mark.parametrize("dtype", SUPPORTED)
def test_tensor_from_numpy_keeps_dtype_and_copies(backend, check, data, dtype):
    for shape in [(), (0,), (1,), (7, 13), (2, 0, 3)]:
        a = data.rand(shape, dtype)
        t = lm.tensor(a)
        assert t.shape == a.shape and t.dtype == a.dtype and t.ndim == a.ndim
        assert t.size == a.size and t.nbytes == a.nbytes
        check(t, a.copy())
    a = data.rand((3, 4), dtype)
    keep = a.copy()
    t = lm.asarray(a)
    a[...] = a[0, 0]  # later writes to the source do not reach the tensor
    check(t, keep)
    check(lm.tensor(keep.T), keep.T)  # a non-contiguous source
    check(lm.tensor(keep[::-1, ::2]), keep[::-1, ::2])


def test_tensor_from_python(backend, check):
    cases = [
        [[1, 2], [3, 4]],
        [1.0, 2],
        [True, False],
        [],
        [[[]]],
        3,
        2.5,
        True,
        [1 + 2j],
        (1, 2, 3),
        -(2**40),
    ]
    for obj in cases:
        check(lm.tensor(obj), np.asarray(obj))
    check(lm.tensor([1, 2], dtype="float16"), np.array([1, 2], np.float16))
    check(lm.tensor([1.7, -2.2], dtype=lm.int32), np.array([1.7, -2.2]).astype(np.int32))
    check(lm.tensor(np.float32(2.5)), np.asarray(np.float32(2.5)))
    check(lm.tensor(np.int8(-3)), np.asarray(np.int8(-3)))
    check(lm.tensor([np.float16(1), np.float16(2)]), np.array([1, 2], np.float16))


def test_tensor_of_tensor(backend, check):
    t = lm.tensor(np.arange(4, dtype=np.float32))
    assert lm.tensor(t) is t
    assert lm.asarray(t) is t
    check(lm.tensor(t, dtype="int32"), np.arange(4, dtype=np.int32))


class _DLPackOnly:
    """A foreign array that only speaks DLPack (delegating to a numpy array)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@pytest.mark.parametrize("dtype", ["float16", "float32", "int8", "int64", "bool"])
def test_tensor_from_dlpack(backend, check, data, dtype):
    a = data.rand((5, 3), dtype)
    check(lm.tensor(_DLPackOnly(a)), a)
    check(lm.asarray(_DLPackOnly(a[:, 1:])), a[:, 1:])
    keep = a.copy()
    t = lm.tensor(_DLPackOnly(a))
    a[...] = a[0, 0]
    check(t, keep)  # the tensor owns a copy, not the producer's memory


def test_tensor_from_array_protocol(backend, check):
    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return np.arange(6, dtype=np.int32).reshape(2, 3)

    check(lm.tensor(ArrayLike()), np.arange(6, dtype=np.int32).reshape(2, 3))


def test_unsigned_and_int16_keep_their_dtype(backend, check):
    """The Array API's integer dtypes: int16 and uint8..uint64 are kept and promote like numpy
    (uint8 + int8 -> int16, uint64 + 1 stays uint64)."""
    for src in (np.uint8, np.uint16, np.uint32, np.uint64, np.int16):
        info = np.iinfo(src)
        a = np.array([info.min, 0, 1, info.max], dtype=src)
        t = lm.tensor(a)
        check(t, a)
        check(t + 1, a + 1)
        check(t * t, a * a)
        check(t // 3, a // 3)
        check(lm.max(t), np.max(a))
        check(t.astype("float64"), a.astype(np.float64))
    check(lm.tensor(np.uint8([200])) + lm.tensor(np.int8([-3])),
          np.uint8([200]) + np.int8([-3]))  # fmt: skip


def test_unsupported_inputs_raise_type_error():
    with pytest.raises(TypeError, match="non-numeric"):
        lm.tensor(np.array(["a", "b"]))
    with pytest.raises(TypeError, match="non-numeric"):
        lm.tensor(np.array([object(), 1], dtype=object))
    with pytest.raises(TypeError):
        lm.tensor("hello")
    with pytest.raises(TypeError):
        lm.tensor([1, "a"])
    with pytest.raises(TypeError, match="tensor"):
        lm.tensor([[1, 2], [3]])  # ragged
    with pytest.raises(TypeError, match="unsupported dtype"):
        lm.tensor(np.zeros(2, np.longdouble))
    with pytest.raises(TypeError, match="unsupported dtype"):
        lm.tensor(np.zeros(2, "datetime64[s]"))
    with pytest.raises(TypeError, match="unsupported dtype float128|not a dtype"):
        lm.tensor([1, 2], dtype="float128")
    with pytest.raises(TypeError, match="not a dtype"):
        lm.zeros(3, dtype="nonsense")
    with pytest.raises(TypeError, match="unsupported dtype"):
        lm.ones(3, dtype=np.longdouble)
    t = lm.tensor(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="unsupported dtype"):
        t.astype(np.longdouble)
    with pytest.raises(TypeError, match="unsupported dtype"):
        t.astype(object)
    with pytest.raises(TypeError, match="unsupported operand"):
        t + "a"
    with pytest.raises(TypeError, match="unsupported operand"):
        lm.add(t, None)
    with pytest.raises(TypeError, match="unsupported operand"):
        t * {1: 2}


# ----------------------------------------------------------------------------- constants


@pytest.mark.parametrize("shape", [(), 0, 5, (0, 3), (7, 13), [2, 3, 1]], ids=repr)
def test_zeros_ones_full_empty(backend, check, shape, known_compiled_bug):
    check(lm.zeros(shape), np.zeros(shape, np.float32))
    check(lm.ones(shape), np.ones(shape, np.float32))
    check(lm.zeros(shape, dtype="int8"), np.zeros(shape, np.int8))
    check(lm.ones(shape, dtype=lm.bool_), np.ones(shape, bool))
    check(lm.full(shape, 2.5), np.full(shape, 2.5, np.float32))  # the Array API default float
    check(lm.full(shape, 7), np.full(shape, 7))
    check(lm.full(shape, True), np.full(shape, True))
    check(lm.full(shape, -3, dtype="float16"), np.full(shape, -3, np.float16))
    check(lm.full(shape, 2.9, dtype="int32"), np.full(shape, 2.9, dtype=np.int32))
    check(lm.full(shape, np.nan, dtype="float32"), np.full(shape, np.nan, np.float32))
    e = lm.empty(shape, dtype="int64")
    assert e.shape == np.empty(shape).shape and e.dtype == np.int64
    assert e.numpy().shape == e.shape


def test_like_functions(backend, check, data, known_compiled_bug):
    for dtype in ("float16", "int32", "bool"):
        a = data.rand((4, 3), dtype)
        t = lm.tensor(a)
        check(lm.zeros_like(t), np.zeros_like(a))
        check(lm.ones_like(t), np.ones_like(a))
        check(lm.full_like(t, 1), np.full_like(a, 1))
        check(lm.zeros_like(t, dtype="float64"), np.zeros_like(a, dtype=np.float64))
        check(lm.ones_like(t.T), np.ones_like(a.T))
    t = lm.tensor(np.zeros((2, 2), np.int32))
    check(lm.full_like(t, 2.7), np.full_like(np.zeros((2, 2), np.int32), 2.7))


def test_arange(backend, check):
    check(lm.arange(5), np.arange(5))
    check(lm.arange(0), np.arange(0))
    check(lm.arange(2, 11, 3), np.arange(2, 11, 3))
    check(lm.arange(10, 0, -3), np.arange(10, 0, -3))
    check(lm.arange(0.0, 1.0, 0.1), np.arange(0.0, 1.0, 0.1).astype(np.float32))
    check(lm.arange(10, step=5), np.arange(0, 10, 5))  # the step was ignored once
    check(lm.arange(1, 2, 0.25), np.arange(1, 2, 0.25, dtype=np.float32))
    check(lm.arange(5, 0, -2, dtype="int8"), np.arange(5, 0, -2, dtype=np.int8))
    check(lm.arange(0, 5, 1.5, dtype="float64"), np.arange(0, 5, 1.5))
    check(lm.arange(-3, 7, 4), np.arange(-3, 7, 4))
    check(lm.arange(5, dtype="float32"), np.arange(5, dtype=np.float32))
    check(lm.arange(3, 1), np.arange(3, 1))
    with pytest.raises(ValueError, match="step"):
        lm.arange(0, 5, 0)


def test_linspace(backend, check):
    f32 = np.float32  # the Array API default floating dtype
    check(lm.linspace(0, 1, 5), np.linspace(0, 1, 5, dtype=f32))
    check(lm.linspace(0, 1, 5, endpoint=False), np.linspace(0, 1, 5, endpoint=False, dtype=f32))
    check(lm.linspace(-2, 3, 1), np.linspace(-2, 3, 1, dtype=f32))
    check(lm.linspace(0, 1, 0), np.linspace(0, 1, 0, dtype=f32))
    check(lm.linspace(0, 1), np.linspace(0, 1, dtype=f32))
    check(lm.linspace(0, 1, 3, dtype="float64"), np.linspace(0, 1, 3))
    check(lm.linspace(0, 10, 7, dtype="float32"), np.linspace(0, 10, 7, dtype=np.float32))
    with pytest.raises(ValueError, match="linspace"):
        lm.linspace(0, 1, -1)


def test_broadcast_constant_realizes(backend, check, known_compiled_bug):
    """Minimal repro: a constant broadcast to a shape, realized with no buffer input."""
    check(lm.zeros((3,)), np.zeros(3, np.float32))


def test_eye(backend, check):
    check(lm.eye(3), np.eye(3, dtype=np.float32))
    check(lm.eye(3, 5), np.eye(3, 5, dtype=np.float32))
    check(lm.eye(4, 3, k=1), np.eye(4, 3, k=1, dtype=np.float32))
    check(lm.eye(3, k=-2, dtype="int8"), np.eye(3, k=-2, dtype=np.int8))
    check(lm.eye(0), np.eye(0, dtype=np.float32))


def test_random_is_deterministic(backend, check):
    for fn in (lm.random.rand, lm.random.randn):
        a = fn(4, 5, seed=1).numpy()
        b = fn((4, 5), seed=1).numpy()
        c = fn(4, 5, seed=2).numpy()
        assert a.shape == (4, 5) and a.dtype == np.float32
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
        h = fn(3, seed=1, dtype="float16")
        assert h.dtype == np.float16 and h.shape == (3,)
        assert fn(seed=0).shape == ()
        assert fn(0, 3, seed=0).shape == (0, 3)
    u = lm.random.rand(10000, seed=3).numpy()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    n = lm.random.randn(10000, seed=3).numpy()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
    check(lm.random.rand(3, seed=7) * 2, lm.random.rand(3, seed=7).numpy() * np.float32(2))


# ----------------------------------------------------------------------------- dtypes module


def test_dtype_objects_are_numpy_dtypes():
    assert lm.float16 == np.float16 and lm.float32 == np.dtype("float32")
    assert lm.int8 == np.int8 and lm.bool_ == np.bool_ and lm.complex64 == np.complex64
    for name in SUPPORTED:
        assert dt.as_dtype(name) == np.dtype(name)
        assert dt.as_dtype(np.dtype(name)) == np.dtype(name)
    assert dt.as_dtype("bool_") == np.bool_
    assert dt.as_dtype(float) == np.float64
    assert dt.as_dtype(int) == np.int64
    assert dt.as_dtype(bool) == np.bool_
    assert dt.as_dtype(np.float32) == np.float32


@pytest.mark.parametrize("bad", ["float128", object, "U4", "nope", "datetime64[s]"])
def test_as_dtype_rejects(bad):
    if isinstance(bad, str) and bad == "float128" and not hasattr(np, "float128"):
        pytest.skip("no float128 on this platform")
    with pytest.raises(TypeError, match="dtype"):
        dt.as_dtype(bad)


def test_result_type_follows_numpy():
    for a in SUPPORTED:
        for b in SUPPORTED:
            assert dt.result_type(np.dtype(a), np.dtype(b)) == np.result_type(a, b)
    assert dt.result_type(np.dtype("int8"), 1) == np.int8
    assert dt.result_type(np.dtype("float16"), 1.5) == np.float16
    assert dt.result_type(np.dtype("int32"), 1.5) == np.float64


# ----------------------------------------------------------------------------- devices


@pytest.fixture
def device_api():
    try:
        init = lm.init_device
        cur = lm.current_device
    except (AttributeError, ImportError) as e:
        pytest.skip(f"lm.init_device is not available yet: {e}")
    return init, cur


def test_default_device(backend, device_api):
    init, cur = device_api
    t = lm.tensor(np.zeros(3, np.float32))
    assert t.device is cur()
    assert str(t.device) == "npu:0"
    assert (t + 1).device is t.device
    assert lm.zeros(3).device is t.device
    assert init(0) is cur()  # asking again for the current device returns it
    assert "npu:0" in repr(t)


def test_mismatched_devices_raise_at_call(backend, device_api):
    from lazymath import runtime

    _, cur = device_api
    d0 = cur()
    a = lm.tensor(np.ones(3, np.float32))
    d1 = runtime.Device(1, "ascend910b")  # a second device, without closing the current one
    try:
        runtime.set_device(d1)
        b = lm.tensor(np.ones(3, np.float32))
        assert b.device is d1 and str(b.device) == "npu:1"
    finally:
        runtime.set_device(d0)
    for fn in (lm.add, lm.matmul, lm.maximum):
        with pytest.raises(ValueError, match="different devices"):
            fn(a, b)
    with pytest.raises(ValueError, match="different devices"):
        lm.concat([a, b])
    with pytest.raises(ValueError, match="different devices"):
        lm.where(a > 0, a, b)
    np.testing.assert_array_equal((a + a).numpy(), 2 * np.ones(3, np.float32))
    close = getattr(d1, "close", None)
    if close is not None:
        close()


def test_repr_shows_shape_dtype_state(backend):
    t = lm.tensor(np.zeros((2, 3), np.float16)) + 1
    r = repr(t)
    assert "(2, 3)" in r and "float16" in r and "lazy" in r
    t.realize()
    assert "realized" in repr(t)


def test_default_float_follows_numpy():
    """The float dtype numpy computes sqrt/true division in, for every supported input."""
    for d in dt.SUPPORTED:
        assert dt.default_float_for(d) == np.sqrt(np.zeros(1, d)).dtype, d
    assert dt.is_float(lm.float16) and dt.is_int(lm.int8) and dt.is_complex(lm.complex64)
    assert not dt.is_int(lm.bool_) and not dt.is_float(lm.int32)
