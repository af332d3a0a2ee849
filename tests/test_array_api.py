"""The Python Array API standard (2024.12) as lazymath's namespace, by the standard's sections.

Protects: `__array_namespace__` / `__array_namespace_info__`, the data type functions (finfo,
iinfo, isdtype, result_type, can_cast against the standard's promotion table), the creation
functions' signatures and default dtypes (float32 is the default floating dtype), `copy=` and
`device=` keywords, the scalar conversions (implicit syncs), and DLPack both ways with numpy,
torch and JAX (zero-copy where the producer allows it, read-only and non-contiguous cases,
clear errors).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import lazymath as lm

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float32", "float64"]
COMPLEX = ["complex64", "complex128"]
ALL = ["bool", *INTS, *FLOATS, *COMPLEX]


# ----------------------------------------------------------------------------- namespace


def test_namespace_is_the_module():
    x = lm.ones(3)
    assert x.__array_namespace__() is lm
    assert x.__array_namespace__(api_version="2024.12") is lm
    with pytest.raises(ValueError, match="version"):
        x.__array_namespace__(api_version="1999.01")
    assert lm.__array_api_version__ == "2024.12"
    assert lm.newaxis is None and lm.pi == np.pi and lm.e == np.e
    assert np.isnan(lm.nan) and lm.inf == np.inf


def test_namespace_info():
    info = lm.__array_namespace_info__()
    caps = info.capabilities()
    assert set(caps) >= {"boolean indexing", "data-dependent shapes"}
    assert info.default_device() is lm.ones(1).device
    assert info.default_device() in info.devices()
    d = info.default_dtypes()
    assert d == {"real floating": lm.float32, "complex floating": lm.complex64,
                 "integral": lm.int64, "indexing": lm.int64}  # fmt: skip
    assert set(info.dtypes()) == set(ALL)
    assert set(info.dtypes(kind="signed integer")) == {"int8", "int16", "int32", "int64"}
    assert set(info.dtypes(kind=("bool", "complex floating"))) == {"bool", *COMPLEX}
    for name, dtype in info.dtypes().items():
        assert getattr(lm, name) == dtype


# ----------------------------------------------------------------------------- data types


@pytest.mark.parametrize("name", FLOATS + COMPLEX + ["float16"])
def test_finfo(name):
    f, n = lm.finfo(getattr(lm, name)), np.finfo(name)
    assert (f.bits, f.eps, f.max, f.min, f.smallest_normal) == (
        n.bits, float(n.eps), float(n.max), float(n.min), float(n.smallest_normal))  # fmt: skip
    assert isinstance(f.eps, float) and f.dtype == np.finfo(name).dtype
    assert lm.finfo(lm.zeros(2, dtype=name)).bits == n.bits


@pytest.mark.parametrize("name", INTS)
def test_iinfo(name):
    i, n = lm.iinfo(getattr(lm, name)), np.iinfo(name)
    assert (i.bits, i.min, i.max) == (n.bits, n.min, n.max)
    assert isinstance(i.max, int) and i.dtype == np.dtype(name)


def test_info_errors():
    with pytest.raises(TypeError, match="iinfo"):
        lm.finfo(lm.int32)
    with pytest.raises(TypeError, match="finfo"):
        lm.iinfo(lm.float32)
    with pytest.raises(TypeError, match="dtype"):
        lm.finfo("nonsense")


def test_isdtype():
    assert lm.isdtype(lm.int16, "signed integer") and not lm.isdtype(lm.uint8, "signed integer")
    assert lm.isdtype(lm.uint64, "integral") and lm.isdtype(lm.uint64, "numeric")
    assert not lm.isdtype(lm.bool, "numeric") and lm.isdtype(lm.bool, "bool")
    assert lm.isdtype(lm.complex64, ("real floating", "complex floating"))
    assert lm.isdtype(lm.float32, lm.float32) and not lm.isdtype(lm.float32, lm.float64)
    with pytest.raises(ValueError, match="kind"):
        lm.isdtype(lm.float32, "floating")


# the standard's promotion table (2024.12, "Type Promotion Rules"), the defined pairs
def _std_promote(a: str, b: str) -> str | None:
    order_i = ["int8", "int16", "int32", "int64"]
    order_u = ["uint8", "uint16", "uint32", "uint64"]
    if a == b:
        return a
    if "bool" in (a, b):
        return None
    if a in order_i and b in order_i:
        return max(a, b, key=order_i.index)
    if a in order_u and b in order_u:
        return max(a, b, key=order_u.index)
    if {a, b} <= set(order_i + order_u):
        u, i = (a, b) if a in order_u else (b, a)
        need = order_u.index(u) + 1  # a signed type one size up
        if need > 3:
            return None
        return order_i[max(need, order_i.index(i))]
    fl = {"float32": (4, False), "float64": (8, False), "complex64": (4, True),
          "complex128": (8, True)}  # fmt: skip
    if a in fl and b in fl:
        size = max(fl[a][0], fl[b][0])
        cplx = fl[a][1] or fl[b][1]
        return {(4, False): "float32", (8, False): "float64", (4, True): "complex64",
                (8, True): "complex128"}[(size, cplx)]  # fmt: skip
    return None


def test_result_type_and_can_cast_follow_the_table():
    for a in ALL:
        for b in ALL:
            want = _std_promote(a, b)
            da, db = getattr(lm, a), getattr(lm, b)
            if want is not None:
                assert lm.result_type(da, db) == np.dtype(want), (a, b)
                assert lm.result_type(lm.zeros(1, dtype=a), db) == np.dtype(want), (a, b)
                # and the operators compute in that dtype
                assert (lm.zeros(2, dtype=a) + lm.zeros(2, dtype=b)).dtype == want, (a, b)
            if want is not None:  # the standard's table: exactly its answer
                assert lm.can_cast(da, db) == (want == b), (a, b)
            else:  # a pair it leaves to the library: the promotion lazymath's operators use
                got = (lm.zeros(2, dtype=a) + lm.zeros(2, dtype=b)).dtype
                assert lm.can_cast(da, db) == (got == b), (a, b)
    # array-api-tests' test_can_cast demands these (mixed kinds, numpy's answers) ...
    assert lm.can_cast(lm.bool, lm.float64) and lm.can_cast(lm.int64, lm.float64)
    assert lm.can_cast(lm.bool, lm.int8) and lm.can_cast(lm.uint8, lm.float32)
    # ... but narrowing stays False, whatever the pair's kind
    assert not lm.can_cast(lm.complex64, lm.float64) and not lm.can_cast(lm.float32, lm.int64)
    assert not lm.can_cast(lm.uint64, lm.int64) and not lm.can_cast(lm.int8, lm.bool)
    assert lm.can_cast(lm.zeros(1, dtype="bool"), lm.float64)  # a tensor: its dtype
    with pytest.raises(TypeError, match="can_cast"):
        lm.can_cast("nope", lm.float64)
    assert lm.result_type(lm.int8, 1) == lm.int8  # Python scalars are weak
    assert lm.result_type(lm.float32, 1.5) == lm.float32
    assert lm.result_type(lm.float32, 1j) == lm.complex64
    assert lm.result_type(lm.bool, True) == lm.bool
    with pytest.raises(ValueError, match="at least one"):
        lm.result_type(1, 2.0)


# ----------------------------------------------------------------------------- creation


def test_creation_defaults_and_signatures(backend, check):
    assert lm.asarray(1.5).dtype == lm.float32 and lm.asarray([1, 2.5]).dtype == lm.float32
    assert lm.asarray(3).dtype == lm.int64 and lm.asarray([True]).dtype == lm.bool
    assert lm.asarray([1 + 2j]).dtype == lm.complex64
    assert lm.asarray(np.float64(1.5)).dtype == lm.float64  # arrays keep their dtype
    assert lm.asarray([[1.0]], dtype=lm.float64).dtype == lm.float64
    check(lm.arange(10, step=5), np.arange(0, 10, 5))
    check(lm.arange(7), np.arange(7))
    check(lm.arange(2.5), np.arange(2.5, dtype=np.float32))
    check(lm.arange(0, 1, 1 / 3), np.arange(0, 1, 1 / 3).astype(np.float32))
    check(lm.arange(10, 3), np.arange(10, 3))
    assert lm.arange(0, 10**6, 3).shape == (333334,)
    check(lm.full((2, 3), 7), np.full((2, 3), 7))
    check(lm.full((2,), True), np.full((2,), True))
    check(lm.full((2,), 1j), np.full((2,), 1j, np.complex64))
    check(lm.empty((0, 3)), np.zeros((0, 3), np.float32))
    check(lm.empty_like(lm.ones((2, 1), dtype="int16")), np.zeros((2, 1), np.int16))
    check(lm.zeros_like(lm.ones(3, dtype="uint8")), np.zeros(3, np.uint8))
    check(lm.full_like(lm.ones(3, dtype="int32"), 4), np.full(3, 4, np.int32))
    check(lm.eye(3, 4, k=1), np.eye(3, 4, k=1, dtype=np.float32))
    check(lm.linspace(0, 2, num=5, endpoint=False), np.linspace(0, 2, 5, False, dtype=np.float32))
    check(lm.linspace(0, 1j, num=3), np.linspace(0, 1j, 3).astype(np.complex64))
    with pytest.raises(ValueError, match="step"):
        lm.arange(0, 10, 0)
    with pytest.raises(TypeError, match="real number"):
        lm.arange(1j)
    with pytest.raises(TypeError, match="complex"):
        lm.full(2, 1j, dtype="float32")
    with pytest.raises(OverflowError):
        lm.full(2, 300, dtype="int8")


def test_device_keyword():
    dev = lm.__array_namespace_info__().default_device()
    for t in (lm.zeros(2, device=dev), lm.ones(2, device=dev), lm.arange(3, device=dev),
              lm.asarray([1], device=dev), lm.full(1, 2, device=dev), lm.eye(2, device=dev),
              lm.linspace(0, 1, 3, device=dev), lm.empty(1, device=dev)):  # fmt: skip
        assert t.device is dev
    x = lm.ones(2)
    assert x.to_device(dev) is x and x.to_device(str(dev)) is x
    with pytest.raises(ValueError, match="device"):
        lm.zeros(2, device="gpu:7")
    with pytest.raises(ValueError, match="device"):
        x.to_device(object())


def test_asarray_copy(backend):
    a = np.arange(6, dtype=np.float32)
    t = lm.asarray(a)  # copy=None copies host arrays
    a[0] = 100
    assert t.numpy()[0] == 0
    s = lm.asarray(a, copy=False)  # shares
    a[1] = 200
    assert s.numpy()[1] == 200 and not s.numpy().flags.writeable
    with pytest.raises(ValueError, match="copy"):
        lm.asarray(a[::2], copy=False)
    with pytest.raises(ValueError, match="copy"):
        lm.asarray(a, dtype="float64", copy=False)
    with pytest.raises(ValueError, match="copy"):
        lm.asarray([1.0, 2.0], copy=False)
    x = lm.ones(3)
    assert lm.asarray(x) is x and lm.asarray(x, copy=False) is x
    y = lm.asarray(x, copy=True)
    assert y is not x
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    with pytest.raises(ValueError, match="copy"):
        lm.asarray(x, dtype="float64", copy=False)
    assert lm.asarray(x, dtype="float64").dtype == lm.float64
    with pytest.raises(OverflowError):
        lm.asarray(2**70)


def test_asarray_large_python_float_rounds_to_inf(backend):
    """A Python float beyond float32's range becomes inf under the float32 default (IEEE rounding,
    torch.asarray's answer), not a TypeError: the Array API suite converts its scalars this way.
    3.4028235677973366e+38 is exactly float32's max + half an ulp, the first value that rounds to inf."""
    big = 3.4028235677973366e38
    assert lm.asarray(big).dtype == lm.float32
    np.testing.assert_array_equal(
        lm.asarray([big, -1e300, 1.5]).numpy(), np.array([np.inf, -np.inf, 1.5], np.float32)
    )
    assert lm.asarray(float(np.nextafter(big, 0))).numpy() == np.finfo(np.float32).max
    assert lm.asarray(1e300, dtype="float64").numpy() == 1e300
    assert lm.asarray(1e300 + 1j).numpy() == np.complex64(complex(np.inf, 1))
    x = lm.asarray(
        np.array([1.0, -2.0, 0.0])
    )  # float64 tensor beside the large float stays float64
    np.testing.assert_allclose(lm.atan2(x, big).numpy(), np.arctan2(x.numpy(), big), rtol=1e-15)
    with pytest.raises(OverflowError):
        lm.asarray(2**70)


