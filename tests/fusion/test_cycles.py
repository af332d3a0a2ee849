"""The group DAG is acyclic for every graph (issue 38).

A complex input's reversed slice, its abs (AI CPU: complex64), an argmax of that abs with an
epilogue (`argmax - argmax`) and an AI CPU comparison reading both made `_merge_aicpu` join the
comparison to the abs kernel the argmax reads: "cycle between kernels". The merge now counts
every value a kernel writes (epilogues too), and a cycle met anyway is split, not raised.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath.fusion import grouping

SPECS = ["ascend910", "ascend910b"]


def _repro():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(17) + 1j * rng.standard_normal(17)).astype(np.complex64)
    X = lm.asarray(x)
    n3 = lm.abs((X - 0)[11::-1])
    n6 = lm.argmax(n3) - lm.argmax(n3)
    out = lm.exp(lm.equal(n6, n3))
    a = np.abs(x[11::-1])
    want = np.exp(np.equal(np.argmax(a) - np.argmax(a), a))
    return X, out, want


def assert_acyclic(s) -> None:
    """Every kernel of schedule `s` reads only user inputs and values written by kernels
    launched before it (the launch order is a topological order of the group DAG)."""
    written: set[int] = set()
    for k in s.kernels:
        for n in k.group.inputs:
            assert n.realized is not None or id(n) in written, (
                f"{k.name} reads {n.op}{list(n.shape)} before any kernel writes it"
            )
        written |= {id(n) for n in k.group.outputs}


@pytest.mark.parametrize("spec", SPECS)
def test_repro_schedule_is_acyclic(spec):
    X, out, _ = _repro()
    s = lm.schedule(X, out, spec=spec)
    assert_acyclic(s)
    # the rule is fixed: the split safety net is not needed here
    assert not any(e.what == "split" for e in s.fusion_log)


def _merge_aicpu_roots_only(self, groups):
    """The pre-fix `_merge_aicpu`: it knew only the roots a kernel writes, not its epilogue
    values, so it merged the repro's comparison into the abs kernel (a cycle)."""
    owner = {id(r): g for g in groups for r in g.roots}
    dead = set()
    for g in groups:
        if g.kind != "aicpu":
            continue
        prod = {id(owner[id(b)]): owner[id(b)] for b in self._boundary(g)
                if id(b) in owner and owner[id(b)] is not g}  # fmt: skip
        if len(prod) != 1:
            continue
        (p,) = prod.values()
        if p.kind != "aicpu" or id(p) in dead:
            continue
        p.members |= g.members
        p.roots = p.roots + g.roots
        p.core = None
        for r in g.roots:
            owner[id(r)] = p
        dead.add(id(g))
    return [g for g in groups if id(g) not in dead]


@pytest.mark.parametrize("spec", SPECS)
def test_a_cycle_is_split_not_raised(spec, monkeypatch):
    """The planner's safety net: a merge that closes a cycle is undone and logged."""
    monkeypatch.setattr(grouping.Planner, "_merge_aicpu", _merge_aicpu_roots_only)
    X, out, want = _repro()
    s = lm.schedule(X, out, spec=spec)
    assert_acyclic(s)
    splits = [e for e in s.fusion_log if e.what == "split"]
    assert splits and "cycle between kernels" in splits[0].reason
    lm.realize(X, out)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-3)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("backend", ["llvm", "interp"], indirect=True)
def test_repro_realizes_equal_to_numpy(spec, backend):
    lm.init_device(0, spec=spec)
    try:
        X, out, want = _repro()
        lm.realize(X, out)
        got = out.numpy()
    finally:
        lm.init_device(0, spec="ascend910")
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-3)
