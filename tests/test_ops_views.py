"""Views and copies (reshape, transpose, slicing, concat, pad, ...) against numpy, on every
backend.

Protects: numpy's shape rules and values for every view op and basic indexing form, views of
views (composition), views feeding computation, every element size (1, 2, 4, 8 bytes), and the
reference executor's promise that views stay zero-copy where numpy's do.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm

DTYPES = ["float16", "float32", "float64", "int8", "int64", "bool"]

# (id, input shape, f(module, x)) -- the same expression runs on numpy and on lazymath
VIEWS = [
    ("reshape", (6, 35), lambda m, x: x.reshape(5, 42)),
    ("reshape-1", (6, 35), lambda m, x: x.reshape(-1, 7)),
    ("reshape-flat", (6, 35), lambda m, x: x.reshape(-1)),
    ("reshape-0d", (1, 1), lambda m, x: x.reshape(())),
    ("reshape-0size", (0, 6), lambda m, x: x.reshape(3, 0, 2)),
    ("reshape-fn", (6, 35), lambda m, x: m.reshape(x, (2, 3, 5, 7))),
    ("reshape-of-T", (6, 35), lambda m, x: x.T.reshape(7, 30)),  # numpy copies here
    ("reshape-of-slice", (6, 35), lambda m, x: x[:, ::5].reshape(-1)),
    ("flatten", (3, 4, 5), lambda m, x: x.flatten()),
    ("T", (6, 35), lambda m, x: x.T),
    ("T-3d", (3, 4, 5), lambda m, x: x.T),
    ("mT", (3, 4, 5), lambda m, x: x.mT),
    ("transpose", (3, 4, 5), lambda m, x: m.transpose(x, (1, 2, 0))),
    ("transpose-neg", (3, 4, 5), lambda m, x: x.transpose(-1, 0, 1)),
    ("permute_dims", (3, 4, 5), lambda m, x: m.permute_dims(x, (2, 0, 1))),
    (
        "transpose-twice",
        (3, 4, 5),
        lambda m, x: m.permute_dims(m.permute_dims(x, (2, 0, 1)), (2, 0, 1)),
    ),
    (
        "transpose-back",
        (3, 4, 5),
        lambda m, x: m.permute_dims(m.permute_dims(x, (2, 0, 1)), (1, 2, 0)),
    ),
    ("swapaxes", (3, 4, 5), lambda m, x: m.swapaxes(x, 0, 2)),
    ("swapaxes-neg", (3, 4, 5), lambda m, x: x.swapaxes(-1, -2)),
    ("expand_dims", (3, 4), lambda m, x: m.expand_dims(x, 1)),
    ("expand_dims-neg", (3, 4), lambda m, x: m.expand_dims(x, -1)),
    ("expand_dims-tuple", (3, 4), lambda m, x: m.expand_dims(x, (0, 3))),
    ("squeeze", (1, 3, 1, 4), lambda m, x: m.squeeze(x)),
    ("squeeze-axis", (1, 3, 1, 4), lambda m, x: m.squeeze(x, 2)),
    ("squeeze-tuple", (1, 3, 1, 4), lambda m, x: x.squeeze((0, -2))),
    ("broadcast_to", (3, 1), lambda m, x: m.broadcast_to(x, (2, 3, 5))),
    ("broadcast_to-0", (3, 1), lambda m, x: m.broadcast_to(x, (3, 0))),
    ("broadcast-then-T", (3, 1), lambda m, x: m.broadcast_to(x, (3, 5)).T),
    ("flip-all", (3, 4, 5), lambda m, x: m.flip(x)),
    ("flip-axis", (3, 4, 5), lambda m, x: m.flip(x, 1)),
    ("flip-tuple", (3, 4, 5), lambda m, x: m.flip(x, (0, -1))),
    ("flip-flip", (3, 4, 5), lambda m, x: m.flip(m.flip(x, 1), 1)),
    ("flip-of-T", (6, 35), lambda m, x: m.flip(x.T, 0)),
    ("int", (7, 13), lambda m, x: x[2]),
    ("neg-int", (7, 13), lambda m, x: x[-1]),
    ("int-int", (7, 13), lambda m, x: x[3, -2]),
    ("slice", (7, 13), lambda m, x: x[1:5]),
    ("slice-step", (7, 13), lambda m, x: x[1::3, ::2]),
    ("slice-neg-step", (7, 13), lambda m, x: x[::-1, -2:1:-3]),
    ("slice-neg-bounds", (7, 13), lambda m, x: x[-3:, :-4]),
    ("slice-empty", (7, 13), lambda m, x: x[5:2]),
    ("slice-past-end", (7, 13), lambda m, x: x[4:100, -100:3]),
    ("None", (7, 13), lambda m, x: x[None]),
    ("None-mid", (7, 13), lambda m, x: x[:, None, ::2]),
    ("ellipsis", (3, 4, 5), lambda m, x: x[..., 1]),
    ("ellipsis-mid", (3, 4, 5), lambda m, x: x[1, ..., ::-2]),
    ("ellipsis-None", (3, 4, 5), lambda m, x: x[..., None]),
    ("empty-tuple", (3, 4), lambda m, x: x[()]),
    ("0d-index", (), lambda m, x: x[()]),
    ("0d-None", (), lambda m, x: x[None]),
    ("slice-of-slice", (7, 13), lambda m, x: x[1:][::2][:, 3:][::-1]),
    ("slice-of-flip", (7, 13), lambda m, x: m.flip(x, 1)[:, 2:9:3]),
    ("slice-of-T", (7, 13), lambda m, x: x.T[::-2, 1:]),
    ("int-of-T", (7, 13), lambda m, x: x.T[3]),
    ("slice-of-bcast", (3, 1), lambda m, x: m.broadcast_to(x, (3, 6))[1:, ::-2]),
    ("slice-of-0size", (0, 5), lambda m, x: x[:, 1:3]),
    ("numpy-int-index", (7, 13), lambda m, x: x[np.int64(2), np.int32(-1)]),
]

COPIES = [
    ("concat", lambda m, x: m.concat([x, x[::-1], x[:0]], axis=0)),
    ("concat-axis-1", lambda m, x: m.concat([x, x[:, :2]], axis=1)),
    ("concat-neg", lambda m, x: m.concat([x.T, x.T], axis=-1)),
    ("concat-one", lambda m, x: m.concat([x], axis=0)),
    ("concatenate", lambda m, x: m.concatenate([x[:3], x[3:]])),
    ("stack", lambda m, x: m.stack([x, x[::-1]])),
    ("stack-axis-1", lambda m, x: m.stack([x, x, x], axis=1)),
    ("stack-neg", lambda m, x: m.stack([x, x], axis=-1)),
    ("pad-int", lambda m, x: m.pad(x, 2)),
    ("pad-pairs", lambda m, x: m.pad(x, ((1, 0), (0, 3)))),
    ("pad-value", lambda m, x: m.pad(x, ((0, 2), (1, 1)), constant_values=1)),
    ("pad-zero", lambda m, x: m.pad(x, 0)),
    ("pad-of-T", lambda m, x: m.pad(x.T[::-1], ((1, 1), (2, 0)))),
]


def _run(check, fn, a, t, label):
    want = fn(np, a)
    for got, exp in ((fn(lm, t), want), (_plus_one(fn(lm, t)), _plus_one(want))):
        try:
            check(got, exp)
        except AssertionError as e:
            raise AssertionError(f"{label}: {e}") from None


def _plus_one(x):
    """A computation consuming the view (the compiled path reads it through strides)."""
    if x.dtype == np.bool_:
        return np.logical_not(x) if isinstance(x, np.ndarray) else lm.logical_not(x)
    one = x.dtype.type(1)
    return x + one if isinstance(x, np.ndarray) else x + 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", VIEWS, ids=[c[0] for c in VIEWS])
def test_view(backend, check, data, case, dtype):
    name, shape, fn = case
    a = data.rand(shape, dtype)
    _run(check, fn, a, lm.tensor(a), f"{name} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", COPIES, ids=[c[0] for c in COPIES])
def test_copy_ops(backend, check, data, case, dtype):
    name, fn = case
    for layout, a, t in data.layouts((5, 7), dtype):
        _run(check, fn, a, t, f"{name} {dtype} {layout}")


def test_concat_promotes(backend, check, data):
    a = data.rand((2, 3), "int8")
    b = data.rand((1, 3), "float16")
    c = data.rand((4, 3), "bool")
    check(lm.concat([lm.tensor(a), lm.tensor(b), lm.tensor(c)]), np.concatenate([a, b, c]))
    check(lm.stack([lm.tensor(a[0]), lm.tensor(c[0])]), np.stack([a[0], c[0]]))


def test_concat_zero_size_and_single_rows(backend, check, data):
    a = data.rand((0, 3), "float32")
    b = data.rand((1, 3), "float32")
    check(lm.concat([lm.tensor(a), lm.tensor(b), lm.tensor(a)]), np.concatenate([a, b, a]))
    check(lm.concat([lm.tensor(a), lm.tensor(a)]), np.concatenate([a, a]))


def test_pad_dtypes_and_values(backend, check, data):
    for dtype in ("float16", "int32", "bool"):
        a = data.rand((3, 4), dtype)
        check(lm.pad(lm.tensor(a), ((1, 2), (3, 0)), constant_values=1),
              np.pad(a, ((1, 2), (3, 0)), constant_values=1))  # fmt: skip
    a = data.rand((4,), "float32")
    check(
        lm.pad(lm.tensor(a), (2, 3), constant_values=-1.5), np.pad(a, (2, 3), constant_values=-1.5)
    )
    a = data.rand((0, 2), "float32")
    check(lm.pad(lm.tensor(a), 1), np.pad(a, 1))
    a = data.rand((), "float32")
    check(lm.pad(lm.tensor(a), 1), np.pad(a, 1))  # 0-d: nothing to pad, like numpy


def test_len_iter_and_views_of_realized(backend, check, data):
    a = data.rand((4, 3), "float32")
    t = lm.tensor(a)
    assert len(t) == 4
    rows = list(t)
    assert len(rows) == 4
    for r, ra in zip(rows, a):
        check(r, ra)
    u = (t * 2).realize()
    check(u.T[1:], (a * 2).T[1:])  # views of a realized result
    check(u.reshape(-1)[::-1], (a * 2).reshape(-1)[::-1])
    with pytest.raises(TypeError, match="0-d"):
        len(lm.tensor(np.float32(1)))


def test_reference_views_are_zero_copy(reference, data):
    """In the reference path, views of a buffer share its memory, like numpy's views."""
    a = data.rand((6, 8), "float32")
    t = lm.tensor(a)
    base = t.numpy()
    for v in (t.T, t[1:, ::2], t[::-1], lm.broadcast_to(t[:1], (5, 8)), t.reshape(8, 6),
              lm.expand_dims(t, 0), t[2], lm.flip(t, 1)):  # fmt: skip
        out = v.numpy()
        assert np.shares_memory(out, base), f"{v.node.op} copied"