def test_scalar_conversions(backend):
    t = lm.asarray([2.5])
    assert float(t) == 2.5 and int(t) == 2 and complex(t) == 2.5 and bool(t)
    assert bool(lm.asarray(0.0)) is False
    assert int(lm.asarray(7)) == 7 and [0, 1, 2][lm.asarray(1)] == 1
    with pytest.raises(TypeError, match="exactly one element"):
        float(lm.ones(2))
    with pytest.raises(TypeError, match="integer"):
        [1][lm.asarray(0.0)]
    with pytest.raises(OverflowError):
        int(lm.asarray(float("inf")))
    with pytest.raises(ValueError):
        int(lm.asarray(float("nan")))


# ----------------------------------------------------------------------------- DLPack


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint8", "int64", "bool",
                                   "complex64"])  # fmt: skip
def test_dlpack_numpy_both_ways(backend, dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((5, 7)) * 10).astype(dtype)
    t = lm.asarray(a) * 1 if dtype != "bool" else lm.asarray(a)  # a computed, realized result
    t.realize()
    assert t.__dlpack_device__() == (1, 0)
    b = np.from_dlpack(t)
    np.testing.assert_array_equal(b, a)
    assert np.shares_memory(b, t.numpy()) and not b.flags.writeable  # zero-copy, read-only
    c = np.from_dlpack(t, copy=True)
    assert not np.shares_memory(c, t.numpy())
    lazy = lm.asarray(a)[::-1, 1::2]  # a lazy, non-contiguous view: realized on export
    np.testing.assert_array_equal(np.from_dlpack(lazy), a[::-1, 1::2])
    u = lm.from_dlpack(a)
    np.testing.assert_array_equal(u.numpy(), a)
    assert np.shares_memory(u.numpy(), a)  # zero-copy import
    v = lm.from_dlpack(a, copy=True)
    assert not np.shares_memory(v.numpy(), a)
    w = lm.from_dlpack(a.T)  # non-contiguous: copied (copy=None)
    np.testing.assert_array_equal(w.numpy(), a.T)
    with pytest.raises(BufferError, match="contiguous"):
        lm.from_dlpack(a.T, copy=False)


def test_dlpack_legacy_consumer_and_errors():
    t = lm.arange(4).realize()
    cap = t.__dlpack__()  # legacy: a copy (the buffer is read-only)
    assert type(cap).__name__ == "PyCapsule"
    for mv in ({}, {"max_version": (0, 0)}):  # legacy with copy=False: the buffer, no copy
        assert type(t.__dlpack__(copy=False, **mv)).__name__ == "PyCapsule"
    with pytest.raises(BufferError, match="device"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError, match="__dlpack__"):
        lm.from_dlpack([1, 2])


class _LegacyProducer:
    """Forwards a legacy (unversioned) capsule, as an old consumer would request it."""

    def __init__(self, t, copy):
        self.t, self.copy = t, copy

    def __dlpack__(self, stream=None, **_):
        return self.t.__dlpack__(copy=self.copy)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


@pytest.mark.parametrize("shape_view", [((5, 7), np.s_[::-1, 1::2]), ((1,), np.s_[:]),
                                        ((0, 3), np.s_[:]), ((), ())])  # fmt: skip
def test_dlpack_legacy_copy_false_aliases_the_buffer(shape_view):
    shape, view = shape_view
    a = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    t = lm.asarray(a)[view]
    t = (t * 1.5).realize() if t.size else t.realize()
    got = np.from_dlpack(_LegacyProducer(t, False))
    np.testing.assert_array_equal(got, a[view] * 1.5)
    if t.size:  # zero-copy: the same memory, and it outlives the exporting handle
        assert np.shares_memory(got, t.numpy())
    copied = np.from_dlpack(_LegacyProducer(t, None))  # copy=None: a fresh buffer
    np.testing.assert_array_equal(copied, a[view] * 1.5)
    if t.size:
        assert not np.shares_memory(copied, t.numpy())
    del t
    np.testing.assert_array_equal(got, a[view] * 1.5)


