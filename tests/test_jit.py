"""lm.jit: a staged function equals eager lazymath, traces once per signature and replays."""

import numpy as np
import pytest

import lazymath as lm
from lazymath import engine, settings, staging_batch
from lazymath.backend.compile import compile_kernel
from lazymath.backend.npu import cost, isa_codec
from lazymath.backend.npu.kernel_ir import (
    ArgView,
    DynamicElementwiseKernel,
    DynamicReduceKernel,
    DynamicRowKernel,
    ElementwiseKernel,
    SOp,
    contiguous_view,
)
from lazymath.runtime.device import get_spec
from lazymath.runtime.replay import layout_id
from lazymath.staging import DonatedError

RNG = np.random.default_rng(34)


@pytest.fixture(params=["llvm", "interp"])
def backend(request):
    with settings.override(LAZYMATH_BACKEND=request.param):
        yield request.param


def _x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# every op family, on awkward shapes: (function, inputs as numpy arrays)
FAMILIES = {
    "elementwise": (lambda a, b: lm.relu(a * 2.0 + b) - lm.exp(-lm.abs(b)), (_x(7, 13), _x(13))),
    "compare_where": (lambda a, b: lm.where(a > b, a, b * 0.5), (_x(1, 5), _x(3, 1))),
    "reduce": (lambda a, b: (lm.sum(a, axis=1), lm.max(a * b, axis=0)), (_x(11, 17), _x(17))),
    "rows": (lambda a, b: lm.softmax(a + b, axis=-1), (_x(5, 31), _x(31))),
    "matmul": (lambda a, b: lm.relu(a @ b) * 0.25, (_x(19, 23), _x(23, 3))),
    "views": (lambda a, b: (a.T[::-1] + b[::2, None])[1:], (_x(6, 9), _x(18))),
    "int": (lambda a, b: (a * 3 + b) // 2 % 5, (np.arange(-7, 8, dtype=np.int32),
                                                  np.int32(4) + np.arange(15, dtype=np.int32))),
    "complex": (lambda a, b: a * b + 1j, (_x(4) + 1j * _x(4), _x(4).astype(np.complex64))),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_jit_equals_eager_for_every_op_family(family, preset, backend):
    fn, arrays = FAMILIES[family]
    jf = lm.jit(fn)
    for call in range(3):  # the trace, then two replays of new data
        data = [a if call == 0 else (a * (call + 1)).astype(a.dtype) for a in arrays]
        got = jf(*[lm.asarray(d) for d in data])
        want = fn(*[lm.asarray(d) for d in data])
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)
    assert jf.traces == 1


def test_replay_runs_no_python_op_code_and_retraces_only_on_a_new_signature(capsys, monkeypatch):
    calls = []

    @lm.jit(dynamic=False)  # a new leading size retraces (automatic dynamic: see below)
    def step(x, y):
        calls.append(1)
        return lm.sqrt(lm.abs(x)) * y

    a, b = _x(100), _x(100)
    programs = engine.PROGRAMS.misses
    for _ in range(5):
        r = step(lm.asarray(a), lm.asarray(b))
    np.testing.assert_allclose(r.numpy(), np.sqrt(np.abs(a)) * b, rtol=1e-6)
    assert len(calls) == 1 and step.traces == 1
    assert engine.PROGRAMS.misses - programs <= 1
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    step(lm.asarray(_x(101)), lm.asarray(_x(101)))  # new shape
    step(lm.asarray(a), lm.asarray(b))  # seen before: replayed, no trace
    step(lm.asarray(a.astype(np.float64)), lm.asarray(b))  # new dtype
    err = capsys.readouterr().err
    assert len(calls) == 3
    assert "retrace: input 0 was (100,) float32 strides (4,), now (101,) float32" in err
    assert "now (100,) float64" in err and "strides (8,)" in err
    assert err.count("[lazymath] jit ") == 2  # the replay of a known signature says nothing


