"""ISA-level differential fuzzer: random valid programs (movers, vector ops, loops, flags, Cube
tiles) run on the LLVM lowering and the interpreter and must agree; random invalid Cube programs
(tiles that overflow their buffers) must be rejected by Program.check.

Seeds are fixed (the suite is deterministic); each program is small, so the whole file takes
seconds. A failure prints the seed and the program listing.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from lazymath.backend.host import lower_cube, lower_llvm  # noqa: F401 (Cube rules)
from lazymath.backend.native import jit  # noqa: F401 (Cube rules)
from lazymath.backend.npu import cube_semantics, interp, isa  # noqa: F401 (Cube rules)
from lazymath.backend.npu import isa_cube as cube
from lazymath.runtime.device import ASCEND910B

_counter = [0]
UB = 256  # elements per UB buffer


def run_both(prog: isa.Program, arrays: list[np.ndarray]) -> tuple[list, list]:
    a_int = [a.copy() for a in arrays]
    interp.run(prog, a_int, 0, 1)
    _counter[0] += 1
    sym = f"t_fuzz_{_counter[0]}"
    addr, _ = jit.get_jit().compile(str(lower_llvm.lower_program(prog, symbol=sym)), sym,
                                    sym + "_mod")  # fmt: skip
    a_nat = [a.copy() for a in arrays]
    argv = (ctypes.c_void_p * len(a_nat))(*[a.ctypes.data for a in a_nat])
    jit.as_cfunc(addr)(0, 1, argv)
    return a_int, a_nat


def random_vector_program(rng: np.random.Generator) -> tuple[isa.Program, int]:
    """GM x, y -> UB, a loop of random vector ops on random in-bounds windows, UB -> GM out,
    with the MTE2 -> V and V -> MTE3 flags a real NPU needs."""
    n_total = int(rng.integers(1, UB))
    gx = isa.Buffer("x", "GM", "float32", 0, arg=0)
    gy = isa.Buffer("y", "GM", "float32", 0, arg=1)
    go = isa.Buffer("o", "GM", "float32", 0, arg=2)
    ubs = [isa.Buffer(f"u{i}", "UB", "float32", UB) for i in range(4)]
    # every UB element is written before it is read (on-chip memory starts undefined: zeros on
    # interp, stack garbage on llvm)
    body: list = [isa.VDup(isa.Ref(u), 0.0, UB) for u in ubs]
    body.append(isa.SetFlag("V", "MTE2", 0))
    body.append(isa.WaitFlag("V", "MTE2", 0))
    body += [isa.CopyIn(isa.Ref(ubs[0]), isa.Ref(gx), (n_total,), (1,)),
             isa.CopyIn(isa.Ref(ubs[1]), isa.Ref(gy), (n_total,), (1,)),
             isa.SetFlag("MTE2", "V", 0), isa.WaitFlag("MTE2", "V", 0)]  # fmt: skip
    i = isa.Var("i")
    trips = int(rng.integers(1, 4))
    ops: list = []
    for _ in range(int(rng.integers(2, 8))):
        n = int(rng.integers(1, 64))
        stride = int(rng.integers(0, 32))
        room = UB - n - stride * (trips - 1)
        offs = [int(rng.integers(0, max(room, 1))) for _ in range(3)]

        def ref(k: int, buf, offs=offs, stride=stride) -> isa.Ref:
            return isa.Ref(buf, isa.add(offs[k], isa.mul(i, stride)))

        src = [ubs[int(rng.integers(0, 4))] for _ in range(3)]
        dst = ubs[int(rng.integers(2, 4))]
        # valid: a source window is the destination window (in place) or disjoint from it; a
        # partial overlap inside one instruction is not an NPU program (the vector unit reads
        # and writes in repeats of 256 bytes)
        for k, sb in ((1, src[0]), (2, src[1])):
            if sb is dst and offs[k] != offs[0] and abs(offs[k] - offs[0]) < n:
                offs[k] = offs[0]
        if src[2] is dst and offs[1] != offs[0] and abs(offs[1] - offs[0]) < n:
            src[2] = ubs[0]
        kind = rng.integers(0, 4)
        if kind == 0:
            op = str(rng.choice(["vadd", "vsub", "vmul", "vmax", "vmin"]))
            ops.append(isa.VBinary(op, ref(0, dst), ref(1, src[0]), ref(2, src[1]), n))
        elif kind == 1:
            op = str(rng.choice(["vabs", "vneg", "vrelu", "vfloor"]))
            ops.append(isa.VUnary(op, ref(0, dst), ref(1, src[0]), n))
        elif kind == 2:
            op = str(rng.choice(["vadds", "vmuls", "vmaxs"]))
            ops.append(isa.VScalar(op, ref(0, dst), ref(1, src[0]), float(rng.normal()), n))
        else:
            ops.append(isa.VFma(ref(0, dst), ref(1, src[0]), ref(2, src[1]), ref(1, src[2]), n))
    body.append(isa.Loop(i, 0, trips, 1, tuple(ops)))
    body += [isa.SetFlag("V", "MTE3", 0), isa.WaitFlag("V", "MTE3", 0),
             isa.CopyOut(isa.Ref(go), isa.Ref(ubs[2]), (UB,), (1,)),
             isa.CopyOut(isa.Ref(go, UB), isa.Ref(ubs[3]), (UB,), (1,))]  # fmt: skip
    return isa.Program("fuzz_vec", (gx, gy, go), tuple(ubs), tuple(body)), n_total


@pytest.mark.parametrize("seed", range(10))
def test_random_vector_programs_agree(seed):
    rng = np.random.default_rng(seed)
    prog, n = random_vector_program(rng)
    prog.check(ASCEND910B)
    x = rng.normal(size=UB).astype(np.float32)
    y = rng.normal(size=UB).astype(np.float32)
    got_i, got_n = run_both(prog, [x, y, np.zeros(2 * UB, np.float32)])
    np.testing.assert_allclose(got_n[2], got_i[2], rtol=2e-6, atol=1e-6,
                               err_msg=f"seed {seed}\n{prog}")  # fmt: skip


def random_cube_program(rng: np.random.Generator, valid: bool = True):
    """One Cube tile: LoadNz A/B, LoadL0 (sometimes into the second L0 slot), Mmad (sometimes
    accumulating a second K chunk), FixPipe. Invalid: one extent pushed past its tile."""
    m, n, k = (int(v) for v in rng.integers(1, 40, 3))
    rp = -(-m // 16) * 16 + 16 * int(rng.integers(0, 2))
    kp, np_ = -(-k // 16) * 16, -(-n // 16) * 16
    A = isa.Buffer("a", "GM", "float32", 0, arg=0)
    B = isa.Buffer("b", "GM", "float32", 0, arg=1)
    O = isa.Buffer("o", "GM", "float32", 0, arg=2)
    l1a = isa.Buffer("l1a", "L1", "float32", rp * kp)
    l1b = isa.Buffer("l1b", "L1", "float32", kp * np_)
    slot_a = int(rng.integers(0, 2))
    l0a = isa.Buffer("l0a", "L0A", "float32", 2 * rp * kp)
    l0b = isa.Buffer("l0b", "L0B", "float32", kp * np_)
    l0c = isa.Buffer("l0c", "L0C", "float32", rp * np_)
    R = isa.Ref
    a0 = R(l0a, slot_a * rp * kp)
    mm = m
    if not valid:
        mm = rp + int(rng.integers(1, 8))  # more rows than the tiles pad: must be rejected
    body = [
        cube.LoadNz(R(l1a, 0), rp, R(A, 0), (k, 1), m, k, 16),
        cube.LoadNz(R(l1b, 0), kp, R(B, 0), (n, 1), k, n, 16),
        isa.SetFlag("MTE2", "MTE1", 0), isa.WaitFlag("MTE2", "MTE1", 0),
        cube.LoadL0(a0, rp, R(l1a, 0), rp, -(-m // 16) * 16, kp),
        cube.LoadL0(R(l0b, 0), kp, R(l1b, 0), kp, kp, np_),
        isa.SetFlag("MTE1", "M", 0), isa.WaitFlag("MTE1", "M", 0),
        cube.Mmad(R(l0c, 0), rp, a0, rp, R(l0b, 0), kp, mm, n, k, 0, "float32"),
    ]  # fmt: skip
    twice = bool(rng.integers(0, 2))
    if twice:  # accumulate the same product again
        body.append(cube.Mmad(R(l0c, 0), rp, a0, rp, R(l0b, 0), kp, m, n, k, 1, "float32"))
    body += [
        isa.SetFlag("M", "FIX", 0),
        isa.WaitFlag("M", "FIX", 0),
        cube.FixPipe(R(O, 0), (n, 1), R(l0c, 0), rp, m, n, bool(rng.integers(0, 2))),
    ]
    prog = isa.Program("fuzz_cube", (A, B, O), (l1a, l1b, l0a, l0b, l0c), tuple(body),
                       unit="cube")  # fmt: skip
    return prog, (m, n, k, twice, body[-1].relu)


@pytest.mark.parametrize("seed", range(8))
def test_random_cube_programs_agree_with_numpy(seed):
    rng = np.random.default_rng(1000 + seed)
    prog, (m, n, k, twice, relu) = random_cube_program(rng)
    prog.check(ASCEND910B)
    a = rng.normal(size=m * k).astype(np.float32)
    b = rng.normal(size=k * n).astype(np.float32)
    want = a.reshape(m, k).astype(np.float64) @ b.reshape(k, n) * (2 if twice else 1)
    want = np.maximum(want, 0) if relu else want
    got_i, got_n = run_both(prog, [a, b, np.zeros(m * n, np.float32)])
    for got in (got_i[2], got_n[2]):
        np.testing.assert_allclose(got.reshape(m, n), want, rtol=1e-4, atol=1e-4,
                                   err_msg=f"seed {seed}\n{prog}")  # fmt: skip


@pytest.mark.parametrize("seed", range(16))
def test_random_invalid_cube_programs_are_rejected(seed):
    prog, _ = random_cube_program(np.random.default_rng(2000 + seed), valid=False)
    with pytest.raises(ValueError, match="rows in an NZ tile|outside"):
        prog.check(ASCEND910B)


def test_check_rejects_a_partially_overlapping_vector_instruction():
    """Found by the fuzzer: a vector op whose source window overlaps its destination window
    without being it gave different results on llvm and interp. check() rejects it; in place
    and disjoint windows stay valid."""
    u = isa.Buffer("u", "UB", "float32", UB)
    i = isa.Var("i")

    def prog(src_off) -> isa.Program:
        op = isa.VUnary("vabs", isa.Ref(u, isa.add(10, isa.mul(i, 4))),
                        isa.Ref(u, isa.add(src_off, isa.mul(i, 4))), 40)  # fmt: skip
        return isa.Program("ov", (), (u,), (isa.Loop(i, 0, 3, 1, (op,)),))

    prog(10).check(ASCEND910B)  # in place
    prog(50).check(ASCEND910B)  # disjoint
    with pytest.raises(ValueError, match="overlaps the destination 5 elements apart"):
        prog(15).check(ASCEND910B)