def test_dlpack_torch_shares_memory(backend):
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = lm.from_dlpack(x)
    x[0, 0] = 42.0  # written through the producer, read through lazymath: shared
    assert t.numpy()[0, 0] == 42.0
    np.testing.assert_array_equal((t * 2).numpy(), x.numpy() * 2)
    y = torch.from_dlpack(lm.asarray(x.numpy()) + 1)
    assert torch.equal(y, x + 1)
    r = (t + 0).realize()
    z = torch.from_dlpack(r)
    assert z.data_ptr() == r.numpy().ctypes.data  # zero-copy export
    tt = lm.from_dlpack(x.T)  # non-contiguous torch view: copied
    np.testing.assert_array_equal(tt.numpy(), x.T.numpy())
    for td, ld in ((torch.int16, "int16"), (torch.uint8, "uint8"), (torch.bool, "bool"),
                   (torch.float64, "float64"), (torch.complex64, "complex64")):  # fmt: skip
        s = torch.ones(3, dtype=td)
        assert lm.from_dlpack(s).dtype == ld
        assert torch.from_dlpack(lm.ones(3, dtype=ld).realize()).dtype == td
    assert lm.asarray(x).dtype == lm.float32  # asarray takes DLPack producers


def test_dlpack_jax():
    jnp = pytest.importorskip("jax.numpy")
    j = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    t = lm.from_dlpack(j)
    np.testing.assert_array_equal(t.numpy(), np.asarray(j))
    back = jnp.from_dlpack((t * 3).realize())
    np.testing.assert_array_equal(np.asarray(back), np.asarray(j) * 3)


# ----------------------------------------------------------------------------- operators


def test_bitwise_operators(backend, check, data):
    for dtype in ("int8", "int32", "int64", "bool"):
        a, b = data.rand((7, 13), dtype, -50, 50), data.rand((7, 13), dtype, -50, 50)
        ta, tb = lm.asarray(a), lm.asarray(b)
        check(ta & tb, a & b)
        check(ta | tb, a | b)
        check(ta ^ tb, a ^ b)
        check(~ta, ~a)
        check(ta.T & 3 if dtype != "bool" else ta.T & True, a.T & (3 if dtype != "bool" else True))
    a = data.rand((5, 6), "int32", -100, 100)
    s = np.array([0, 1, 5, 31, 32, 40], np.int32)  # counts at and past the width: all out
    check(lm.asarray(a) << lm.asarray(s), np.left_shift(a, s))
    check(lm.asarray(a) >> lm.asarray(s), np.right_shift(a, s))
    check(1 << lm.asarray(s[:4]), 1 << s[:4])
    check(lm.asarray(a)[::-1] >> 2, a[::-1] >> 2)
    with pytest.raises(TypeError, match="bitwise_and"):
        lm.ones(2) & lm.ones(2)


def test_inplace_operators_rebind(backend, check):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = lm.asarray(a)
    y = x[1:]  # a view of the old node keeps its values
    x += 1
    x *= lm.asarray(np.float32([1, 2, 3, 4]))
    x -= 0.5
    x /= 2
    x **= 2
    want = (((a + 1) * np.float32([1, 2, 3, 4]) - 0.5) / 2) ** 2
    check(x, want)
    check(y, a[1:])
    i = lm.arange(6)
    i //= 4
    i %= 3
    i <<= 2
    i |= 1
    i ^= 3
    i &= 6
    i >>= 1
    k = np.arange(6)
    k //= 4
    k %= 3
    k <<= 2
    k |= 1
    k ^= 3
    k &= 6
    k >>= 1
    check(i, k)
    m = lm.asarray(np.eye(3, dtype=np.float32))
    m @= lm.asarray(np.full((3, 3), 2, np.float32))
    check(m, np.full((3, 3), 2, np.float32))
    with pytest.raises(TypeError, match="cannot be stored"):
        j = lm.arange(3)
        j += 0.5
    with pytest.raises(ValueError, match="shape"):
        z = lm.ones(3)
        z += lm.ones((2, 3))


SET_CASES = [
    (np.s_[1:3], "scalar"),
    (np.s_[:, 2:11:3], "array"),
    (np.s_[::-2, 4], "array"),
    (np.s_[..., None, 3], "scalar"),
    (np.s_[2], "array"),
    (np.s_[4:0:-3, 10:0:-4], "array"),
    (np.s_[:, :], "array"),
    (np.s_[3:3], "scalar"),
    (np.s_[-1, -1], "scalar"),
]


@pytest.mark.parametrize("idx,kind", SET_CASES, ids=[str(c[0]) for c in SET_CASES])
def test_setitem_basic_is_lazy_and_functional(backend, check, idx, kind):
    a = np.arange(60, dtype=np.float32).reshape(5, 12)
    x = lm.asarray(a) * 1
    before = x
    keep = x.node
    want = a.copy()
    region = want[idx].shape
    v = np.arange(np.prod(region), dtype=np.float32).reshape(region) - 100
    if kind == "scalar":
        x[idx] = -7.0
        want[idx] = -7.0
    else:
        x[idx] = lm.asarray(v)
        want[idx] = v
    assert x is before and (x.node is not keep or 0 in region)  # rebound to a new node
    assert not x.is_realized or (kind == "array" and region == a.shape)  # no realize
    check(x, want)
    check(lm.Tensor(keep), a)  # the old node is untouched


def test_setitem_masks_and_integer_arrays(backend, check):
    a = np.linspace(-3, 3, 35, dtype=np.float32).reshape(5, 7)
    x = lm.asarray(a)
    x[x < 0] = 0.0  # a mask with a scalar: lazy where()
    assert not x.is_realized
    b = a.copy()
    b[b < 0] = 0
    check(x, b)
    x[lm.asarray([0, 4]), 1:3] = lm.asarray(np.float32([[1, 2], [3, 4]]))  # realizes
    b[[0, 4], 1:3] = [[1, 2], [3, 4]]
    check(x, b)
    m = a > 1
    x[m] = lm.asarray(np.arange(m.sum(), dtype=np.float32))
    b[m] = np.arange(m.sum())
    check(x, b)
    i = lm.arange(5)
    i[1] = 2  # same kind only (as the in-place operators)
    check(i, np.array([0, 2, 2, 3, 4]))
    with pytest.raises(TypeError, match="cannot store"):
        i[1] = 2.0
    with pytest.raises(TypeError, match="cannot store"):
        i[1] = lm.asarray(2.5)
    with pytest.raises(ValueError, match="broadcast"):
        x[0] = lm.ones(3)
    with pytest.raises(IndexError, match="out of bounds"):
        x[9] = 1.0


def test_advanced_getitem(backend, check):
    a = np.arange(24, dtype=np.int32).reshape(4, 6)
    x = lm.asarray(a) + 0
    check(x[x % 3 == 0], a[a % 3 == 0])
    check(x[lm.asarray([3, 0, 3])], a[[3, 0, 3]])
    check(x[1:, lm.asarray([5, -1])], a[1:, [5, -1]])
    check(x[np.array([True, False, True, False])], a[np.array([True, False, True, False])])
    check(x[..., [0]], a[..., [0]])


# ----------------------------------------------------------------------------- fusion


NEW_UNARY = ["isnan", "isinf", "isfinite", "signbit", "trunc", "square", "log1p", "expm1", "log2",
             "log10", "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos", "atan"]  # fmt: skip
NEW_BINARY = ["copysign", "hypot", "logaddexp", "atan2"]


@pytest.fixture(params=["ascend910", "ascend910b"])
def spec(request):
    lm.init_device(0, spec=request.param)
    yield request.param
    lm.init_device(0, spec="ascend910")


