"""Simulated NPU timeline: streams, events, pipes, cores, clock."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from lazymath.runtime import ASCEND910, ASCEND910B, SimKernel, simulate
from lazymath.runtime.timeline import canonical_pipe, merge_intervals, simulate_ops


@dataclass
class Cost:
    total: int
    pipes: dict = field(default_factory=dict)
    intervals: object = None
    cores: int = 0


def vec(total: int) -> Cost:
    """A double-buffered vector kernel: MTE2 then Vector overlapping, MTE3 at the end."""
    q = total // 4
    return Cost(
        total,
        {"MTE2": 2 * q, "Vector": 2 * q, "MTE3": q},
        {"MTE2": [(0, 2 * q)], "Vector": [(q, 3 * q)], "MTE3": [(3 * q, total)]},
    )


def test_chain_on_one_stream_is_serial():
    tl = simulate([SimKernel(f"k{i}", 0, vec(400)) for i in range(3)], ASCEND910)
    assert [(k.start, k.end) for k in tl.kernels] == [(0, 400), (400, 800), (800, 1200)]
    assert tl.makespan == 1200 == tl.serial_cycles
    assert tl.stream_busy == {0: [(0, 400), (400, 800), (800, 1200)]}


def test_two_streams_overlap_and_event_orders_the_join():
    ks = [
        SimKernel("a", 0, vec(1000)),
        SimKernel("b", 1, vec(600), record=0),
        SimKernel("join", 0, vec(200), waits=(0,)),
        SimKernel("late", 1, vec(100), waits=(0,)),  # waiting on own past record: no delay
    ]
    tl = simulate(ks, ASCEND910)
    a, b, j, late = tl.kernels
    assert (a.start, b.start) == (0, 0)  # independent branches overlap
    assert tl.events[0] == 600
    assert j.start == 1000  # stream 0 was busier than the event
    assert late.start == 600
    assert tl.makespan == 1200 and tl.serial_cycles == 1900
    ks[0] = SimKernel("a", 0, vec(100))
    assert simulate(ks, ASCEND910).kernels[2].start == 600  # now the event decides


def test_pipe_intervals_shift_and_merge_into_utilization():
    tl = simulate([SimKernel("a", 0, vec(400)), SimKernel("b", 1, vec(400))], ASCEND910)
    a = tl.kernels[0]
    assert a.pipes == {"MTE2": [(0, 200)], "Vector": [(100, 300)], "MTE3": [(300, 400)]}
    assert tl.pipe_busy["Vector"] == [(100, 300)]  # both kernels' spans coincide
    util = tl.utilization()
    assert util == {"MTE2": 0.5, "Vector": 0.5, "MTE3": 0.25}
    assert list(util) == ["MTE2", "Vector", "MTE3"]  # trace/track order


def test_missing_intervals_fall_back_to_pipe_cycles_from_start():
    tl = simulate(
        [SimKernel("a", 0, vec(100)), SimKernel("k", 0, Cost(300, {"vector": 250, "MTE2": 300}))],
        ASCEND910,
    )
    k = tl.kernels[1]
    assert k.pipes == {"Vector": [(100, 350)], "MTE2": [(100, 400)]}
    assert k.cycles_by_pipe == {"Vector": 250, "MTE2": 300}


@pytest.mark.parametrize(
    "intervals",
    [
        {"MTE2": [(0, 10)], "V": [(5, 20)]},
        [("MTE2", 0, 10), ("vector", 5, 20)],
        [type("I", (), {"pipe": p, "start": s, "end": e})() for p, s, e in
         [("mte2", 0, 10), ("Vector", 5, 20)]],
    ],
)  # fmt: skip
def test_interval_formats_are_accepted(intervals):
    tl = simulate([SimKernel("k", 0, Cost(20, {}, intervals))], ASCEND910)
    assert tl.kernels[0].pipes == {"MTE2": [(0, 10)], "Vector": [(5, 20)]}


def test_costs_are_duck_typed():
    class Odd:
        total_cycles = 77

    tl = simulate([SimKernel("n", 0, 50), SimKernel("o", 0, Odd()), SimKernel("z", 0)], None)
    assert [k.cycles for k in tl.kernels] == [50, 77, 0]
    assert canonical_pipe("fixpipe") == "FixPipe" and canonical_pipe("Cube") == "Cube"


def test_cores_limit_concurrency_on_the_coupled_910():
    full = [SimKernel("a", 0, Cost(100, cores=32)), SimKernel("b", 1, Cost(100, cores=32))]
    tl = simulate(full, ASCEND910)
    assert [k.start for k in tl.kernels] == [0, 100]  # both need every core: serialized
    half = [SimKernel("a", 0, Cost(100, cores=16)), SimKernel("b", 1, Cost(100, cores=16))]
    assert [k.start for k in simulate(half, ASCEND910).kernels] == [0, 0]
    # a later-queued small kernel fills the gap next to a big one
    mix = [SimKernel("a", 0, Cost(100, cores=24)), SimKernel("b", 1, Cost(50, cores=24)),
           SimKernel("c", 2, Cost(50, cores=8))]  # fmt: skip
    assert [k.start for k in simulate(mix, ASCEND910).kernels] == [0, 100, 0]


def test_split_910b_cube_and_vector_cores_are_separate_pools():
    ks = [SimKernel("mm", 0, Cost(100, cores=24), unit="cube"),
          SimKernel("ew", 1, Cost(100, cores=48), unit="vector"),
          SimKernel("mm2", 2, Cost(100, cores=1), unit="cube")]  # fmt: skip
    tl = simulate(ks, ASCEND910B)
    assert [k.start for k in tl.kernels] == [0, 0, 100]
    tl = simulate(ks, ASCEND910)  # coupled: one pool of 32 AI cores
    assert [k.start for k in tl.kernels] == [0, 100, 0]  # 24 + 1 cores fit, 24 + 32 do not


def test_seconds_use_the_spec_clock():
    tl = simulate([SimKernel("k", 0, 1800)], ASCEND910B)
    assert tl.clock_hz == 1.8e9 and tl.makespan_s == pytest.approx(1e-6)
    assert "makespan 1800 cycles" in str(tl)


def test_raw_op_log_with_unrecorded_wait_and_rerecord():
    ops = [
        ("wait", 1, "never"),  # recorded outside this timeline: reached at 0
        ("kernel", SimKernel("a", 0, 100)),
        ("record", 0, "e"),
        ("kernel", SimKernel("b", 0, 100)),
        ("record", 0, "e"),  # re-record: later waits see 200
        ("wait", 1, "e"),
        ("kernel", SimKernel("c", 1, 10)),
    ]
    tl = simulate_ops(ops, ASCEND910, record_ops=True)
    assert tl.kernels[2].start == 200
    assert tl.sync_spans == [(0, 0), (100, 0), (200, 0), (0, 200)]


def test_merge_intervals():
    assert merge_intervals([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 6)]
    assert merge_intervals([]) == []
