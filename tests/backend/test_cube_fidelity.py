"""The Cube program is a property of the device and the kernel, and every consumer (LLVM host
lowering, numpy interpreter, cost model) gives it one meaning.

Protects the audit repros of issue 21: the tiling and the block split used to come from host
constants and os.cpu_count() (same matmul, different programs and cycle counts on different
hosts); a 16x16x16 Cube program that passed check() wrote past L0C on llvm (the host
microkernel rounds m up to its 6 rows).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from lazymath.backend import compile as C
from lazymath.backend.host import lower_llvm
from lazymath.backend.native import jit
from lazymath.backend.npu import cost, interp, isa
from lazymath.backend.npu import isa_cube as cube
from lazymath.backend.npu.kernel_ir import ArgView, MatmulKernel, SOp
from lazymath.backend.npu.templates import matmul as T
from lazymath.runtime.device import ASCEND910, ASCEND910B

_counter = [0]


def mm_kernel(m: int, n: int, k: int, dtype: str = "float16") -> MatmulKernel:
    a = ArgView(dtype, (m, k), (k, 1))
    b = ArgView(dtype, (k, n), (n, 1))
    return MatmulKernel((), m, n, k, a, b, None, None, dtype, (), (SOp("acc", "float32"),), (0,),
                        (ArgView("float32", (m, n), (n, 1)),))  # fmt: skip


@pytest.mark.parametrize("spec", [ASCEND910, ASCEND910B], ids=lambda s: s.name)
@pytest.mark.parametrize("shape", [(300, 512, 768), (4096, 4096, 4096), (37, 19, 5)])
def test_program_and_cost_do_not_depend_on_the_host(monkeypatch, spec, shape):
    """Audit: 300x512x768 gave 6 blocks / 47,271 cycles with 2 host workers and 39 / 37,467 with
    16. Now the listing and the estimate are the same for any host core count; only the host
    mapping (how many threads run the blocks) follows the host."""
    ir = mm_kernel(*shape)
    seen = []
    for cpus in (2, 16):
        monkeypatch.setattr(C, "num_threads", lambda cpus=cpus: cpus)  # the host mapping's count
        prog = T.build(ir, spec, "mm")
        est = cost.estimate(prog, spec)
        seen.append((str(prog), est.total, est.pipes, C.host_blocks(ir, prog)))
    (text2, tot2, pipes2, hb2), (text16, tot16, pipes16, hb16) = seen
    assert text2 == text16 and tot2 == tot16 and pipes2 == pipes16
    assert hb2 <= 2 and hb16 <= 16
    if shape[0] >= 300:
        assert hb16 > hb2  # the host mapping does follow the host


def test_presets_get_tilings_from_their_capacities():
    """910 (L0C 256 KiB, L1 1 MiB) and 910B (L0C 128 KiB, L1 512 KiB) tile differently, each within
    its own capacities, and split over their own Cube core counts (32 / 24)."""
    ir = mm_kernel(4096, 4096, 4096)
    t910, t910b = T.tile_matmul(ir, ASCEND910), T.tile_matmul(ir, ASCEND910B)
    assert (t910.tm, t910.tn) != (t910b.tm, t910b.tn)
    for spec, t in ((ASCEND910, t910), (ASCEND910B, t910b)):
        assert t.l0c_bufs * t.tm * t.tn * 4 <= spec.l0c_bytes
        assert t.l0a_bufs * t.tm * t.kl0 * 2 <= spec.l0a_bytes
        assert t.l0b_bufs * t.kl0 * t.n0 * 2 <= spec.l0b_bytes
        assert t.kc % t.kl0 == 0 and t.tn % t.n0 == 0
        assert t.l1_bufs * (t.tm + t.tn) * t.kc * 2 <= spec.l1_bytes
        prog = T.build(ir, spec, "mm")
        assert prog.blocks == prog.device_blocks == spec.cube_cores
        assert t.items % spec.cube_cores == 0


def _cube_program(m: int, n: int, k: int, rp: int) -> isa.Program:
    """A hand-written single-tile Cube program: padded row count `rp` (a multiple of 16)."""
    kp, np_ = -(-k // 16) * 16, -(-n // 16) * 16
    A = isa.Buffer("a", "GM", "float32", 0, arg=0)
    B = isa.Buffer("b", "GM", "float32", 0, arg=1)
    O = isa.Buffer("o", "GM", "float32", 0, arg=2)
    l1a = isa.Buffer("l1a", "L1", "float32", rp * kp)
    l1b = isa.Buffer("l1b", "L1", "float32", kp * np_)
    l0a = isa.Buffer("l0a", "L0A", "float32", rp * kp)
    l0b = isa.Buffer("l0b", "L0B", "float32", kp * np_)
    l0c = isa.Buffer("l0c", "L0C", "float32", rp * np_)
    R = isa.Ref
    body = (
        cube.LoadNz(R(l1a, 0), rp, R(A, 0), (k, 1), m, k, 16),
        cube.LoadNz(R(l1b, 0), kp, R(B, 0), (n, 1), k, n, 16),
        cube.LoadL0(R(l0a, 0), rp, R(l1a, 0), rp, -(-m // 16) * 16, kp),
        cube.LoadL0(R(l0b, 0), kp, R(l1b, 0), kp, kp, np_),
        cube.Mmad(R(l0c, 0), rp, R(l0a, 0), rp, R(l0b, 0), kp, m, n, k, 0, "float32"),
        cube.FixPipe(R(O, 0), (n, 1), R(l0c, 0), rp, m, n),
    )
    return isa.Program("cube_hand", (A, B, O), (l1a, l1b, l0a, l0b, l0c), body, unit="cube")


def run_both(prog: isa.Program, arrays: list[np.ndarray]) -> tuple[list, list]:
    a_int = [a.copy() for a in arrays]
    interp.run(prog, a_int, 0, 1)
    _counter[0] += 1
    sym = f"t_cube_fid_{_counter[0]}"
    text = str(lower_llvm.lower_program(prog, symbol=sym))
    addr, _ = jit.get_jit().compile(text, sym, sym + "_mod")
    a_nat = [a.copy() for a in arrays]
    argv = (ctypes.c_void_p * len(a_nat))(*[a.ctypes.data for a in a_nat])
    jit.as_cfunc(addr)(0, 1, argv)
    return a_int, a_nat


@pytest.mark.parametrize("m,n,k,rp", [(16, 16, 16, 16), (13, 16, 16, 16), (20, 33, 17, 32),
                                      (48, 16, 32, 48), (1, 1, 1, 16)])  # fmt: skip
def test_cube_tile_whose_rows_are_not_a_multiple_of_the_host_microkernel(m, n, k, rp):
    """Audit: a 16x16x16 program that passed check() segfaulted in 5 of 12 runs on llvm (the host
    6-row microkernel wrote rows 16-17 past L0C). The last rows of a tile now run a microkernel of
    that many rows; the result equals numpy's on both consumers, run after run."""
    prog = _cube_program(m, n, k, rp).check(ASCEND910B)
    rng = np.random.default_rng(m * 1000 + n)
    a = rng.standard_normal(m * k).astype(np.float32)
    b = rng.standard_normal(k * n).astype(np.float32)
    want = (a.reshape(m, k).astype(np.float64) @ b.reshape(k, n)).reshape(-1)
    for _ in range(3):
        out = np.full(m * n, np.nan, np.float32)
        got_i, got_n = run_both(prog, [a, b, out])
        np.testing.assert_allclose(got_i[2], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got_n[2], want, rtol=1e-5, atol=1e-5)