def test_new_elementwise_functions_fuse_into_one_kernel(backend, check):
    a = np.linspace(1.0, 3.0, 7 * 13, dtype=np.float32).reshape(7, 13)
    x = lm.asarray(a)
    out = x
    want = a
    for name in ("log1p", "expm1", "log2", "sinh", "asinh", "atan", "cosh", "log10"):
        out = getattr(lm, name)(out)
        want = getattr(
            np, {"asinh": "arcsinh", "acosh": "arccosh", "atan": "arctan"}.get(name, name)
        )(want)
    out = lm.hypot(out, x) + lm.logaddexp(out, x) + lm.copysign(out, -x) + lm.atan2(out, x)
    want = np.hypot(want, a) + np.logaddexp(want, a) + np.copysign(want, -a) + np.arctan2(want, a)
    res = lm.where(lm.isfinite(out) & ~lm.signbit(out), out, lm.square(lm.trunc(out)))
    (k,) = lm.schedule(res).kernels  # one Vector kernel, no AI CPU detour
    assert "log1p" in k.ops and "hypot" in k.ops and "isfinite" in k.ops
    want = np.where(np.isfinite(want) & ~np.signbit(want), want, np.square(np.trunc(want)))
    check(res, want, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_new_functions_in_a_matmul_epilogue(backend, spec, check, dtype):
    """A Cube epilogue (910) or the Vector kernel after it (910B) lowers every new function."""
    rng = np.random.default_rng(1)
    a = rng.uniform(0.1, 0.5, (9, 16)).astype(dtype)
    w = rng.uniform(0.1, 0.5, (16, 5)).astype(dtype)
    p = lm.asarray(a) @ lm.asarray(w)
    pn = (a.astype(np.float32) @ w.astype(np.float32)).astype(dtype)
    tol = dict(rtol=2e-3, atol=2e-3) if dtype == "float16" else dict(rtol=1e-5, atol=1e-6)
    for name in NEW_UNARY:
        ref = getattr(
            np,
            {
                "asinh": "arcsinh",
                "acosh": "arccosh",
                "atanh": "arctanh",
                "asin": "arcsin",
                "acos": "arccos",
                "atan": "arctan",
            }.get(name, name),
        )
        x, xn = (p + 1, pn + 1) if name == "acosh" else (p, pn)
        check(getattr(lm, name)(x), ref(xn), **tol)
    for name in NEW_BINARY:
        ref = getattr(np, {"atan2": "arctan2"}.get(name, name))
        check(getattr(lm, name)(p, -p), ref(pn, -pn), **tol)


SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-30,
                    -1e-30, 88.0, -88.0, 1e30, 710.0], np.float64)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_new_functions_special_cases(backend, check, dtype):
    """The standard's special cases (NaN, +-inf, +-0, tiny and huge arguments, the edges of
    the domains) as numpy computes them, for every new function."""
    x = SPECIAL.astype(dtype)
    t = lm.asarray(x)
    with np.errstate(all="ignore"):
        for name in NEW_UNARY:
            ref = getattr(
                np,
                {
                    "asinh": "arcsinh",
                    "acosh": "arccosh",
                    "atanh": "arctanh",
                    "asin": "arcsin",
                    "acos": "arccos",
                    "atan": "arctan",
                }.get(name, name),
            )
            check(getattr(lm, name)(t), ref(x), rtol=2e-3 if dtype == "float16" else None)
        a, b = np.meshgrid(x, x)
        ta, tb = lm.asarray(a), lm.asarray(b)
        for name in NEW_BINARY:
            ref = getattr(np, {"atan2": "arctan2"}.get(name, name))
            check(getattr(lm, name)(ta, tb), ref(a, b), rtol=2e-3 if dtype == "float16" else None)


# ----------------------------------------------------------------------------- part 3


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_searching_sorting_sets(backend, check, data, dtype):
    a = data.rand((5, 7), dtype, -4, 4)
    x = lm.asarray(a)[::-1]  # a lazy, flipped view
    a = a[::-1]
    check(lm.any(x, axis=0), np.any(a, axis=0))
    check(lm.all(x, axis=1, keepdims=True), np.all(a, axis=1, keepdims=True))
    check(lm.any(lm.asarray(np.zeros((0,), dtype))), np.any(np.zeros((0,), dtype)))
    check(lm.all(lm.asarray(np.zeros((0,), dtype))), np.all(np.zeros((0,), dtype)))
    check(lm.count_nonzero(x), np.asarray(np.count_nonzero(a), np.int64))
    for t in (lm.nonzero(x),):
        for got, want in zip(t, np.nonzero(a)):
            check(got, want.astype(np.int64))
    if dtype != "bool":
        check(lm.sort(x, axis=0), np.sort(a, axis=0))
        check(lm.sort(x, descending=True), -np.sort(-a.astype(np.float64), axis=-1).astype(dtype))
        check(lm.argsort(x, axis=1), np.argsort(a, axis=1, kind="stable"))
        k = lm.argsort(x, descending=True).numpy()  # stable: ties keep their order
        assert (np.diff(np.take_along_axis(a, k, -1), axis=-1) <= 0).all()
        ties = np.take_along_axis(a, k, -1)
        assert all((np.diff(k[r][ties[r] == v]) > 0).all() for r in range(5) for v in ties[r])
        check(lm.cumulative_sum(x, axis=1), np.cumsum(a, axis=1))
        check(lm.cumulative_prod(x[:, :3], axis=0, include_initial=True),
              np.concatenate([np.ones((1, 3), np.cumprod(a[:, :3], 0).dtype),
                              np.cumprod(a[:, :3], 0)]))  # fmt: skip
        s = np.sort(a.ravel())
        check(lm.searchsorted(lm.asarray(s), x, side="right"), np.searchsorted(s, a, "right"))
    u = lm.unique_all(x)
    v, i, inv, c = np.unique(a, return_index=True, return_inverse=True, return_counts=True)
    check(u.values, v)
    check(u.indices, i.astype(np.int64))
    check(u.inverse_indices, inv.reshape(a.shape).astype(np.int64))
    check(u.counts, c.astype(np.int64))
    check(lm.unique_values(x), v)
    check(lm.unique_counts(x).counts, c.astype(np.int64))
    check(lm.isin(x, lm.asarray(a[0])), np.isin(a, a[0]))
    check(lm.isin(x, lm.asarray(a[0]), invert=True), ~np.isin(a, a[0]))


def test_manipulation_functions(backend, check, data):
    a = data.rand((3, 5), "float32")
    x = lm.asarray(a).T  # non-contiguous
    a = a.T
    check(lm.moveaxis(lm.asarray(np.zeros((2, 3, 4))), 0, -1), np.zeros((3, 4, 2)))
    check(lm.tile(x, (2, 1, 3)), np.tile(a, (2, 1, 3)))
    check(lm.repeat(x, 3, axis=1), np.repeat(a, 3, axis=1))
    check(lm.repeat(x, lm.asarray([1, 0, 2, 1, 1]), axis=0), np.repeat(a, [1, 0, 2, 1, 1], 0))
    check(lm.roll(x, (2, -1), axis=(0, 1)), np.roll(a, (2, -1), (0, 1)))
    check(lm.roll(x, 7), np.roll(a, 7))
    check(lm.diff(x, axis=0), np.diff(a, axis=0))
    check(lm.diff(x, n=2, prepend=lm.asarray(a[:, :1])), np.diff(a, 2, prepend=a[:, :1]))
    check(lm.tril(x), np.tril(a))
    check(lm.triu(x, k=2), np.triu(a, 2))
    for got, want in zip(lm.unstack(x, axis=1), [a[:, i] for i in range(3)]):
        check(got, want)
    for got, want in zip(lm.broadcast_arrays(x, lm.ones((1, 3))), np.broadcast_arrays(a, 1)):
        check(got, want if got.dtype == want.dtype else want.astype(np.float32))
    gx, gy = lm.meshgrid(lm.arange(3), lm.arange(4))
    wx, wy = np.meshgrid(np.arange(3), np.arange(4))
    check(gx, wx)
    check(gy, wy)
    gi = lm.meshgrid(lm.arange(3), lm.arange(4), indexing="ij")
    check(gi[0], np.meshgrid(np.arange(3), np.arange(4), indexing="ij")[0])
    check(lm.take(x, lm.asarray([4, 0, 0]), axis=0), a[[4, 0, 0]])
    idx = np.argsort(a, axis=0)
    check(lm.take_along_axis(x, lm.asarray(idx), axis=0), np.take_along_axis(a, idx, 0))
    check(lm.matrix_transpose(x), a.T)
    check(lm.concat([x, x], axis=None), np.concatenate([a, a], axis=None))
    check(lm.clip(x, min=0.2, max=0.5), np.clip(a, 0.2, 0.5))
    check(lm.var(x, correction=1), np.var(a, ddof=1))
    check(lm.sum(lm.asarray(np.uint8([200, 100])), dtype=lm.uint16), np.uint16(300))
    check(lm.sum(lm.asarray(np.uint8([200, 100])), dtype=lm.uint8), np.uint8(44))  # wraps
    check(
        lm.prod(lm.asarray(np.int8([100, 3])), dtype=lm.int8),
        np.prod(np.int8([100, 3]), dtype=np.int8),
    )
    v = np.float32([1.0, -2.0, 0.0])
    check(lm.nextafter(lm.asarray(v), 3.0), np.nextafter(v, np.float32(3.0)))
    check(lm.nextafter(-1, lm.asarray(v)), np.nextafter(np.float32(-1), v))
    u8 = np.uint8([[200, 7], [3, 255]])
    check(lm.vecdot(lm.asarray(u8), lm.asarray(u8)), np.sum(u8 * u8, axis=-1, dtype=np.uint8))
    check(lm.logical_xor(x > 0.5, x < 0.7), np.logical_xor(a > 0.5, a < 0.7))
    with pytest.raises(ValueError, match="axis"):
        lm.cumulative_sum(x)
    with pytest.raises(ValueError, match="0-d"):
        lm.nonzero(lm.asarray(1.0))
    with pytest.raises(IndexError, match="take"):
        lm.take(x, lm.asarray([9]), axis=0)


