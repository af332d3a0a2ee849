"""User kernels (`lm.kernel`, lazymath/lowlevel.py): written with the kernel builder, equal to
numpy on both presets and both compiled backends, recorded as graph nodes between producers and
consumers, cached (program cache, disk cache in a second process, source edits recompile),
validated against the author's reference, costed per pipe, and rejected with clear messages when
they overflow a buffer, race between pipes or misuse the API."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend.npu import isa
from lazymath.backend.npu.races import RaceError
from lazymath.lowlevel import KernelDefinitionError, ceil_div

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

C = 1.5957691216057308  # 2 * sqrt(2 / pi): gelu(x) ~ x * sigmoid(C * (x + 0.044715 x^3))


def gelu_ref(x, **_params):  # the call's keyword parameters (max_tile) are passed too
    x = x.astype(np.float32)
    with np.errstate(over="ignore"):  # exp(-C * ...) -> inf for very negative x: gelu -> -0
        return x / (1 + np.exp(-C * (x + np.float32(0.044715) * x * x * x)))


def gelu_tiling(spec, x, y, *, max_tile=1 << 30):
    # double-buffered in/out queues (2 x 2 tiles) + one temporary tile, 32-element aligned
    fit = spec.ub_bytes // (5 * x.dtype.itemsize) // 32 * 32
    tile = max(32, min(fit, max_tile, -(-max(x.size, 1) // 32) * 32))
    return {"tile": tile, "blocks": min(8, max(1, ceil_div(x.size, tile)))}


@lm.kernel(unit="vector", tiling=gelu_tiling, reference=gelu_ref, epilogue=True)
def gelu(k, x, y, *, tile, max_tile=1 << 30):
    """y = gelu(x), tile by tile, ping-pong UB queues, pipe flags between the movers and V."""
    n = x.size
    xin = k.ub(x.dtype, 2 * tile, "xin")
    yout = k.ub(y.dtype, 2 * tile, "yout")
    tmp = k.ub(x.dtype, tile, "tmp")
    start, stop = k.block_range(ceil_div(n, tile))
    for e in (0, 1):
        k.set_flag("V", "MTE2", e)
        k.set_flag("MTE3", "V", e)
    with k.loop(start, stop) as t:
        pp = k.let(t % 2, "pp")
        cnt = k.let(isa.imin(tile, n - t * tile), "cnt")
        xa, ya = xin[pp * tile], yout[pp * tile]
        k.wait_flag("V", "MTE2", pp)
        k.copy_in(xa, x[t * tile], cnt)
        k.set_flag("MTE2", "V", pp)
        k.wait_flag("MTE2", "V", pp)
        k.wait_flag("MTE3", "V", pp)
        k.vmul(tmp, xa, xa, cnt)
        k.vmuls(tmp, tmp, 0.044715, cnt)
        k.vadds(tmp, tmp, 1.0, cnt)
        k.vmul(tmp, tmp, xa, cnt)
        k.vmuls(tmp, tmp, -C, cnt)
        k.vexp(tmp, tmp, cnt)
        k.vadds(tmp, tmp, 1.0, cnt)
        k.vdiv(ya, xa, tmp, cnt)
        k.epilogue(ya, cnt, size=tile)  # fused elementwise consumers run here, in place
        k.set_flag("V", "MTE2", pp)
        k.set_flag("V", "MTE3", pp)
        k.wait_flag("V", "MTE3", pp)
        k.copy_out(y[t * tile], ya, cnt)
        k.set_flag("MTE3", "V", pp)
    for e in (0, 1):
        k.wait_flag("V", "MTE2", e)
        k.wait_flag("MTE3", "V", e)


def mm_shape(a, b):
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"need (m, k) @ (k, n), got {a.shape} @ {b.shape}")
    return (a.shape[0], b.shape[1]), "float32"


def mm_ref(a, b):
    return a.astype(np.float32) @ b.astype(np.float32)


@lm.kernel(unit="cube", outputs=mm_shape, reference=mm_ref,
           tiling=lambda spec, a, b, c: {"tm": 32, "tn": 32, "tk": 32, "blocks": 4},
           flops=lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1])  # fmt: skip
def small_mm(k, a, b, c, *, tm, tn, tk):
    """c = a @ b, one 32x32 output tile per item, K in chunks of 32 accumulated in L0C."""
    M, K = a.shape
    N = b.shape[1]
    l1a, l1b = k.l1(a.dtype, tm * tk, "l1a"), k.l1(b.dtype, tk * tn, "l1b")
    l0a, l0b = k.l0a(a.dtype, tm * tk, "l0a"), k.l0b(b.dtype, tk * tn, "l0b")
    l0c = k.l0c("float32", tm * tn, "l0c")
    nn = ceil_div(N, tn)
    start, stop = k.block_range(ceil_div(M, tm) * nn)
    with k.loop(start, stop) as t:
        m0, n0 = k.let(t // nn * tm, "m0"), k.let(t % nn * tn, "n0")
        mv, nv = k.let(isa.imin(tm, M - m0), "mv"), k.let(isa.imin(tn, N - n0), "nv")
        with k.loop(ceil_div(K, tk)) as kc:
            k0 = k.let(kc * tk, "k0")
            kv = k.let(isa.imin(tk, K - k0), "kv")
            k.load_nz(l1a, a[m0 * K + k0], mv, kv, (K, 1), dst_rows=tm)
            k.load_nz(l1b, b[k0 * N + n0], kv, nv, (N, 1), dst_rows=tk)
            k.set_flag("MTE2", "MTE1")
            k.wait_flag("MTE2", "MTE1")
            k.load_l0(l0a, l1a, (mv + 15) // 16 * 16, (kv + 15) // 16 * 16, tm, tm)
            k.load_l0(l0b, l1b, (kv + 15) // 16 * 16, (nv + 15) // 16 * 16, tk, tk)
            k.set_flag("MTE1", "M")
            k.wait_flag("MTE1", "M")
            k.mmad(l0c, l0a, l0b, mv, nv, kv, tm, tk, tm, accumulate=isa.imin(kc, 1))
            k.pipe_barrier()
        k.fixpipe(c[m0 * N + n0], l0c, mv, nv, (N, 1), src_rows=tm)
        k.pipe_barrier()


@pytest.fixture(params=["ascend910", "ascend910b"])
def spec(request):
    lm.init_device(0, spec=request.param)
    yield request.param
    lm.init_device(0, spec="ascend910")


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_vector_kernel_equals_numpy(spec, backend):
    for n in (0, 1, 31, 1000, 5003):
        a = np.linspace(-6, 6, n, dtype=np.float32)
        ck = gelu.compile(a, backend=backend, max_tile=256)  # several tiles: both ping-pongs
        out = np.full(n, np.nan, np.float32)
        ck(a, out)
        np.testing.assert_allclose(out, gelu_ref(a), rtol=1e-5, atol=1e-6)
    assert ck.program.device_blocks == 8 and ck.backend == backend


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_cube_kernel_equals_numpy(spec, backend):
    rng = np.random.default_rng(0)
    # (each Cube compile costs ~1 s of LLVM: two shapes, both dtypes, tails on every axis)
    for dt, (m, kk, n) in (("float32", (1, 1, 1)), ("float16", (37, 70, 29))):
        a = rng.standard_normal((m, kk)).astype(dt)
        b = rng.standard_normal((kk, n)).astype(dt)
        ck = small_mm.compile(a, b, backend=backend)
        c = np.zeros((m, n), np.float32)
        ck(a.reshape(-1), b.reshape(-1), c.reshape(-1))
        np.testing.assert_allclose(c, mm_ref(a, b), rtol=1e-4, atol=1e-4)


def test_kernel_inside_a_graph(spec, backend, check):
    """Producers and consumers around a user kernel: each side is its own fused kernel; the
    fusion log says why; the value equals numpy on every backend (the reference backend runs
    the author's numpy reference)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((37, 70)).astype(np.float16)
    b = rng.standard_normal((70, 29)).astype(np.float16)
    x = lm.tensor(a)
    out = lm.sum(gelu(small_mm(x * 2, lm.tensor(b)) + 1) * 3, axis=0)
    s = lm.schedule(out)
    kinds = [(k.kind, k.unit) for k in s.kernels]
    assert ("custom", "cube") in kinds and ("custom", "vector") in kinds
    assert [k.ops for k in s.kernels if k.kind == "custom"] == [["small_mm"], ["gelu"]]
    assert "a user kernel reads dense inputs from GM" in str(s)
    c = mm_ref(a * np.float16(2), b) + 1
    check(out, (gelu_ref(c) * 3).sum(axis=0), rtol=1e-4, atol=1e-4)


def test_epilogue_slot_fuses_elementwise_consumers(spec, backend, monkeypatch):
    """gelu is defined with epilogue=True and calls k.epilogue(tile, n): consumers that read
    only its value and constants run inside it (composites included); others stay apart."""
    a = np.linspace(-4, 4, 3001, dtype=np.float32)
    y = lm.sin(gelu(lm.tensor(a)) * 2 + 1)
    (k,) = lm.schedule(y).kernels
    assert k.ops == ["gelu", "mul", "add", "sin"] and k.kind == "custom"
    assert not lm.schedule(y).fusion_log
    monkeypatch.setenv("LAZYMATH_VALIDATE", "1")  # also checks the reference + epilogue path
    np.testing.assert_allclose(y.numpy(), np.sin(gelu_ref(a) * 2 + 1), rtol=1e-5, atol=1e-5)
    x = lm.tensor(a)
    z = gelu(x) * x  # reads another tensor: not an epilogue
    s = lm.schedule(z)
    assert [k.ops for k in s.kernels] == [["gelu"], ["mul"]]
    assert "epilogue slot takes elementwise ops on its value and constants" in str(s)
    np.testing.assert_allclose(z.numpy(), gelu_ref(a) * a, rtol=1e-5, atol=1e-6)
    # small_mm has no epilogue slot: its consumers stay a separate kernel
    b = np.ones((4, 4), np.float32)
    assert len(lm.schedule(small_mm(lm.tensor(b), lm.tensor(b)) * 2).kernels) == 2


def test_strided_and_offset_inputs_are_made_dense(backend, check):
    """A user kernel reads dense GM: views (transposed, sliced, offset, flipped) and
    non-contiguous arrays reach it through a copy."""
    a = np.linspace(-4, 4, 7 * 13, dtype=np.float32).reshape(7, 13)
    check(gelu(lm.tensor(a).T), gelu_ref(a.T), rtol=1e-5, atol=1e-6)
    check(gelu(lm.tensor(a)[2:, ::-3]), gelu_ref(a[2:, ::-3]), rtol=1e-5, atol=1e-6)
    check(gelu(lm.asarray(a[:, 1:])), gelu_ref(a[:, 1:]), rtol=1e-5, atol=1e-6)


def test_program_cache_and_params(check):
    a = np.linspace(-3, 3, 300, dtype=np.float32)
    x = lm.tensor(a)
    gelu(x).realize()
    hits = lm.cache_info()["program_hits"]
    check(gelu(lm.tensor(a)), gelu_ref(a), rtol=1e-5)
    assert lm.cache_info()["program_hits"] == hits + 1
    # a keyword parameter is part of the op's key: another program, same values
    check(gelu(lm.tensor(a), max_tile=64), gelu_ref(a), rtol=1e-5)
    assert lm.cache_info()["program_hits"] == hits + 1
    k = lm.schedule(gelu(x, max_tile=64)).kernels[0]
    assert k.ir.params == (("max_tile", 64),)


def test_validate_compares_with_the_reference(monkeypatch):
    a = np.linspace(-3, 3, 100, dtype=np.float32)
    monkeypatch.setenv("LAZYMATH_VALIDATE", "1")
    np.testing.assert_allclose(gelu(lm.tensor(a)).numpy(), gelu_ref(a), rtol=1e-5)

    @lm.kernel(reference=lambda x: x + 1)  # the program computes x + 2: the check must fire
    def wrong(k, x, y):
        t = k.ub(x.dtype, 128, "t")
        k.copy_in(t, x[0], x.size)
        k.vadds(t, t, 2.0, x.size)
        k.copy_out(y[0], t, x.size)

    with pytest.raises(AssertionError, match="LAZYMATH_VALIDATE: kernel k0_wrong"):
        wrong(lm.tensor(a)).numpy()


def test_cost_profile_and_report(tmp_path):
    a = np.linspace(-3, 3, 4096, dtype=np.float32)
    cost = gelu.cost(a, max_tile=512)
    assert {"MTE2", "MTE3", "Vector"} <= set(cost.pipes) and cost.total > 0
    x = lm.tensor(a)
    y = gelu(x * 2)
    with lm.profile() as p:
        y.realize()
    names = [r.name for r in p.kernels]
    assert any("gelu" in n for n in names), names
    assert "gelu" in p.summary(print_=False)
    path = lm.report(gelu(x) + 1, filename=tmp_path / "r.html")
    assert "gelu" in open(path).read()
    (gelu(x * 3) * lm.tensor(a)).visualize(str(tmp_path / "g.dot"))
    assert "gelu (kernel)" in (tmp_path / "g.dot").read_text()


def test_missing_flag_is_a_race_on_the_interpreter():
    @lm.kernel(tiling=lambda spec, x, y: {"tile": 64})
    def racy(k, x, y, *, tile):
        a, b = k.ub(x.dtype, tile, "a"), k.ub(x.dtype, tile, "b")
        with k.loop(ceil_div(x.size, tile)) as t:
            cnt = k.let(isa.imin(tile, x.size - t * tile))
            k.copy_in(a, x[t * tile], cnt)
            k.set_flag("MTE2", "V")
            k.wait_flag("MTE2", "V")
            k.vexp(b, a, cnt)
            k.copy_out(y[t * tile], b, cnt)  # no V -> MTE3 flag before the copy-out

    a = np.zeros(200, np.float32)
    with pytest.raises(RaceError, match=r"race on b: MTE3 .* Vector->MTE3"):
        racy.compile(a, backend="interp")(a, np.zeros_like(a))
    with pytest.raises(RaceError, match="race on b"):
        racy.check(a)
    with pytest.raises(RaceError, match="race on b: .*found when the kernel was built"):
        racy(lm.tensor(a)).numpy()  # on llvm too: the build steps block 0 through interp
    np.testing.assert_allclose(gelu.check(a + 1, max_tile=64), gelu_ref(a + 1), rtol=1e-5)


def test_validate_steps_user_kernels_through_the_interpreter(monkeypatch):
    """With a numpy reference the validate run still interprets the program: a race is found
    even when the kernel runs natively."""

    @lm.kernel(reference=np.exp, tiling=lambda spec, x, y: {"tile": 64}, check=False)
    def racy_exp(k, x, y, *, tile):
        a, b = k.ub(x.dtype, tile, "a"), k.ub(x.dtype, tile, "b")
        with k.loop(ceil_div(x.size, tile)) as t:
            cnt = k.let(isa.imin(tile, x.size - t * tile))
            k.copy_in(a, x[t * tile], cnt)
            k.set_flag("MTE2", "V")
            k.wait_flag("MTE2", "V")
            k.vexp(b, a, cnt)
            k.copy_out(y[t * tile], b, cnt)

    a = np.zeros(100, np.float32)
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    # check=False: no build-time dry run, and llvm trusts the flags
    np.testing.assert_allclose(racy_exp(lm.tensor(a)).numpy(), np.exp(a))
    monkeypatch.setenv("LAZYMATH_VALIDATE", "1")
    with pytest.raises(RaceError, match="race on b"):
        racy_exp(lm.tensor(a + 1)).numpy()


def test_definition_and_call_errors():
    a = np.zeros(10, np.float32)

    @lm.kernel
    def huge(k, x, y):
        k.ub("float32", 1000, "small")
        k.ub("float32", 100_000, "big")

    with pytest.raises(isa.BufferOverflowError, match=r"UB buffer big \(100000 x float32 = "
                       r"400000 B\) does not fit: 4000 B of UB already declared, UB capacity "
                       r"262144 B on ascend910"):  # fmt: skip
        huge.program(a)
    with pytest.raises(isa.BufferOverflowError, match="UB capacity 196608 B on ascend910b"):
        huge.program(a, spec="ascend910b")

    @lm.kernel
    def bad_dtype(k, x, y):
        k.ub("complex64", 8, "z")

    with pytest.raises(KernelDefinitionError, match="unknown dtype 'complex64'"):
        bad_dtype.program(a)

    @lm.kernel
    def l1_in_vector(k, x, y):
        k.l1("float16", 64)

    with pytest.raises(KernelDefinitionError, match="a Vector kernel has only UB"):
        l1_in_vector.program(a)

    @lm.kernel(unit="cube")
    def ub_on_910b_cube(k, x, y):
        k.ub("float32", 64)

    ub_on_910b_cube.program(a)  # the coupled 910's Cube core has UB
    with pytest.raises(KernelDefinitionError, match="Cube cores have no UB"):
        ub_on_910b_cube.program(a, spec="ascend910b")

    @lm.kernel(epilogue=True)
    def no_slot_call(k, x, y):
        t = k.ub(x.dtype, 64, "t")
        k.copy_in(t, x[0], x.size)
        k.copy_out(y[0], t, x.size)

    with pytest.raises(KernelDefinitionError, match="never calls k.epilogue"):
        (no_slot_call(a) + 1).numpy()

    @lm.kernel
    def bad_pipe(k, x, y):
        k.set_flag("MTE2", "VEC")

    with pytest.raises(KernelDefinitionError, match="unknown pipe 'VEC'"):
        bad_pipe.program(a)

    @lm.kernel(outputs=lambda x: (x.shape[3], x.dtype))
    def bad_shape(k, x, y):
        pass

    with pytest.raises(KernelDefinitionError, match="shape function raised IndexError"):
        bad_shape(a)
    with pytest.raises(TypeError, match="takes 1 input"):
        gelu(a, a)
    with pytest.raises(KernelDefinitionError, match="unit must be one of vector, cube"):
        lm.kernel(unit="aicpu")(lambda k, x, y: None)
    with pytest.raises(TypeError, match="must be hashable"):
        gelu(a, max_tile=[1])


CACHE_SCRIPT = """
import numpy as np, lazymath as lm
from lazymath.backend.npu import isa

@lm.kernel(tiling=lambda spec, x, y: {{"tile": 128}})
def plus(k, x, y, *, tile):
    t = k.ub(x.dtype, tile, "t")
    with k.loop(lm.lowlevel.ceil_div(x.size, tile)) as i:
        cnt = k.let(isa.imin(tile, x.size - i * tile))
        k.copy_in(t, x[i * tile], cnt)
        k.vadds(t, t, {value}, cnt)
        k.copy_out(y[i * tile], t, cnt)

a = np.arange(300, dtype=np.float32)
assert np.array_equal(plus(lm.tensor(a)).numpy(), a + {value})
info = lm.cache_info()
print(info["compiled"], info["disk_hits"])
"""


def test_disk_cache_hit_in_a_second_process_and_edits_recompile(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, LAZYMATH_CACHE_DIR=str(tmp_path / "cache"),
               LAZYMATH_BACKEND="llvm")  # fmt: skip

    def run(value: str) -> tuple[int, int]:
        script = tmp_path / "k.py"
        script.write_text(textwrap.dedent(CACHE_SCRIPT.format(value=value)))
        out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        compiled, hits = out.stdout.split()[-2:]
        return int(compiled), int(hits)

    assert run("1.0") == (1, 0)  # first process: compiles and stores
    assert run("1.0") == (0, 1)  # second process: loads the kernel from disk
    assert run("2.0") == (1, 0)  # the source changed: a new key, compiled again


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_launch_on_a_user_stream_after_an_event(backend):
    """The runtime layer beside lazy graphs: a realize, an event recorded after it on the
    default stream, a user stream that waits on it and runs a user kernel on device memory
    (aclrtMalloc / aclrtMemcpy / aclrtLaunchKernel with a chosen block count)."""
    rt = lm.runtime
    a = np.linspace(-3, 3, 3001, dtype=np.float32)
    dev = lm.current_device()
    h = (lm.tensor(a) * 0.5).realize()
    ev = rt.create_event("after-realize")
    ev.record(dev.default_stream)
    st = dev.create_stream()
    st.wait_event(ev)
    y = gelu.launch(h.numpy(), stream=st, blocks=3, backend=backend, max_tile=512)
    st.synchronize()
    np.testing.assert_allclose(y, gelu_ref(a * np.float32(0.5)), rtol=1e-5, atol=1e-6)
    # the same on device buffers, the kernel compiled once and launched with 5 blocks
    ck = gelu.compile(a, backend=backend, max_tile=512)
    src, dst = rt.malloc(a.nbytes), rt.malloc(a.nbytes)
    rt.memcpy_h2d(src, a)
    rt.launch(ck, 5, [src, dst], st)
    st.synchronize()
    out = rt.memcpy_d2h(np.empty_like(a), dst)
    rt.free(src)
    rt.free(dst)
    np.testing.assert_allclose(out, gelu_ref(a), rtol=1e-5, atol=1e-6)


def test_context_and_ascendcl_names():
    from lazymath.lowlevel import Context, ascendcl_names

    names = ascendcl_names()
    assert "aclrtLaunchKernel" in names and "aclrtStreamWaitEvent" in names
    assert all(callable(f) for f in names.values())
    before = lm.current_device()
    ctx = Context(0, spec="ascend910b")
    assert lm.current_device() is before
    with ctx:
        assert lm.current_device().spec.name == "ascend910b"
        x = lm.tensor(np.arange(40, dtype=np.float32))
        k = lm.schedule(gelu(x)).kernels[0]
        assert k.unit == "vector" and "ascend910b" in str(lm.schedule(gelu(x)))
    assert lm.current_device() is before


def _exp_and_sum_ref(x):
    e = np.exp(x.astype(np.float32))
    return e, np.asarray(e.sum(dtype=np.float32) if e.size else np.float32(0))


@lm.kernel(outputs=lambda x: [(x.shape, "float32"), ((), "float32")], reference=_exp_and_sum_ref,
           rtol=1e-4)  # fmt: skip
def exp_and_sum(k, x, e, total, *, tile=256):
    """Two outputs: e = exp(x) and total = sum(e) (one block, no flags: serialised)."""
    xb, acc = k.ub("float32", tile, "xb"), k.ub("float32", 8, "acc")
    k.vdup(acc, 0.0, 1)
    with k.loop(ceil_div(x.size, tile)) as t:
        n = k.let(isa.imin(tile, x.size - t * tile), "n")
        k.copy_in(xb, x[t * tile], n)
        k.vexp(xb, xb, n)
        k.copy_out(e[t * tile], xb, n)
        k.vreduce("vcadd", acc, xb, n)
    k.copy_out(total[0], acc, 1)


def test_a_kernel_with_two_outputs(backend, spec):
    a = np.linspace(-2, 2, 7 * 101, dtype=np.float32).reshape(7, 101)
    x = lm.tensor(a)
    e, total = exp_and_sum(x + 1)
    assert e.shape == (7, 101) and total.shape == ()
    s = lm.schedule(e * 2, total)
    assert [k.ops for k in s.kernels if k.kind == "custom"] == [["exp_and_sum"]]
    want_e, want_t = _exp_and_sum_ref(a + 1)
    np.testing.assert_allclose((e * 2).numpy(), want_e * 2, rtol=1e-5)
    np.testing.assert_allclose(total.numpy(), want_t, rtol=1e-5)
    (t_only,) = [exp_and_sum(lm.tensor(a))[1]]  # one output used: the other is scratch
    np.testing.assert_allclose(t_only.numpy(), _exp_and_sum_ref(a)[1], rtol=1e-5)
    e2, t2 = exp_and_sum.launch(a, backend="interp" if backend == "interp" else None)
    lm.current_device().synchronize()
    np.testing.assert_allclose(e2, want_e / np.e, rtol=1e-5)
    with pytest.raises(KernelDefinitionError, match="shape function raised TypeError"):
        exp_and_sum.launch(a, a)


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_a_hand_scheduled_program_of_user_kernels(backend):
    """Your own schedule: two independent user kernels on streams 1 and 2, a third on stream 1
    that waits for stream 2's event (Device.execute replays the launches; `Launch` names the
    stream, the block count, the waits and the record)."""
    rt = lm.runtime
    a = np.linspace(-3, 3, 2000, dtype=np.float32)
    g1 = gelu.compile(a, backend=backend, max_tile=256)
    e1 = exp_and_sum.compile(a, backend=backend)
    g2 = gelu.compile(a, backend=backend, max_tile=128)
    y1, y2, y3 = (np.empty_like(a) for _ in range(3))
    tot = np.zeros((), np.float32)
    steps = [
        rt.Launch(g1, blocks=4, stream=1, unit="vector"),
        rt.Launch(e1, blocks=1, stream=2, record=0, unit="vector"),
        rt.Launch(g2, blocks=2, stream=1, waits=(0,), unit="vector"),  # reads y2 (stream 2)
    ]
    argvs = [g1.make_argv([a, y1]), e1.make_argv([a, y2, tot.reshape(1)]),
             g2.make_argv([y2, y3])]  # fmt: skip
    dev = lm.current_device()
    with lm.profile() as p:
        dev.execute(steps, argvs, [rt.create_event()])
    np.testing.assert_allclose(y1, gelu_ref(a), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y3, gelu_ref(np.exp(a)), rtol=1e-5, atol=1e-6)
    assert sorted({k.stream for k in p.kernels}) == [1, 2]


def _affine3_ref(x):
    with np.errstate(over="ignore"):
        return (x * x.dtype.type(3) + x.dtype.type(1)).astype(x.dtype)


@lm.kernel(reference=_affine3_ref)
def affine3(k, x, y, *, tile=128):
    """y = 3x + 1 in x's dtype (integers wrap like numpy)."""
    b = k.ub(x.dtype, tile, "b")
    with k.loop(ceil_div(x.size, tile)) as t:
        n = k.let(isa.imin(tile, x.size - t * tile))
        k.copy_in(b, x[t * tile], n)
        k.vmuls(b, b, 3, n)
        k.vadds(b, b, 1, n)
        k.copy_out(y[t * tile], b, n)


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_every_buffer_dtype(backend):
    for dt in ("float16", "float32", "float64", "int8", "int32", "int64"):
        a = (np.arange(-150, 151) % 100).astype(dt)  # int8: 3 * 99 + 1 wraps
        out = np.zeros_like(a)
        affine3.compile(a, backend=backend)(a, out)
        np.testing.assert_array_equal(out, _affine3_ref(a), err_msg=dt)


@lm.kernel(outputs=lambda *, n, value: ((n,), "float32"),
           reference=lambda *, n, value: np.full(n, value, np.float32))  # fmt: skip
def fill(k, y, *, n, value):
    """A kernel without inputs: its output's shape comes from its parameters."""
    b = k.ub("float32", 256, "b")
    k.vdup(b, float(value), 256)
    with k.loop(ceil_div(n, 256)) as t:
        k.copy_out(y[t * 256], b, k.let(isa.imin(256, n - t * 256)))


def test_a_kernel_without_inputs(backend, check):
    check(fill(n=1000, value=2.5) + 1, np.full(1000, 3.5, np.float32))
    check(fill(n=0, value=1.0), np.zeros(0, np.float32))


def test_let_of_a_plain_register_keeps_the_authors_order():
    """k.let(value, "name") where value is already a register (an expression that simplified
    to a Var) made a new register holding it; it used to swap the two and fail."""
    from lazymath.backend.npu.userkernel import KernelBuilder
    from lazymath.runtime.device import get_spec

    k = KernelBuilder("t", "vector", get_spec("ascend910"))
    a = k.let(5, "a")
    b = k.let(a, "b")  # value is a plain Var, name a string: the author's order
    assert isinstance(b, isa.Var) and b != a
    c = k.let(isa.Var("c"), 7)  # isa.Builder's order still works
    assert c == isa.Var("c")
    lets = [i for i in k.body if isinstance(i, isa.Let)]
    assert [(str(i.var), str(i.value)) for i in lets][-2:] == [(str(b), str(a)), ("c", "7")]