def test_view_ops_record_no_copy_nodes(reference, data):
    """View ops become view nodes (reshape/permute/expand/slice), never computation."""
    t = lm.tensor(data.rand((6, 8), "float32"))
    for v in (t.T, t[1:, ::2], t[::-1], lm.broadcast_to(t[:1], (5, 8)), t.reshape(8, 6),
              lm.expand_dims(t, 0), t[None, 2], lm.flip(t, 1), t.mT):  # fmt: skip
        assert v.node.op in ("reshape", "permute", "expand", "slice"), v.node.op
    assert t.reshape(6, 8) is t
    assert t.T.T.node is t.node  # composed permutations cancel
    assert lm.squeeze(t) is t
    assert lm.squeeze(t[None]).node is t.node  # reshape of reshape is one reshape


# ----------------------------------------------------------------------------- errors


def test_view_errors_at_call():
    t = lm.tensor(np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"reshape.*\(3, 4\).*\(5, 3\)"):
        t.reshape(5, 3)
    with pytest.raises(ValueError, match="reshape"):
        t.reshape(-1, -1)
    with pytest.raises(ValueError, match="reshape"):
        t.reshape(5, -1)
    with pytest.raises(ValueError, match="reshape"):
        lm.tensor(np.zeros((0, 6))).reshape(3, 0, -1)  # -1 is ambiguous for 0 elements
    with pytest.raises(ValueError, match="permute_dims"):
        lm.permute_dims(t, (0, 0))
    with pytest.raises(ValueError, match="permute_dims"):
        lm.permute_dims(t, (0, 1, 2))
    with pytest.raises(ValueError, match="swapaxes.*out of bounds"):
        lm.swapaxes(t, 0, 2)
    with pytest.raises(ValueError, match=r"squeeze.*axis 1 of size 4"):
        lm.squeeze(t, 1)
    with pytest.raises(ValueError, match="expand_dims"):
        lm.expand_dims(t, 3)
    with pytest.raises(ValueError, match=r"broadcast_to.*\(3, 4\)"):
        lm.broadcast_to(t, (3, 5))
    with pytest.raises(ValueError, match="broadcast_to"):
        lm.broadcast_to(t, (4,))
    with pytest.raises(ValueError, match="flip.*out of bounds"):
        lm.flip(t, 2)
    with pytest.raises(ValueError, match="mT"):
        _ = lm.tensor(np.zeros(3)).mT
    with pytest.raises(ValueError, match="concat.*axis 1"):
        lm.concat([t, lm.tensor(np.zeros((3, 5)))], axis=0)
    with pytest.raises(ValueError, match="concat.*dimensions"):
        lm.concat([t, lm.tensor(np.zeros(3))])
    with pytest.raises(ValueError, match="concat"):
        lm.concat([])
    with pytest.raises(ValueError, match="stack.*same shape"):
        lm.stack([t, t.T])
    with pytest.raises(ValueError, match="pad.*non-negative"):
        lm.pad(t, -1)
    with pytest.raises(ValueError, match="pad.*constant"):
        lm.pad(t, 1, mode="reflect")
    with pytest.raises(ValueError, match="pad.*pad_width"):
        lm.pad(t, ((1, 2, 3),))
    with pytest.raises(TypeError, match="reshape.*ints"):
        t.reshape(2.5, 2)


