"""Program cache tests (issue 5): a realize keys the compiled program by the graph's structural
signature (structure, shapes, dtypes, strides, constants, device spec; never the data), and a
hit replays it without graph passes, networkx, LLVM or the planner.

Most tests run on LAZYMATH_BACKEND=irref (the fused kernel IR evaluated with numpy: no
compilation, so they are fast); the headline custom op and the no-LLVM-on-a-hit guard also run
on llvm.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import types
import weakref

import numpy as np
import pytest

import lazymath as lm
from lazymath import engine
from lazymath.graph import reference
from lazymath.runtime import replay

RNG = np.random.default_rng(11)


def custom_op(A, B, scale):
    return lm.mul(lm.relu(lm.matmul(A, B)), scale)


def np_custom_op(a, b, s):
    return (np.maximum(a.astype(np.float32) @ b.astype(np.float32), 0) * np.float32(s)).astype(
        np.float16
    )


def f16(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float16)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def stats() -> tuple[int, int]:
    st = engine.PROGRAMS.stats()
    return st["program_hits"], st["program_misses"]


def realize_counting(*tensors) -> tuple[int, int]:
    """Realize and return (hits, misses) it added."""
    h0, m0 = stats()
    lm.realize(*tensors)
    h1, m1 = stats()
    return h1 - h0, m1 - m0


@pytest.fixture(autouse=True)
def fresh_programs(monkeypatch):
    """Each test starts with an empty program cache (compiled kernels stay cached)."""
    monkeypatch.setattr(engine, "PROGRAMS", engine.ProgramCache())


@pytest.fixture
def irref(monkeypatch):
    monkeypatch.setenv("LAZYMATH_BACKEND", "irref")
    monkeypatch.delenv("LAZYMATH_DEBUG", raising=False)
    return "irref"


@pytest.fixture
def llvm(monkeypatch):
    pytest.importorskip("lazymath.backend.compile")
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    monkeypatch.delenv("LAZYMATH_DEBUG", raising=False)
    return "llvm"


# ----------------------------------------------------------------------------- hits


@pytest.mark.parametrize("backend", ["irref", "llvm"])
def test_second_custom_op_call_with_new_inputs_is_a_hit(backend, monkeypatch):
    if backend == "llvm":
        pytest.importorskip("lazymath.backend.compile")
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    results = []
    for i in range(3):
        a, b, s = f16(24, 40), f16(40, 17), np.float16(0.25 * (i + 1))
        out = custom_op(lm.tensor(a), lm.tensor(b), lm.tensor(s))
        hits, misses = realize_counting(out)
        if i == 0:
            assert (hits, misses) == (0, 1)
        else:
            assert (hits, misses) == (1, 0), f"call {i}: {hits} hits, {misses} misses"
        got = out.numpy()
        np.testing.assert_allclose(
            got.astype(np.float32), np_custom_op(a, b, s).astype(np.float32), rtol=2e-3, atol=1e-2
        )
        results.append((got, a, b, s))
    # a replay allocates fresh outputs: earlier results are not overwritten
    for got, a, b, s in results:
        np.testing.assert_allclose(
            got.astype(np.float32), np_custom_op(a, b, s).astype(np.float32), rtol=2e-3, atol=1e-2
        )


def test_hit_counts_on_the_program(irref):
    x = f32(33)
    (lm.exp(lm.tensor(x)) * 2.0).realize()
    key_count = len(engine.PROGRAMS)
    for _ in range(3):
        (lm.exp(lm.tensor(f32(33))) * 2.0).realize()
    assert len(engine.PROGRAMS) == key_count
    assert max(p.hits for p in engine.PROGRAMS.programs()) >= 3
    assert lm.cache_info()["program_hits"] >= 3


def test_data_is_not_part_of_the_signature(irref):
    x = f32(7, 5)
    (lm.tensor(x) + lm.tensor(f32(5))).realize()
    y = np.full((7, 5), np.nan, np.float32)  # any values, even NaN
    hits, misses = realize_counting(lm.tensor(y) + lm.tensor(np.zeros(5, np.float32)))
    assert (hits, misses) == (1, 0)


def test_zero_d_tensor_parameter_is_data_not_a_constant(irref):
    """The custom op's scale is a 0-d tensor: a new scale value must replay the program."""
    a, b = f16(8, 16), f16(16, 8)
    custom_op(lm.tensor(a), lm.tensor(b), lm.tensor(np.float16(0.5))).realize()
    out = custom_op(lm.tensor(a), lm.tensor(b), lm.tensor(np.float16(-2.0)))
    assert realize_counting(out) == (1, 0)
    np.testing.assert_allclose(
        out.numpy().astype(np.float32),
        np_custom_op(a, b, -2.0).astype(np.float32),
        rtol=2e-3,
        atol=1e-2,
    )