def test_pytrees_in_and_out_and_keyword_arguments():
    @lm.jit
    def f(params, batch, *, scale):
        h = batch["x"] @ params[0] + params[1]
        return {"h": h * scale, "parts": [lm.sum(h), lm.tanh(h)]}

    w, bias, x = _x(8, 4), _x(4), _x(3, 8)
    for k in range(3):
        out = f((lm.asarray(w), lm.asarray(bias)), {"x": lm.asarray(x + k)}, scale=2.0)
        h = (x + k) @ w + bias
        assert sorted(out) == ["h", "parts"] and isinstance(out["parts"], list)
        np.testing.assert_allclose(out["h"].numpy(), h * 2, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["parts"][0].numpy(), h.sum(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out["parts"][1].numpy(), np.tanh(h), rtol=1e-5, atol=1e-6)
    assert f.traces == 1
    f((lm.asarray(w), lm.asarray(bias)), {"x": lm.asarray(x)}, scale=3.0)  # a static value
    assert f.traces == 2


def test_static_argnums_and_numpy_inputs():
    f = lm.jit(lambda x, axis: lm.sum(x * x, axis=axis), static_argnums=1)
    a = _x(5, 6)
    for axis in (0, 1, 0, 1):
        np.testing.assert_allclose(f(a, axis).numpy(), (a * a).sum(axis), rtol=1e-5)
    assert f.traces == 2 and f.cache_size() == 2


def test_a_0d_tensor_argument_changes_without_retracing_or_compiling():
    f = lm.jit(lambda x, lr: x - lr * x)
    x = _x(50)
    f(lm.asarray(x), lm.asarray(np.float32(0.5)))
    programs = engine.PROGRAMS.misses
    for i in range(100):
        lr = np.float32(i * 1e-2)
        np.testing.assert_allclose(f(lm.asarray(x), lm.asarray(lr)).numpy(), x - lr * x,
                                   rtol=1e-6)  # fmt: skip
    assert f.traces == 1 and engine.PROGRAMS.misses == programs


def test_a_python_scalar_argument_retraces_but_compiles_once():
    f = lm.jit(lambda x, s: x * s + 1.0)
    x = _x(64)
    f(lm.asarray(x), 0.5)
    programs = engine.PROGRAMS.misses
    for i in range(30):
        np.testing.assert_allclose(f(lm.asarray(x), i * 0.1).numpy(),
                                   x * np.float32(i * 0.1) + 1, rtol=1e-6)  # fmt: skip
    assert engine.PROGRAMS.misses == programs  # the scalar is a runtime kernel argument


def test_outputs_that_are_inputs_and_closures():
    w = lm.asarray(_x(4))

    @lm.jit
    def f(x):
        return x, x + w

    a = _x(4)
    for _ in range(2):
        same, s = f(lm.asarray(a))
        np.testing.assert_array_equal(same.numpy(), a)
        np.testing.assert_allclose(s.numpy(), a + w.numpy(), rtol=1e-6)
    assert f.traces == 1


def test_lower_gives_text_explain_and_cost():
    f = lm.jit(lambda a, b: lm.relu(a @ b) + 1.0)
    low = f.lower(lm.asarray(_x(16, 8)), lm.asarray(_x(8, 4)))
    text = low.as_text()
    assert "matmul" in text and "---" in text
    c = low.cost()
    assert c["kernels"] == 1 and c["flops"] >= 2 * 16 * 8 * 4 and c["bytes"] > 0
    assert "k0_matmul" in str(low.explain())
    assert f.traces == 0  # lower does not store a program


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="callable"):
        lm.jit(3)
    with pytest.raises(ValueError, match="both static and donated"):
        lm.jit(lambda x: x, static_argnums=0, donate=0)
    f = lm.jit(lambda x, opts: x, static_argnums=1)
    with pytest.raises(TypeError, match="static argument 1"):
        f(lm.asarray(_x(2)), [1, 2])
    g = lm.jit(lambda x: x)
    with pytest.raises(TypeError, match="neither a tensor"):
        g(object.__new__(type("Thing", (), {"__hash__": None})))
    with pytest.raises(IndexError, match="static_argnums names argument 2"):
        lm.jit(lambda x: x, static_argnums=2)(lm.asarray(_x(2)))


