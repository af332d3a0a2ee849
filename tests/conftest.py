"""Shared fixtures for the lazymath test suite.

- `backend`: parametrizes a test over every backend named in LAZYMATH_TEST_BACKENDS (default
  "reference,llvm,interp") and selects it through LAZYMATH_BACKEND. A compiled backend whose
  engine cannot be imported yet is skipped with the import error as the reason, so the suite
  passes on a partial checkout and starts covering llvm/interp as soon as `lazymath.engine` lands.
- `reference`: forces the numpy reference executor (laziness tests count its calls).
- `preset`: runs a test once per device preset (ascend910, ascend910b) on device 0, restoring
  ascend910 afterwards; `@pytest.mark.parametrize("preset", [...], indirect=True)` picks others.
- `check`: compare a lazymath tensor with numpy's answer (dtype, shape, values; NaN-aware) using
  per-dtype tolerances.
- LAZYMATH_CACHE_DIR points at a per-session temporary directory (autouse), so tests never read
  or write the user's kernel cache.
- The block pool's oversubscription detection (`_threads.OVERSUB_DETECT`) is off (autouse): on a
  loaded CI host it would run launches serially for a second at a time, and tests that check
  which threads ran blocks would depend on the load; tests/runtime/test_oversubscription.py
  turns it on where it is the subject.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

_DEFAULT_BACKENDS = "reference,llvm,interp"
_COMPILED = ("llvm", "interp")


def _backend_names() -> list[str]:
    raw = os.environ.get("LAZYMATH_TEST_BACKENDS", _DEFAULT_BACKENDS)
    names = [b.strip().lower() for b in raw.split(",") if b.strip()]
    return names or ["reference"]


_unavailable: dict[str, str | None] = {}  # backend -> why it cannot run (None: it can)


def _compiled_unavailable(name: str) -> str | None:
    """Why backend `name` cannot run in this checkout, or None when it can.

    The compiled path counts as missing while `lazymath.engine`, or a module it imports on the
    first realize, does not import (ImportError during a one-element smoke realize). Any other
    error is a real bug and is left to the tests to report, not hidden behind a skip.
    """
    if name not in _unavailable:
        why = None
        old = os.environ.get("LAZYMATH_BACKEND")
        try:
            importlib.import_module("lazymath.engine")
            import lazymath as lm

            os.environ["LAZYMATH_BACKEND"] = name
            (lm.tensor(np.array([1.0, 2.0], np.float32)) + 1).numpy()
        except ImportError as e:  # ModuleNotFoundError included
            why = f"{type(e).__name__}: {e}"
        except Exception:  # noqa: BLE001 - a broken backend must fail its tests, not skip
            why = None
        finally:
            if old is None:
                os.environ.pop("LAZYMATH_BACKEND", None)
            else:
                os.environ["LAZYMATH_BACKEND"] = old
        _unavailable[name] = why
    return _unavailable[name]


@pytest.fixture(scope="session", autouse=True)
def _no_oversubscription_detection():
    """See the module docstring."""
    from lazymath import _threads

    saved, _threads.OVERSUB_DETECT = _threads.OVERSUB_DETECT, False
    yield
    _threads.OVERSUB_DETECT = saved


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    """Keep compiled kernels of this session in a private temporary directory."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("lazymath-cache")
    mp.setenv("LAZYMATH_CACHE_DIR", str(path))
    yield path
    mp.undo()


@pytest.fixture(params=_backend_names())
def backend(request, monkeypatch) -> str:
    """Run the test once per backend; skip compiled backends until their engine imports."""
    name = request.param
    if name in _COMPILED:
        why = _compiled_unavailable(name)
        if why is not None:
            pytest.skip(f"backend {name!r} unavailable: the compiled path does not import ({why})")
    monkeypatch.setenv("LAZYMATH_BACKEND", name)
    return name


@pytest.fixture(params=["ascend910", "ascend910b"])
def preset(request) -> str:
    """Device 0 set to each preset in turn (kernels, tiling and costs differ between them)."""
    import lazymath as lm

    lm.init_device(0, spec=request.param)
    yield request.param
    lm.init_device(0, spec="ascend910")


@pytest.fixture
def reference(monkeypatch) -> str:
    """Force the numpy reference executor (its call counter is the laziness oracle)."""
    monkeypatch.setenv("LAZYMATH_BACKEND", "reference")
    return "reference"


# Tolerances per result dtype: (rtol, atol). Integers and bools compare exactly.
TOL = {
    np.dtype("float16"): (1e-3, 1e-3),
    np.dtype("float32"): (1e-5, 1e-6),
    np.dtype("float64"): (1e-12, 1e-12),
    np.dtype("complex64"): (1e-5, 1e-5),
    np.dtype("complex128"): (1e-12, 1e-12),
}