# ----------------------------------------------------------------------------- misses


def _misses_after_warm(build_a, build_b) -> int:
    """Realize build_a() (warming the cache), then build_b(): the misses build_b adds."""
    build_a().realize()
    build_a().realize()
    return realize_counting(build_b())[1]


def test_same_graph_hits_after_warmup(irref):
    g = lambda: lm.sin(lm.tensor(f32(12))) + 1.0  # noqa: E731
    assert _misses_after_warm(g, g) == 0


@pytest.mark.parametrize(
    "what,other",
    [
        ("shape", lambda: lm.sin(lm.tensor(f32(13))) + 1.0),
        ("dtype", lambda: lm.sin(lm.tensor(f16(12))) + 1.0),
        ("op", lambda: lm.cos(lm.tensor(f32(12))) + 1.0),
        ("strides", lambda: lm.sin(lm.tensor(f32(24))[::2]) + 1.0),
        ("negative strides", lambda: lm.sin(lm.tensor(f32(12))[::-1]) + 1.0),
    ],
)
def test_different_signature_is_a_miss(irref, what, other):
    base = lambda: lm.sin(lm.tensor(f32(12))) + 1.0  # noqa: E731
    assert _misses_after_warm(base, other) == 1, what


def test_a_new_scalar_value_is_a_hit_unless_folded(irref, monkeypatch):
    """A Python scalar is a runtime argument by default: another value replays the program;
    with LAZYMATH_SCALAR_ARGS=0 it is a constant of the signature, so a miss."""
    base = lambda: lm.sin(lm.tensor(f32(12))) + 1.0  # noqa: E731
    other = lambda: lm.sin(lm.tensor(f32(12))) + 2.0  # noqa: E731
    assert _misses_after_warm(base, other) == 0
    monkeypatch.setenv("LAZYMATH_SCALAR_ARGS", "0")
    assert _misses_after_warm(base, other) == 1


def _leaf(arr: np.ndarray) -> lm.Tensor:
    """A leaf tensor over `arr` as is (lm.tensor copies to C order; realized results and
    buffers from other libraries can be strided)."""
    from lazymath.graph import node as gn

    return lm.Tensor(gn.buffer_node(arr))


def test_input_strides_are_part_of_the_signature(irref):
    """Same shape, same graph, but the leaf buffer is a transposed numpy view."""
    base = lambda: lm.exp(_leaf(f32(4, 6))) * 3.0  # noqa: E731
    transposed = lambda: lm.exp(_leaf(f32(6, 4).T)) * 3.0  # noqa: E731
    assert _misses_after_warm(base, transposed) == 1
    a = f32(6, 4)
    out = lm.exp(_leaf(a.T)) * 3.0
    assert realize_counting(out) == (1, 0)  # the transposed program is cached now
    np.testing.assert_allclose(out.numpy(), np.exp(a.T) * 3.0, rtol=1e-6)


