"""The Python Array API standard (2024.12) as lazymath's namespace, by the standard's sections.

Protects: `__array_namespace__` / `__array_namespace_info__`, the data type functions (finfo,
iinfo, isdtype, result_type, can_cast against the standard's promotion table), the creation
functions' signatures and default dtypes (float32 is the default floating dtype), `copy=` and
`device=` keywords, the scalar conversions (implicit syncs), and DLPack both ways with numpy,
torch and JAX (zero-copy where the producer allows it, read-only and non-contiguous cases,
clear errors).
"""

from __future__ import annotations

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
    assert isinstance(f.eps, float) and f.dtype == np.dtype(name)
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
            assert lm.can_cast(da, db) == (want == b), (a, b)
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
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__(copy=False)
    with pytest.raises(BufferError, match="device"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError, match="__dlpack__"):
        lm.from_dlpack([1, 2])


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
