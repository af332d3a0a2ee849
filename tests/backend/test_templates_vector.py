"""Vector templates end to end: hand-built KernelIR -> compile_kernel -> numpy comparison.

Both backends (llvm native code and the ISA interpreter) and both device presets; awkward
shapes (0, 1, primes, broadcast, permuted and negative strides), dtypes float16/float32/int32/
int64/bool, multi-output kernels, every scalar op, reductions over axis sets with prologue and
epilogue, argmax/argmin and NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

from lazymath.backend.compile import compile_kernel
from lazymath.backend.npu.kernel_ir import (
    ArgView,
    ElementwiseKernel,
    ReduceKernel,
    SOp,
    contiguous_view,
)
from lazymath.runtime.device import get_spec

BACKENDS = ["llvm", "interp"]
SPECS = ["ascend910", "ascend910b"]
rng = np.random.default_rng(1234)


# ----------------------------------------------------------------------------- helpers


def data(dtype: str, n: int, lo=-4.0, hi=4.0) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dt.kind in "iu":
        return rng.integers(-50 if dt.kind == "i" else 0, 50, n).astype(dt)
    return rng.uniform(lo, hi, n).astype(dt)


def np_view(flat: np.ndarray, v: ArgView) -> np.ndarray:
    if 0 in v.shape:
        return np.zeros(v.shape, flat.dtype)
    idx = np.full(v.shape, v.offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(v.shape, v.strides)):
        shp = [1] * len(v.shape)
        shp[d] = n
        idx = idx + (np.arange(n) * s).reshape(shp)
    return flat[idx]


def extent(v: ArgView) -> int:
    if 0 in v.shape:
        return 1
    return v.offset + sum((n - 1) * s for n, s in zip(v.shape, v.strides) if s > 0) + 1


def flipped(dtype: str, shape: tuple, axis: int) -> ArgView:
    """A C-contiguous buffer read with axis `axis` reversed (negative stride)."""
    c = contiguous_view(dtype, shape)
    st = list(c.strides)
    off = (shape[axis] - 1) * st[axis]
    st[axis] = -st[axis]
    return ArgView(dtype, shape, tuple(st), off)


def broadcast(dtype: str, shape: tuple, src_shape: tuple) -> ArgView:
    """A contiguous src_shape buffer broadcast to `shape` (numpy rules, stride 0)."""
    c = contiguous_view(dtype, src_shape)
    pad = len(shape) - len(src_shape)
    st = [0] * pad + [0 if n == 1 else s for n, s in zip(src_shape, c.strides)]
    return ArgView(dtype, shape, tuple(st), 0)


def transposed(dtype: str, shape: tuple) -> ArgView:
    """A buffer of the reversed shape read transposed (column-major walk)."""
    c = contiguous_view(dtype, tuple(reversed(shape)))
    return ArgView(dtype, shape, tuple(reversed(c.strides)), 0)


def eval_np(expr, loads, acc=None):
    """Reference semantics of an expression with numpy (fusion's contract)."""
    from lazymath.backend.npu.ir_reference import eval_expr

    shape = np.broadcast_shapes(*[x.shape for x in loads]) if loads else ()
    if acc is not None:
        shape = acc.shape
    with np.errstate(all="ignore"):
        return eval_expr(expr, loads, shape, acc)


def run_elementwise(shape, inputs, expr, results, out_dtypes, backend, spec, out_views=None):
    outs = out_views or tuple(contiguous_view(d, shape) for d in out_dtypes)
    ir = ElementwiseKernel(shape, tuple(inputs), tuple(outs), tuple(expr), tuple(results))
    k = compile_kernel(ir, get_spec(spec), backend)
    flats = [data(v.dtype, extent(v)) for v in inputs]
    oflat = [np.zeros(extent(v), v.dtype) for v in outs]
    k(*flats, *oflat)
    got = [np_view(o, v) for o, v in zip(oflat, outs)]
    vals = eval_np(expr, [np_view(f, v) for f, v in zip(flats, inputs)])
    want = [np.broadcast_to(vals[r], shape).astype(d) for r, d in zip(results, out_dtypes)]
    return got, want, k


def close(got, want, dtype, rtol=None):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        tol = rtol or {"float16": 2e-3, "float32": 2e-6, "float64": 1e-12}[dt.name]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol, equal_nan=True)  # fmt: skip
    else:
        np.testing.assert_array_equal(got, want)