def test_device_spec_is_part_of_the_signature(irref):
    A, B = f16(8, 16), f16(16, 8)
    g = lambda: custom_op(lm.tensor(A), lm.tensor(B), lm.tensor(np.float16(0.5)))  # noqa: E731
    g().realize()
    try:
        lm.init_device(0, spec="ascend910b")
        out = g()
        assert realize_counting(out) == (0, 1)
        np.testing.assert_allclose(
            out.numpy().astype(np.float32),
            np_custom_op(A, B, 0.5).astype(np.float32),
            rtol=2e-3,
            atol=1e-2,
        )
        assert realize_counting(g()) == (1, 0)
    finally:
        lm.init_device(0, spec="ascend910")
    assert realize_counting(g()) == (1, 0)  # the 910 program is still cached


def test_backend_is_part_of_the_key(irref, monkeypatch):
    pytest.importorskip("lazymath.backend.compile")
    g = lambda: lm.tensor(f32(9)) * 2.0 + 1.0  # noqa: E731
    g().realize()
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    g().realize()
    assert realize_counting(g()) == (1, 0)
    monkeypatch.setenv("LAZYMATH_BACKEND", "irref")
    assert realize_counting(g()) == (1, 0)


def test_realizing_different_output_sets_are_different_programs(irref):
    def build():
        x = lm.tensor(f32(20))
        return lm.exp(x), lm.sin(x)

    a, b = build()
    assert realize_counting(a, b) == (0, 1)
    a, b = build()
    assert realize_counting(a) == (0, 1)  # exp alone is another program
    a, b = build()
    assert realize_counting(a, b) == (1, 0)
    a, b = build()
    assert realize_counting(b, a) == (0, 1)  # output order is part of the signature


# ----------------------------------------------------------------------------- the hit path

_FORBIDDEN_MODULES = (
    "networkx",
    "llvmlite",
    "lazymath.fusion",
    "lazymath.backend.native.jit",
    "lazymath.backend.host.lower_llvm",
    "lazymath.backend.host.lower_cube",
    "lazymath.backend.npu.templates",
    "lazymath.backend.native.kernel_cache",
    "lazymath.backend.host.gemm",
    "lazymath.backend.npu.vmath",
)


def _boom(*args, **kwargs):
    raise AssertionError("the program-cache hit path called the compiler")


def _forbid_compilation(monkeypatch) -> None:
    """Make every entry point of the miss path raise."""
    import lazymath.fusion as fusion
    import lazymath.fusion.grouping as grouping
    import lazymath.fusion.memory as memory

    monkeypatch.setattr(fusion, "make_schedule", _boom)
    monkeypatch.setattr(fusion, "plan_memory", _boom)
    monkeypatch.setattr(grouping, "plan", _boom)
    monkeypatch.setattr(memory, "plan_memory", _boom)
    monkeypatch.setattr(engine, "compile_program", _boom)
    try:
        import lazymath.backend.compile as bc

        monkeypatch.setattr(bc, "compile_kernel", _boom)
        monkeypatch.setattr(bc, "compile_kernels", _boom)
        monkeypatch.setattr(bc, "build_program", _boom)
    except ImportError:
        pass
    try:
        import llvmlite.binding as llvm

        for name in ("parse_assembly", "create_mcjit_compiler", "create_pass_builder",
                     "create_target_machine", "parse_bitcode"):  # fmt: skip
            if hasattr(llvm, name):
                monkeypatch.setattr(llvm, name, _boom)
    except ImportError:
        pass
    try:
        import networkx as nx

        for name in ("DiGraph", "Graph", "topological_sort", "MultiDiGraph"):
            monkeypatch.setattr(nx, name, _boom)
    except ImportError:
        pass


