"""Laziness itself, and errors.

Protects: building a graph computes nothing (the reference executor's call counter does not
move), every realize point works and realizes exactly once, shared work is computed once,
live intermediates become buffers after a realize, deep graphs do not hit the recursion limit,
interning gives CSE, scalar-only subgraphs fold to constants; and shape/dtype errors are raised
at the op call with a message naming the op, the shapes and the rule, with the user's file:line
recorded on every node.
"""

from __future__ import annotations

import gc
import inspect
import operator
import weakref

import numpy as np
import pytest

import lazymath as lm
from lazymath.graph import reference

HERE = __file__


def _line() -> int:
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno


def _calls() -> int:
    return reference.CALLS["nodes"]


@pytest.fixture
def x(reference):
    return lm.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))


# ----------------------------------------------------------------------------- laziness


def test_building_computes_nothing(x):
    before = _calls()
    y = lm.exp(x * 2 + 1).sum(axis=0)
    z = lm.softmax(x.T @ x, axis=-1) - lm.mean(x)
    w = lm.concat([y, z[0]]).reshape(2, 4)[:, ::-1]
    assert _calls() == before, "an op call computed something"
    assert not y.is_realized and not z.is_realized and not w.is_realized
    w.realize()
    assert _calls() > before
    assert w.is_realized


def test_repr_and_metadata_do_not_realize(x):
    y = lm.sin(x) + 1
    before = _calls()
    r = repr(y)
    assert "lazy" in r and "(3, 4)" in r and "float32" in r
    assert y.shape == (3, 4) and y.dtype == np.float32 and y.ndim == 2 and y.size == 12
    assert y.nbytes == 48 and len(y) == 3
    _ = str(y), y.device
    assert _calls() == before and not y.is_realized
    y.realize()
    assert "realized" in repr(y)


def test_bool_of_one_element_realizes_and_counts(x):
    """bool()/int()/float()/complex()/index() of a one-element tensor are implicit syncs (as in
    Dask and PyTorch): they realize and return the value, and are counted by kind."""
    import sys

    tensor_mod = sys.modules["lazymath.tensor"]

    y = x.sum() > 3
    before = dict(tensor_mod.SYNCS)
    assert bool(y) is True and y.is_realized
    assert tensor_mod.SYNCS["bool"] == before.get("bool", 0) + 1
    z = x.sum() < -1e9
    if z:
        raise AssertionError("bool(z) must be False")
    assert int(x.sum().astype("int64")) == int(x.numpy().sum())
    assert float(x[0, 0]) == float(x.numpy()[0, 0])
    assert complex(x[0, 0]) == complex(x.numpy()[0, 0])
    with pytest.raises(TypeError, match="exactly one element"):
        bool(x)
    with pytest.raises(TypeError, match="exactly one element"):
        _ = x > 0 and True


def test_realize_points(x):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = x * 2
    assert y.realize() is y
    assert y.realize() is y  # realizing twice is a no-op
    np.testing.assert_array_equal(y.numpy(), a * 2)
    np.testing.assert_array_equal(np.asarray(x + 1), a + 1)
    np.testing.assert_array_equal(np.asarray(x + 1, dtype=np.float64), (a + 1).astype(np.float64))
    assert (x + 1).tolist() == (a + 1).tolist()
    c = np.array(x)  # a writable copy: writing to it does not touch the tensor
    c[...] = -1
    np.testing.assert_array_equal(x.numpy(), a)
    assert not x.numpy().flags.writeable and not y.numpy().flags.writeable
    with pytest.raises(ValueError):
        x.numpy()[0, 0] = 5  # the tensor's own buffer is read-only
    s = x.sum()
    assert s.item() == float(a.sum()) and isinstance(s.item(), float)
    assert x[1, 2].item() == 6.0
    assert float(x[1, 2]) == 6.0 and int(x[1, 2]) == 6
    i = lm.tensor(np.array(2, np.int32))
    assert operator.index(i) == 2 and [10, 20, 30][i] == 30
    with pytest.raises(TypeError, match="integer"):
        operator.index(x[0, 0])
    with pytest.raises(ValueError, match="one element"):
        x.item()


def test_realize_many_computes_shared_work_once(x, monkeypatch):
    seen: list[str] = []
    real = reference.evaluate

    def counting(node, srcs):
        seen.append(node.op)
        return real(node, srcs)

    monkeypatch.setattr(reference, "evaluate", counting)
    s = lm.exp(x)  # the shared subexpression
    a, b, c = s + 1, s * 2, lm.sum(s)
    lm.realize(a, b, c)
    assert seen.count("exp") == 1, seen
    assert a.is_realized and b.is_realized and c.is_realized
    e = np.exp(np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_allclose(a.numpy(), e + 1, rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), e * 2, rtol=1e-6)
    np.testing.assert_allclose(c.numpy(), e.sum(), rtol=1e-6)
    n = len(seen)
    lm.realize(a, b, c)
    assert len(seen) == n  # nothing left to do
    lm.realize()  # no tensors: fine
    with pytest.raises(TypeError, match="realize"):
        lm.realize(np.zeros(3))


