"""`lm.explain` says more than `lm.schedule`: why each kernel is on its unit (AI CPU reasons
included), its roofline class in words, its simulated AI cores next to its host blocks, each
fusion decision with the user's line, and whether the streams overlap in the simulated timeline
and why not. It returns a str that displays as itself in a REPL and as HTML in Jupyter.
Nothing here executes a kernel, except the profiler test at the end."""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath.fusion.grouping import aicpu_reason

HERE = __file__.replace("\\", "/").rsplit("/", 1)[-1]


def _branches(rows: int, cols: int):
    rng = np.random.default_rng(rows)
    x = lm.tensor(rng.standard_normal((rows, cols), dtype=np.float32))
    y = lm.tensor(rng.standard_normal((rows, cols), dtype=np.float32))
    a = lm.sum(lm.exp(x) * 0.5, axis=1)
    b = lm.max(lm.sin(y) + 1.0, axis=1)
    return lm.sum(a * b)


def _section(text: str, name: str) -> str:
    return text.split(f"\n{name}:\n", 1)[1]


def test_explanation_is_a_str_that_displays_as_itself():
    x = lm.tensor(np.ones((3, 5), np.float32))
    e = lm.explain(lm.exp(x) + 1)
    assert isinstance(e, str) and isinstance(e, lm.api.Explanation)
    assert repr(e) == str(e) and "\n" in repr(e)  # a REPL echo shows the lines, not '\n'
    html = e._repr_html_()
    assert html.startswith("<pre") and "why each kernel runs where it does:" in html
    assert "&lt;" not in html or "<" in str(e)  # escaped, not interpreted
    assert e.schedule.kernels[0].name in e


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_units_are_explained(spec):
    i = lm.tensor(np.arange(9, dtype=np.int32).reshape(3, 3))
    d = lm.tensor(np.ones(4, np.float64))
    f = lm.tensor(np.ones((32, 48), np.float32))
    text = lm.explain(i @ i, d + 1, lm.relu(f @ f.T), lm.pad(f, ((1, 1), (0, 0))), spec=spec)
    why = _section(text, "why each kernel runs where it does")
    assert (
        "AI CPU: an int32 matmul: lazymath's Cube kernels take float16, bfloat16 or float32" in why
    )
    assert "cast to float32 to use the Cube" in why
    assert "AI CPU: float64 is not an AI Core dtype" in why
    assert "AI CPU: pad has no AI Core kernel template yet" in why
    assert "Cube: a matmul on the 16x16x16 fractal multiply-accumulate unit" in why
    assert f"(created at {__file__}:" in why  # the user's line of each kernel
    for line in why.splitlines():
        if line.strip().startswith("bound:") and "host CPU" not in line:
            assert ("memory-bound:" in line) or ("compute-bound:" in line), line
            assert "ridge point" in line and "FLOP/byte" in line


def test_aicpu_reason_is_none_for_ai_core_nodes():
    f = lm.tensor(np.ones((4, 4), np.float32))
    h = lm.tensor(np.ones((4, 4), np.float16))
    for t in (f + 1, f @ f, h @ h, lm.sum(f, axis=0), f.astype(lm.int32)):
        assert aicpu_reason(t._node) is None, t._node.op
    i8 = lm.tensor(np.ones((4, 4), np.int8))
    assert "int8 matmul" in aicpu_reason((i8 @ i8)._node)


def test_fusion_decisions_name_the_reduction_and_the_users_line():
    x = lm.tensor(np.ones((4, 6, 5), np.float32))
    out = lm.exp(x) + lm.sum(x, axis=(0, 2), keepdims=True)
    line = out._node.loc
    text = lm.explain(out)
    log = str(lm.schedule(out)).split("fusion log:", 1)[1]
    assert "reduce.sum[" in log and f"[{HERE}:" in log  # the log line itself: which reduction
    dec = _section(text, "fusion decisions")
    assert "refuse reduce.sum[6]:float32 -> add[4, 6, 5]:float32" in dec
    assert "why: consumer runs over a different (broadcast) iteration space" in dec
    assert f"at:  {line}" in dec
    m = lm.max(x, axis=1)
    assert "reduce.max" in str(lm.schedule(m + lm.sum(m)))  # max and sum are told apart


def test_no_refusal_says_so():
    x = lm.tensor(np.ones(7, np.float32))
    assert "none logged: every op fused" in _section(lm.explain(lm.exp(x) * 2), "fusion decisions")


def test_streams_that_cannot_overlap_say_why():
    """1024 rows: each branch's kernel occupies every AI core of the ascend910, so the second
    stream waits for cores (what examples/streams.py showed without saying)."""
    text = lm.explain(_branches(1024, 4096))
    why = _section(text, "why each kernel runs where it does")
    assert "32 blocks on the simulated ascend910 (32 of its 32 AI cores)" in why
    assert "on this host (threads over its cores)" in why
    streams = _section(text, "streams")
    assert streams.startswith("  streams did not overlap: the branches are independent, but each")
    assert "all 32 AI cores of the simulated ascend910" in streams


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_streams_that_overlap_say_so(spec):
    streams = _section(lm.explain(_branches(8, 4096), spec=spec), "streams")
    assert streams.startswith("  streams overlapped: makespan ")
    assert "us saved" in streams


def test_one_stream():
    x = lm.tensor(np.ones(5, np.float32))
    assert _section(lm.explain(lm.exp(x)), "streams").startswith("  one stream:")


def test_profiler_shows_simulated_cores_and_why_streams_did_not_overlap(monkeypatch):
    monkeypatch.setenv("LAZYMATH_BACKEND", "interp")  # exact and quick to build, no LLVM
    c = _branches(64, 256)
    with lm.profile() as p:
        c.realize()
    text = p.summary(print_=False)
    head = text.splitlines()[0]
    assert " blk " in head and " cores " in head
    assert "streams did not overlap" in text or "streams overlapped" in text
