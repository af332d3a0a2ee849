"""lm.jit never replays a trace that read the values of its inputs.

A replay launches the stored program on new buffers; anything the trace computed on the host
from the first call's values (a host gather such as `lm.take`, Python control flow on
`float(x.sum())`, `.numpy()` of an input, a realize of an intermediate inside fn) would be
reused silently. Found on main fd38caf: `lm.jit(lambda x, i: lm.take(x, i, axis=0) * 2.0)`
returned the first call's gather for every later call. Such functions now run fn on every
call (correct, and LAZYMATH_DEBUG=1 says why); functions that only build lazy graphs, with
constants made inside or outside fn, still trace once.
"""

import numpy as np
import pytest

import lazymath as lm
from lazymath import settings

RNG = np.random.default_rng(37)


@pytest.fixture(params=["llvm", "interp"])
def backend(request):
    with settings.override(LAZYMATH_BACKEND=request.param):
        yield request.param


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _calls(fn, inputs, want):
    for args in inputs:
        got = fn(*[lm.asarray(a) for a in args])
        np.testing.assert_allclose(np.asarray(got), want(*args), rtol=1e-6)


def test_host_gather_inside_fn_is_not_replayed(backend):
    f = lm.jit(lambda x, i: lm.take(x, i, axis=0) * 2.0)
    idx = [np.array([0, 1]), np.array([3, 4]), np.array([4, 0])]
    _calls(f, [(_f32(5, 3), i) for i in idx], lambda x, i: np.take(x, i, axis=0) * 2.0)


def test_control_flow_on_a_value_is_not_replayed(backend):
    def step(x):
        return x * 2.0 if float(x.sum()) > 0 else x * 3.0

    f = lm.jit(step)
    a = np.ones(7, np.float32)
    _calls(f, [(a,), (-a,), (a,)], lambda x: x * 2.0 if x.sum() > 0 else x * 3.0)


def test_numpy_of_an_input_inside_fn_is_not_replayed(backend):
    f = lm.jit(lambda x: lm.asarray(np.sort(x.numpy())) + x)
    _calls(f, [(_f32(9),), (_f32(9),)], lambda x: np.sort(x) + x)


def test_realize_of_an_intermediate_inside_fn_is_not_replayed(backend):
    f = lm.jit(lambda x: (x * 2.0).realize() + 1.0)
    _calls(f, [(_f32(4, 3),), (_f32(4, 3),)], lambda x: x * 2.0 + 1.0)


def test_lazy_functions_with_constants_still_trace_once(backend):
    c = lm.asarray(_f32(6))  # made outside fn

    def step(x):
        k = lm.asarray(np.arange(6, dtype=np.float32))  # made inside fn: the same each call
        return (x * 2.0 + 1) * c + k

    f = lm.jit(step)
    want = lambda x: (x * 2.0 + 1) * np.asarray(c) + np.arange(6, dtype=np.float32)  # noqa: E731
    _calls(f, [(_f32(6),) for _ in range(4)], want)
    assert f.traces == 1


def test_debug_names_why_a_call_is_not_replayed(capsys):
    f = lm.jit(lambda x, i: lm.take(x, i, axis=0))
    with settings.override(LAZYMATH_DEBUG="1"):
        f(lm.asarray(_f32(4)), lm.asarray(np.array([1, 2])))
    assert "not replayed: fn reads values of its inputs" in capsys.readouterr().err