L = lambda dt, k: SOp("load", dt, (), k)  # noqa: E731
K = lambda dt, v: SOp("const", dt, (), v)  # noqa: E731


# ----------------------------------------------------------------------------- elementwise


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (100_003,), (37, 1001), (3, 1, 5, 7)])
def test_add_mul_shapes_and_broadcast(shape, spec, backend):
    a = contiguous_view("float32", shape)
    b = broadcast("float32", shape, shape[-1:])  # a row vector broadcast over everything
    expr = [L("float32", 0), L("float32", 1), SOp("add", "float32", (0, 1)),
            K("float32", 0.5), SOp("mul", "float32", (2, 3))]  # fmt: skip
    got, want, _ = run_elementwise(shape, [a, b], expr, [4], ["float32"], backend, spec)
    close(got[0], want[0], "float32")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "views",
    ["flip0", "flip1", "transposed", "col_broadcast", "scalar"],
)
def test_strided_views_are_read_in_place(views, backend):
    shape = (53, 89)
    v = {
        "flip0": flipped("float32", shape, 0),
        "flip1": flipped("float32", shape, 1),
        "transposed": transposed("float32", shape),
        "col_broadcast": broadcast("float32", shape, (53, 1)),
        "scalar": broadcast("float32", shape, (1,)),
    }[views]
    expr = [L("float32", 0), L("float32", 1), SOp("sub", "float32", (0, 1))]
    got, want, _ = run_elementwise(shape, [v, contiguous_view("float32", shape)], expr, [2],
                                   ["float32"], backend, "ascend910")  # fmt: skip
    close(got[0], want[0], "float32")


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_output_view_and_multi_output(backend):
    shape = (40, 33)
    out_t = transposed("float32", shape)
    out_f = flipped("bool", shape, 1)
    expr = [L("float32", 0), SOp("neg", "float32", (0,)), K("float32", 0.0),
            SOp("gt", "bool", (0, 2)), SOp("abs", "float32", (0,))]  # fmt: skip
    got, want, k = run_elementwise(
        shape, [contiguous_view("float32", shape)], expr, [1, 3, 4],
        ["float32", "bool", "float32"], backend, "ascend910b",
        out_views=(out_t, out_f, contiguous_view("float32", shape)),
    )  # fmt: skip
    for g, w, d in zip(got, want, ["float32", "bool", "float32"]):
        close(g, w, d)
    assert k.program.blocks >= 1 and "copy_ub_to_gm" in k.isa_text


UNARY_F = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan",
           "tanh", "sigmoid", "relu", "sign", "floor", "ceil", "round"]  # fmt: skip