def test_live_intermediate_becomes_buffer(x):
    b = lm.exp(x) * 3  # a live intermediate
    c = lm.sum(b + 1)
    c.realize()
    assert b.is_realized, "a live tensor inside the realized subgraph must be realized too"
    before = _calls()
    np.testing.assert_allclose(b.numpy(), np.exp(np.arange(12, dtype=np.float32)).reshape(3, 4) * 3,
                               rtol=1e-6)  # fmt: skip
    d = (b * 2).realize()  # builds on the buffer: only the new mul (and its const) run
    assert _calls() - before <= 2
    assert d.is_realized


def test_dead_intermediates_are_freed(x):
    b = lm.exp(x)
    ref = weakref.ref(b.node)
    c = b + 1
    del b
    c.realize()
    gc.collect()
    assert ref() is None, "the graph behind a realized tensor must be freed"
    assert c.node.srcs == ()


def _chain(n: int):
    """An n-op chain on a 4-element tensor and numpy's float32 answer."""
    y = lm.tensor(np.zeros(4, np.float32))
    want = np.zeros(4, np.float32)
    for i in range(n):
        y = y + 1 if i % 2 else y * 1.0001
        want = want + np.float32(1) if i % 2 else want * np.float32(1.0001)
    return y, want


def test_deep_chain_realizes_without_recursion_error(reference):
    y, want = _chain(10_000)
    assert "lazy" in repr(y)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4)


def test_chain_compiled(backend):
    """A few hundred ops in one realize on every backend (fusion splits them into kernels)."""
    y, want = _chain(300)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4)


def test_deep_chain_plans_and_compiles(monkeypatch):
    """10,000 ops plan into capped kernels without recursion; 2,000 of them also compile and
    run natively (compiling ~100 kernels for the full chain is kept out of CI time)."""
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    y, _ = _chain(10_000)
    s = lm.schedule(y)
    assert len(s.kernels) >= 10_000 // lm.fusion.rules.MAX_KERNEL_OPS
    y, want = _chain(2_000)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4)


def test_deep_chain_of_views_and_cleanup(reference):
    t = lm.tensor(np.arange(6, dtype=np.float32))
    y = t
    for i in range(10_000):
        y = (y.reshape(2, 3) if i % 2 == 0 else y.reshape(6)) + 0.5
    np.testing.assert_allclose(y.numpy(), np.arange(6) + 5000.0)
    del y
    gc.collect()


def test_cse_same_expression_same_node(x):
    t1 = lm.exp(x * 2 + 1)
    t2 = lm.exp(x * 2 + 1)
    assert t1 is not t2 and t1.node is t2.node
    assert (x.T @ x).node is (x.T @ x).node
    assert lm.sum(x, axis=0).node is x.sum(0).node
    assert (x + 1).node is not (x + 2).node
    y = lm.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert (x + 1).node is not (y + 1).node  # distinct buffers are never merged
    assert (x.T.T + 1).node is (x + 1).node  # T.T cancels, then the add is shared


def test_constant_folding(backend, known_compiled_bug):
    t = lm.full((), 2.0) * 3 + 1
    assert t.node.op == "const"
    assert t.item() == 7.0 and t.dtype == np.float32  # full's default float (the Array API's)
    u = lm.full((2, 3), 2, dtype="int32") * 3 - lm.ones((2, 3), dtype="int32")
    assert u.node.op == "expand" and u.node.srcs[0].op == "const"
    np.testing.assert_array_equal(u.numpy(), np.full((2, 3), 5, np.int32))
    v = lm.sqrt(lm.full((4,), 16.0, dtype="float32"))
    assert v.node.op == "expand" and v.node.srcs[0].realized.item() == 4.0
    c = lm.full((2, 2), 2.7).astype("int8")  # a cast of a constant is a constant
    assert c.node.op == "expand" and c.node.srcs[0].realized.item() == 2
    assert c.dtype == np.int8
    w = lm.zeros((3,)) + lm.tensor(np.ones(3, np.float32))  # a buffer operand: not folded
    assert w.node.op == "add"


def test_constant_folding_computes_nothing_at_realize(reference):
    before = _calls()
    t = (lm.full((), 2.0) * 3 + 1).realize()
    assert t.item() == 7.0
    assert _calls() == before  # folded at build time, and folding is not counted


# ----------------------------------------------------------------------------- errors


def _raises_here(exc, match, fn):
    """fn() raises `exc` matching `match`, from a call made in this file (the user's line)."""
    with pytest.raises(exc, match=match) as info:
        fn()
    files = [str(e.path) for e in info.traceback]
    assert HERE in files, f"traceback does not show the user's file: {files}"
    return info