class _ModuleTracer:
    """sys.setprofile hook: records Python calls made in forbidden modules (main thread)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        mod = frame.f_globals.get("__name__", "")
        if mod.startswith(_FORBIDDEN_MODULES):
            self.calls.append(f"{mod}.{frame.f_code.co_name}")

    def __enter__(self):
        sys.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


@pytest.mark.parametrize("backend", ["irref", "llvm"])
def test_hit_path_touches_no_compiler(backend, monkeypatch):
    if backend == "llvm":
        pytest.importorskip("lazymath.backend.compile")
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)

    def op(x, y):  # 3 kernels: sum | broadcast consumer | reduction prologue
        s = (x * y).sum(axis=1, keepdims=True)
        return ((x - s) * 2.0).max(axis=0)

    x, y = f32(9, 13), f32(9, 13)
    first = op(lm.tensor(x), lm.tensor(y))
    first.realize()
    assert len(lm.schedule(op(lm.tensor(x), lm.tensor(y))).kernels) >= 2

    x2, y2 = f32(9, 13), f32(9, 13)
    out = op(lm.tensor(x2), lm.tensor(y2))
    _forbid_compilation(monkeypatch)
    with _ModuleTracer() as tracer:
        hits, misses = realize_counting(out)
    assert (hits, misses) == (1, 0)
    assert not tracer.calls, f"hit path entered: {sorted(set(tracer.calls))}"
    want = ((x2 - (x2 * y2).sum(axis=1, keepdims=True)) * 2.0).max(axis=0)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def test_forbidding_compilation_makes_a_miss_fail(irref, monkeypatch):
    """The guard above is real: a miss under the same patches raises."""
    _forbid_compilation(monkeypatch)
    out = lm.tensor(f32(31)) * 7.0 - 0.5  # a never-seen constant: a miss
    with pytest.raises(AssertionError, match="called the compiler"):
        out.realize()


def test_tracer_sees_the_miss_path(irref):
    out = lm.tensor(f32(29)) * 5.0 - 0.5
    with _ModuleTracer() as tracer:
        assert realize_counting(out) == (0, 1)
    assert any(c.startswith("lazymath.fusion.grouping") for c in tracer.calls)


def test_cached_program_keeps_no_inputs_alive(irref):
    x = lm.tensor(f32(100_000))
    out = lm.exp(x) + 1.0
    out.realize()
    ref = weakref.ref(x._node.realized if x._node.realized.base is None else x._node.realized.base)
    del x, out
    gc.collect()
    assert ref() is None, "a cached program (or its schedule) holds a graph input"


_WORKSPACE_SCRIPT = """
import numpy as np, lazymath as lm
x = np.arange(65536, dtype=np.float32) % 7
for _ in range(2):  # a miss, then a program-cache hit
    got = float(lm.tensor(x).sum().numpy())
    assert got == float(x.sum()), (got, float(x.sum()))