BINARY_F = ["add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "minimum"]
CMP = ["eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_unary_float_op(dtype, backend):
    """One multi-output kernel computing every unary op of the same input."""
    n = 1029
    ops = UNARY_F + ["leaky_relu"]
    expr = [L(dtype, 0), SOp("abs", dtype, (0,)), K(dtype, 0.01), SOp("add", dtype, (1, 2))]
    for op in ops:  # log/sqrt/rsqrt get |x| + 0.01, the others x
        src = 3 if op in ("log", "sqrt", "rsqrt") else 0
        expr.append(SOp(op, dtype, (src,), 0.1 if op == "leaky_relu" else None))
    results = tuple(range(4, 4 + len(ops)))
    view = contiguous_view(dtype, (n,))
    ir = ElementwiseKernel((n,), (view,), (view,) * len(ops), tuple(expr), results)
    k = compile_kernel(ir, get_spec("ascend910"), backend)
    x = data(dtype, n, -6.0, 6.0)
    x[:7] = np.array([0.0, -0.0, 2.5, -2.5, np.nan, np.inf, -np.inf], dtype)
    outs = [np.zeros(n, dtype) for _ in ops]
    k(x, *outs)
    vals = eval_np(expr, [x])
    for op, o, r in zip(ops, outs, results):
        rtol = {"float32": 4e-6, "float16": 2e-3}[dtype] * (4 if op == "tan" else 1)
        try:
            close(o, vals[r], dtype, rtol)
        except AssertionError as e:
            raise AssertionError(f"op {op}: {e}") from None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64"])
def test_every_binary_op(dtype, backend):
    """One multi-output kernel computing every binary op and comparison of the same inputs."""
    n = 517
    ops = [op for op in BINARY_F + CMP if not (np.dtype(dtype).kind in "iu" and op == "div")]
    expr = [L(dtype, 0), L(dtype, 1)]
    for op in ops:
        expr.append(SOp(op, "bool" if op in CMP else dtype, (0, 1)))
    results = tuple(range(2, 2 + len(ops)))
    view = contiguous_view(dtype, (n,))
    outs_v = tuple(contiguous_view(e.dtype, (n,)) for e in expr[2:])
    ir = ElementwiseKernel((n,), (view, view), outs_v, tuple(expr), results)
    k = compile_kernel(ir, get_spec("ascend910"), backend)
    x, y = data(dtype, n), data(dtype, n)
    if np.dtype(dtype).kind in "iu":
        y = (np.abs(y) % 9).astype(dtype)  # numpy raises on negative integer exponents
    else:
        x = np.where(np.arange(n) % 3 == 0, np.abs(x), x).astype(dtype)  # pow: positive bases
    y[:3] = np.array([0, 0, 1], dtype=dtype)  # division by zero must not crash (ints give 0)
    x[:3] = np.array([5, 0, -7], dtype=dtype)
    if np.dtype(dtype).kind == "f":
        x[3], y[4] = np.nan, np.nan
    outs = [np.zeros(n, v.dtype) for v in outs_v]
    k(x, y, *outs)
    vals = eval_np(expr, [x, y])
    for op, o, r in zip(ops, outs, results):
        try:
            close(o, vals[r], o.dtype.name, 4e-6 if dtype == "float32" else None)
        except AssertionError as e:
            raise AssertionError(f"op {op}: {e}") from None


@pytest.mark.parametrize("backend", BACKENDS)
def test_int_floor_divide_python_sign_rules_and_min_over_minus_one(backend):
    x = np.array([7, -7, 7, -7, 0, -(2**31), -(2**31), 5], np.int32)
    y = np.array([2, 2, -2, -2, 3, -1, 0, 0], np.int32)
    for op in ("floor_divide", "remainder"):
        expr = [L("int32", 0), L("int32", 1), SOp(op, "int32", (0, 1))]
        v = contiguous_view("int32", (8,))
        k = compile_kernel(ElementwiseKernel((8,), (v, v), (v,), tuple(expr), (2,)),
                           get_spec("ascend910"), backend)  # fmt: skip
        o = np.zeros(8, np.int32)
        k(x, y, o)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(o, getattr(np, op)(x, y))


@pytest.mark.parametrize("backend", BACKENDS)
def test_casts_bool_logic_and_where(backend):
    n = 301
    f, i, b = "float32", "int32", "bool"
    expr = [
        L(f, 0), L(i, 1), L(b, 2),
        SOp("cast", i, (0,)),  # 3: float -> int truncates toward zero
        SOp("cast", b, (0,)),  # 4: float -> bool is != 0
        SOp("logical_and", b, (4, 2)),  # 5
        SOp("logical_not", b, (5,)),  # 6
        SOp("cast", f, (1,)),  # 7
        SOp("where", f, (6, 7, 0)),  # 8
        SOp("cast", "float16", (8,)),  # 9
        SOp("logical_or", b, (2, 6)),  # 10
        SOp("cast", "int64", (2,)),  # 11: bool -> int is 0/1
        SOp("add", i, (3, 1)),  # 12
    ]  # fmt: skip
    views = [contiguous_view(d, (n,)) for d in (f, i, b)]
    outs = [i, b, "float16", b, "int64", i]
    got, want, _ = run_elementwise((n,), views, expr, [3, 6, 9, 10, 11, 12], outs, backend,
                                   "ascend910")  # fmt: skip
    for g, w, d in zip(got, want, outs):
        close(g, w, d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_constants_scalar_forms_and_constant_tiles(backend):
    n = 999
    expr = [L("float32", 0), K("float32", 3.0), SOp("sub", "float32", (1, 0)),  # 3 - x
            SOp("div", "float32", (1, 0)),  # 3 / x
            SOp("maximum", "float32", (1, 0)), SOp("lt", "bool", (1, 0)),  # 3 < x
            SOp("where", "float32", (5, 1, 0)), SOp("sub", "float32", (0, 1))]  # fmt: skip
    got, want, k = run_elementwise((n,), [contiguous_view("float32", (n,))], expr,
                                   [2, 3, 4, 5, 6, 7], ["float32"] * 3 + ["bool", "float32",
                                                                          "float32"],
                                   backend, "ascend910")  # fmt: skip
    for g, w in zip(got, want):
        close(g, w, w.dtype.name)
    assert "vadds" in k.isa_text and "vector_dup" in k.isa_text


def test_large_elementwise_uses_blocks_and_double_buffering():
    n = 1 << 20
    v = contiguous_view("float32", (n,))
    expr = (L("float32", 0), SOp("exp", "float32", (0,)))
    k = compile_kernel(ElementwiseKernel((n,), (v,), (v,), expr, (1,)), get_spec("ascend910"))
    text = k.isa_text
    assert "in0_tile" in text and "wait_flag V->MTE2 pp" in text and "set_flag MTE2->V pp" in text
    tile = next(b for b in k.program.buffers if b.name == "in0_tile").size // 2
    assert tile % 32 == 0 and k.program.scope_bytes(k.spec)["UB"] <= k.spec.ub_bytes
    x = data("float32", n)
    o = np.zeros(n, np.float32)
    k(x, o)
    np.testing.assert_allclose(o, np.exp(x), rtol=4e-6)
    small = compile_kernel(ElementwiseKernel((1000,), (contiguous_view("float32", (1000,)),),
                                             (contiguous_view("float32", (1000,)),), expr, (1,)),
                           get_spec("ascend910"))  # fmt: skip
    assert small.blocks == 1


def test_tiles_follow_the_spec_ub_size():
    n = 1 << 20
    v = contiguous_view("float32", (n,))
    expr = (L("float32", 0), SOp("sin", "float32", (0,)))
    ir = ElementwiseKernel((n,), (v,), (v,), expr, (1,))
    t = {s: compile_kernel(ir, get_spec(s), "interp").program for s in SPECS}
    ub = {s: t[s].scope_bytes(get_spec(s))["UB"] for s in SPECS}
    assert ub["ascend910"] <= 256 * 1024 and ub["ascend910b"] <= 192 * 1024
    assert ub["ascend910b"] < ub["ascend910"]


# ----------------------------------------------------------------------------- reduce


def run_reduce(shape, axes, op, dtype, backend, spec="ascend910", acc=None, pro=None,
               epi=None, epi_inputs=(), x=None, view=None):  # fmt: skip
    keep = [d for d in range(len(shape)) if d not in axes]
    out_shape = tuple(shape[d] for d in keep)
    acc = acc or ("int64" if op in ("argmax", "argmin") else dtype)
    v = view or contiguous_view(dtype, shape)
    pro = pro or (L(dtype, 0),)
    epi = epi or (SOp("acc", acc),)
    out_dt = epi[-1].dtype
    eviews = tuple(contiguous_view(d, out_shape) for d in epi_inputs)
    ir = ReduceKernel(shape, axes, op, (v,), tuple(pro), len(pro) - 1, acc, out_shape, eviews,
                      tuple(epi), (len(epi) - 1,), (contiguous_view(out_dt, out_shape),))  # fmt: skip
    k = compile_kernel(ir, get_spec(spec), backend)
    flat = x if x is not None else data(dtype, extent(v))
    eflats = [data(d, max(1, int(np.prod(out_shape)))) for d in epi_inputs]
    o = np.zeros(max(1, int(np.prod(out_shape))), out_dt)
    k(flat, *eflats, o)
    got = o[: int(np.prod(out_shape))].reshape(out_shape)
    xs = np_view(flat, v)
    p = eval_np(pro, [xs])[-1]
    p = np.broadcast_to(p, shape)
    if op in ("argmax", "argmin"):
        moved = np.transpose(p, keep + list(axes)).reshape(out_shape + (-1,))
        r = getattr(np, op)(moved, axis=-1).astype(np.int64)
    else:
        fn = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
        wide = np.float64 if np.dtype(acc).kind == "f" else acc
        r = np.asarray(fn(p.astype(wide), axis=axes)).astype(acc)
    eloads = [e[: int(np.prod(out_shape))].reshape(out_shape) for e in eflats]
    want = eval_np(epi, eloads, np.asarray(r).reshape(out_shape))[-1]
    return got, np.broadcast_to(want, out_shape).astype(out_dt), k


SHAPES_AXES = [((7,), (0,)), ((100_003,), (0,)), ((37, 1001), (1,)), ((37, 1001), (0,)),
               ((5, 6, 7), (0, 2)), ((5, 6, 7), (1,)), ((5, 6, 7), (0, 1, 2)), ((3, 4), ()),
               ((2000, 3), (1,)), ((3, 2000), (0,)), ((1, 9), (0,))]  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["sum", "max", "min", "argmax", "argmin"])
@pytest.mark.parametrize("shape,axes", SHAPES_AXES)
def test_reduce_axis_sets(shape, axes, op, backend):
    got, want, _ = run_reduce(shape, axes, op, "float32", backend)
    close(got, want, want.dtype.name, 2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", SPECS)
def test_reduce_prologue_epilogue_and_epilogue_inputs(spec, backend):
    # sqrt(sum(x*x, axis=1)) * w + 1   (an L2 norm with a scale)
    pro = (L("float32", 0), SOp("mul", "float32", (0, 0)))
    epi = (SOp("acc", "float32"), SOp("sqrt", "float32", (0,)), L("float32", 0),
           SOp("mul", "float32", (1, 2)), K("float32", 1.0), SOp("add", "float32", (3, 4)))  # fmt: skip
    for shape, axes in [((64, 333), (1,)), ((333, 64), (0,)), ((4, 50, 6), (0, 2))]:
        got, want, _ = run_reduce(shape, axes, "sum", "float32", backend, spec, pro=pro,
                                  epi=epi, epi_inputs=("float32",))  # fmt: skip
        close(got, want, "float32", 2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["max", "min", "argmax", "argmin", "sum"])
def test_reduce_nan_propagation_and_first_occurrence(op, backend):
    x = np.array([[1, 5, 5, np.nan, 5, np.nan], [2, 2, -1, -1, 0, 2], [np.nan] * 6,
                  [-np.inf, -np.inf, 3, 3, np.inf, np.inf]], np.float32)  # fmt: skip
    for axes, flat in [((1,), x), ((0,), x), ((1,), np.ascontiguousarray(x.T))]:
        shape = flat.shape
        got, want, _ = run_reduce(shape, axes, op, "float32", backend, x=flat.reshape(-1).copy())
        close(got, want, want.dtype.name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce_dtypes(backend):
    # float16 sums accumulate in float32; int32 sums in int64; bool sums count; bool max = any
    got, want, _ = run_reduce((3, 4097), (1,), "sum", "float16", backend)
    close(got, want, "float16", 2e-3)
    got, want, _ = run_reduce((50, 77), (0,), "sum", "int32", backend, acc="int64")
    close(got, want, "int64")
    got, want, _ = run_reduce((9, 33), (1,), "prod", "int64", backend)
    close(got, want, "int64")
    got, want, _ = run_reduce((40, 7), (0,), "sum", "bool", backend, acc="int64")
    close(got, want, "int64")
    got, want, _ = run_reduce((40, 7), (1,), "max", "bool", backend, acc="bool")
    close(got, want, "bool")
    got, want, _ = run_reduce((13, 31), (1,), "argmin", "int32", backend)
    close(got, want, "int64")


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce_strided_and_broadcast_inputs(backend):
    shape = (41, 57)
    for v in (flipped("float32", shape, 1), flipped("float32", shape, 0),
              transposed("float32", shape), broadcast("float32", shape, (57,))):  # fmt: skip
        for axes in [(0,), (1,), (0, 1)]:
            for op in ("sum", "argmax"):
                got, want, _ = run_reduce(shape, axes, op, "float32", backend, view=v)
                close(got, want, want.dtype.name, 2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_reduction_is_split_over_blocks(backend):
    n = 300_007
    for op in ("sum", "max", "argmin", "prod"):
        lo, hi = (0.999, 1.001) if op == "prod" else (-4.0, 4.0)
        x = data("float32", n, lo, hi)
        got, want, k = run_reduce((n,), (0,), op, "float32", backend, x=x)
        close(got, want, want.dtype.name, 2e-5)
        assert k.program.workspace > 0 and "atomic_add" in k.isa_text
    # the kernel re-arms its completion counter: the same argv can be launched again
    o = np.zeros(1, np.float32)
    argv = k.make_argv([x, o])
    for _ in range(2):
        o[:] = 0
        for b in range(k.blocks):
            k.run_block(argv, b, k.blocks)
        close(o.reshape(()), want, "float32", 2e-5)


def test_empty_and_zero_size_reductions():
    got, want, _ = run_reduce((0, 5), (0,), "sum", "float32", "llvm")
    np.testing.assert_array_equal(got, np.zeros(5, np.float32))
    got, _, _ = run_reduce((5, 0), (0,), "sum", "float32", "llvm")
    assert got.shape == (0,)
    with pytest.raises(ValueError, match="zero-size reduction"):
        run_reduce((0, 5), (0,), "max", "float32", "llvm")