def test_l1_overwritten_after_load_l0a_gives_a_at_b_on_both_consumers():
    """Audit: LoadL0 was a copy on interp and a pointer alias on llvm, so overwriting L1 after
    loading L0A gave A @ B on interp and B @ B on llvm. The lowering now proves the alias
    unobservable or copies: this program keeps the copy and both give A @ B."""
    m = n = k = 16
    A = isa.Buffer("a", "GM", "float32", 0, arg=0)
    B = isa.Buffer("b", "GM", "float32", 0, arg=1)
    O = isa.Buffer("o", "GM", "float32", 0, arg=2)
    l1a = isa.Buffer("l1a", "L1", "float32", 256)
    l1b = isa.Buffer("l1b", "L1", "float32", 256)
    l0a = isa.Buffer("l0a", "L0A", "float32", 256)
    l0b = isa.Buffer("l0b", "L0B", "float32", 256)
    l0c = isa.Buffer("l0c", "L0C", "float32", 256)
    R = isa.Ref
    body = (
        cube.LoadNz(R(l1a, 0), 16, R(A, 0), (k, 1), m, k, 16),
        cube.LoadL0(R(l0a, 0), 16, R(l1a, 0), 16, 16, 16),
        cube.LoadNz(R(l1a, 0), 16, R(B, 0), (n, 1), k, n, 16),  # L1 reused for B
        cube.LoadNz(R(l1b, 0), 16, R(B, 0), (n, 1), k, n, 16),
        cube.LoadL0(R(l0b, 0), 16, R(l1b, 0), 16, 16, 16),
        cube.Mmad(R(l0c, 0), 16, R(l0a, 0), 16, R(l0b, 0), 16, m, n, k, 0, "float32"),
        cube.FixPipe(R(O, 0), (n, 1), R(l0c, 0), 16, m, n),
    )
    prog = isa.Program("l1_reuse", (A, B, O), (l1a, l1b, l0a, l0b, l0c), body, unit="cube")
    prog.check(ASCEND910)
    from lazymath.backend.host.lower_cube import aliasable_l0

    assert aliasable_l0(prog) == {"l0b"}  # l0a's source changed before the Mmad read it
    rng = np.random.default_rng(1)
    a = rng.standard_normal(256).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    want = (a.reshape(16, 16).astype(np.float64) @ b.reshape(16, 16)).reshape(-1)
    got_i, got_n = run_both(prog, [a, b, np.zeros(256, np.float32)])
    np.testing.assert_allclose(got_i[2], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_n[2], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", [ASCEND910, ASCEND910B], ids=lambda s: s.name)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_template_keeps_the_proven_l0_alias(spec, dtype):
    """The matmul template's programs are proven alias-safe (the host keeps its pointer step),
    and their memoised B panels read a GM buffer the program never writes."""
    from lazymath.backend.host.lower_cube import aliasable_l0, memo_sources_read_only

    prog = T.build(mm_kernel(300, 512, 768, dtype), spec, "mm")
    assert aliasable_l0(prog) == {"l0a", "l0b"}
    assert memo_sources_read_only(prog)


@pytest.mark.parametrize(
    "m,rp,why",
    [(17, 16, "rows in an NZ tile"), (16, 16, None)],
)
def test_check_rejects_a_cube_access_outside_its_tile(m, rp, why):
    """Every Cube instruction's accesses are bounded statically: an Mmad over more rows than its
    L0 tiles pad is rejected by check() before any consumer runs it."""
    prog = _cube_program(16, 16, 16, rp)
    bad = tuple(
        cube.Mmad(i.c, i.c_rows, i.a, i.a_rows, i.b, i.b_rows, m, i.n, i.k, 0, "float32")
        if isinstance(i, cube.Mmad) else i for i in prog.body
    )  # fmt: skip
    prog = isa.Program(prog.name, prog.args, prog.buffers, bad, unit="cube")
    if why is None:
        prog.check(ASCEND910B)
        return
    with pytest.raises(ValueError, match=why):
        prog.check(ASCEND910B)


def test_check_rejects_an_l0c_offset_past_the_buffer():
    prog = _cube_program(16, 16, 16, 16)
    j = isa.Var("j")
    body = tuple(
        isa.Loop(j, 0, 2, 1, (cube.Mmad(i.c + isa.mul(j, 256), 16, i.a, 16, i.b, 16, 16, 16, 16, 0,
                                        "float32"),))  # fmt: skip
        if isinstance(i, cube.Mmad) else i for i in prog.body
    )  # fmt: skip
    with pytest.raises(ValueError, match="outside"):
        isa.Program(prog.name, prog.args, prog.buffers, body, unit="cube").check(ASCEND910B)


def test_interpreter_checks_the_memo_hint():
    """A memoised LoadNz lets the host skip a repack; the interpreter (which always copies)
    raises when the skipped load's source is not the panel the slot holds."""
    A = isa.Buffer("a", "GM", "float32", 0, arg=0)
    l1 = isa.Buffer("l1", "L1", "float32", 256)
    i = isa.Var("i")
    load = cube.LoadNz(isa.Ref(l1, 0), 16, isa.Ref(A, isa.mul(i, 16)), (16, 1), 16, 16, 16,
                       memo=0, memo_fill=isa.sub(1, isa.imin(i, 1)), memo_slots=1,
                       memo_slot_elems=256)  # fmt: skip
    prog = isa.Program("memo", (A,), (l1,), (isa.Loop(i, 0, 2, 1, (load,)),), unit="cube")
    with pytest.raises(ValueError, match="skips its repack"):
        interp.run(prog, [np.zeros(512, np.float32)])


def _without(body, drop) -> tuple:
    """`body` with every instruction for which drop(instr) holds removed (loops and ifs too)."""
    out = []
    for i in body:
        if isinstance(i, (isa.Loop, isa.If)):
            import dataclasses

            out.append(dataclasses.replace(i, body=_without(i.body, drop)))
        elif not drop(i):
            out.append(i)
    return tuple(out)


def _flag(src: str, dst: str):
    return lambda i: isinstance(i, (isa.SetFlag, isa.WaitFlag)) and (i.src, i.dst) == (src, dst)


def _elementwise_program():
    from lazymath.backend.npu.kernel_ir import ElementwiseKernel, contiguous_view
    from lazymath.backend.npu.templates import elementwise as E

    n = 70_000
    v = contiguous_view("float32", (n,))
    expr = (SOp("load", "float32", (), 0), SOp("exp", "float32", (0,)))
    return E.build(ElementwiseKernel((n,), (v,), (v,), expr, (1,)), ASCEND910, "ew"), n


def test_dropped_mte2_to_vector_flag_is_a_race():
    """Audit: removing an MTE2 -> Vector set/wait pair was accepted by the check, the interpreter
    and the cost model (which called the racy program faster). The interpreter now raises,
    naming both instructions; the intact program runs clean."""
    prog, n = _elementwise_program()
    x = np.linspace(-3, 3, n).astype(np.float32)
    out = np.zeros(n, np.float32)
    interp.run(prog, [x, out], 0, prog.blocks)
    np.testing.assert_allclose(out[: n // prog.blocks], np.exp(x[: n // prog.blocks]), rtol=1e-6)
    racy = dataclasses_replace(prog, body=_without(prog.body, _flag("MTE2", "V")))
    racy.check(ASCEND910)  # well-formed: the race is a property of the run
    from lazymath.backend.npu.races import RaceError

    with pytest.raises(RaceError, match=r"MTE2 'copy_gm_to_ub.*no set_flag/wait_flag MTE2->Vector"):
        interp.run(racy, [x, out], 0, prog.blocks)


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_cost_model_rejects_a_wait_without_its_set():
    """Audit: cost.estimate charged 1 cycle for a wait_flag with no set_flag."""
    prog, _ = _elementwise_program()
    first_set = [True]

    def drop_one_set(i) -> bool:
        if isinstance(i, isa.SetFlag) and (i.src, i.dst) == ("MTE2", "V") and first_set[0]:
            first_set[0] = False
            return True
        return False

    unpaired = dataclasses_replace(prog, body=_without(prog.body, drop_one_set))
    with pytest.raises(ValueError, match="no pending set_flag"):
        cost.estimate(unpaired, ASCEND910)


@pytest.mark.parametrize("pair", [("MTE2", "MTE1"), ("MTE1", "M"), ("M", "FIX"), ("M", "MTE1")])
def test_dropped_cube_pipeline_flag_is_a_race(pair):
    """The matmul template's MTE2 -> MTE1 -> Cube -> FixPipe chain (and the free-slot flags back)
    is complete: the program runs race-free on the interpreter, and dropping any one pair of the
    chain is reported as a race between the two pipes' instructions."""
    from lazymath.backend.npu.races import RaceError

    ir = mm_kernel(40, 300, 700, "float16")
    prog = T.build(ir, ASCEND910B, "mm")
    rng = np.random.default_rng(2)
    a = rng.uniform(-1, 1, 40 * 700).astype(np.float16)
    b = rng.uniform(-1, 1, 700 * 300).astype(np.float16)
    out = np.zeros(40 * 300, np.float32)
    for blk in range(prog.blocks):
        interp.run(prog, [a, b, out], blk, prog.blocks)
    want = a.reshape(40, 700).astype(np.float64) @ b.reshape(700, 300)
    np.testing.assert_allclose(out.reshape(40, 300), want, atol=2e-2)
    racy = dataclasses_replace(prog, body=_without(prog.body, _flag(*pair)))
    with pytest.raises(RaceError, match="race on"):
        for blk in range(prog.blocks):
            interp.run(racy, [a, b, out], blk, prog.blocks)


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_transcendental_prologue_runs_as_a_vector_kernel(spec):
    """Audit: `tan(A) @ B` called libm's tanf inside the Cube kernel's GM -> L1 packing and cost
    nothing. A prologue with an op that needs the math library now runs as its own Vector
    kernel (vmath, costed); the Cube kernel's native code calls no libm function."""
    import lazymath as lm
    from lazymath.api import schedule

    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (40, 24)).astype(np.float32)
    b = rng.uniform(-1, 1, (24, 33)).astype(np.float32)
    ta, tb = lm.tensor(a), lm.tensor(b)
    kernels = schedule(lm.tan(ta) @ tb, spec=spec).kernels
    assert [(k.unit, list(k.ops)) for k in kernels] == [("vector", ["tan"]), ("cube", ["matmul"])]
    got = (lm.tan(ta) @ tb).numpy()
    np.testing.assert_allclose(got, np.tan(a.astype(np.float64)) @ b, rtol=1e-5, atol=1e-5)
    # a cheap prologue: Vector instructions in the Cube kernel on the coupled 910, its own
    # Vector kernel on the split 910B (see test_cheap_prologue_*)
    units = [k.unit for k in schedule((ta * 2.0) @ tb, spec=spec).kernels]
    assert units == (["mix"] if spec == "ascend910" else ["vector", "cube"])


def _prologue_kernel(m: int, n: int, k: int) -> tuple[MatmulKernel, np.ndarray, np.ndarray]:
    """float32 operands, float16 Cube: A -> relu(0.5 - A) as float16, B -> (3 B) as float16."""
    f, h = "float32", "float16"
    pa = (SOp("load", f, (), 0), SOp("neg", f, (0,)), SOp("const", f, (), 0.5),
          SOp("add", f, (1, 2)), SOp("relu", f, (3,)), SOp("cast", h, (4,)))  # fmt: skip
    pb = (SOp("load", f, (), 0), SOp("const", f, (), 3.0), SOp("mul", f, (0, 1)),
          SOp("cast", h, (2,)))  # fmt: skip
    av, bv = ArgView(f, (m, k), (k, 1)), ArgView(f, (k, n), (n, 1))
    ov = ArgView(f, (m, n), (n, 1))
    ir = MatmulKernel((), m, n, k, av, bv, pa, pb, h, (), (SOp("acc", f),), (0,), (ov,))
    rng = np.random.default_rng(5)
    return ir, rng.uniform(-1, 1, (m, k)).astype(f), rng.uniform(-1, 1, (k, n)).astype(f)


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_cheap_prologue_is_vector_instructions_on_the_910(backend):
    """Audit: neg / add const / relu / scale / cast prologues ran inside the host's GM -> L1
    packing at 0 cycles. On the coupled 910 they are Vector instructions on UB between a
    GM -> UB copy and the UB -> L1 move: in the listing, costed, no LoadNz prologue left."""
    m, n, k = 37, 45, 300
    ir, a, b = _prologue_kernel(m, n, k)
    # the prologue computes in float32 (its ops' dtype), then rounds to the Cube's float16
    ra = np.maximum(np.float32(0.5) - a, np.float32(0)).astype(np.float16).astype(np.float64)
    rb = (np.float32(3.0) * b).astype(np.float16).astype(np.float64)
    kern = C.compile_kernel(ir, "ascend910", backend=backend)
    out = np.zeros((m, n), np.float32)
    kern(a, b, out)
    np.testing.assert_allclose(out, ra @ rb, rtol=1e-5, atol=2e-4)
    prog = kern.program
    loads = [i for i in prog.instructions() if isinstance(i, cube.LoadNz)]
    assert loads and all(i.prologue is None and i.src.buf.scope == "UB" for i in loads)
    ops = {i.op for i in prog.instructions() if isinstance(i, (isa.VUnary, isa.VScalar))}
    assert {"vneg", "vrelu", "vmuls"} <= ops or {"vmuls", "vadds"} <= ops, ops
    assert any(isinstance(i, isa.VConv) for i in prog.instructions())
    text = str(prog)
    assert "+prologue" not in text and "copy_gm_to_ub" in text
    est = cost.estimate(prog, ASCEND910)
    assert est.pipes["Vector"] > 0


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_cheap_prologue_is_its_own_vector_kernel_on_the_910b(backend):
    """On the split 910B the Cube core has no Vector unit: the fusion rules run the operand
    prologue as its own Vector kernel and say why in the fusion log; the result is the same."""
    import lazymath as lm
    from lazymath import settings
    from lazymath.api import schedule

    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (29, 40)).astype(np.float32)
    b = rng.uniform(-1, 1, (40, 23)).astype(np.float32)
    ta, tb = lm.tensor(a), lm.tensor(b)
    expr = lambda: lm.maximum(-ta, 0.25) @ (tb * 2.0)  # noqa: E731
    sched = schedule(expr(), spec="ascend910b")
    assert [k.unit for k in sched.kernels].count("vector") >= 1
    assert [k.unit for k in sched.kernels][-1] == "cube"
    assert any("has no Vector unit" in str(e) for e in sched.fusion_log)
    want = np.maximum(-a.astype(np.float64), 0.25) @ (2.0 * b.astype(np.float64))
    lm.init_device(0, spec="ascend910b")
    try:
        with settings.override(LAZYMATH_BACKEND=backend):
            got = expr().numpy()
    finally:
        lm.init_device(0, spec="ascend910")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
