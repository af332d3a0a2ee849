"""Cost model: the vector formula, overlap from flags, cheap long loops, timelines."""

from __future__ import annotations

import dataclasses
import time

import pytest

from lazymath.backend.compile import build_program
from lazymath.backend.npu import cost, isa
from lazymath.backend.npu.isa import Buffer, Builder, Program, Ref
from lazymath.backend.npu.kernel_ir import ElementwiseKernel, SOp, contiguous_view
from lazymath.runtime.device import get_spec

SPEC = get_spec("ascend910")


def _strip_flags(body: tuple) -> tuple:
    out = []
    for i in body:
        if isinstance(i, (isa.SetFlag, isa.WaitFlag)):
            continue
        if isinstance(i, isa.Loop):
            i = dataclasses.replace(i, body=_strip_flags(i.body))
        out.append(i)
    return tuple(out)


def _exp_kernel(n: int, spec=SPEC) -> Program:
    v = contiguous_view("float32", (n,))
    expr = (SOp("load", "float32", (), 0), SOp("exp", "float32", (0,)))
    return build_program(ElementwiseKernel((n,), (v,), (v,), expr, (1,)), spec, "k_exp")


def test_vector_formula_matches_the_model_constants():
    # latency + ceil(bytes / 256) * cycles_per_repeat - 1
    assert cost.vector_cycles(SPEC, "vadd", 1024) == 6 + 4 * 2 - 1
    assert cost.vector_cycles(SPEC, "vexp", 257) == 12 + 2 * 2 - 1
    assert cost.vector_cycles(SPEC, "vunknown", 256) == 10 + 2 - 1
    u = Buffer("u", "UB", "float16", 1024)
    b = Builder()
    b.vadd(Ref(u), Ref(u), Ref(u), 1024)  # 2 KiB of float16 = 8 repeats
    c = cost.estimate(Program("k", (), (u,), tuple(b.body)), SPEC)
    assert c.pipes["Vector"] == 6 + 8 * 2 - 1


def test_double_buffering_overlaps_pipes_and_serial_does_not():
    prog = _exp_kernel(1 << 22)
    c = cost.estimate(prog, SPEC)
    busy = {p: v for p, v in c.pipes.items() if p in ("MTE2", "Vector", "MTE3")}
    assert all(v > 0 for v in busy.values())
    assert max(busy.values()) < c.total < sum(busy.values())  # overlap, but not free
    serial = dataclasses.replace(prog, body=_strip_flags(prog.body))
    cs = cost.estimate(serial, SPEC)
    assert cs.total >= sum(busy.values())  # no flags: nothing may overlap
    assert cs.pipes["Vector"] == pytest.approx(c.pipes["Vector"])


def test_long_loops_are_extrapolated_not_unrolled():
    def prog(trips: int) -> Program:
        x = Buffer("x", "GM", "float32", 0, arg=0)
        t = Buffer("t", "UB", "float32", 2 * 4096)
        b = Builder()
        pp = isa.Var("pp")
        b.set_flag("V", "MTE2", 0)
        b.set_flag("V", "MTE2", 1)
        with b.loop("i", 0, trips) as i:
            b.let(pp, isa.mod(i, 2))
            b.wait_flag("V", "MTE2", pp)
            b.copy_in(Ref(t, isa.mul(pp, 4096)), Ref(x, isa.mul(i, 4096)), (4096,), (1,))
            b.set_flag("MTE2", "V", pp)
            b.wait_flag("MTE2", "V", pp)
            b.vexp(Ref(t, isa.mul(pp, 4096)), Ref(t, isa.mul(pp, 4096)), 4096)
            b.set_flag("V", "MTE2", pp)
        b.wait_flag("V", "MTE2", 0)
        b.wait_flag("V", "MTE2", 1)
        return Program("long", (x,), (t,), tuple(b.body))

    t0 = time.perf_counter()
    huge = cost.estimate(prog(10**9), SPEC)
    assert time.perf_counter() - t0 < 2.0
    a, b2 = cost.estimate(prog(10**6), SPEC), cost.estimate(prog(2 * 10**6), SPEC)
    assert b2.total / a.total == pytest.approx(2.0, rel=1e-3)
    assert huge.total / a.total == pytest.approx(1000.0, rel=1e-3)
    assert huge.truncated and len(huge.intervals["Vector"]) <= cost.MAX_INTERVALS + 1


def test_extrapolation_equals_explicit_simulation(monkeypatch):
    prog = _exp_kernel(1 << 20)
    fast = cost.estimate(prog, SPEC)
    monkeypatch.setattr(cost, "EXPLICIT_TRIPS", 10**9)
    slow = cost.estimate(prog, SPEC)
    assert fast.total == pytest.approx(slow.total, rel=1e-9)
    assert fast.pipes == pytest.approx(slow.pipes, rel=1e-9)


def test_intervals_form_a_timeline():
    c = cost.estimate(_exp_kernel(300_000), SPEC)
    for pipe, iv in c.intervals.items():
        for (s0, e0), (s1, e1) in zip(iv, iv[1:]):
            assert s0 < e0 <= s1 < e1, pipe
        if iv:
            assert iv[0][0] >= 0 and iv[-1][1] <= c.total
    assert c.bound in ("MTE2", "MTE3", "Vector") and "cycles" in str(c)


def test_more_cores_means_fewer_cycles_per_block():
    n = 1 << 24
    c910 = cost.estimate(_exp_kernel(n, SPEC), SPEC)
    spec_b = get_spec("ascend910b")
    c910b = cost.estimate(_exp_kernel(n, spec_b), spec_b)
    assert c910.blocks == 32 and c910b.blocks == 48
    assert c910b.total < c910.total
    assert c910b.seconds < c910.seconds  # and a faster clock


def test_split_reduction_charges_the_combine_to_the_last_block():
    from lazymath.backend.npu.kernel_ir import ReduceKernel

    n = 1 << 22
    v = contiguous_view("float32", (n,))
    ir = ReduceKernel((n,), (0,), "sum", (v,), (SOp("load", "float32", (), 0),), 0, "float32",
                      (), (), (SOp("acc", "float32"),), (0,), (contiguous_view("float32", ()),))  # fmt: skip
    prog = build_program(ir, SPEC, "k_sum")
    c = cost.estimate(prog, SPEC)
    assert prog.workspace and c.blocks > 1 and not c.unknown
    one = cost.estimate(prog, SPEC, block_num=1)
    assert c.total < one.total / 4  # the reduction itself is spread over the cores