def test_linalg(backend, check, data):
    rng = np.random.default_rng(3)
    m = rng.standard_normal((2, 4, 4)).astype(np.float32) + 4 * np.eye(4, dtype=np.float32)
    x = lm.asarray(m)
    spd = m @ m.transpose(0, 2, 1)
    tol = dict(rtol=1e-4, atol=1e-4)
    check(lm.linalg.matmul(x, x), m @ m, **tol)
    check(
        lm.linalg.tensordot(x, x, axes=([1, 2], [2, 1])),
        np.tensordot(m, m, ([1, 2], [2, 1])),
        **tol,
    )
    check(lm.vecdot(x, x, axis=1), np.sum(m * m, axis=1), **tol)
    check(lm.linalg.outer(x[0, 0], x[1, 1]), np.outer(m[0, 0], m[1, 1]))
    for k in (-2, 0, 1, 3, 5):
        check(lm.linalg.diagonal(x, offset=k), np.diagonal(m, k, -2, -1).copy())
    check(lm.linalg.trace(x), np.trace(m, axis1=-2, axis2=-1), **tol)
    for o in (1, 2, 0, np.inf, -np.inf, 3):
        check(lm.linalg.vector_norm(x, axis=-1, ord=o), np.linalg.norm(m, ord=o, axis=-1), **tol)
    for o in ("fro", 1, -1, np.inf, 2, "nuc"):
        check(lm.linalg.matrix_norm(x, ord=o), np.linalg.norm(m, ord=o, axis=(-2, -1)), **tol)
    check(lm.linalg.inv(x), np.linalg.inv(m), **tol)
    check(lm.linalg.det(x), np.linalg.det(m), **tol)
    check(lm.linalg.solve(x, x[:, :, :2]), np.linalg.solve(m, m[:, :, :2]), **tol)
    check(lm.linalg.cholesky(lm.asarray(spd)), np.linalg.cholesky(spd), **tol)
    check(lm.linalg.eigvalsh(lm.asarray(spd)), np.linalg.eigvalsh(spd), **tol)
    check(lm.linalg.svdvals(x), np.linalg.svd(m, compute_uv=False), **tol)
    check(lm.linalg.matrix_power(x, 3), np.linalg.matrix_power(m, 3), **tol)
    check(lm.linalg.matrix_power(x, 0), np.broadcast_to(np.eye(4, dtype=np.float32), m.shape))
    q, r = lm.linalg.qr(x)
    check(q @ r, m, **tol)
    sign, logdet = lm.linalg.slogdet(x)
    check(sign * lm.exp(logdet), np.linalg.det(m), **tol)
    assert sign.dtype == logdet.dtype == x.dtype
    check(lm.linalg.cross(x[0, :3, :3], x[1, :3, :3]), np.cross(m[0, :3, :3], m[1, :3, :3]), **tol)
    assert lm.linalg.matrix_rank(x).dtype == lm.int64
    with pytest.raises(TypeError, match="floating"):
        lm.linalg.inv(lm.asarray(np.eye(2, dtype=np.int32)))


# ----------------------------------------------------------------------------- fft extension


def test_fft_extension(backend, check):
    """fftn/ifftn/rfftn/irfftn/hfft/ihfft/fftshift/ifftshift/fftfreq/rfftfreq against
    numpy.fft: the standard's signatures and dtypes, s/axes/n crop and pad, every norm, a
    non-contiguous input. llvm compiles kernels per DFT length and shape: it runs three of
    the cases (the interpreter runs the same lowered kernels for all of them)."""
    rng = np.random.default_rng(5)
    c = (rng.standard_normal((2, 3, 5)) + 1j * rng.standard_normal((2, 3, 5))).astype("complex64")
    r = rng.standard_normal((3, 5)).astype("float32")
    x, xr = lm.asarray(c), lm.asarray(r)
    tol = dict(rtol=1e-4, atol=1e-4)
    cases = [
        (lm.fft.fftn(x), np.fft.fftn(c)),
        (lm.fft.ifftn(x, s=[2, 5], axes=[2, 0], norm="ortho"),
         np.fft.ifftn(c, s=[2, 5], axes=[2, 0], norm="ortho")),
        (lm.fft.fftn(x, axes=[1], norm="forward"), np.fft.fftn(c, axes=[1], norm="forward")),
        (lm.fft.rfftn(xr.T), np.fft.rfftn(r.T)),  # non-contiguous
        (lm.fft.rfftn(xr, s=[2, 5], axes=[0, 1], norm="forward"),
         np.fft.rfftn(r, s=[2, 5], axes=[0, 1], norm="forward")),
        (lm.fft.irfftn(x), np.fft.irfftn(c)),
        (lm.fft.irfftn(x, s=[-1, 5], axes=[0, 2], norm="ortho"),
         np.fft.irfftn(c, s=[2, 5], axes=[0, 2], norm="ortho")),
        (lm.fft.hfft(x), np.fft.hfft(c)),
        (lm.fft.hfft(x, n=5, axis=1, norm="ortho"), np.fft.hfft(c, n=5, axis=1, norm="ortho")),
        (lm.fft.ihfft(xr), np.fft.ihfft(r)),
        (lm.fft.ihfft(xr, n=4, axis=0, norm="forward"),
         np.fft.ihfft(r, n=4, axis=0, norm="forward")),
    ]  # fmt: skip
    for got, want in cases if backend != "llvm" else [cases[i] for i in (2, 7, 9)]:
        want = want.astype("complex64" if want.dtype.kind == "c" else "float32")
        assert got.dtype == want.dtype and got.shape == want.shape
        check(got, want, **tol)
    assert lm.fft.fftn(lm.asarray(c.astype("complex128"))).dtype == lm.complex128
    assert lm.fft.hfft(lm.asarray(c.astype("complex128"))).dtype == lm.float64
    for axes in (None, 1, (0, 2), ()):
        check(lm.fft.fftshift(x, axes=axes), np.fft.fftshift(c, axes=axes))
        check(lm.fft.ifftshift(x[:, ::-1], axes=axes), np.fft.ifftshift(c[:, ::-1], axes=axes))
    for n, d in ((1, 1.0), (6, 0.5), (7, 2.0)):
        check(lm.fft.fftfreq(n, d=d), np.fft.fftfreq(n, d).astype("float32"))
        check(lm.fft.rfftfreq(n, d=d, dtype=lm.float64), np.fft.rfftfreq(n, d))
    assert lm.fft.fftfreq(4, device=lm.ones(1).device).dtype == lm.float32
    with pytest.raises(TypeError, match="real floating"):
        lm.fft.fftfreq(4, dtype=lm.int32)
    with pytest.raises(ValueError, match="differ in length"):
        lm.fft.fftn(x, s=[2], axes=[0, 1])
    with pytest.raises(TypeError, match="real"):
        lm.fft.ihfft(x)


# ----------------------------------------------------------------------------- scan/sort kernels


def _desc_order(a, ax):
    """numpy's stable descending argsort (NaN first, ties by index) as array_api defines it."""
    idx = np.argsort(np.flip(a, ax), axis=ax, kind="stable")
    return (a.shape[ax] - 1 - np.flip(idx, ax)).astype(np.int64)