print("ok")
"""


def test_replay_of_a_kernel_with_a_gm_workspace(tmp_path):
    pytest.importorskip("lazymath.backend.compile")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, LAZYMATH_BACKEND="llvm", PYTHONPATH=root,
               LAZYMATH_CACHE_DIR=str(tmp_path))  # fmt: skip
    env.pop("LAZYMATH_DEBUG", None)
    r = subprocess.run([sys.executable, "-c", _WORKSPACE_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


# ----------------------------------------------------------------------------- live intermediates


def test_live_intermediate_is_realized_along(irref):
    x = lm.tensor(f32(50))
    y = lm.exp(x) * 2.0  # the user keeps y
    z = y + 1.0
    assert realize_counting(z) == (0, 1)
    assert y._node.realized is not None  # realized along with z
    h, m = stats()
    yv = y.numpy()  # no second realize
    assert stats() == (h, m)
    np.testing.assert_allclose(yv, np.exp(x.numpy()) * 2.0, rtol=1e-6)
    np.testing.assert_allclose(z.numpy(), yv + 1.0, rtol=1e-6)


def test_live_intermediate_is_not_recomputed_reference(monkeypatch):
    monkeypatch.setenv("LAZYMATH_BACKEND", "reference")
    x = lm.tensor(f32(50))
    y = lm.exp(x) * 2.0
    z = y + 1.0
    z.realize()
    calls = reference.CALLS["nodes"]
    y.numpy()
    assert reference.CALLS["nodes"] == calls  # y came with z
    (y - 3.0).realize()  # builds on the realized y
    used = reference.CALLS["nodes"] - calls
    calls = reference.CALLS["nodes"]
    (lm.tensor(y.numpy()) - 3.0).realize()  # the same work on a fresh leaf
    assert used == reference.CALLS["nodes"] - calls


def test_live_intermediate_program_is_cached_with_it(irref):
    def step():
        x = lm.tensor(f32(40))
        y = lm.sin(x)  # live: an output of the program too
        z = y * y
        return x, y, z, realize_counting(z)

    assert step()[3] == (0, 1)
    x, y, z, counts = step()
    assert counts == (1, 0)
    assert y._node.realized is not None
    np.testing.assert_allclose(y.numpy(), np.sin(x.numpy()), rtol=1e-6)
    np.testing.assert_allclose(z.numpy(), np.sin(x.numpy()) ** 2, rtol=1e-6)


# ----------------------------------------------------------------------------- precompile


def test_precompile_then_first_call_is_a_hit(irref):
    def fn(a, b):
        return lm.relu(a @ b) * 0.5

    n = lm.precompile(fn, np.zeros((12, 20), np.float16), np.zeros((20, 6), np.float16))
    assert n == 1
    out = fn(lm.tensor(f16(12, 20)), lm.tensor(f16(20, 6)))
    assert realize_counting(out) == (1, 0)


# ----------------------------------------------------------------------------- LAZYMATH_DEBUG


def _softmaxish(n: int = 10):
    x = lm.tensor(f32(2, 4, n))
    e = lm.exp(x)  # read by two kernels (no row kernel: axes not adjacent): materialized, logged
    return e / e.sum(axis=(0, 2), keepdims=True)


def test_debug_1_prints_one_line_per_realize(irref, monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    capsys.readouterr()
    _softmaxish(11).realize()
    _softmaxish(11).realize()
    got = capsys.readouterr()
    assert got.out == ""  # debug output goes to stderr
    lines = [ln for ln in got.err.splitlines() if ln.strip()]
    assert len(lines) == 2, lines
    first, second = lines
    assert "program miss (" in first and "irref (numpy)" in first and "program hit" in second
    for ln in lines:
        assert ln.startswith("[lazymath] realize ")
        assert "planned peak" in ln
        assert "kernel" in ln and re.search(r"\d (us|ms|s)$", ln)
    assert "fusion log" not in "\n".join(lines)


def test_debug_2_adds_the_table_and_the_fusion_log(irref, monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "2")
    capsys.readouterr()
    _softmaxish(12).realize()
    out = capsys.readouterr().err
    assert out.count("[lazymath] realize") == 1
    assert "kernel" in out and "unit" in out and "bound" in out  # the table header
    assert "vector" in out and "GFLOPS" in out and "GB/s" in out
    assert "fusion log:" in out and "materialize" in out
    _softmaxish(12).realize()  # a hit prints the cached program's table and log too
    out = capsys.readouterr().err
    assert "hit" in out and "fusion log:" in out and "replay" in out


def test_debug_0_prints_nothing(irref, monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "0")
    capsys.readouterr()
    _softmaxish(13).realize()
    assert capsys.readouterr() == ("", "")


# ----------------------------------------------------------------------------- replay fast path


def _softmax_and_l2(x):
    e = lm.exp(x - x.max())
    p = e / e.sum()
    return p, (p * p).sum()


def _np_softmax_and_l2(x):
    e = np.exp(x - x.max())
    p = e / e.sum()
    return p, (p * p).sum()


def test_replay_outputs_are_fresh_arrays(llvm):
    """A replay reuses its argvs and arena, never its outputs: an earlier result survives."""
    xs = [f32(37) for _ in range(4)]
    results = []
    for xn in xs:
        p, l2 = _softmax_and_l2(lm.tensor(xn))
        lm.realize(p, l2)
        results.append((p.numpy(), l2.numpy()))
    (prog,) = engine.PROGRAMS.programs()
    assert prog.hits == 3 and prog._replay, "the hits took the replay path"
    for xn, (p, l2) in zip(xs, results):
        want_p, want_l = _np_softmax_and_l2(xn)
        np.testing.assert_allclose(p, want_p, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(l2, want_l, rtol=1e-5)
    assert len({id(p) for p, _ in results}) == 4


def test_replay_from_several_threads_at_once(llvm):
    """Threads replaying one program concurrently each take their own context (arena +
    argvs): no thread sees another's inputs or intermediates."""
    import threading

    lm.realize(*_softmax_and_l2(lm.tensor(f32(257))))  # compile once
    inputs = [[f32(257) for _ in range(25)] for _ in range(4)]
    errors: list = []

    def work(xs):
        try:
            for xn in xs:
                p, l2 = _softmax_and_l2(lm.tensor(xn))
                lm.realize(p, l2)
                want_p, want_l = _np_softmax_and_l2(xn)
                np.testing.assert_allclose(p.numpy(), want_p, rtol=1e-5, atol=1e-7)
                np.testing.assert_allclose(l2.numpy(), want_l, rtol=1e-5)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(xs,)) for xs in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    (prog,) = engine.PROGRAMS.programs()
    assert prog.hits == 100
    assert 1 <= len(prog._contexts) <= 4


