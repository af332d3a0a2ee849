"""Python scalars are runtime kernel arguments by default (LAZYMATH_SCALAR_ARGS=1): a loop over
scalar values compiles once, through operators and `lm.*` calls, with NEP 50's weak dtypes."""

import numpy as np
import pytest

import lazymath as lm
from lazymath import engine, settings
from lazymath.backend.native import kernel_cache


def _kernels_built() -> int:
    """Kernels compiled or loaded from the disk cache in this process so far."""
    info = kernel_cache.cache_info()
    return info["compiled"] + info["disk_hits"]


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_300_scalars_compile_once_by_default(backend, preset):
    """300 distinct floats through `*`/`+`, lm.multiply, lm.clip and lm.where: one program
    per expression (the first value), no kernel built after it, every result numpy's."""
    x = (np.linspace(-3, 3, 257) * 1.37).astype(np.float32)
    a = lm.asarray(x)
    steps = [
        (lambda s: a * s + 0.5, lambda s: x * np.float32(s) + np.float32(0.5)),
        (lambda s: lm.multiply(a, s), lambda s: x * np.float32(s)),
        (
            lambda s: lm.clip(a, -s, s + 0.25),
            lambda s: np.clip(x, np.float32(-s), np.float32(s + 0.25)),
        ),  # fmt: skip
        (lambda s: lm.where(a > 0.0, a, s), lambda s: np.where(x > 0, x, np.float32(s))),
    ]
    with settings.override(LAZYMATH_BACKEND=backend):
        for got, want in steps:
            got(0.125).numpy()  # the first value compiles
            programs, kernels = engine.PROGRAMS.misses, _kernels_built()
            for i in range(300):
                s = 0.5 + i * 1e-3
                r = got(s).numpy()
                assert r.dtype == np.float32
                np.testing.assert_allclose(r, want(s), rtol=1e-6)
            assert engine.PROGRAMS.misses - programs <= 1
            assert _kernels_built() - kernels <= 1


def test_scalar_args_off_folds_constants():
    """LAZYMATH_SCALAR_ARGS=0: the scalar is a literal of the kernel (no extra input)."""
    a = lm.asarray(np.arange(8, dtype=np.float32))

    def inputs():
        return [len(sk.group.ir.inputs) for sk in lm.schedule(a * 3.0).kernels]

    on = inputs()
    with settings.override(LAZYMATH_SCALAR_ARGS="0"):
        assert inputs() == [n - 1 for n in on]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int64", "uint8",
                                   "bool", "complex64", "complex128"])  # fmt: skip
@pytest.mark.parametrize("scalar", [2, 2.5, True, 1.5 - 0.5j])
def test_weak_dtypes_of_every_scalar_kind(dtype, scalar):
    """bool/int/float/complex scalars on either side of + - * / // %: numpy 2's (NEP 50)
    result dtypes and values, or numpy's error class."""
    v = (np.arange(7) - 3).astype(dtype)
    if dtype == "bool":
        v = np.array([True, False, True])
    t = lm.asarray(v)
    ops = [lambda u: u + scalar, lambda u: scalar - u, lambda u: u * scalar, lambda u: u / scalar,
           lambda u: scalar * u, lambda u: lm.multiply(u, scalar), lambda u: lm.add(scalar, u)]  # fmt: skip
    if not isinstance(scalar, complex) and np.dtype(dtype).kind != "c":
        ops += [lambda u: u // scalar, lambda u: u % scalar]
    for f in ops:
        with np.errstate(all="ignore"):
            try:
                want = f(v)
            except Exception as e:  # numpy refuses (e.g. bool - bool): so does lazymath
                with pytest.raises(type(e)):
                    f(t).numpy()
                continue
            got = f(t).numpy()
        assert got.dtype == want.dtype, (dtype, scalar)
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-3)


def test_complex_scalar_and_large_float():
    """`x + 0j` is complex of x's precision; 1e300 against float64 does not overflow through a
    float32 cast; 1e300 against float32 is inf as in numpy."""
    x = np.array([0.5, -2.0, 3.0], dtype=np.float32)
    a = lm.asarray(x)
    r = (a + 0j).numpy()
    assert r.dtype == np.complex64
    np.testing.assert_array_equal(r, x + 0j)
    r = (a * (2 - 1j)).numpy()
    np.testing.assert_allclose(r, x * (2 - 1j), rtol=1e-6)
    d = lm.asarray(x.astype(np.float64))
    for f in (lambda u: u + 1e300, lambda u: u * 1e300, lambda u: 1e300 / u, lambda u: u - 1e-300):
        np.testing.assert_array_equal(f(d).numpy(), f(x.astype(np.float64)))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal((a * 1e300).numpy(), x * 1e300)


def test_out_of_range_int_keeps_numpy_error():
    """An int outside the tensor's integer dtype is not a runtime argument: numpy's error."""
    a = lm.asarray(np.arange(3, dtype=np.int8))
    with pytest.raises(OverflowError):
        (a + 1000).numpy()
    np.testing.assert_array_equal((a + 100).numpy(), np.arange(3, dtype=np.int8) + 100)


def test_structural_scalars_stay_static():
    """An integer exponent and lazymath's own constants are not kernel arguments."""
    a = lm.asarray(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8))
    base = [len(sk.group.ir.inputs) for sk in lm.schedule(a + a).kernels]
    assert [len(sk.group.ir.inputs) for sk in lm.schedule(a**3 + a).kernels] == base
    np.testing.assert_allclose((a**3).numpy(), a.numpy() ** 3, rtol=1e-6)
    with settings.override(LAZYMATH_SCALAR_ARGS="0"):
        off = [len(sk.group.ir.inputs) for sk in lm.schedule(lm.softmax(a)).kernels]
    assert [len(sk.group.ir.inputs) for sk in lm.schedule(lm.softmax(a)).kernels] == off


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_comparisons_and_inplace_scalars_compile_once(backend):
    """`y += s` and `y > s` with a new float each step: one program, numpy's answers."""
    x = lm.asarray(np.arange(10, dtype=np.float32))
    with settings.override(LAZYMATH_BACKEND=backend):
        y = x + 0.0
        y += 0.5
        (y > 1.0).numpy()  # the first values compile
        programs = engine.PROGRAMS.misses
        for i in range(40):
            y = x + 0.0
            y += i + 0.25  # (never 0.0: equal scalars share one leaf, another graph shape)
            got = (y > i + 3.0).numpy()
            np.testing.assert_array_equal(got, np.arange(10) + (i + 0.25) > i + 3)
        assert engine.PROGRAMS.misses - programs == 0


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_scalars_folded_into_a_matmul_row_epilogue_follow_their_values(backend):
    """max(A @ B, -1) * s + 1 is one matmul kernel only with s folded in (the row epilogue
    takes no input): the program is specialized to s's value and a new value compiles a new
    one, never replays the old (each result is numpy's)."""
    a = np.random.default_rng(1).random((37, 19), dtype=np.float32)
    b = np.random.default_rng(2).random((19, 23), dtype=np.float32)
    A, B = lm.asarray(a), lm.asarray(b)
    with settings.override(LAZYMATH_BACKEND=backend):
        for s in (2.0, 3.0, 2.0, 5.0):
            r = lm.max(A @ B, axis=-1) * s + 1.0
            assert len(lm.schedule(r).kernels) == 1
            np.testing.assert_allclose(r.numpy(), (a @ b).max(-1) * s + 1, rtol=1e-5)