def test_indexing_errors_at_call():
    t = lm.tensor(np.zeros((3, 4), np.float32))
    with pytest.raises(IndexError, match="out of bounds"):
        t[3]
    with pytest.raises(IndexError, match="out of bounds"):
        t[0, -5]
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        t[..., ...]
    with pytest.raises(IndexError, match="out of bounds"):
        t[[0, 7]]  # integer arrays (the Array API's advanced indexing) are checked too
    with pytest.raises(IndexError, match="integer or bool"):
        t[np.array([0.5, 1])]
    with pytest.raises(IndexError):
        t[1.5]
    with pytest.raises(IndexError):
        t[np.ones((2, 2), bool)]  # a mask of the wrong shape
    with pytest.raises(ValueError, match="zero"):
        t[::0]
    with pytest.raises(IndexError):
        lm.tensor(np.float32(1))[0]


def test_expand_dims_out_of_range_axis_is_an_index_error():
    """The Array API standard raises IndexError for an axis outside [-ndim-1, ndim] (found by
    array-api-tests' test_expand_dims: lazymath raised ValueError); numpy's AxisError is both."""
    x = lm.asarray(np.zeros((2, 3), np.float32))
    for bad in (3, -4, 7):
        with pytest.raises(IndexError, match="expand_dims: axis"):
            lm.expand_dims(x, axis=bad)
        with pytest.raises(ValueError):
            lm.expand_dims(x, axis=bad)
    for ok in (2, -3, 0):
        assert lm.expand_dims(x, axis=ok).shape == np.expand_dims(np.zeros((2, 3)), ok).shape