def test_replay_of_non_contiguous_and_negative_stride_inputs(llvm):
    base = f32(9, 31)
    t = lm.tensor(base)
    for view, lazy in ((base[::2, 1:], t[::2, 1:]), (base[::-1, ::-3], t[::-1, ::-3]),
                       (base.T, t.T)):  # fmt: skip
        for _ in range(2):  # miss, then hit
            got = (lm.exp(lazy) * 2.0 + 1.0).numpy()
            np.testing.assert_allclose(got, np.exp(view) * 2 + 1, rtol=1e-6)


def test_replay_of_a_big_arena_returns_it_to_the_pool(llvm):
    """Arenas above KEEP_ARENA_BYTES come from the device pool per call and go back after it;
    small ones belong to the cached program and are not device memory in use."""
    n = replay.KEEP_ARENA_BYTES // 4 + 1000  # one float32 intermediate bigger than the limit
    xn = f32(n)
    for _ in range(3):
        x = lm.tensor(xn)
        m = lm.exp(x) * 2.0  # materialized: it has two consumers of different reductions
        a, b = m.sum(), (m * m).max()
        del m  # not live: an arena intermediate, not an output
        before = lm.runtime.memory_stats().allocated
        lm.realize(a, b)
        assert lm.runtime.memory_stats().allocated == before
        np.testing.assert_allclose(a.item(), (np.exp(xn) * 2).sum(), rtol=1e-4)
        np.testing.assert_allclose(b.item(), ((np.exp(xn) * 2) ** 2).max(), rtol=1e-5)
    (prog,) = engine.PROGRAMS.programs()
    if prog.arena_bytes > replay.KEEP_ARENA_BYTES:
        assert prog._contexts == []


def test_small_outputs_do_not_hold_device_memory(llvm):
    x = lm.tensor(f32(100))
    before = lm.runtime.memory_stats().allocated
    outs = [lm.sin(x) + float(i) for i in range(3)]
    lm.realize(*outs)
    assert lm.runtime.memory_stats().allocated == before
    for i, o in enumerate(outs):
        np.testing.assert_allclose(o.numpy(), np.sin(x.numpy()) + i, rtol=1e-6, atol=3e-7)