def assert_matches(got, expected, *, rtol=None, atol=None, check_dtype=True) -> np.ndarray:
    """Realize `got` (a Tensor) and compare it with the numpy array `expected`.

    The dtype must equal numpy's; values match exactly for integers/bools and within
    per-dtype tolerances (overridable) for floats, with NaN == NaN and matching infinities.
    """
    import lazymath as lm

    assert isinstance(got, lm.Tensor), f"expected a lazymath Tensor, got {type(got).__name__}"
    expected = np.asarray(expected)
    if check_dtype:
        assert got.dtype == expected.dtype, f"dtype {got.dtype} != numpy's {expected.dtype}"
    assert got.shape == expected.shape, f"shape {got.shape} != numpy's {expected.shape}"
    arr = got.numpy()
    assert isinstance(arr, np.ndarray)
    assert arr.shape == expected.shape, f"realized shape {arr.shape} != {expected.shape}"
    assert arr.dtype == got.dtype, f"realized dtype {arr.dtype} != declared {got.dtype}"
    if expected.dtype.kind in "fc":
        r, a = TOL.get(expected.dtype, (1e-6, 1e-6))
        r = r if rtol is None else rtol
        a = a if atol is None else atol
        np.testing.assert_allclose(
            arr.astype(np.complex128 if expected.dtype.kind == "c" else np.float64),
            expected.astype(np.complex128 if expected.dtype.kind == "c" else np.float64),
            rtol=r,
            atol=a,
            equal_nan=True,
        )
    else:
        np.testing.assert_array_equal(arr, expected)
    return arr


@pytest.fixture
def check():
    """The `assert_matches` comparison, as a fixture (test modules do not import conftest)."""
    return assert_matches


class Data:
    """Deterministic test inputs and the awkward memory layouts every op must handle."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def rand(self, shape, dtype, lo=-3.0, hi=3.0, nonzero: bool = False) -> np.ndarray:
        """Random array of `dtype` in [lo, hi]; ints are uniform integers, bools fair coins."""
        dtype = np.dtype(dtype)
        shape = tuple(shape)
        if dtype == np.bool_:
            a = np.asarray(self.rng.random(shape) < 0.5)
            if nonzero:
                a[...] = True
            return a
        if dtype.kind in "iu":
            a = self.rng.integers(int(np.ceil(lo)), int(np.floor(hi)) + 1, size=shape)
            if nonzero:
                a[a == 0] = 1
            return a.astype(dtype)
        if dtype.kind == "c":
            re = self.rng.uniform(lo, hi, size=shape)
            im = self.rng.uniform(lo, hi, size=shape)
            return (re + 1j * im).astype(dtype)
        a = self.rng.uniform(lo, hi, size=shape)
        if nonzero:
            a[np.abs(a) < 0.25] = 0.5
        return a.astype(dtype)

    def layouts(self, shape, dtype, lo=-3.0, hi=3.0, nonzero: bool = False):
        """[(name, numpy view, lazymath view)] of the same values in different layouts:
        contiguous, transposed, strided slice, negative strides, broadcast (size-1 axis
        expanded). The lazymath view is built with lazymath ops from a contiguous buffer,
        exactly as the numpy view is built from its base."""
        import lazymath as lm

        shape = tuple(shape)
        out = []
        base = self.rand(shape, dtype, lo, hi, nonzero)
        out.append(("contiguous", base, lm.tensor(base)))
        if len(shape) >= 2:
            base = self.rand(shape[::-1], dtype, lo, hi, nonzero)
            out.append(("transposed", base.T, lm.tensor(base).T))
        if len(shape) >= 1:
            base = self.rand(shape[:-1] + (2 * shape[-1] + 1,), dtype, lo, hi, nonzero)
            out.append(("strided", base[..., 1::2], lm.tensor(base)[..., 1::2]))
            base = self.rand(shape, dtype, lo, hi, nonzero)
            if len(shape) >= 2:  # [::-1] on the first axis, flip() on the last
                out.append(("flipped", np.flip(base[::-1], -1),
                            lm.flip(lm.tensor(base)[::-1], -1)))  # fmt: skip
            else:
                out.append(("flipped", base[::-1], lm.tensor(base)[::-1]))
            base = self.rand((1,) + shape[1:], dtype, lo, hi, nonzero)
            out.append(("broadcast", np.broadcast_to(base, shape),
                        lm.broadcast_to(lm.tensor(base), shape)))  # fmt: skip
        return out


@pytest.fixture
def data() -> Data:
    """Seeded input factory (the same values on every run)."""
    return Data(0)


def xfail_compiled(request, backend: str, reason: str) -> None:
    """Mark the running test xfail (non-strict) on the compiled backends only: a known bug of
    the compiled path, while the reference path must keep passing."""
    if backend in _COMPILED:
        request.applymarker(pytest.mark.xfail(reason=f"compiled path: {reason}", strict=False))


@pytest.fixture
def known_compiled_bug(request, backend):
    """`known_compiled_bug("reason")` inside a test: xfail it on llvm/interp only."""
    return lambda reason: xfail_compiled(request, backend, reason)