SHAPE_ERRORS = [
    (
        "add broadcast",
        lambda: lm.ones((3, 4)) + lm.tensor(np.zeros(5)),
        r"add.*\(3, 4\).*\(5,\).*broadcast",
    ),
    (
        "mul broadcast",
        lambda: lm.mul(lm.tensor(np.zeros((2, 3))), lm.tensor(np.zeros((3, 2)))),
        r"mul.*\(2, 3\).*\(3, 2\)",
    ),
    (
        "where broadcast",
        lambda: lm.where(lm.tensor(np.ones(3, bool)), lm.tensor(np.ones(4)), 0),
        r"where.*\(3,\).*\(4,\)",
    ),
    (
        "matmul inner",
        lambda: lm.tensor(np.zeros((2, 3))) @ lm.tensor(np.zeros((4, 5))),
        r"matmul.*\(2, 3\).*\(4, 5\)",
    ),
    (
        "reshape size",
        lambda: lm.tensor(np.zeros((2, 3))).reshape(4, 2),
        r"reshape.*\(2, 3\).*\(4, 2\)",
    ),
    ("bad axis", lambda: lm.sum(lm.tensor(np.zeros((2, 3))), axis=2), r"sum.*axis 2.*2 dimensions"),
    ("bad neg axis", lambda: lm.max(lm.tensor(np.zeros((2, 3))), axis=-3), r"max.*axis -3"),
    ("squeeze", lambda: lm.squeeze(lm.tensor(np.zeros((2, 3))), 0), r"squeeze.*size 2"),
    (
        "concat",
        lambda: lm.concat([lm.tensor(np.zeros((2, 3))), lm.tensor(np.zeros((2, 4)))]),
        r"concat.*\(2, 3\).*\(2, 4\)",
    ),
    (
        "broadcast_to",
        lambda: lm.broadcast_to(lm.tensor(np.zeros(3)), (2, 4)),
        r"broadcast_to.*\(3,\)",
    ),
    ("transpose", lambda: lm.transpose(lm.tensor(np.zeros((2, 3))), (0, 2)), r"permute_dims"),
]


@pytest.mark.parametrize("case", SHAPE_ERRORS, ids=[c[0] for c in SHAPE_ERRORS])
def test_shape_errors_at_call(reference, case):
    _, fn, match = case
    before = _calls()
    _raises_here(ValueError, match, fn)
    assert _calls() == before  # raised while building: nothing was computed


DTYPE_ERRORS = [
    (
        "bool matmul",
        lambda: lm.matmul(lm.tensor(np.ones((2, 2), bool)), lm.tensor(np.ones((2, 2), bool))),
        r"matmul.*bool",
    ),
    ("bool sub", lambda: lm.tensor(np.ones(2, bool)) - lm.tensor(np.ones(2, bool)), r"sub.*bool"),
    ("bool neg", lambda: -lm.tensor(np.ones(2, bool)), r"neg.*bool"),
    ("invert float", lambda: ~lm.tensor(np.ones(2, np.float32)), r"bitwise_invert.*float32"),
    ("string data", lambda: lm.tensor(np.array(["x"])), r"non-numeric"),
    ("object data", lambda: lm.tensor(np.array([None, 1], dtype=object)), r"non-numeric"),
    ("float128 dtype", lambda: lm.zeros(3, dtype="longdouble"), r"unsupported dtype.*supports"),
    ("astype datetime", lambda: lm.ones(2).astype("datetime64[s]"), r"unsupported dtype"),
    ("string operand", lambda: lm.ones(2) + "1", r"add.*unsupported operand.*str"),
    ("None operand", lambda: lm.maximum(lm.ones(2), None), r"maximum.*unsupported operand"),
    ("rfft complex", lambda: lm.fft.rfft(lm.tensor(np.ones(4, np.complex64))), r"rfft.*real"),
]


@pytest.mark.parametrize("case", DTYPE_ERRORS, ids=[c[0] for c in DTYPE_ERRORS])
def test_dtype_errors_at_call(reference, case):
    _, fn, match = case
    _raises_here(TypeError, match, fn)


def test_index_errors_at_call():
    t = lm.tensor(np.zeros((2, 3)))
    _raises_here(IndexError, r"index 3 is out of bounds for axis 1 with size 3", lambda: t[0, 3])
    _raises_here(IndexError, "too many indices", lambda: t[0, 0, 0])


def test_nodes_record_the_users_line(x):
    t = lm.tensor(np.ones(3))
    line = _line() - 1  # the line above
    assert t.node.loc == f"{HERE}:{line}"
    u = lm.exp(x) + 1
    line = _line() - 1  # the line above
    assert u.node.loc == f"{HERE}:{line}"
    assert u.node.srcs[0].loc == f"{HERE}:{line}"  # the exp, created on the same line
    s = lm.softmax(x)
    line = _line() - 1  # the line above
    # every node softmax builds internally points at the user's call, not lazymath's code
    from lazymath.graph.node import toposort

    for n in toposort([s.node]):
        if n.op not in ("buffer", "const"):
            assert n.loc == f"{HERE}:{line}", (n, n.loc)


def test_error_at_realize_names_the_users_line(reference):
    base = lm.tensor(np.array([2, 3], np.int32))
    exp = lm.tensor(np.array([-1, 1], np.int32)) * 1  # computed: its values are not known yet
    bad = base**exp  # (a known negative exponent raises right here, like numpy)
    line = _line() - 1  # the line above
    with pytest.raises(ValueError, match="negative integer powers") as info:
        bad.realize()
    text = "".join(getattr(info.value, "__notes__", [])) + str(info.value)
    assert f"{HERE}:{line}" in text