def test_a_settings_change_between_replays_retraces(monkeypatch):
    """The replay's fast key holds the raw settings state: an environment change or an override
    between calls must reach the full signature (a program compiled for another backend or
    target is never replayed)."""
    f = lm.jit(lambda x: lm.exp(x) * 3.0)
    x = lm.asarray(_x(33))
    want = np.exp(x.numpy()) * np.float32(3)
    for _ in range(3):
        np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-6)
    assert f.traces == 1
    monkeypatch.setenv("LAZYMATH_BACKEND", "interp")
    np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-6)
    assert f.traces == 2 and f.cache_size() == 2
    monkeypatch.delenv("LAZYMATH_BACKEND")
    f(x)
    assert f.traces == 2  # back to llvm: the first entry, replayed
    with settings.override(LAZYMATH_TARGET_CPU="x86-64"):
        np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-6)
        assert f.traces == 3
    f(x)
    with settings.override(LAZYMATH_HOST_MATH=True):
        f(x)
    assert f.traces == 4


def test_replayed_outputs_reuse_dropped_buffers_and_never_overwrite_held_ones():
    """A small output the caller dropped is reused by the next replay (no allocation); one the
    caller still holds (the tensor, its numpy array, a view of it) is never written again."""
    f = lm.jit(lambda x, y: x * 2.0 + y)
    xs = [_x(257) for _ in range(4)]
    y = lm.asarray(_x(257))
    f(lm.asarray(xs[0]), y)
    addr = f(lm.asarray(xs[0]), y).numpy().__array_interface__["data"][0]
    again = f(lm.asarray(xs[1]), y).numpy()  # the previous result was dropped: same memory
    assert again.__array_interface__["data"][0] == addr
    held = [again, f(lm.asarray(xs[2]), y), f(lm.asarray(xs[3]), y).numpy()[5:]]
    yn = y.numpy()
    np.testing.assert_allclose(held[0], xs[1] * 2 + yn, rtol=1e-6)
    np.testing.assert_allclose(held[1].numpy(), xs[2] * 2 + yn, rtol=1e-6)
    np.testing.assert_allclose(held[2], (xs[3] * 2 + yn)[5:], rtol=1e-6)
    assert not held[1].numpy().flags.writeable


def test_the_replay_key_tells_layouts_apart_by_their_cached_layout_ids():
    """The fast key holds each input's layout id (runtime.replay.layout_id, cached on the node
    with its address): equal layouts share an id, a strided layout of the same shape
    or another dtype does not, so such an input retraces instead of replaying another layout's
    program."""
    a = np.arange(24, dtype=np.float32)
    assert layout_id(a[:12]) == layout_id(a[12:]) != layout_id(a[::2])
    assert layout_id(a[:12]) != layout_id(a[:12].astype(np.float64))
    f = lm.jit(lambda x: x * 3.0 - 1.0)
    dense, strided = lm.asarray(a[:12].copy()), lm.asarray(a)[::2]
    np.testing.assert_allclose(f(dense).numpy(), a[:12] * 3 - 1, rtol=1e-6)
    np.testing.assert_allclose(f(strided).numpy(), a[::2] * 3 - 1, rtol=1e-6)
    np.testing.assert_allclose(f(strided).numpy(), a[::2] * 3 - 1, rtol=1e-6)
    np.testing.assert_allclose(f(lm.asarray(a[12:].copy())).numpy(), a[12:] * 3 - 1, rtol=1e-6)
    wide = lm.asarray(a[:12].astype(np.float64))
    np.testing.assert_allclose(f(wide).numpy(), a[:12] * 3.0 - 1, rtol=1e-12)
    assert f(wide).dtype == np.float64
    assert f.traces == 2  # float32 (three layouts of one, replayed) and float64
    node = dense._node
    assert node.addr[0] is node.realized and node.addr[2] == layout_id(node.realized)


def test_big_outputs_come_from_the_device_pool_and_return_to_it():
    f = lm.jit(lambda x: x + 1.0)
    x = lm.asarray(_x(1 << 19))  # 2 MiB: above the small-output size
    f(x).numpy()
    dev = lm.runtime.current_device()
    before = dev.memory_stats()
    for _ in range(5):
        np.testing.assert_allclose(f(x).numpy()[:7], x.numpy()[:7] + 1, rtol=1e-6)
    after = dev.memory_stats()
    assert after.misses == before.misses and after.hits >= before.hits + 5
    assert after.allocated == before.allocated  # each result went back when dropped