@pytest.mark.parametrize(
    "dtype,preset",
    [(d, "ascend910") for d in ("float32", "int32", "float16", "int64", "int8", "bool")]
    + [("float32", "ascend910b"), ("int64", "ascend910b")],  # the smaller UB, the widest rows
    indirect=["preset"],
)
def test_scan_sort_search_kernels(backend, preset, check, dtype):
    """cumulative_sum/prod, sort/argsort (ascending, descending, stable) and searchsorted run
    as Vector kernels (no AI CPU kernel in the schedule) and equal numpy exactly: NaN, -0.0,
    ties, awkward shapes (1, primes, an empty axis), flipped and transposed inputs, every
    axis. (llvm: one shape per dtype; it compiles a kernel per shape.)"""
    rng = np.random.default_rng(7)
    shapes = [(3, 13), (1, 5, 2), (0, 4), (7,)] if backend != "llvm" else [(3, 13)]
    for shape in shapes:
        a = rng.integers(-3, 4, shape).astype(dtype)
        if dtype.startswith("float") and a.size > 4:
            a.flat[[0, 3, 4]] = [np.nan, -0.0, np.nan]
        x = lm.asarray(a)
        if a.ndim == 2:
            x, a = x[::-1].T, a[::-1].T  # flipped and transposed: not contiguous
        for ax in range(a.ndim):
            if dtype != "bool":
                check(lm.sort(x, axis=ax), np.sort(a, axis=ax, kind="stable"))
                check(lm.sort(x, axis=ax, descending=True), np.take_along_axis(
                    a, _desc_order(a, ax), ax))  # fmt: skip
            check(lm.argsort(x, axis=ax), np.argsort(a, axis=ax, kind="stable").astype("int64"))
            check(lm.argsort(x, axis=ax, descending=True), _desc_order(a, ax))
            if dtype != "float16":  # (numpy's float16 cumsum rounds differently per step)
                acc = lm.sum(lm.zeros((1,), dtype)).dtype
                check(lm.cumulative_sum(x, axis=ax), np.cumsum(a, axis=ax, dtype=acc))
                check(lm.cumulative_prod(x, axis=ax, dtype=acc, include_initial=True),
                      np.concatenate([np.ones(a.shape[:ax] + (1,) + a.shape[ax + 1:], acc),
                                      np.cumprod(a, axis=ax, dtype=acc)], axis=ax))  # fmt: skip
        if dtype != "bool":
            s = np.sort(a.ravel())
            for side in ("left", "right"):
                check(lm.searchsorted(lm.asarray(s), x, side=side),
                      np.searchsorted(s, a, side).astype("int64"))  # fmt: skip
    x = lm.asarray(rng.integers(-3, 4, (4, 9)).astype(dtype))
    for out in (lm.sort(x) if dtype != "bool" else x, lm.argsort(x, descending=True),
                lm.cumulative_sum(x, axis=0), lm.searchsorted(lm.sort(x[0]), x)):  # fmt: skip
        assert "aicpu" not in [k.unit for k in lm.schedule(out).kernels]
    if dtype == "float32":
        assert "bitonic sorting network" in str(lm.explain(lm.argsort(x)))


def test_scan_sort_host_fallbacks(backend, check):
    """Dtypes without Vector instructions and rows longer than the bitonic kernel's UB row run
    numpy on the AI CPU, with the same results."""
    from lazymath import sorting

    a = np.random.default_rng(8).standard_normal((2, sorting.SORT_MAX + 3))
    x = lm.asarray(a)
    check(lm.sort(x, axis=1), np.sort(a, axis=1))
    check(lm.argsort(lm.astype(x, lm.float32), descending=True),
          _desc_order(a.astype("float32"), 1))  # fmt: skip
    check(lm.cumulative_sum(x, axis=1), np.cumsum(a, axis=1))
    u = np.array([3, 1, 2, 1], np.uint16)
    check(lm.cumulative_sum(lm.asarray(u)), np.cumsum(u, dtype=np.uint64))
    check(lm.searchsorted(lm.asarray(np.sort(a[0])), x[1]), np.searchsorted(np.sort(a[0]), a[1]))


# ----------------------------------------------------------------------------- standard-only code
# Functions written only against the standard (as array_api_compat users write them): the
# namespace comes from the data, nothing names numpy or lazymath.


def _standardize_softmax(x):
    xp = x.__array_namespace__()
    mu = xp.mean(x, axis=0, keepdims=True)
    sd = xp.std(x, axis=0, correction=1, keepdims=True)
    z = (x - mu) / xp.where(sd == 0, xp.ones_like(sd), sd)
    z = z - xp.max(z, axis=1, keepdims=True)
    e = xp.exp(z)
    return e / xp.sum(e, axis=1, keepdims=True)


def _logistic_regression(x, y, steps=5, lr=0.5):
    """Gradient descent on the mean log loss; returns the weights, the loss, the accuracy."""
    xp = x.__array_namespace__()
    n, d = x.shape
    xb = xp.concat([x, xp.ones((n, 1), dtype=x.dtype)], axis=1)
    w = xp.zeros((d + 1,), dtype=x.dtype)
    for _ in range(steps):
        p = 1 / (1 + xp.exp(-(xb @ w)))
        w = w - lr * (xp.matrix_transpose(xb) @ (p - y)) / n
    t = xb @ w
    loss = xp.mean(xp.logaddexp(xp.zeros_like(t), t) - y * t)
    acc = xp.mean(xp.astype((t > 0) == (y > 0.5), x.dtype))
    return w, loss, acc


def _kmeans_step(x, centers):
    """One Lloyd step: nearest center per point (argmin), new centers as one-hot means."""
    xp = x.__array_namespace__()
    d2 = xp.sum((x[:, None, :] - centers[None, :, :]) ** 2, axis=-1)
    label = xp.argmin(d2, axis=1)
    k = centers.shape[0]
    onehot = xp.astype(label[:, None] == xp.arange(k)[None, :], x.dtype)
    counts = xp.sum(onehot, axis=0)
    new = (xp.matrix_transpose(onehot) @ x) / xp.maximum(counts, 1)[:, None]
    return label, new, xp.cumulative_sum(counts)


def _pca_lstsq(x, y):
    """Top-2 principal directions (eigh of the covariance, sorted descending) and the
    least-squares fit of y by linalg.solve of the normal equations."""
    xp = x.__array_namespace__()
    xc = x - xp.mean(x, axis=0)
    cov = xp.matrix_transpose(xc) @ xc / (x.shape[0] - 1)
    vals, vecs = xp.linalg.eigh(cov)
    order = xp.argsort(-vals)  # (numpy 2.4's argsort has no descending=)
    top = xp.take(vecs, order[:2], axis=1)
    top = top * xp.sign(xp.sum(top, axis=0))  # fix the eigenvectors' signs
    beta = xp.linalg.solve(xp.matrix_transpose(x) @ x, xp.matrix_transpose(x) @ y)
    return xp.flip(xp.sort(vals)), top, beta


def test_standard_only_pipelines_match_numpy(backend, check):
    """Standardize + softmax, logistic regression by gradient descent, a k-means step, PCA and
    a least-squares solve, written only against the standard, on numpy and on lazymath. (llvm
    runs the regression only: it compiles every kernel; interp runs the same lowered kernels
    for all of them.)"""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((37, 5)).astype(np.float32) * np.float32([1, 2, 0.5, 3, 1])
    yv = (a @ np.float32([1, -2, 0.5, 0, 1]) > 0).astype(np.float32)
    x, y = lm.asarray(a), lm.asarray(yv)
    tol = dict(rtol=1e-4, atol=1e-5)
    # the regression's first step multiplies by lm.zeros: a matmul operand made of constants
    # alone (it raised NeedMaterialize on the compiled backends)
    for got, want in zip(_logistic_regression(x, y, steps=2), _logistic_regression(a, yv, 2)):
        check(got, np.asarray(want, np.float32), **tol)
    if backend == "llvm":
        return
    check(_standardize_softmax(x), _standardize_softmax(a), **tol)
    c0 = a[[0, 7, 19]]
    for got, want in zip(_kmeans_step(x, lm.asarray(c0)), _kmeans_step(a, c0)):
        check(got, np.asarray(want, got.dtype), **tol)
    for got, want in zip(_pca_lstsq(x, y), _pca_lstsq(a, yv)):
        check(got, want, rtol=1e-3, atol=1e-4)