def test_replay_reuses_a_dropped_output_and_never_a_live_one(llvm):
    """A small output nobody refers to any more is reused by the next replay; a result still
    held (as a tensor, an array, or a view of it) is never written again."""
    xs = [f32(64) for _ in range(6)]

    def run(xn):
        return lm.sin(lm.tensor(xn)) * 3.0 + 1.0

    t = run(xs[0])
    t.realize()  # compile
    (prog,) = engine.PROGRAMS.programs()
    del t
    t1 = run(xs[1])
    t1.realize()
    first = t1.numpy()
    np.testing.assert_allclose(first, np.sin(xs[1]) * 3 + 1, rtol=1e-5, atol=1e-6)
    del t1
    ctx = prog._contexts[-1]
    assert ctx.outs[0] is first  # kept by the context for reuse
    view = first[::2]  # a live view: the array must not be reused
    del first
    t2 = run(xs[2])
    t2.realize()
    assert t2.numpy() is not view.base
    np.testing.assert_allclose(view, (np.sin(xs[1]) * 3 + 1)[::2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t2.numpy(), np.sin(xs[2]) * 3 + 1, rtol=1e-5, atol=1e-6)
    arr2 = id(ctx.outs[0])  # (an id: holding the array would keep it from being reused)
    del t2, view
    t3 = run(xs[3])
    t3.realize()
    assert id(t3.numpy()) == arr2, "a dropped output is reused"
    np.testing.assert_allclose(t3.numpy(), np.sin(xs[3]) * 3 + 1, rtol=1e-5, atol=1e-6)
    assert not t3.numpy().flags.writeable
    kept = [run(xn) for xn in xs[4:]]  # results held at once are distinct arrays
    lm.realize(*kept)
    assert kept[0].numpy() is not kept[1].numpy() and kept[0].numpy() is not t3.numpy()
    for k, xn in zip(kept, xs[4:]):
        np.testing.assert_allclose(k.numpy(), np.sin(xn) * 3 + 1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t3.numpy(), np.sin(xs[3]) * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("be", ["llvm", "interp"])
def test_a_multi_stream_program_replays_through_device_execute(be, monkeypatch):
    """The engine's replay of a program on several streams and the low-level API run the same
    stream loop (`Device.execute`: waits, launch, record per step): one loop, not two."""
    monkeypatch.setenv("LAZYMATH_BACKEND", be)
    from lazymath.runtime.api import Device

    calls = []
    execute = Device.execute

    def spy(self, program, argvs, events=None, **kw):
        calls.append([(s.stream, s.waits, s.record) for s in program])
        return execute(self, program, argvs, events, **kw)

    monkeypatch.setattr(Device, "execute", spy)
    a, b, c, d = (f16(8, 16), f16(16, 8), f16(8, 16), f16(16, 8))
    want = (a.astype(np.float32) @ b) @ (c.astype(np.float32) @ d)
    for _ in range(2):  # a miss, then a hit: both replay through Device.execute
        A, B, C, D = (lm.tensor(x) for x in (a, b, c, d))
        got = ((A @ B) @ (C @ D)).numpy()
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2)
    assert len(calls) == 2 and calls[0] == calls[1]
    steps = calls[0]
    assert len({s for s, _, _ in steps}) == 2  # two streams, joined by an event
    assert sum(r is not None for _, _, r in steps) == 1 and any(w for _, w, _ in steps)


def test_program_cache_is_lru_with_counters():
    from lazymath import settings

    cache = engine.ProgramCache()
    progs = {k: types.SimpleNamespace(hits=0) for k in "abc"}
    with settings.override(LAZYMATH_PROGRAM_CACHE_LIMIT="2"):
        cache.put("a", progs["a"])
        cache.put("b", progs["b"])
        assert cache.get("a") is progs["a"]  # a is now the most recently used
        cache.put("c", progs["c"])  # evicts b
    assert cache.get("b") is None and cache.get("c") is progs["c"]
    assert [k for k, _ in cache.items()] == ["a", "c"]
    assert cache.stats() == {"programs": 2, "program_hits": 2, "program_misses": 1,
                             "program_evictions": 1}  # fmt: skip
    assert progs["a"].hits == 1 and cache.pop("a") is progs["a"] and len(cache) == 1
    cache.clear()
    assert len(cache) == 0 and cache.get("c") is None


def test_program_cache_lookups_from_many_threads_all_hit():
    """Concurrent lookups of a cached program all find it: moving it to the recent end must
    not leave a moment in which another thread misses (it would compile the graph again and
    split the hit counts: test_replay_from_several_threads_at_once could fail that way), and
    the hit counts add up."""
    import threading

    cache = engine.ProgramCache()
    prog = types.SimpleNamespace(hits=0)
    cache.put("k", prog)
    found = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:

        def work():
            found.append(sum(cache.get("k") is prog for _ in range(2000)))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert found == [2000] * 4
    assert cache.hits == prog.hits == 8000 and cache.misses == 0