def test_replays_from_several_threads_and_under_the_profiler():
    import threading

    f = lm.jit(lambda x, y: lm.maximum(x, y) - y)
    data = [(_x(300), _x(300)) for _ in range(4)]
    f(lm.asarray(data[0][0]), lm.asarray(data[0][1]))
    errors = []

    def work(a, b):
        ta, tb = lm.asarray(a), lm.asarray(b)
        for _ in range(200):
            r = f(ta, tb).numpy()
            if not np.allclose(r, np.maximum(a, b) - b, rtol=1e-6):
                errors.append(1)

    threads = [threading.Thread(target=work, args=d) for d in data]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and f.traces == 1
    with lm.profile():
        r = f(lm.asarray(data[1][0]), lm.asarray(data[1][1]))
    np.testing.assert_allclose(r.numpy(), np.maximum(*data[1]) - data[1][1], rtol=1e-6)


def _mlp(x, b, w):
    return lm.softmax(lm.relu(x @ w + b) * 0.5, axis=-1), lm.sum(lm.abs(x.T[::-1].T), axis=1)


def _mlp_ref(x, b, w):
    z = np.maximum(x @ w + b, 0) * 0.5
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True), np.abs(x).sum(1)


def test_a_dynamic_batch_compiles_one_program_for_sizes_1_to_4096(preset, backend):
    """dynamic=0: one program per dtype runs every batch size (whole chunks as row views, the
    tail padded), equal to numpy; interp runs fewer sizes (it is slow)."""
    w, b = _x(9, 5), _x(5)
    sizes = [1, 2, 3, 5, 7, 8, 31, 64, 65, 127] + ([200, 513, 1000, 4093, 4096] if backend ==
                                                      "llvm" else [129])  # fmt: skip
    for dtype in (np.float32, np.float64):
        f = lm.jit(_mlp, dynamic=0)
        wt, bt = lm.asarray(w.astype(dtype)), lm.asarray(b.astype(dtype))
        programs = engine.PROGRAMS.misses
        for n in sizes:
            x = _x(n, 9, dtype=dtype)
            got = f(lm.asarray(x), bt, wt)
            for g, r in zip(got, _mlp_ref(x, b.astype(dtype), w.astype(dtype))):
                assert g.shape == r.shape and g.dtype == dtype
                np.testing.assert_allclose(g.numpy(), r, rtol=1e-4, atol=1e-5)
        assert f.traces == 1 and engine.PROGRAMS.misses - programs <= 1


def test_the_batch_becomes_dynamic_after_a_second_size(capsys, monkeypatch):
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    f = lm.jit(lambda x, y: {"s": lm.tanh(x) * y, "t": [x.reshape(x.shape[0], 2, 3)[:, 1]]})
    y = lm.asarray(_x(6))
    programs = engine.PROGRAMS.misses
    for n in (4, 9, 4, 1, 100, 0, 37):
        x = _x(n, 6)
        out = f(lm.asarray(x), y)
        np.testing.assert_allclose(out["s"].numpy(), np.tanh(x) * y.numpy(), rtol=1e-6)
        np.testing.assert_array_equal(out["t"][0].numpy(), x.reshape(n, 2, 3)[:, 1])
    err = capsys.readouterr().err
    assert "dynamic batch: inputs [0] leading dim now 9" in err
    assert f.traces == 2 and engine.PROGRAMS.misses - programs <= 2  # size 4, then the chunk


@pytest.mark.parametrize("name", ["mean0", "flip", "cumsum0", "gram", "slice"])
def test_functions_that_mix_batch_rows_keep_a_program_per_size(name, capsys, monkeypatch):
    fns = {
        "mean0": (lambda x: x - lm.mean(x, axis=0), lambda x: x - x.mean(0)),
        "flip": (lambda x: x[::-1] * 2.0, lambda x: x[::-1] * 2),
        "cumsum0": (lambda x: lm.cumulative_sum(x, axis=0), lambda x: np.cumsum(x, 0)),
        "gram": (lambda x: x.T @ x, lambda x: x.T @ x),
        "slice": (lambda x: x[1:] + 1.0, lambda x: x[1:] + 1),
    }
    fn, ref = fns[name]
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    f = lm.jit(fn, dynamic=0)
    for n in (3, 5, 8):
        x = _x(n, 4)
        np.testing.assert_allclose(f(lm.asarray(x)).numpy(), ref(x), rtol=1e-5, atol=1e-5)
    assert "not a dynamic batch (" in capsys.readouterr().err
    assert f.cache_size() == 3