def test_setitem_python_scalars_are_weak(check):
    """A Python scalar stores into any tensor whose kind holds it (int into uint8, complex into
    complex64: the official suite's asarray test writes such values); out of range or of a
    higher kind raises."""
    x = lm.asarray(np.array([1, 2], np.uint8))
    x[0] = 0
    check(x, np.array([0, 2], np.uint8))
    with pytest.raises(OverflowError):
        x[0] = 300
    with pytest.raises(TypeError, match="float"):
        x[1] = 2.5
    c = lm.asarray(np.array([1, 2], np.complex64))
    c[1] = 1j
    check(c, np.array([1, 1j], np.complex64))
    f = lm.asarray(np.float32([1, 2]))
    f[0], f[1] = 3, True
    check(f, np.float32([3, 1]))
    check(lm.clip(f, 1.5, 2.0), np.float32([2, 1.5]))  # positional min, max as numpy
    check(lm.clip(f, max=2.0), np.float32([2, 1]))


@pytest.mark.parametrize("dtype", ["int16", "uint8", "uint16", "uint32", "uint64"])
def test_sort_and_search_widen_small_and_unsigned_ints(backend, check, dtype):
    """int16 and unsigned values sort and search in a wider signed dtype that keeps their order
    (the bitonic kernel holds int8/int32/int64): extremes of the dtype included; uint64 has
    no wider dtype and runs numpy on the AI CPU."""
    info = np.iinfo(dtype)
    a = np.array([[info.max, 0, 7, info.min, 7, info.max - 1, 1]], dtype)
    x = lm.asarray(a)
    check(lm.sort(x), np.sort(a, kind="stable"))
    check(lm.argsort(x, descending=True), _desc_order(a, 1))
    s = np.sort(a[0])
    check(lm.searchsorted(lm.asarray(s), x, side="right"), np.searchsorted(s, a, "right"))
    if dtype != "uint64":
        assert "bitonic_sort" in [k.ops[0] for k in lm.schedule(lm.sort(x)).kernels]


# ----------------------------------------------------------------------------- the standard's names

# every name of the 2024.12 standard's namespace and of its linalg and fft extensions (from the
# standard's own function lists); lazymath's extras are pinned by tests/test_namespace.py
STANDARD_NAMES = """
abs acos acosh add all any arange argmax argmin argsort asarray asin asinh astype atan
atan2 atanh bitwise_and bitwise_invert bitwise_left_shift bitwise_or bitwise_right_shift
bitwise_xor broadcast_arrays broadcast_to can_cast ceil clip concat conj copysign cos
cosh count_nonzero cumulative_prod cumulative_sum diff divide e empty empty_like equal
exp expand_dims expm1 eye finfo flip floor floor_divide from_dlpack full full_like
greater greater_equal hypot iinfo imag inf isdtype isfinite isinf isnan less less_equal
linspace log log10 log1p log2 logaddexp logical_and logical_not logical_or logical_xor
matmul matrix_transpose max maximum mean meshgrid min minimum moveaxis multiply nan
negative newaxis nextafter nonzero not_equal ones ones_like permute_dims pi positive pow
prod real reciprocal remainder repeat reshape result_type roll round searchsorted sign
signbit sin sinh sort sqrt square squeeze stack std subtract sum take take_along_axis
tan tanh tensordot tile tril triu trunc unique_all unique_counts unique_inverse
unique_values unstack var vecdot where zeros zeros_like
""".split()
LINALG_NAMES = """
cholesky cross det diagonal eigh eigvalsh inv matmul matrix_norm matrix_power
matrix_rank matrix_transpose outer pinv qr slogdet solve svd svdvals tensordot trace
vecdot vector_norm
""".split()
FFT_NAMES = """
fft fftfreq fftn fftshift hfft ifft ifftn ifftshift ihfft irfft irfftn rfft rfftfreq
rfftn
""".split()
STANDARD_DTYPES = ["bool", *INTS, *FLOATS, *COMPLEX]
ARRAY_NAMES = """
dtype device mT ndim shape size T to_device __array_namespace__ __dlpack__ __dlpack_device__
__abs__ __add__ __and__ __bool__ __complex__ __eq__ __float__ __floordiv__ __ge__ __getitem__
__gt__ __index__ __int__ __invert__ __le__ __lshift__ __lt__ __matmul__ __mod__ __mul__ __ne__
__neg__ __or__ __pos__ __pow__ __rshift__ __setitem__ __sub__ __truediv__ __xor__ __radd__
__rsub__ __rmul__ __rtruediv__ __rfloordiv__ __rmod__ __rpow__ __rmatmul__ __rand__ __ror__
__rxor__ __rlshift__ __rrshift__ __iadd__ __isub__ __imul__ __itruediv__ __ifloordiv__ __imod__
__ipow__ __imatmul__ __iand__ __ior__ __ixor__ __ilshift__ __irshift__
""".split()


def test_every_name_of_the_standard_is_there():
    """The namespace, its dtypes, the linalg and fft extensions and the array object carry every
    name the standard (2024.12) lists: the part of 'Done when' that the namespace pin does not
    check by itself."""
    for names, where in ((STANDARD_NAMES + STANDARD_DTYPES, lm), (LINALG_NAMES, lm.linalg),
                         (FFT_NAMES, lm.fft), (ARRAY_NAMES, lm.ones((2, 2)))):  # fmt: skip
        assert [n for n in names if not hasattr(where, n)] == [], where
    assert set(STANDARD_NAMES) <= set(dir(lm))


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_linalg_of_complex_keeps_real_results_real(dtype):
    rng = np.random.default_rng(3)
    m = (rng.standard_normal((3, 4, 4)) + 1j * rng.standard_normal((3, 4, 4))).astype(dtype)
    sign, logabs = lm.linalg.slogdet(lm.asarray(m))
    assert sign.dtype == dtype and logabs.dtype == np.finfo(dtype).dtype
    ws, wl = np.linalg.slogdet(m.astype(np.complex128))
    np.testing.assert_allclose(sign.numpy(), ws, rtol=1e-4)
    np.testing.assert_allclose(logabs.numpy(), wl, rtol=1e-4)
    np.testing.assert_allclose(np.abs(sign.numpy()), 1, rtol=1e-5)
    u, sv, vh = lm.linalg.svd(lm.asarray(m), full_matrices=False)  # S real, U and Vh complex
    assert u.dtype == vh.dtype == dtype and sv.dtype == np.finfo(dtype).dtype
    np.testing.assert_allclose(sv.numpy(), np.linalg.svd(m, compute_uv=False), rtol=1e-4)
    h = m @ np.conj(np.swapaxes(m, -1, -2))  # Hermitian: real eigenvalues
    w, v = lm.linalg.eigh(lm.asarray(h))
    assert w.dtype == np.finfo(dtype).dtype and v.dtype == dtype
    np.testing.assert_allclose(w.numpy(), np.linalg.eigvalsh(h), rtol=1e-3, atol=1e-4)


INF, NAN = np.inf, np.nan
# (z, the standard's expm1(z)): its complex special cases, C99 Annex G's cexp(z) - 1
EXPM1_SPECIAL = [
    (complex(0.0, 0.0), complex(0.0, 0.0)),
    (complex(-0.0, 0.0), complex(0.0, 0.0)),
    (complex(INF, 0.0), complex(INF, 0.0)),
    (complex(-INF, INF), complex(-1.0, 0.0)),
    (complex(INF, INF), complex(INF, NAN)),
    (complex(-INF, NAN), complex(-1.0, 0.0)),
    (complex(INF, NAN), complex(INF, NAN)),
    (complex(NAN, 0.0), complex(NAN, 0.0)),
    (complex(-INF, 2.0), complex(-1.0, 0.0)),
    (complex(1.0, INF), complex(NAN, NAN)),
    (complex(NAN, 1.0), complex(NAN, NAN)),
]


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_expm1_special_cases_and_accuracy(dtype):
    z = np.array([c for c, _ in EXPM1_SPECIAL], dtype=dtype)
    got = lm.expm1(lm.asarray(z)).numpy()
    assert got.dtype == dtype
    for zi, gi, (_, w) in zip(z, got, EXPM1_SPECIAL, strict=True):
        for part, g, e in (("real", gi.real, w.real), ("imag", gi.imag, w.imag)):
            if np.isnan(e):
                assert np.isnan(g), (zi, part, gi)
            else:
                assert g == e and np.signbit(g) == np.signbit(e), (zi, part, gi, w)
    # conj symmetry: expm1(conj(z)) == conj(expm1(z)) (the (+0, -0) imaginary sign included)
    got_c = lm.expm1(lm.conj(lm.asarray(z[:3]))).numpy()
    assert np.all(np.signbit(got_c.imag) == ~np.signbit(got[:3].imag))
    # no cancellation near 0, where numpy's exp(z) - 1 loses every digit of the real part
    t = np.array([complex(1e-9, 1e-5), complex(-3e-8, 2e-4), complex(0.5, -0.25)])
    t = t.astype(dtype).astype(np.complex128)  # the reference from the rounded inputs
    want = np.array([complex(math.expm1(c.real) * math.cos(c.imag)
                             - 2 * math.sin(c.imag / 2) ** 2,
                             math.exp(c.real) * math.sin(c.imag)) for c in t])  # fmt: skip
    rt = 1e-5 if dtype == "complex64" else 1e-12
    np.testing.assert_allclose(lm.expm1(lm.asarray(t.astype(dtype))).numpy(), want, rtol=rt)
    # real inputs: numpy's expm1 unchanged
    r = np.array([-1e-7, 0.0, 3.0], dtype=np.float64)
    np.testing.assert_array_equal(lm.expm1(lm.asarray(r)).numpy(), np.expm1(r))


