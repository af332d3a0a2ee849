"""Stream assignment (lazymath/fusion/streams.py): branches split, chains stay, events only
where a cross-stream RAW/WAR/WAW dependency is not already ordered."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from lazymath.fusion.streams import (
    KernelDeps,
    assign_streams,
    dependencies,
    verify_plan,
)


def K(reads, writes, name="") -> KernelDeps:
    return KernelDeps(frozenset(reads), frozenset(writes), name)


def test_two_branches_join_on_two_streams_with_one_event():
    # x -> a -> b ;  x -> c -> d ; (b, d) -> e
    ks = [K({0}, {1}, "a"), K({0}, {2}, "c"), K({1}, {3}, "b"), K({2}, {4}, "d"),
          K({3, 4}, {5}, "join")]  # fmt: skip
    plan = assign_streams(ks)
    a, c, b, d, join = plan
    assert a.stream == b.stream and c.stream == d.stream and a.stream != c.stream
    assert plan.n_events == 1
    # the join continues the stream of its latest dependency (d) and waits for b
    assert join.stream == d.stream and join.waits == (b.record,) and b.record == 0
    assert a.record is c.record is d.record is join.record is None
    verify_plan(ks, plan)
    text = str(plan)
    assert "join" in text and "e0" in text and text.endswith(", 1 event")


def test_chain_is_one_stream_without_events():
    ks = [K({i}, {i + 1}) for i in range(10)]
    plan = assign_streams(ks, n_streams=4)
    assert set(plan.streams) == {0} and plan.n_events == 0
    assert all(e.waits == () and e.record is None for e in plan)


def test_independent_kernels_spread_by_load():
    ks = [K({10 + i}, {20 + i}) for i in range(4)]
    assert assign_streams(ks, 2).streams == (0, 1, 0, 1)
    weighted = [KernelDeps(frozenset({1}), frozenset({2}), weight=10.0),
                KernelDeps(frozenset({3}), frozenset({4}), weight=1.0),
                KernelDeps(frozenset({5}), frozenset({6}), weight=1.0)]  # fmt: skip
    assert assign_streams(weighted, 2).streams == (0, 1, 1)


def test_war_dependency_gets_an_event():
    # k0 reads buffer 1 on s0; k1 (independent) on s1; k2 overwrites 1 after reading k1's 4
    ks = [K({1}, {2}), K({3}, {4}), K({4}, {1})]
    assert dependencies(ks)[2] == {0, 1}  # WAR on 1 and RAW on 4
    plan = assign_streams(ks)
    assert plan.streams == (0, 1, 1)
    assert plan[2].waits == (plan[0].record,) and plan[0].record is not None
    verify_plan(ks, plan)


def test_waw_dependency_gets_an_event():
    ks = [K({5}, {1}), K({6}, {2}), K({2}, {1})]  # k2 rewrites k0's output 1
    assert dependencies(ks)[2] == {0, 1}
    plan = assign_streams(ks)
    assert plan.streams == (0, 1, 1) and plan[2].waits == (0,) and plan.n_events == 1
    verify_plan(ks, plan)


def test_raw_only_reads_do_not_depend():
    ks = [K({1}, {2}), K({1}, {3})]  # two readers of the same input
    assert dependencies(ks) == [set(), set()]
    assert assign_streams(ks).streams == (0, 1)


def test_events_are_deduplicated():
    # k0 on s0 feeds three consumers on s1: one event recorded once, waited once
    ks = [K({0}, {1}), K({9}, {2}), K({1, 2}, {3}), K({1, 3}, {4}), K({1, 4}, {5})]
    plan = assign_streams(ks)
    assert plan.streams == (0, 1, 1, 1, 1)
    assert plan.n_events == 1
    assert [e.waits for e in plan] == [(), (), (0,), (), ()]
    verify_plan(ks, plan)


def test_transitive_order_needs_no_event():
    # s0: k0 -> k1 ; s1: k2 ; k3 joins k1 and k2 on s1 (waits e0 after k1);
    # k4 reads k0's output too, but waiting for k1 already ordered k0 before s1: no new event
    ks = [K({0}, {1}), K({1}, {2}), K({9}, {3}), K({2, 3}, {4}), K({1, 4}, {5})]
    plan = assign_streams(ks)
    assert plan.streams == (0, 0, 1, 1, 1)
    assert [e.waits for e in plan] == [(), (), (), (0,), ()]
    assert plan[1].record == 0 and plan[0].record is None and plan.n_events == 1
    verify_plan(ks, plan)


def test_one_stream_means_no_events():
    ks = [K({0}, {1}), K({0}, {2}), K({1, 2}, {3})]
    plan = assign_streams(ks, n_streams=1)
    assert plan.streams == (0, 0, 0) and plan.n_events == 0


def test_plan_kernels_alias_and_records_alias():
    plan = assign_streams([K({0}, {1}), K({0}, {2}), K({1, 2}, {3})])
    assert plan.kernels == plan.entries and plan[0].records == plan[0].record


@st.composite
def programs(draw):
    """Random programs; drawn from one seed so generation stays cheap (hypothesis still
    shrinks the seed, the size and the stream count)."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    n = draw(st.integers(0, 25))
    ks = [
        KernelDeps(
            frozenset(rng.sample(range(10), rng.randint(0, 3))),
            frozenset(rng.sample(range(10), rng.randint(1, 2))),
            weight=rng.choice([1.0, 3.0]),
        )
        for _ in range(n)
    ]
    return ks, draw(st.integers(1, 4))


@settings(max_examples=200, deadline=None)
@given(programs())
def test_every_dependency_is_ordered(prog):
    ks, n_streams = prog
    plan = assign_streams(ks, n_streams)
    verify_plan(ks, plan)
    assert all(0 <= e.stream < n_streams for e in plan)
    recorded = [e.record for e in plan if e.record is not None]
    assert sorted(recorded) == list(range(plan.n_events))  # each event recorded exactly once
    all_deps = dependencies(ks)
    for i, e in enumerate(plan):
        deps = all_deps[i]
        if not deps:
            continue
        # same-stream order never costs an event: no wait on an event of the own stream
        own = {plan[j].record for j in range(i) if plan[j].stream == e.stream}
        assert not (set(e.waits) & own)
