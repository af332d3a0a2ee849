"""A short run of the project fuzzer (lazymath.testing.fuzz) in CI: random graphs of every op
family, dtype, view and realize order on the compiled backends against the reference backend.
The long run is ``python -m lazymath.testing.fuzz --graphs N``."""

from __future__ import annotations

import io

import numpy as np

from lazymath import settings
from lazymath.testing import fuzz


def test_fuzzer_finds_no_mismatch_on_a_short_run():
    out = io.StringIO()
    failures = fuzz.run(16, seed=1000, backends=("llvm", "interp"), out=out, stop_after=1)
    assert not failures, out.getvalue()


def test_fuzzer_detects_and_shrinks_a_mismatch(monkeypatch):
    """The comparison and the shrinker work: a planted wrong result (every sum is off by one on
    the backend under test) is reported, and shrunk to the one step that shows it."""
    case = fuzz.Case(7, [np.arange(6, dtype=np.float32).reshape(2, 3)],
                     [fuzz.Step("exp", (0,)), fuzz.Step("neg", (0,)),
                      fuzz.Step("sum", (2,), {"axis": 1, "keepdims": False})],
                     [1, 3], "each", (1, 0))  # fmt: skip
    assert fuzz.check(case, "interp") is None
    real_apply = fuzz._apply

    def wrong(mod, step, vals):
        out = real_apply(mod, step, vals)
        if step.op == "sum" and settings.BACKEND.get() == "interp":
            out = out + 1
        return out

    monkeypatch.setattr(fuzz, "_apply", wrong)
    assert "differs" in fuzz.check(case, "interp")
    small = fuzz.shrink(case, "interp")
    assert [s.op for s in small.steps] == ["neg", "sum"] and small.outputs == [2]
    assert "Step('sum'" in small.repro("interp")


def test_tolerance_follows_the_least_precise_dtype_of_the_chain():
    """Fuzzer seed 201072: a float32 log_softmax cast to float64 carries float32 rounding; it
    is compared at float32's tolerance, a value computed in float64 throughout at float64's."""
    want = [np.array([-0.0004583738336805254, 1.0])]
    got = [np.array([-0.00045849301386624575, 1.0])]
    assert fuzz._compare(got, want, [{"float64", "float32"}]) is None
    assert "differs" in fuzz._compare(got, want, [{"float64"}])
