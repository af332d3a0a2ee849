"""The ISA as data: listings, the capacity check and its message, flag pairing, IntExpr."""

from __future__ import annotations

import numpy as np
import pytest

from lazymath.backend.npu import interp, isa
from lazymath.backend.npu.isa import BLOCK_IDX, BLOCK_NUM, Buffer, Builder, Program, Ref, Var
from lazymath.runtime.device import get_spec

SPEC = get_spec("ascend910")


def _copy_program(tile: int, n: int = 1000, name: str = "k3_sin", n_tiles: int = 1) -> Program:
    x = Buffer("x", "GM", "float32", 0, arg=0)
    y = Buffer("y", "GM", "float32", 0, arg=1)
    bufs = [Buffer(f"x_tile{i}", "UB", "float32", tile) for i in range(n_tiles)]
    b = Builder()
    with b.loop("i", 0, n, tile) as i:
        cnt = isa.imin(tile, isa.sub(n, i))
        b.copy_in(Ref(bufs[0]), Ref(x, i), (cnt,), (1,))
        b.vmuls(Ref(bufs[0]), Ref(bufs[0]), 2.0, tile)
        b.copy_out(Ref(y, i), Ref(bufs[0]), (cnt,), (1,))
    return Program(name, (x, y), tuple(bufs), tuple(b.body))


def test_listing_is_indented_and_uses_ascendc_names():
    text = str(_copy_program(256))
    assert "for i in 0..1000 step 256:" in text
    lines = text.splitlines()
    body = [ln for ln in lines if "copy_gm_to_ub" in ln or "vmuls" in ln or "copy_ub_to_gm" in ln]
    assert len(body) == 3 and all(ln.startswith("    ") for ln in body)
    assert "ub x_tile0: float32[256]  1024 B" in text


def test_flags_print_as_pipe_pairs():
    b = Builder()
    b.set_flag("MTE2", "V", 0)
    b.wait_flag("MTE2", "V", 0)
    p = Program("k", (), (), tuple(b.body))
    assert "set_flag MTE2->V 0" in str(p) and "wait_flag MTE2->V 0" in str(p)


def test_overflow_error_names_scope_buffers_sizes_and_capacity():
    prog = _copy_program(32768, name="k3_sin", n_tiles=3)  # 3 x 128 KiB > 256 KiB
    with pytest.raises(isa.BufferOverflowError) as e:
        prog.check(SPEC)
    msg = str(e.value)
    assert isinstance(e.value, ValueError)
    assert msg.startswith("UB overflow in kernel k3_sin: buffers x_tile0 (131072 B)")
    assert "x_tile2 (131072 B)" in msg
    assert "total 393216 B > UB capacity 262144 B (ascend910)" in msg


def test_same_program_fits_910_but_not_910b():
    prog = _copy_program(28672, n_tiles=2)  # 224 KiB: fits 256 KiB, not 192 KiB
    prog.check(SPEC)
    with pytest.raises(isa.BufferOverflowError, match=r"UB capacity 196608 B \(ascend910b\)"):
        prog.check(get_spec("ascend910b"))


def test_check_rejects_undeclared_buffers_and_bad_event_ids():
    x = Buffer("x", "GM", "float32", 0, arg=0)
    ghost = Buffer("ghost", "UB", "float32", 8)
    p = Program("k", (x,), (), (isa.CopyIn(Ref(ghost), Ref(x), (8,), (1,)),))
    with pytest.raises(ValueError, match="undeclared buffer ghost"):
        p.check(SPEC)
    p = Program("k", (), (), (isa.SetFlag("V", "MTE2", 7),))
    with pytest.raises(ValueError, match="event id 7"):
        p.check(SPEC)
    p.check(get_spec("ascend910b"))  # 8 event ids per pipe pair there


def test_vector_instruction_must_not_read_gm():
    x = Buffer("x", "GM", "float32", 0, arg=0)
    t = Buffer("t", "UB", "float32", 8)
    p = Program("k", (x,), (t,), (isa.VUnary("vexp", Ref(t), Ref(x), 8),))
    with pytest.raises(ValueError, match="reads GM"):
        p.check(SPEC)


def test_interp_detects_wait_without_set_and_unwaited_set():
    b = Builder()
    b.wait_flag("MTE2", "V", 1)
    with pytest.raises(interp.FlagError, match="wait_flag MTE2->V 1 with no pending set_flag"):
        interp.run(Program("k", (), (), tuple(b.body)), [])
    b = Builder()
    b.set_flag("V", "MTE3", 0)
    with pytest.raises(interp.FlagError, match="set_flag V->MTE3 0 was never waited for"):
        interp.run(Program("k", (), (), tuple(b.body)), [])


def test_flags_pair_across_loop_iterations_with_dynamic_event_ids():
    b = Builder()
    pp = Var("pp")
    b.set_flag("V", "MTE2", 0)
    b.set_flag("V", "MTE2", 1)
    with b.loop("i", 0, 5) as i:
        b.let(pp, isa.mod(i, 2))
        b.wait_flag("V", "MTE2", pp)
        b.set_flag("V", "MTE2", pp)
    b.wait_flag("V", "MTE2", 0)
    b.wait_flag("V", "MTE2", 1)
    interp.run(Program("k", (), (), tuple(b.body)), [])  # pairs up: no error


@pytest.mark.parametrize("a,b", [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 3)])
def test_int_expr_floor_semantics(a, b):
    va, vb = Var("a"), Var("b")
    env = {va: a, vb: b}
    assert isa.eval_int(isa.floordiv(va, vb), env) == a // b
    assert isa.eval_int(isa.mod(va, vb), env) == a % b
    assert isa.eval_int(isa.ceildiv(va, 3), {va: a}) == -(-a // 3)


def test_int_expr_folds_constants_and_prints():
    assert isa.add(2, 3) == 5 and isa.mul(BLOCK_IDX, 1) is BLOCK_IDX
    e = isa.imin(isa.add(isa.mul(BLOCK_IDX, 10), 10), 35)
    assert str(e) == "min(((block_idx * 10) + 10), 35)"
    assert isa.eval_int(e, {BLOCK_IDX: 3, BLOCK_NUM: 4}) == 35


def test_builder_scratch_defaults_to_tile_and_rejects_dynamic_sizes():
    b = Builder(tile=64)
    r = b.scratch("float16")
    assert r.buf.size == 64 and r.buf.scope == "UB" and b.buffers == [r.buf]
    with pytest.raises(ValueError, match="static positive size"):
        b.scratch("float32", Var("n"))


def test_walk_is_iterative_on_deep_nesting():
    body: tuple = (isa.Let(Var("x"), 1),)
    for d in range(3000):
        body = (isa.Loop(Var(f"i{d}"), 0, 1, 1, body),)
    assert len(isa.walk(body)) == 3001


def test_registered_pipes_cover_movers_and_vector():
    ub = Ref(Buffer("t", "UB", "float32", 8))
    gm = Ref(Buffer("x", "GM", "float32", 0, arg=0))
    assert isa.pipe_of(isa.CopyIn(ub, gm, (8,), (1,))) == "MTE2"
    assert isa.pipe_of(isa.CopyOut(gm, ub, (8,), (1,))) == "MTE3"
    assert isa.pipe_of(isa.VUnary("vexp", ub, ub, 8)) == "Vector"
    assert np.dtype(ub.buf.dtype).itemsize * ub.buf.size == ub.buf.nbytes
