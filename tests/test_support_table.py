"""docs/ops.md is generated from the planner (lazymath.support): it must say what lm.schedule
does today, for every user-reachable op of the registry and every supported dtype."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import lazymath as lm
from lazymath import support
from lazymath.graph.ops import Op

DOC = Path(__file__).resolve().parent.parent / "docs" / "ops.md"


def test_docs_ops_table_is_current():
    want = support.markdown()
    assert DOC.read_text() == want, (
        "docs/ops.md is stale: regenerate it with `python -m lazymath.support --markdown > "
        "docs/ops.md`"
    )


def test_cells_follow_the_planner():
    f32, f64 = np.dtype("float32"), np.dtype("float64")
    assert support.unit_cell("exp", f32) == "V"  # Vector kernel
    assert support.unit_cell("exp", f64) == "A"  # float64 runs on the AI CPU
    assert support.unit_cell("matmul", np.dtype("float16")) == "C"
    assert support.unit_cell("bitwise_and", f32) == "-"  # a TypeError at the call
    # the table holds every elementwise op that has a public function
    names = {r[0] for r in support.rows()}
    assert {"add", "sin", "where", "sum", "argmax", "matmul"} <= names
    assert all(support._function(n) is not None for n in names)
    assert all(str(m.value) in names for m in Op if m.kind.value == "elementwise"
               and support._function(str(m.value)) is not None)  # fmt: skip
    assert lm.schedule(lm.exp(lm.ones((4, 8)) + lm.zeros(8))).kernels  # sanity: schedules