def test_dynamic_argument_errors():
    with pytest.raises(ValueError, match="dynamic must be"):
        lm.jit(lambda x: x, dynamic=1)
    with pytest.raises(ValueError, match="dynamic must be"):
        lm.jit(lambda x: x, dynamic=True)
    with pytest.raises(ValueError, match="chunk must be"):
        lm.jit(lambda x: x, dynamic=0, chunk=0)
    f = lm.jit(lambda x: x * 2.0, dynamic=False)
    for n in (2, 3, 4):
        f(lm.asarray(_x(n)))
    assert f.cache_size() == 3


# ----------------------------------------------------------------------------- run-time rows


def _ew_kernel(shape, views, expr, results):
    return DynamicElementwiseKernel(shape, views[:-1], views[-1:], expr, results)


ADD_RELU = (SOp("load", "float32", (), 0), SOp("load", "float32", (), 1),
            SOp("add", "float32", (0, 1)), SOp("relu", "float32", (2,)))  # fmt: skip


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("kb", ["llvm", "interp"])
@pytest.mark.parametrize("case", ["1d", "rows", "wide", "3d", "bcast_flip"])
def test_a_dynamic_elementwise_kernel_takes_its_rows_at_run_time(case, kb, spec):
    """One compiled kernel serves 0..cap rows: the row count is its last GM argument, loops and
    the tail tile follow it, and no row past the count is written (NaN sentinels stay)."""
    cap, rest = {"1d": (61, ()), "rows": (64, (7,)), "wide": (5, (20011,)), "3d": (13, (3, 5)),
                 "bcast_flip": (37, (11,))}[case]  # fmt: skip
    shape = (cap, *rest)
    full = contiguous_view("float32", shape)
    if case == "bcast_flip":  # b is one row broadcast over the batch; a is read flipped in rows
        a = ArgView("float32", shape, (11, -1), 10)
        b = ArgView("float32", shape, (0, 1), 0)
    else:
        a = b = full
    k = compile_kernel(_ew_kernel(shape, (a, b, full), ADD_RELU, (3,)), get_spec(spec), kb)
    assert "get_value tiling" in k.isa_text and kb in repr(k)
    for n in (0, 1, 2, cap // 2 + 1, cap - 1, cap):
        x = _x(n + 2, *rest)  # two rows past n: never read
        y = _x(1 if case == "bcast_flip" else n, *rest)
        out = np.full((n + 2, *rest), np.nan, np.float32)
        if n:
            k(x, y, out, np.array([n], np.int64))
        xa = x[:n, ::-1] if case == "bcast_flip" else x[:n]
        np.testing.assert_array_equal(out[:n], np.maximum(xa + y, 0))
        assert np.isnan(out[n:]).all()


def test_the_row_count_is_checked_costed_and_cached_as_data():
    shape = (256, 100)
    v = contiguous_view("float32", shape)
    ir = _ew_kernel(shape, (v, v, v), ADD_RELU, (3,))
    prog = compile_kernel(ir, get_spec("ascend910"), "interp").program
    assert isa_codec.decode(isa_codec.encode(prog)) == prog  # the disk cache stores it
    small = cost.estimate(prog, get_spec("ascend910"), values={"rows": 3}).total
    assert small < cost.estimate(prog, get_spec("ascend910")).total  # default: the bound
    k = compile_kernel(ir, get_spec("ascend910"), "interp")
    x = _x(300, 100)
    with pytest.raises(ValueError, match=r"get_value tiling .* read 300, outside 0\.\.256"):
        k(x, x, np.empty_like(x), np.array([300], np.int64))
    static = compile_kernel(ElementwiseKernel(shape, (v, v), (v,), ADD_RELU, (3,)),
                            get_spec("ascend910"), "interp")  # fmt: skip
    assert "get_value" not in static.isa_text  # never the same cached kernel


def _step(x, y, s):
    return lm.relu(x * s + y) - lm.exp(-lm.abs(x)) * 0.5, (x[:, ::-1] + y).astype(lm.float16)


def _step_ref(x, y, s):
    return np.maximum(x * s + y, 0) - np.exp(-np.abs(x)) * 0.5, (x[:, ::-1] + y).astype(np.float16)


def test_an_elementwise_dynamic_batch_is_one_program_with_run_time_rows(preset, backend, capsys,
                                                                        monkeypatch):  # fmt: skip
    """Sizes 1..4096 (every size on llvm up to 300, then a spread): one traced program per
    dtype, its kernels taking the row count at run time (no padded tail copies), equal to
    numpy; a non-contiguous batch and a 0-row batch too."""
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    sizes = (list(range(1, 300)) + [511, 512, 513, 1000, 4093, 4096] if backend == "llvm"
             else [1, 2, 63, 64, 65, 130])  # fmt: skip
    for dtype in (np.float32, np.float16):  # (float64 runs on the AI CPU: host chunks)
        y = _x(6, dtype=dtype)
        tol = 1e-5 if dtype == np.float32 else 1e-2
        f = lm.jit(_step, dynamic=0)
        programs = engine.PROGRAMS.misses
        s = lm.asarray(np.asarray(1.5, dtype))
        for n in [*sizes, 0]:
            x = _x(n, 6, dtype=dtype)
            got = f(lm.asarray(x), lm.asarray(y), s)
            for g, r in zip(got, _step_ref(x, y, dtype(1.5))):
                assert g.shape == r.shape and g.dtype == r.dtype
                np.testing.assert_allclose(g.numpy().astype(np.float32), r.astype(np.float32),
                                           rtol=max(tol, 2e-3 * (r.dtype == np.float16)),
                                           atol=tol)  # fmt: skip
        x = _x(2 * 77, 6, dtype=dtype)[::2]  # a strided batch
        for g, r in zip(f(lm.asarray(x), lm.asarray(y), s), _step_ref(x, y, dtype(1.5))):
            np.testing.assert_allclose(g.numpy().astype(np.float32), r.astype(np.float32),
                                       rtol=1e-2, atol=tol)  # fmt: skip
        assert f.traces == 1 and engine.PROGRAMS.misses - programs <= 1
    err = capsys.readouterr().err
    assert "the row count a kernel argument" in err and "host chunks" not in err


def _reduce_ir(shape, axes, op, a, out_dtype):
    out_shape = tuple(d for i, d in enumerate(shape) if i not in axes)
    acc = "int64" if op.startswith("arg") else "float32"
    return DynamicReduceKernel(shape, axes, op, (a,), (SOp("load", "float32", (), 0),), 0, acc,
                               out_shape, (), (SOp("acc", acc),), (0,),
                               (contiguous_view(out_dtype, out_shape),))  # fmt: skip


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("kb", ["llvm", "interp"])
@pytest.mark.parametrize("case", ["rows", "3d", "wide", "outer", "flip"])
def test_a_dynamic_reduce_kernel_takes_its_rows_at_run_time(case, kb, spec):
    """One compiled reduction serves 0..cap rows (inner and outer tilings, the batch merged
    with other kept dims, a flipped strided input): sum/max/argmax of the first n rows equal
    numpy's, and no output row past n is written."""
    cap, rest, axes = {"rows": (64, (7,), (1,)), "3d": (37, (3, 5), (2,)),
                       "wide": (13, (3001,), (1,)), "outer": (11, (50, 7), (1,)),
                       "flip": (29, (9,), (1,))}[case]  # fmt: skip
    shape = (cap, *rest)
    a = contiguous_view("float32", shape)
    if case == "flip":  # rows of a (cap, 18) buffer: every other column, reversed
        a = ArgView("float32", shape, (18, -2), 17)
    kept = tuple(d for i, d in enumerate(rest, 1) if i not in axes)
    for op in ("sum", "max", "argmax"):
        odt = np.int64 if op == "argmax" else np.float32
        ir = _reduce_ir(shape, axes, op, a, np.dtype(odt).name)
        k = compile_kernel(ir, get_spec(spec), kb)
        assert "get_value tiling" in k.isa_text
        for n in (0, 1, 2, cap // 2 + 1, cap):
            x = _x(n + 2, *((18,) if case == "flip" else rest))
            xa = x[:n, ::-2] if case == "flip" else x[:n]
            out = np.full((n + 2, *kept), -7, odt)
            if n:
                k(x, out, np.array([n], np.int64))
            np.testing.assert_allclose(out[:n], getattr(np, op)(xa, axis=axes[0]), rtol=1e-5,
                                       atol=1e-5)  # fmt: skip
            assert (out[n:] == -7).all()


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("kb", ["llvm", "interp"])
@pytest.mark.parametrize("case", ["resident", "pipelined", "online", "row_output"])
def test_a_dynamic_row_kernel_takes_its_rows_at_run_time(case, kb, spec):
    """The forms of the row template (blocks of rows, one software-pipelined row, a row
    streamed through UB twice; a per-row output) with the row count read at run time: the
    softmax / variance of the first n rows equal numpy's, and rows past n stay untouched."""
    cap, width, form = {"resident": (40, 7, "row-resident: a block"),
                        "pipelined": (9, 300, "software-pipelined"),
                        "online": (3, 70_001, "online two-pass"),
                        "row_output": (33, 50, "row-resident")}[case]  # fmt: skip
    var = case == "row_output"
    t = lm.asarray(_x(cap, width))
    sched = lm.schedule(lm.var(t, axis=-1) if var else lm.softmax(t, axis=-1), spec=spec)
    assert len(sched.kernels) == 1 and form in sched.fusion_log[-1].reason
    ir = staging_batch._dynamic_ir(sched.kernels[0].ir, cap)
    assert type(ir) is DynamicRowKernel
    k = compile_kernel(ir, get_spec(spec), kb)
    assert "get_value tiling" in k.isa_text
    for n in (0, 1, 2, cap):
        x = _x(n + 1, width)
        out = np.full((n + 1,) if var else (n + 1, width), np.nan, np.float32)
        if n:
            k(x, out, np.array([n], np.int64))
        xa = x[:n].astype(np.float64)
        e = np.exp(xa - xa.max(-1, keepdims=True))
        ref = xa.var(-1) if var else e / e.sum(-1, keepdims=True)
        np.testing.assert_allclose(out[:n], ref, rtol=2e-5, atol=1e-6)
        assert np.isnan(out[n:]).all()


def _rowwise(x, g, w):
    """Reductions and rows over the non-batch axes: a layernorm (rows), a masked softmax
    (rows), a sum and an argmax (reduce), a mean over a middle axis of a 3-D view."""
    m = lm.mean(x, axis=-1, keepdims=True)
    ln = (x - m) * lm.rsqrt(lm.mean((x - m) ** 2, axis=-1, keepdims=True) + 1e-5) * g
    sm = lm.softmax(lm.where(x > 0, x, x * 0.5) + w, axis=-1)
    x3 = x.reshape(x.shape[0], 2, 6)
    return ln, sm, lm.sum(x * g, axis=1), lm.argmax(x, axis=-1), lm.mean(x3, axis=1)


def _rowwise_ref(x, g, w):
    m = x.mean(-1, keepdims=True)
    ln = (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g
    z = np.where(x > 0, x, x * 0.5) + w
    e = np.exp(z - z.max(-1, keepdims=True))
    x3 = x.reshape(x.shape[0], 2, 6)
    return ln, e / e.sum(-1, keepdims=True), (x * g).sum(1), x.argmax(-1), x3.mean(1)


def test_reductions_and_rows_of_a_dynamic_batch_are_one_program_with_run_time_rows(
        preset, backend, capsys, monkeypatch):  # fmt: skip
    """Sizes 1..4096 of reductions and row kernels over the other axes (issue 34: no host
    chunks for them): one trace, at most one program per dtype, every kernel taking the row
    count at run time; equal to numpy, a strided batch and a 0-row batch too."""
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    sizes = (list(range(1, 70)) + [127, 128, 129, 511, 1000, 4093, 4096] if backend == "llvm"
             else [1, 2, 63, 64, 65, 130])  # fmt: skip
    for dtype in (np.float32, np.float16):
        g, w = lm.asarray(_x(12, dtype=dtype)), lm.asarray(_x(12, dtype=dtype))
        tol = 2e-5 if dtype == np.float32 else 2e-2
        f = lm.jit(_rowwise, dynamic=0)
        programs = engine.PROGRAMS.misses
        strided = _x(2 * 77, 12, dtype=dtype)[::2]
        for x in [*(_x(n, 12, dtype=dtype) for n in sizes), _x(0, 12, dtype=dtype), strided]:
            refs = _rowwise_ref(x.astype(np.float64), g.numpy().astype(np.float64),
                                w.numpy().astype(np.float64))  # fmt: skip
            for j, (got, ref) in enumerate(zip(f(lm.asarray(x), g, w), refs)):
                assert got.shape == ref.shape
                if j == 3:  # argmax: ties of float16 values may pick either
                    if dtype == np.float32:
                        np.testing.assert_array_equal(got.numpy(), ref)
                    continue
                np.testing.assert_allclose(got.numpy().astype(np.float64), ref, rtol=tol,
                                           atol=tol)  # fmt: skip
        assert f.traces == 1 and engine.PROGRAMS.misses - programs <= 1
    err = capsys.readouterr().err
    assert "the row count a kernel argument" in err and "host chunks" not in err


# ----------------------------------------------------------------------------- donation


def _addr(t):
    return t._node.realized.__array_interface__["data"][0]


def test_donated_buffers_become_outputs_and_dead_tensors_raise(preset, backend):
    """An SGD-like loop donating its parameter: on llvm the update is written into the donated
    buffer (the same address every step), on interp into fresh ones; the donated tensor raises
    DonatedError on any use, and the results equal numpy."""
    f = lm.jit(lambda p, g, lr: p - lr * g, donate=0)
    p0, g0 = _x(257), _x(257)
    g, lr = lm.asarray(g0), lm.asarray(np.float32(0.25))
    p = lm.asarray(p0.copy())
    addrs = []
    for _ in range(5):
        old, p = p, f(p, g, lr)
        addrs.append(_addr(p))
        with pytest.raises(DonatedError, match=r"float32 tensor of shape \(257,\) donated"):
            old + 1.0
        with pytest.raises(DonatedError):
            f(old, g, lr)
        with pytest.raises(DonatedError):
            lm.realize(old)
    np.testing.assert_allclose(p.numpy(), p0 - 5 * 0.25 * g0, rtol=1e-5, atol=1e-6)
    assert (len(set(addrs[1:])) == 1) == (backend == "llvm")


@pytest.mark.parametrize("holder", ["numpy", "view", "pending", "twice"])
def test_a_donated_buffer_someone_still_sees_is_never_overwritten(holder):
    f = lm.jit(lambda a, b: a * 2.0 + b, donate=(0,))
    b0 = _x(64)
    x = f(lm.asarray(_x(64)), lm.asarray(b0))
    x = f(x, lm.asarray(b0))  # x: a replayed output, owning its buffer
    before = x.numpy().copy()
    held = {"numpy": lambda: x.numpy(), "view": lambda: x[3:],
            "pending": lambda: x * 3.0}.get(holder, lambda: None)()  # fmt: skip
    y = f(x, x) if holder == "twice" else f(x, lm.asarray(b0))
    expect = before * 3 if holder == "twice" else before * 2 + b0
    np.testing.assert_allclose(y.numpy(), expect, rtol=1e-6)
    if holder == "numpy":
        np.testing.assert_array_equal(held, before)
    elif holder in ("view", "pending"):
        ref = {"view": before[3:], "pending": before * 3}[holder]
        np.testing.assert_allclose(held.numpy(), ref, rtol=1e-6)


def test_donation_with_pytrees_outputs_that_are_inputs_and_other_kernels():
    def step(state, g):
        return {"w": state["w"] - 0.1 * g, "m": state["m"] @ state["m"], "k": state["k"]}

    f = lm.jit(step, donate=0)
    w0, m0, k0, g0 = _x(5, 5), _x(5, 5), _x(3), _x(5, 5)
    st = {"w": lm.asarray(w0), "m": lm.asarray(m0), "k": lm.asarray(k0)}
    for _ in range(3):
        old, st = st, f(st, lm.asarray(g0))
        with pytest.raises(DonatedError):
            old["w"].numpy()
        with pytest.raises(DonatedError):
            old["k"].reshape(3)
    np.testing.assert_allclose(st["w"].numpy(), w0 - 0.3 * g0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(st["m"].numpy(), np.linalg.matrix_power(m0, 8), rtol=1e-3)
    np.testing.assert_array_equal(st["k"].numpy(), k0)  # returned input: a live new handle
