"""The structural fuzzer step (issue 38): random multi-output graphs mixing complex inputs,
reversed/strided views, argmax and reductions and comparisons plan into an acyclic kernel order
on both presets (no execution), and a sample realizes equal to the reference backend."""

from __future__ import annotations

import io

from lazymath.testing import fuzz


def test_structural_schedules_are_acyclic_and_a_sample_matches_numpy():
    out = io.StringIO()
    failures, counts = fuzz.run_structural(60, seed=38_000, values_every=15, out=out,
                                           stop_after=1)  # fmt: skip
    assert not failures, out.getvalue()
    assert counts["schedules"] == 120 and counts["valued"] == 4


def test_structural_cases_hold_the_shapes_that_made_cycles():
    """The generator makes what it promises: complex leaves, views, arg-reductions and
    comparisons, several outputs."""
    ops, n_out = set(), []
    for s in range(40):
        c = fuzz.generate_structural(s)
        assert any(a.dtype.kind == "c" for a in c.leaves)
        ops |= {st.op for st in c.steps}
        n_out.append(len(c.outputs))
    assert {"slice", "abs", "argmax", "sum"} <= ops and ops & set(fuzz.COMPARE)
    assert max(n_out) >= 3


def test_schedule_problem_reports_a_cycle(monkeypatch):
    """The schedule check fails loudly when planning raises (here: a planted error)."""
    from lazymath.fusion import grouping

    def broken(self, groups):
        raise RuntimeError("cycle between kernels")

    monkeypatch.setattr(grouping.Planner, "_toposort_groups", broken)
    msg = fuzz.schedule_problem(fuzz.generate_structural(1), "ascend910")
    assert msg is not None and "cycle between kernels" in msg