@pytest.mark.parametrize("dtype", ["uint8", "int16", "uint32", "float64"])
@pytest.mark.parametrize("n", [0, 1, 7])
def test_cumulative_sum_keeps_the_asked_dtype_on_the_host_path(dtype, n):
    a = (np.arange(n) % 5 + 1).astype(dtype)
    for fn, ref, first in ((lm.cumulative_sum, np.cumsum, 0), (lm.cumulative_prod, np.cumprod, 1)):
        out = fn(lm.asarray(a), axis=0, dtype=dtype, include_initial=True)
        assert out.dtype == dtype and out.shape == (n + 1,)
        want = np.concatenate([np.array([first], dtype), ref(a, dtype=dtype)])
        np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.parametrize("preset", ["ascend910", "ascend910b"], indirect=True)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_floor_divide_infinite_operands_follow_the_standard(backend, preset, dtype):
    """The standard's floor_divide table where an operand is infinite is floor(x1 / x2), which
    numpy does not follow (inf // 2 is nan, -1 // inf is -1 there): every backend, both presets,
    the Vector composite (float16/32) and the AI CPU (float64). Expected values are written out."""
    inf, nan = np.inf, np.nan
    cases = [  # (x1, x2, expected)
        (inf, 2.0, inf), (inf, -3.0, -inf), (-inf, 5.0, -inf), (-inf, -0.5, inf),
        (1.0, inf, 0.0), (1.0, -inf, -0.0), (-1.0, inf, -0.0), (-7.5, -inf, 0.0),
        (0.0, inf, 0.0), (-0.0, inf, -0.0), (inf, inf, nan), (-inf, inf, nan), (inf, 0.0, inf),
        (nan, inf, nan), (inf, nan, nan),
        (7.0, 2.0, 3.0), (-7.0, 2.0, -4.0), (7.0, -2.0, -4.0), (1.0, 0.0, inf), (-0.0, 3.0, -0.0),
    ]  # fmt: skip
    a, b, want = (np.array(c, dtype) for c in zip(*cases))
    got = lm.floor_divide(lm.asarray(a), lm.asarray(b)).numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)  # NaN == NaN here
    assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all(), (got, want)
    x = lm.asarray(np.array([inf, -1.0, 3.0], dtype))  # Python scalars beside the tensor too
    np.testing.assert_array_equal((x // 2).numpy(), np.array([inf, -1.0, 1.0], dtype))
    r = (x // inf).numpy()  # inf // inf is NaN (any sign bit), -1 // inf is -0, 3 // inf is +0
    assert np.isnan(r[0]) and np.signbit(r[1:]).tolist() == [True, False] and (r[1:] == 0).all()


def test_element_reads_of_realized_views_compile_nothing(backend):
    """int()/float()/bool()/complex()/item() of one element of a realized tensor, through any
    chain of views (negative steps, transposes, broadcasts, reshapes), read the realized buffer
    on the host: the values equal numpy's and no program is compiled or run (each distinct index
    used to compile a copy kernel: the Array API suite's per-element checks paid ~13 ms each)."""
    from lazymath import engine
    from lazymath.graph import reference

    a = np.arange(-17, 18, dtype=np.int32).reshape(5, 7)
    x = lm.asarray(a)
    x.numpy()
    c = lm.asarray((a + 1j * a[::-1]).astype(np.complex64))
    c.numpy()
    f = (x * 0.5).realize()  # realized by a kernel, not asarray
    views = [
        (lambda t: t[::-1, 2::-2], lambda n: n[::-1, 2::-2]),
        (lambda t: t.T[3:], lambda n: n.T[3:]),
        (lambda t: lm.broadcast_to(t[:1], (4, 5, 7))[2], lambda n: np.broadcast_to(n[:1], (4, 5, 7))[2]),
        (lambda t: lm.reshape(t, (35,))[::-3], lambda n: n.reshape(35)[::-3]),
    ]  # fmt: skip
    programs, calls = len(engine.PROGRAMS), reference.CALLS["nodes"]
    for view, nview in views:
        for t, n in ((x, a), (f, a * 0.5), (c, np.asarray(c.numpy()))):
            vt, vn = view(t), nview(n)
            for idx in np.ndindex(vn.shape):
                if t is c:
                    assert complex(vt[idx]) == complex(vn[idx])
                elif t is f:
                    assert float(vt[idx]) == float(vn[idx]) and vt[idx].item() == vn[idx].item()
                else:
                    assert int(vt[idx]) == int(vn[idx]) and bool(vt[idx]) == bool(vn[idx])
                    assert operator_index(vt[idx]) == int(vn[idx])
    assert len(engine.PROGRAMS) == programs and reference.CALLS["nodes"] == calls
    y = x + 1  # a lazy computation still realizes (and compiles) as before
    assert int(y[4, 6]) == int(a[4, 6]) + 1
    with pytest.raises(TypeError, match="exactly one element"):
        int(x[0])


def operator_index(t) -> int:
    import operator

    return operator.index(t)


@pytest.mark.parametrize("preset", ["ascend910", "ascend910b"], indirect=True)
def test_element_checks_over_realized_tensors_reuse_one_program(backend, preset):
    """`x[i] * y[j]` and `x[i] == y[i]` for every index (the Array API suite's per-element
    checks, Python loops over rows): small contiguous views of realized buffers enter the
    program as leaves, so the slice offsets are no part of the program key and one program
    serves every index (each index used to compile its own kernels, ~18 ms a pair). Strided
    views stay graph nodes and still give numpy's values; lm.jit still binds its inputs anew
    (a view of a traced input must not become a fixed leaf)."""
    from lazymath import engine

    a = np.arange(-13, 22, dtype=np.int32).reshape(5, 7)
    b = (a[::-1] * 3).astype(np.float32)
    x, y = lm.asarray(a), lm.asarray(b)
    programs = len(engine.PROGRAMS)
    for i in range(5):
        for j in range(7):
            assert float(x[i, j] * y[4 - i, j]) == float(a[i, j]) * float(b[4 - i, j])
            assert bool(x[i, j] * 3 == y[4 - i, j])
    for i in range(5):  # whole rows: contiguous views of 7 elements
        np.testing.assert_array_equal((x[i] + y[i]).numpy(), a[i] + b[i])
    # one program per expression (not one per index)
    assert len(engine.PROGRAMS) - programs <= 3
    # strided views (a column, a reversed row) are not leaves but still compute numpy's values
    np.testing.assert_array_equal((x[:, 2] * 2).numpy(), a[:, 2] * 2)
    np.testing.assert_array_equal((y[3, ::-2] - 1).numpy(), b[3, ::-2] - 1)
    f = lm.jit(lambda t: t[1:3] * 2)
    for k in range(3):
        v = np.arange(6, dtype=np.float32) + k
        np.testing.assert_array_equal(f(lm.asarray(v)).numpy(), v[1:3] * 2)
    assert f.cache_size() == (0 if backend == "reference" else 1)  # reference: eager calls
