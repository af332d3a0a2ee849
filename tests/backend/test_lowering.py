"""Hand-written ISA programs: the LLVM lowering must agree with the numpy interpreter.

Every vector instruction kind is run on awkward data (NaN, +-inf, -0.0, zero divisors,
INT_MIN) over a length that is not a multiple of the vector width, through both consumers.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

import numpy as np
import pytest

from lazymath.backend.host import lower_llvm
from lazymath.backend.native import host, jit
from lazymath.backend.npu import interp, isa
from lazymath.backend.npu.isa import Buffer, Builder, Program, Ref, Var
from lazymath.testing.standard import std_floor_divide

N = 37  # not a multiple of any vector width
_counter = [0]


def _special(dtype: str, n: int = N, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        x = (rng.standard_normal(n) * 4).astype(dt)
        x[:8] = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -2.5, 3.5], dtype=dt)[
            : min(8, n)
        ]
        return x
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    info = np.iinfo(dt)
    x = rng.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dt)
    x[:4] = np.array([0, info.min, -1, info.max], dtype=np.int64).astype(dt)[:4]
    return x


def run_both(prog: Program, arrays: list[np.ndarray], blocks: int = 1) -> tuple[list, list]:
    """Run `prog` with the interpreter and natively on copies of `arrays`."""
    a_int = [a.copy() for a in arrays]
    for b in range(blocks):
        interp.run(prog, a_int, b, blocks)
    _counter[0] += 1
    sym = f"t_lower_{_counter[0]}"
    text = str(lower_llvm.lower_program(prog, symbol=sym))
    addr, _ = jit.get_jit().compile(text, sym, sym + "_mod")
    fn = jit.as_cfunc(addr)
    a_nat = [a.copy() for a in arrays]
    argv = (ctypes.c_void_p * len(a_nat))(*[a.ctypes.data for a in a_nat])
    for b in range(blocks):
        fn(b, blocks, argv)
    return a_int, a_nat


def assert_same(x: np.ndarray, y: np.ndarray, ulp_ok: bool = False) -> None:
    if x.dtype.kind == "f":
        if ulp_ok:
            np.testing.assert_allclose(x, y, rtol=4e-6 if x.dtype != np.float16 else 1e-3,
                                       atol=0, equal_nan=True)  # fmt: skip
        else:
            np.testing.assert_array_equal(x, y)
    else:
        np.testing.assert_array_equal(x, y)


@dataclass
class Case:
    """A one-tile program: copy inputs into UB, one instruction, copy the result out."""

    in_dtypes: tuple
    out_dtype: str

    def program(self, make) -> Program:
        gms = [Buffer(f"g{k}", "GM", d, 0, arg=k) for k, d in enumerate(self.in_dtypes)]
        out = Buffer("o", "GM", self.out_dtype, 0, arg=len(gms))
        ubs = [Buffer(f"u{k}", "UB", d, 64) for k, d in enumerate(self.in_dtypes)]
        res = Buffer("r", "UB", self.out_dtype, 64)
        b = Builder()
        for g, u in zip(gms, ubs):
            b.copy_in(Ref(u), Ref(g), (N,), (1,))
        make(b, Ref(res), *[Ref(u) for u in ubs])
        b.copy_out(Ref(out), Ref(res), (N,), (1,))
        return Program("case", (*gms, out), (*ubs, res), tuple(b.body))

    def run(self, make, ulp_ok=False) -> np.ndarray:
        ins = [_special(d, seed=k) for k, d in enumerate(self.in_dtypes)]
        if len(ins) == 2 and np.dtype(self.in_dtypes[1]).kind in "iu":
            ins[1][4:8] = np.array([0, -1, 1, 0], dtype=np.int64).astype(ins[1].dtype)
        self.inputs = ins
        arrays = [*ins, np.zeros(N, self.out_dtype)]
        got_i, got_n = run_both(self.program(make), arrays)
        assert_same(got_i[-1], got_n[-1], ulp_ok)
        return got_n[-1]


FLOATS = ["float16", "float32", "float64"]
INTS = ["int32", "int64", "int8", "uint8"]


BINARY = ["vadd", "vsub", "vmul", "vdiv", "vmax", "vmin", "vfloordiv", "vmod"]


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("op", BINARY)
def test_binary(op, dtype):
    case = Case((dtype, dtype), dtype)
    got = case.run(lambda b, d, x, y: b.emit(isa.VBinary(op, d, x, y, N)))
    x, y = case.inputs
    if np.dtype(dtype).kind == "f" or op not in ("vdiv",):
        ref_fn = {"vadd": np.add, "vsub": np.subtract, "vmul": np.multiply, "vdiv": np.divide,
                  "vmax": np.maximum, "vmin": np.minimum, "vfloordiv": std_floor_divide,
                  "vmod": np.remainder}[op]  # fmt: skip
        with np.errstate(all="ignore"):
            ref = ref_fn(x, y)
        np.testing.assert_array_equal(got, ref.astype(dtype))
    else:  # integer vdiv: C-style truncation, x/0 = 0, MIN/-1 = MIN (Python ints, no numpy)
        np.testing.assert_array_equal(got, np.array([_c_div(int(p), int(q), dtype)
                                                     for p, q in zip(x, y)], dtype))  # fmt: skip


def _wrap(v: int, dtype: str) -> int:
    info = np.iinfo(dtype)
    v &= (1 << info.bits) - 1
    return v - (1 << info.bits) if info.min < 0 and v >= 1 << (info.bits - 1) else v


def _c_div(p: int, q: int, dtype: str) -> int:
    if q == 0:
        return 0
    t = abs(p) // abs(q)
    return _wrap(t if (p < 0) == (q < 0) else -t, dtype)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_int_pow_and_bitwise(dtype):
    case = Case((dtype, dtype), dtype)
    got = case.run(lambda b, d, a, c: b.emit(isa.VBinary("vxor", d, a, c, N)))
    np.testing.assert_array_equal(got, case.inputs[0] ^ case.inputs[1])
    Case((dtype, dtype), dtype).run(lambda b, d, a, c: b.emit(isa.VBinary("vpow", d, a, c, N)))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "op", ["vabs", "vrelu", "vsqrt", "vrsqrt", "vrec", "vneg", "vfloor", "vceil", "vrint", "vtrunc"]
)
def test_unary_float(op, dtype):
    got = Case((dtype,), dtype).run(lambda b, d, x: b.emit(isa.VUnary(op, d, x, N)))
    x = _special(dtype).astype(np.float32 if dtype == "float16" else dtype)
    with np.errstate(all="ignore"):
        ref = {"vabs": np.abs, "vrelu": lambda v: np.maximum(v, 0), "vsqrt": np.sqrt,
               "vrsqrt": lambda v: 1 / np.sqrt(v), "vrec": lambda v: 1 / v, "vneg": np.negative,
               "vfloor": np.floor, "vceil": np.ceil, "vrint": np.rint,
               "vtrunc": np.trunc}[op](x)  # fmt: skip
    np.testing.assert_array_equal(got, ref.astype(dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("op", ["vexp", "vln"])
def test_native_transcendentals_close_to_numpy(op, dtype):
    got = Case((dtype,), dtype).run(lambda b, d, x: b.emit(isa.VUnary(op, d, x, N)), ulp_ok=True)
    x = _special(dtype)
    with np.errstate(all="ignore"):
        ref = (np.exp if op == "vexp" else np.log)(x)
    tol = 1e-3 if dtype == "float16" else 4e-6
    np.testing.assert_allclose(got, ref, rtol=tol, equal_nan=True)


@pytest.mark.parametrize("dtype", INTS + ["bool"])
@pytest.mark.parametrize("op", ["vabs", "vneg", "vnot", "vrelu"])
def test_unary_int(op, dtype):
    if dtype == "bool" and op in ("vneg", "vrelu"):
        pytest.skip("not defined on bool")
    got = Case((dtype,), dtype).run(lambda b, d, x: b.emit(isa.VUnary(op, d, x, N)))
    xs = [int(v) for v in _special(dtype)]  # independent oracle: Python ints, wrapped
    if dtype == "bool":
        ref = {"vabs": xs, "vnot": [1 - v for v in xs]}[op]
    else:
        ref = {"vabs": [abs(v) for v in xs], "vneg": [-v for v in xs],
               "vnot": [~v for v in xs], "vrelu": [max(v, 0) for v in xs]}[op]  # fmt: skip
        ref = [_wrap(v, dtype) for v in ref]
    np.testing.assert_array_equal(got, np.array(ref).astype(dtype))


@pytest.mark.parametrize("cmp", ["eq", "ne", "lt", "le", "gt", "ge"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "uint8", "bool"])
def test_compare_and_select(cmp, dtype):
    case = Case((dtype, dtype), "bool")
    got = case.run(lambda b, d, x, y: b.emit(isa.VCmp(cmp, d, x, y, N)))
    x, y = case.inputs
    ref = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
           "gt": np.greater, "ge": np.greater_equal}[cmp](x, y)  # fmt: skip
    np.testing.assert_array_equal(got, ref)
    Case((dtype,), "bool").run(lambda b, d, x: b.emit(isa.VCmpS(cmp, d, x, 1, N)))


def test_vsel_vdup_vscalar_fma():
    """Each result also against an oracle written without the library (Python ints, math.fma
    semantics through float64, numpy only for the float16 rounding of the scalar)."""

    def make(b, d, m, x, y):
        b.emit(isa.VSel(d, m, x, y, N))

    m, x, y = _special("bool", seed=0), _special("float32", seed=1), _special("float32", seed=2)
    got = Case(("bool", "float32", "float32"), "float32").run(make)
    np.testing.assert_array_equal(got, [xv if mv else yv for mv, xv, yv in zip(m, x, y)])
    got = Case(("float32",), "float32").run(lambda b, d, x: b.vdup(d, -0.0, N))
    assert all(v == 0 and np.signbit(v) for v in got)
    got = Case(("int32",), "int32").run(lambda b, d, x: b.vadds(d, x, -(2**31), N))
    want = [_wrap(int(v) - 2**31, "int32") for v in _special("int32")]
    np.testing.assert_array_equal(got, want)
    got = Case(("float16",), "float16").run(lambda b, d, x: b.vmuls(d, x, 0.1, N))  # f16 scalar
    s16 = float(np.float16(0.1))
    want = [np.float16(float(v) * s16) for v in _special("float16")]  # exact product, one rounding
    np.testing.assert_array_equal(got, np.array(want, np.float16))
    got = Case(("int32",), "int32").run(lambda b, d, x: b.vshr(d, x, 3, N))
    np.testing.assert_array_equal(got, [int(v) >> 3 for v in _special("int32")])
    got = Case(("uint8",), "uint8").run(lambda b, d, x: b.vshr(d, x, 9, N))
    np.testing.assert_array_equal(got, [0] * N)  # a shift past the width clears the lane
    got = Case(("float32", "float32", "float32"), "float32").run(
        lambda b, d, x, y, z: b.vfma(d, x, y, z, N)
    )
    xs, ys, zs = (_special("float32", seed=k) for k in range(3))
    with np.errstate(all="ignore"):  # float64 holds the exact product: one float32 rounding
        want = (xs.astype(np.float64) * ys + zs).astype(np.float32)
    close = np.isfinite(want)
    np.testing.assert_array_equal(got[close], want[close])


@pytest.mark.parametrize(
    "src,dst",
    [("float32", "int32"), ("float64", "float16"), ("float16", "float32"), ("int32", "float32"),
     ("int64", "int32"), ("int32", "int64"), ("uint8", "int32"), ("float32", "bool"),
     ("bool", "float32"), ("int32", "bool"), ("bool", "int64"), ("float32", "uint8"),
     ("float16", "int64"), ("float64", "uint32"), ("float32", "uint64"), ("float32", "int16"),
     ("int64", "float16"), ("uint8", "float16")],
)  # fmt: skip
def test_vconv(src, dst):
    got = Case((src,), dst).run(lambda b, d, x: b.vconv(d, x, N))
    x = _special(src)
    with np.errstate(all="ignore"):
        ref = (x != 0) if dst == "bool" else x.astype(dst)
    keep = np.ones(N, bool)
    if np.dtype(src).kind == "f" and np.dtype(dst).kind == "u":
        keep = np.isfinite(x)  # numpy: implementation-defined (RuntimeWarning), differs by loop
    np.testing.assert_array_equal(got[keep], ref[keep])
    if np.dtype(src).kind == "f" and dst != "bool":
        x = x * 1e3  # out of range for the small ints: numpy's x86 wrap-around semantics
        prog = Case((src,), dst).program(lambda b, d, s: b.vconv(d, s, N))
        got_i, got_n = run_both(prog, [x, np.zeros(N, dst)])
        with np.errstate(all="ignore"):
            ref = x.astype(dst)
        np.testing.assert_array_equal(got_n[-1][keep], ref[keep])
        np.testing.assert_array_equal(got_i[-1], got_n[-1])


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("float64", "int32"),
                                     ("float32", "int64"), ("float64", "int64")])  # fmt: skip
def test_vconv_float_to_int_range_edges(src, dst):
    """x86 truncation at the edges of the integer range: exactly -2^(w-1) converts, 2^(w-1),
    anything beyond and NaN give the minimum integer -- in the vectorized body and the tail."""
    w = np.dtype(dst).itemsize * 8
    lim = 2.0 ** (w - 1)
    below = float(np.nextafter(np.array(lim, src), np.array(0, src)))
    edges = [lim, -lim, below, -below, float(np.nextafter(np.array(-lim, src),
             np.array(-np.inf, src))), 1e30, -1e30, np.nan, np.inf, -np.inf, 0.5, -0.5, -1.5,
             2.9, -0.0]  # fmt: skip
    x = np.resize(np.array(edges, src), N)
    prog = Case((src,), dst).program(lambda b, d, s: b.vconv(d, s, N))
    got_i, got_n = run_both(prog, [x, np.zeros(N, dst)])
    mn = np.iinfo(dst).min
    want = np.array([mn if not (-lim <= v < lim) else int(v) for v in x.tolist()], dst)
    np.testing.assert_array_equal(got_n[-1], want)
    np.testing.assert_array_equal(got_i[-1], want)


def test_vconv_double_to_half_rounds_once():
    x = np.array([1 + 2**-11 + 2**-40] * N, np.float64)  # just above a half-way point
    arrays = [x, np.zeros(N, np.float16)]

    def make(b, d, s):
        b.vconv(d, s, N)

    prog = Case(("float64",), "float16").program(make)
    got_i, got_n = run_both(prog, arrays)
    np.testing.assert_array_equal(got_n[-1], x.astype(np.float16))
    np.testing.assert_array_equal(got_i[-1], x.astype(np.float16))


@pytest.mark.parametrize("op", ["vcadd", "vcmax", "vcmin", "vcmul"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_vreduce_rows(op, dtype):
    rows, n = 3, 11
    g = Buffer("g", "GM", dtype, 0, arg=0)
    o = Buffer("o", "GM", dtype, 0, arg=1)
    u = Buffer("u", "UB", dtype, 64)
    acc = Buffer("acc", "UB", dtype, 8)
    ident = {"vcadd": 0, "vcmul": 1, "vcmax": -np.inf if dtype == "float32" else -(2**31),
             "vcmin": np.inf if dtype == "float32" else 2**31 - 1}[op]  # fmt: skip
    b = Builder()
    b.copy_in(Ref(u), Ref(g), (rows * n,), (1,))
    b.vdup(Ref(acc), ident, rows)
    b.vreduce(op, Ref(acc), Ref(u), n, rows)
    b.copy_out(Ref(o), Ref(acc), (rows,), (1,))
    prog = Program("red", (g, o), (u, acc), tuple(b.body))
    x = (np.arange(rows * n) % 7 - 3).astype(dtype)
    if dtype == "float32":
        x[n + 2] = np.nan
    got_i, got_n = run_both(prog, [x, np.zeros(rows, dtype)])
    fn = {"vcadd": np.sum, "vcmax": np.max, "vcmin": np.min, "vcmul": np.prod}[op]
    ref = fn(x.reshape(rows, n), axis=1).astype(dtype)
    np.testing.assert_array_equal(got_n[1], ref)
    np.testing.assert_array_equal(got_i[1], ref)


@pytest.mark.parametrize("op", ["vargmax", "vargmin"])
def test_vargreduce_first_occurrence_and_nan(op):
    g = Buffer("g", "GM", "float32", 0, arg=0)
    o = Buffer("o", "GM", "int64", 0, arg=1)
    u = Buffer("u", "UB", "float32", 32)
    v = Buffer("v", "UB", "float32", 8)
    ix = Buffer("ix", "UB", "int64", 8)
    x = np.array([1, 5, 5, 0, 0, 3,   2, np.nan, 7, np.nan, 1, 1,   4, 4, 4, 4, 4, 4],
                 np.float32)  # fmt: skip
    b = Builder()
    b.copy_in(Ref(u), Ref(g), (18,), (1,))
    b.vdup(Ref(v), -np.inf if op == "vargmax" else np.inf, 3)
    b.vdup(Ref(ix), 0, 3)
    b.vargreduce(op, Ref(v), Ref(ix), Ref(u), 6, 100, 3)
    b.copy_out(Ref(o), Ref(ix), (3,), (1,))
    prog = Program("arg", (g, o), (u, v, ix), tuple(b.body))
    got_i, got_n = run_both(prog, [x, np.zeros(3, np.int64)])
    ref = (np.argmax if op == "vargmax" else np.argmin)(x.reshape(3, 6), axis=1) + 100
    np.testing.assert_array_equal(got_n[1], ref)
    np.testing.assert_array_equal(got_i[1], ref)


@pytest.mark.parametrize(
    "counts,strides,off",
    [((5,), (1,), 0), ((5,), (0,), 3), ((5,), (-1,), 9), ((5,), (3,), 1),
     ((3, 4), (10, 1), 2), ((3, 4), (0, 1), 0), ((3, 4), (-10, -1), 29), ((3, 4), (1, 0), 5),
     ((0, 4), (1, 1), 0), ((3, 0), (1, 1), 0)],
)  # fmt: skip
def test_strided_copies_in_and_out(counts, strides, off):
    g = Buffer("g", "GM", "float32", 0, arg=0)
    o = Buffer("o", "GM", "float32", 0, arg=1)
    u = Buffer("u", "UB", "float32", 64)
    b = Builder()
    b.vdup(Ref(u), -1.0, 64)
    pitch = None if len(counts) == 1 else 6  # padded rows in UB
    b.copy_in(Ref(u), Ref(g, off), counts, strides, pitch)
    b.copy_out(Ref(o), Ref(u), (64,), (1,))
    prog = Program("cp", (g, o), (u,), tuple(b.body))
    x = np.arange(40, dtype=np.float32)
    got_i, got_n = run_both(prog, [x, np.zeros(64, np.float32)])
    np.testing.assert_array_equal(got_i[1], got_n[1])
    ref = np.full(64, -1.0, np.float32)
    if len(counts) == 1:
        ref[: counts[0]] = x[off + np.arange(counts[0]) * strides[0]]
    else:
        for r in range(counts[0]):
            for c in range(counts[1]):
                ref[r * 6 + c] = x[off + r * strides[0] + c * strides[1]]
    np.testing.assert_array_equal(got_n[1], ref)
    # and back out through a strided GM view
    b = Builder()
    b.copy_in(Ref(u), Ref(g), (5,), (1,))
    b.copy_out(Ref(o, 20), Ref(u), (5,), (-2,))
    got_i, got_n = run_both(Program("cp2", (g, o), (u,), tuple(b.body)),
                            [x, np.zeros(64, np.float32)])  # fmt: skip
    np.testing.assert_array_equal(got_n[1], got_i[1])
    assert list(got_n[1][[20, 18, 16, 14, 12]]) == [0, 1, 2, 3, 4]


def test_loops_lets_blocks_if_and_atomic_counter():
    """Each block writes its id over its slice; the last block to arrive writes a marker."""
    o = Buffer("o", "GM", "int64", 0, arg=0)
    cnt = Buffer("cnt", "GM", "int64", 0, arg=1)
    u = Buffer("u", "UB", "int64", 16)
    b = Builder()
    old, start = Var("old"), Var("start")
    b.let(start, isa.mul(isa.BLOCK_IDX, 10))
    with b.loop("i", 0, 10, 5) as i:
        b.emit(isa.VDup(u and Ref(u), isa.BLOCK_IDX, 5))
        b.copy_out(Ref(o, isa.add(start, i)), Ref(u), (5,), (1,))
    b.emit(isa.AtomicAdd(Ref(cnt), 1, old))
    b.emit(isa.If(old, "==", isa.sub(isa.BLOCK_NUM, 1), (
        isa.VDup(Ref(u), 99, 1), isa.CopyOut(Ref(o, 40), Ref(u), (1,), (1,)))))  # fmt: skip
    prog = Program("blk", (o, cnt), (u,), tuple(b.body))
    got_i, got_n = run_both(prog, [np.zeros(41, np.int64), np.zeros(1, np.int64)], blocks=4)
    for got in (got_i, got_n):
        np.testing.assert_array_equal(got[0][:40], np.repeat(np.arange(4), 10))
        assert got[0][40] == 99 and got[1][0] == 4


def test_missing_lowering_names_the_instruction():
    @dataclass(frozen=True)
    class VMystery:
        dst: Ref
        n: int

    isa.register_instr(VMystery, "Vector")
    u = Buffer("u", "UB", "float32", 8)
    prog = Program("m", (), (u,), (VMystery(Ref(u), 8),))
    with pytest.raises(NotImplementedError, match="VMystery"):
        lower_llvm.lower_program(prog)
    with pytest.raises(NotImplementedError, match="VMystery"):
        interp.run(prog, [])


def test_lowered_loops_are_vectorized_without_alias_checks():
    g = Buffer("g", "GM", "float32", 0, arg=0)
    u, v = Buffer("u", "UB", "float32", 1024), Buffer("v", "UB", "float32", 1024)
    b = Builder()
    b.copy_in(Ref(u), Ref(g), (1024,), (1,))
    b.copy_in(Ref(v), Ref(g, 1024), (1024,), (1,))
    with b.loop("i", 0, Var("block_num")):
        b.vadd(Ref(v), Ref(u), Ref(v), 1024)  # in place on v
    b.copy_out(Ref(g), Ref(v), (1024,), (1,))
    prog = Program("vec", (g,), (u, v), tuple(b.body))
    text = str(lower_llvm.lower_program(prog, symbol="vv"))
    assert "llvm.loop.parallel_accesses" in text
    asm = jit.get_jit().assembly(text)
    t = host.target()  # the target code is generated for (LAZYMATH_TARGET_CPU or the host)
    if t.arch in ("x86_64", "amd64"):
        assert "vaddps" in asm or "addps" in asm
        assert re.search(r"%[yz]mm", asm) if t.vector_bits >= 256 else "%xmm" in asm
        assert t.avx512 or "zmm" not in asm  # never a register class the target lacks
