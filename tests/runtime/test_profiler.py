"""Profiler: measured + simulated records, summary table, Chrome/Perfetto trace JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from conftest import SleepKernel

from lazymath.runtime import Event, profile
from lazymath.runtime import profiler as prof


@dataclass
class Cost:
    total: int
    pipes: dict = field(default_factory=dict)
    intervals: dict = field(default_factory=dict)


def costed(name: str, seconds: float, total: int, unit="vector", bound="memory") -> SleepKernel:
    k = SleepKernel(name, seconds)
    q = total // 4
    k.cost = Cost(
        total,
        {"MTE2": 2 * q, "Vector": 2 * q, "MTE3": q},
        {"MTE2": [(0, 2 * q)], "Vector": [(q, 3 * q)], "MTE3": [(3 * q, total)]},
    )
    k.unit, k.bound = unit, bound
    return k


def run_branches(device, p):
    """a on s0, b on s1 -> record e on s1 -> s0 waits -> join on s0; one realize."""
    s0, s1 = device.stream(0), device.stream(1)
    a, b, j = costed("a", 0.03, 4000), costed("b", 0.03, 2000), costed("join", 0.005, 1000)
    e = Event("b_done")
    with prof.realize("branches", cache_hit=False):
        device.launch(a, 1, [], s0)
        device.launch(b, 1, [], s1)
        e.record(s1)
        s0.wait_event(e)
        device.launch(j, 1, [], s0, source_loc="user.py:7")
        device.synchronize()
    return a, b, j


def test_records_measured_and_simulated_times(device):
    with profile() as p:
        run_branches(device, p)
    a, b, j = p.kernels
    assert [k.name for k in p.kernels] == ["a", "b", "join"]
    assert [k.stream for k in p.kernels] == [0, 1, 0]
    assert all(k.host_us >= 4000 for k in p.kernels)  # each sleeps >= 5 ms
    assert (a.sim_cycles, b.sim_cycles, j.sim_cycles) == (4000, 2000, 1000)
    assert a.sim_us == pytest.approx(4.0)  # 1 GHz ascend910 clock
    assert (a.sim_start_cycles, b.sim_start_cycles, j.sim_start_cycles) == (0, 0, 4000)
    assert j.waits == b.records and len(b.records) == 1 and a.records == ()
    assert j.unit == "vector" and j.bound == "memory" and j.source_loc == "user.py:7"
    assert j.cycles_by_pipe == {"MTE2": 500, "Vector": 500, "MTE3": 250}
    (r,) = p.realizes
    assert r.label == "branches" and r.info == {"cache_hit": False}
    assert r.timeline.makespan == 5000 and r.timeline.serial_cycles == 7000
    if device.scheduler == "threads":  # measured overlap of the independent branches
        assert a.host_start_ns < b.host_end_ns and b.host_start_ns < a.host_end_ns
    else:
        assert a.host_end_ns <= b.host_start_ns


def test_summary_table(device):
    with profile() as p:
        run_branches(device, p)
    text = p.summary(print_=False)
    for word in ("kernel", "host us", "sim cyc", "join", "vector", "memory", "e0"):
        assert word in text
    assert "realize 0 branches: 3 kernels, streams [0, 1], 1 event," in text
    assert "simulated 5.000 us (serial 7.000 us)" in text
    assert repr(text).startswith("<profile summary")


def _nesting_ok(slices: list[dict]) -> bool:
    """Chrome/Perfetto need the slices of one track to nest (no partial overlap)."""
    tol = 1e-6
    stack: list[float] = []
    for s in sorted(slices, key=lambda s: (s["ts"], -s["dur"])):
        end = s["ts"] + s["dur"]
        while stack and stack[-1] <= s["ts"] + tol:
            stack.pop()
        if stack and end > stack[-1] + tol:
            return False
        stack.append(end)
    return True


def test_chrome_trace_has_tracks_slices_and_flows(device, tmp_path):
    with profile() as p:
        run_branches(device, p)
        run_branches(device, p)  # a second realize lands after the first on the NPU axis
    path = p.save(tmp_path / "trace.json")
    trace = json.loads(open(path).read())
    evs = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in evs if e.get("name") == "process_name"}
    assert procs == {1: "host (measured)", 2: "NPU (simulated)"}
    threads = {(e["pid"], e["args"]["name"]) for e in evs if e.get("name") == "thread_name"}
    assert {(1, "realize"), (1, "stream 0"), (1, "stream 1")} <= threads
    assert {(2, "stream 0"), (2, "stream 1"), (2, "MTE2"), (2, "Vector"), (2, "MTE3")} <= threads
    tid = {(e["pid"], e["args"]["name"]): e["tid"] for e in evs if e.get("name") == "thread_name"}
    slices = [e for e in evs if e["ph"] == "X"]
    for pid in (1, 2):
        names = [e["name"] for e in slices if e["pid"] == pid and e["cat"] == "kernel"]
        assert names == ["a", "b", "join"] * 2
    assert [e["name"] for e in slices if e["cat"] == "realize"] == ["branches"] * 2
    npu_join = [e for e in slices if e["pid"] == 2 and e["name"] == "join"]
    assert npu_join[1]["ts"] >= npu_join[0]["ts"] + 5.0 - 1.0  # realizes do not overlap
    assert {e["tid"] for e in slices if e["cat"] == "pipe"} == {
        tid[(2, p_)] for p_ in ("MTE2", "Vector", "MTE3")
    }
    # flows: one record->wait arrow per process per realize, bound to enclosing slices
    flows = [e for e in evs if e["ph"] in ("s", "f")]
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    ends = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert len(starts) == len(ends) == 4 and starts.keys() == ends.keys()
    for fid, f in ends.items():
        s = starts[fid]
        assert f["bp"] == "e" and s["name"] == f["name"] and s["cat"] == f["cat"]
        assert s["tid"] == tid[(s["pid"], "stream 1")] and f["tid"] == tid[(f["pid"], "stream 0")]
        for point in (s, f):
            assert any(
                x["pid"] == point["pid"] and x["tid"] == point["tid"]
                and x["ts"] <= point["ts"] <= x["ts"] + x["dur"] and x["cat"] == "event"
                for x in slices
            )  # fmt: skip
    for key in {(e["pid"], e["tid"]) for e in slices}:
        assert _nesting_ok([e for e in slices if (e["pid"], e["tid"]) == key]), key
    assert "pipe_utilization" in trace["otherData"]


def test_inactive_profiler_records_nothing(device):
    with profile() as p:
        pass
    device.launch(SleepKernel("outside"), 1, [])
    device.synchronize()
    assert p.kernels == [] and prof.active() is None
    assert prof.realize("x").__enter__() is None  # no-op scope


def test_nested_profilers_restore_the_outer(device):
    with profile() as outer:
        device.launch(SleepKernel("k1"), 1, [])
        with profile() as inner:
            device.launch(SleepKernel("k2"), 1, [])
        assert prof.active() is outer
        device.launch(SleepKernel("k3"), 1, [])
    assert [k.name for k in outer.kernels] == ["k1", "k3"]
    assert [k.name for k in inner.kernels] == ["k2"]


def test_record_kernel_explicit(device, tmp_path):
    with profile() as p:
        with prof.realize("manual"):
            p.record_kernel("m0", "cube", 0, 1000, 5000, 0, 800, {"Cube": 800}, "compute",
                            records=3)  # fmt: skip
            p.record_kernel("m1", "vector", 1, 1000, 2000, cycles_by_pipe={"Vector": 300},
                            waits=(3,))  # fmt: skip
    m0, m1 = p.kernels
    assert (m0.sim_start_cycles, m0.sim_end_cycles, m0.host_us) == (0, 800, 4.0)
    assert m1.sim_cycles == 300 and m1.waits and m0.bound == "compute"
    json.loads(open(p.save(tmp_path / "t.json")).read())


def test_cost_is_read_at_finalize_not_at_launch(device):
    """A backend computes costs lazily (~10 ms the first time): launches must not wait for it."""

    class LazyCost(SleepKernel):
        reads = 0

        @property
        def cost(self):
            LazyCost.reads += 1
            return Cost(123, {"Vector": 100})

    class BrokenCost(SleepKernel):
        @property
        def cost(self):
            raise ImportError("cost model not built yet")

    with profile() as p:
        device.launch(LazyCost("lazy"), 1, [])
        device.launch(BrokenCost("broken"), 1, [])
        device.synchronize()
        assert LazyCost.reads == 0
    lazy, broken = p.kernels
    assert LazyCost.reads == 1 and lazy.sim_cycles == 123 and lazy.bound is None
    assert broken.sim_cycles == 0 and broken.cost is None
