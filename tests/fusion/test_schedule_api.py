"""The introspection API (issue 5): `lm.schedule(*tensors)` returns a Schedule (kernels with
name/unit/ops/inputs/outputs/flops/bytes/bound/stream/waits, planned_peak_bytes, fusion_log)
whose `__str__` is a readable table; `lm.explain(*tensors)` starts with the same text.

Nothing here compiles or executes a kernel.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import lazymath as lm
from lazymath.fusion import Schedule, ScheduledKernel
from lazymath.fusion.streams import KernelDeps, StreamEntry, StreamPlan, verify_plan

RNG = np.random.default_rng(3)
HEADER = ["kernel", "unit", "ops", "bound", "flops", "bytes", "stream", "waits"]


def t(*shape: int, dtype: str = "float32") -> lm.Tensor:
    return lm.tensor(RNG.standard_normal(shape).astype(dtype))


def custom_op_graph():
    A, B = t(32, 48, dtype="float16"), t(48, 64, dtype="float16")
    return lm.mul(lm.relu(lm.matmul(A, B)), lm.tensor(np.float16(0.5)))


def softmax_graph():
    """exp (read twice: materialized) | sum | div: the reduced axes are not adjacent, so no
    row kernel takes the whole graph."""
    x = t(2, 4, 5)
    e = lm.exp(x)
    return e / e.sum(axis=(0, 2), keepdims=True)


def diamond_graph():
    """Two independent matmuls joined by a third: two streams and one event."""
    A, B, C, D = (t(8, 16, dtype="float16"), t(16, 8, dtype="float16"),
                  t(8, 16, dtype="float16"), t(16, 8, dtype="float16"))  # fmt: skip
    return (A @ B) @ (C @ D)


# ----------------------------------------------------------------------------- fields


def test_schedule_and_kernel_field_types():
    s = lm.schedule(softmax_graph())
    assert isinstance(s, Schedule)
    assert isinstance(s.planned_peak_bytes, int) and s.planned_peak_bytes > 0
    assert isinstance(s.fusion_log, list)
    assert s.spec.name == "ascend910"
    assert isinstance(s.kernels, list) and s.kernels
    for k in s.kernels:
        assert isinstance(k, ScheduledKernel)
        assert isinstance(k.name, str) and k.name
        assert k.unit in {"cube", "vector", "mix", "aicpu"}
        assert isinstance(k.ops, list) and all(isinstance(o, str) for o in k.ops)
        assert isinstance(k.inputs, list) and all(isinstance(i, str) for i in k.inputs)
        assert isinstance(k.outputs, list) and all(isinstance(o, str) for o in k.outputs)
        assert k.outputs  # every kernel writes something
        assert isinstance(k.flops, int) and k.flops >= 0
        assert isinstance(k.bytes, int) and k.bytes > 0
        assert isinstance(k.intensity, float)
        assert k.bound in {"compute", "memory"}
        assert isinstance(k.stream, int) and k.stream >= 0
        assert isinstance(k.waits, tuple) and all(isinstance(w, int) for w in k.waits)
        assert k.records is None or isinstance(k.records, int)


def test_inputs_and_outputs_describe_op_shape_dtype():
    (k,) = lm.schedule(custom_op_graph()).kernels
    assert k.inputs == ["buffer[32, 48]:float16", "buffer[48, 64]:float16", "buffer[]:float16"]
    assert k.outputs == ["mul[32, 64]:float16"]
    pat = re.compile(r"^[a-z_0-9]+\[[0-9, ]*\]:[a-z0-9]+$")
    for k in lm.schedule(softmax_graph()).kernels:
        assert all(pat.match(s) for s in k.inputs + k.outputs), (k.inputs, k.outputs)


def test_fusion_log_entries():
    s = lm.schedule(softmax_graph())
    assert s.fusion_log
    for e in s.fusion_log:
        assert e.what in {"materialize", "refuse", "recompute", "split", "rows"}
        assert isinstance(e.reason, str) and e.reason
        assert isinstance(e.nodes, tuple) and e.nodes
        assert e.what in str(e) and e.reason in str(e)


def test_uncompiled_kernel_reports():
    (k,) = lm.schedule(custom_op_graph()).kernels
    assert k.compiled is None
    assert k.isa == "<not compiled>"
    assert "no LLVM IR" in k.llvm_ir
    assert k.source_loc.endswith(".py:" + k.source_loc.rsplit(":", 1)[1])
    assert "test_schedule_api.py" in k.source_loc  # the user's line that made the kernel


def test_empty_schedule():
    x = t(5)
    s = lm.schedule(x)  # already realized: nothing to do
    assert s.kernels == [] and s.planned_peak_bytes == 0
    assert "0 kernels" in str(s)
    assert len(lm.schedule().kernels) == 0


def test_schedule_rejects_non_tensors():
    with pytest.raises(TypeError):
        lm.schedule(np.ones(3))


def test_spec_argument_and_current_device():
    g = custom_op_graph()
    assert lm.schedule(g, spec="ascend910b").spec.name == "ascend910b"
    from lazymath.runtime import get_spec

    assert lm.schedule(g, spec=get_spec("ascend910b")).spec.name == "ascend910b"
    try:
        lm.init_device(0, spec="ascend910b")
        s = lm.schedule(g)
        assert s.spec.name == "ascend910b" and len(s.kernels) == 2
    finally:
        lm.init_device(0, spec="ascend910")
    assert len(lm.schedule(g).kernels) == 1


# ----------------------------------------------------------------------------- text


def _rows(text: str) -> list[str]:
    return text.splitlines()


def test_str_table_header_rows_and_summary():
    s = lm.schedule(softmax_graph())
    lines = _rows(str(s))
    assert lines[0].split() == HEADER
    rows = lines[1 : 1 + len(s.kernels)]
    for k, row in zip(s.kernels, rows):
        cols = row.split()
        assert cols[0] == k.name and cols[1] == k.unit
        assert " ".join(k.ops) in row
        assert k.bound in cols
        assert row.rstrip().endswith("-" if not k.waits else ",".join(f"e{w}" for w in k.waits))
    summary = lines[1 + len(s.kernels)]
    assert summary.startswith("planned peak ")
    assert f"{len(s.kernels)} kernels" in summary
    assert "on ascend910" in summary
    assert lines[2 + len(s.kernels)] == "fusion log:"
    log_lines = lines[3 + len(s.kernels) :]
    log_lines = [ln for ln in log_lines if ln.startswith("  ")][: len(s.fusion_log)]
    assert len(log_lines) == len(s.fusion_log)
    assert all(
        ln.startswith("host target: ") for ln in lines[3 + len(s.kernels) + len(log_lines) :]
    )
    for e, ln in zip(s.fusion_log, log_lines):
        assert ln.strip() == str(e).strip()


def test_str_columns_are_aligned():
    s = lm.schedule(softmax_graph())
    lines = _rows(str(s))[: 1 + len(s.kernels)]
    starts = [lines[0].index(h) for h in HEADER[1:]]
    for ln in lines[1:]:
        for st in starts:
            assert ln[st - 2 : st] == "  ", (ln, st)  # each column starts after two spaces


def test_str_of_a_one_kernel_schedule():
    text = str(lm.schedule(custom_op_graph()))
    lines = _rows(text)
    assert lines[1].split()[:5] == ["k0_matmul_relu_mul", "cube", "matmul", "relu", "mul"]
    assert "compute" in lines[1] or "memory" in lines[1]
    assert lines[2] == "planned peak 4.0 KiB, 1 kernel, 0 events, 1 stream on ascend910"
    assert "fusion log" not in text


def test_long_op_lists_are_abbreviated():
    z = t(16)
    for i in range(10):
        z = z * 1.5 if i % 2 else lm.exp(z)
    s = lm.schedule(z)
    (k,) = s.kernels
    assert len(k.ops) == 10
    assert "..(+5)" in str(s)


def test_units_and_numbers_are_human_readable():
    n = 1024
    A = lm.tensor(np.ones((n, n), np.float16))
    text = str(lm.schedule(A @ A))
    assert "2.1 G" in text  # 2 * 1024**3 FLOPs
    assert "6.3 M" in text  # 3 * 1024 * 1024 * 2 bytes
    assert "planned peak 2.0 MiB" in text


def test_explain_starts_with_the_schedule_text_and_says_more():
    g = softmax_graph()
    assert lm.explain(g).startswith(str(lm.schedule(g)) + "\n\nwhy each kernel runs where")
    h = custom_op_graph()
    assert lm.explain(h, spec="ascend910b").startswith(str(lm.schedule(h, spec="ascend910b")))
    assert isinstance(lm.explain(g), str)


def test_explain_of_several_tensors():
    x = t(9)
    a, b = lm.sin(x), lm.exp(x)
    text = lm.explain(a, b)
    assert text.startswith(str(lm.schedule(a, b)))
    assert "1 kernel," in text


def test_repr():
    s = lm.schedule(softmax_graph())  # exp (read twice: materialized) | sum | div
    assert len(s.kernels) == 3
    assert repr(s) == str(s)  # a REPL shows the table, not "<Schedule 3 kernels ...>"
    assert repr(s).startswith("kernel ") and "3 kernels, " in repr(s)
    html = s._repr_html_()
    assert html.startswith("<div><b>Schedule: 3 kernels on ascend910, planned peak ")
    assert "fusion log:" in html and "&lt;" not in str(s)


# ----------------------------------------------------------------------------- streams


def test_streams_and_waits_for_independent_branches():
    s = lm.schedule(diamond_graph())
    assert [k.ops for k in s.kernels] == [["matmul"]] * 3
    assert s.n_streams == 2 and s.n_events == 1
    k0, k1, k2 = s.kernels
    assert k0.stream != k1.stream  # the two independent matmuls run side by side
    # the join runs after both: on one of their streams, waiting on the other's event
    assert k2.stream in (k0.stream, k1.stream)
    other = k0 if k2.stream == k1.stream else k1
    assert other.records is not None and k2.waits == (other.records,)
    assert "e0" in str(s) and "1 event," in str(s) and "2 streams" in str(s)


def test_waits_refer_to_events_recorded_earlier():
    for g in (diamond_graph(), softmax_graph(), custom_op_graph()):
        s = lm.schedule(g)
        recorded = set()
        for k in s.kernels:
            assert set(k.waits) <= recorded, (k.name, k.waits, recorded)
            if k.records is not None:
                recorded.add(k.records)
        assert len(recorded) == s.n_events


def test_stream_plan_orders_every_data_dependency():
    """Replay the schedule's streams and events: each kernel runs after what it reads."""
    x = t(10, 10)
    outs = [lm.exp(x).sum(axis=0), lm.exp(x).max(axis=1), diamond_graph(), softmax_graph()]
    s = lm.schedule(*outs)
    deps = [
        KernelDeps(
            frozenset(id(n) for n in k.group.inputs),
            frozenset(id(n) for n in k.group.outputs),
            k.name,
        )  # fmt: skip
        for k in s.kernels
    ]
    plan = StreamPlan(
        tuple(StreamEntry(k.stream, k.waits, k.records) for k in s.kernels),
        s.n_events,
        max(2, s.n_streams),
    )
    verify_plan(deps, plan)


def test_a_chain_stays_on_one_stream_without_events():
    s = lm.schedule(softmax_graph())
    assert {k.stream for k in s.kernels} == {0}
    assert s.n_events == 0 and all(not k.waits for k in s.kernels)


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_plan_copies_a_strided_input_without_replacing_the_users_array(backend, monkeypatch):
    """A reshape of a strided user array needs a contiguous copy: the plan says so
    (Schedule.copy_inputs) and the runtime copies at each run; the leaf keeps the user's array."""
    from lazymath.graph import node as gn
    from lazymath.tensor import Tensor

    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    v = base[::-1, ::2]
    v.flags.writeable = False
    x = Tensor(gn.buffer_node(v))
    y = x.reshape(24) * 2
    s = lm.schedule(y)
    assert s.copy_inputs == frozenset({id(x.node)})
    assert any(e.what == "materialize" and "contiguous" in e.reason for e in s.fusion_log)
    assert x.node.realized is v
    np.testing.assert_array_equal(y.numpy(), v.reshape(24) * 2)
    assert x.node.realized is v
