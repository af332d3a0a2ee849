"""Kernel-count tests for the fusion policy (issue 5, `lazymath/fusion/rules.py`).

Every test goes through `lm.schedule(...)`, which fuses and plans but compiles and executes
nothing, so the whole file runs in a couple of seconds. Each rule of the issue and each row of
the rules tables has a test that counts kernels, checks their units and op lists, and, for a
refusal, checks that the fusion log says why.

Intermediate tensors are never kept in local variables: a live tensor is realized along with
the outputs (`graph.walk.live_outputs`), which would add kernels the rule under test does not make.
Tests that document a known fusion bug are `xfail(strict=True)` with the bug in the reason.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath.fusion import rules
from lazymath.graph.ops import BINARY as BINARY_OPS

RNG = np.random.default_rng(1234)
UNITS = {"cube", "vector", "mix", "aicpu"}


def t(*shape: int, dtype: str = "float32") -> lm.Tensor:
    """A realized input tensor (a leaf buffer) with random values."""
    return lm.tensor(RNG.standard_normal(shape).astype(dtype))


def sched(*tensors: lm.Tensor, spec: str | None = None):
    s = lm.schedule(*tensors, spec=spec)
    for k in s.kernels:  # invariants every schedule keeps
        assert k.unit in UNITS, k.unit
        assert k.bound in ("compute", "memory")
        assert k.ops and all(isinstance(o, str) for o in k.ops)
    return s


def log_has(s, what: str | None = None, text: str = "") -> bool:
    """Is there a fusion-log entry of kind `what` whose reason contains `text`?"""
    return any((what is None or e.what == what) and text in e.reason for e in s.fusion_log)


def log_text(s) -> str:
    return "\n".join(str(e) for e in s.fusion_log) or "<empty fusion log>"


@pytest.fixture(autouse=True)
def _folded_scalars(monkeypatch):
    """These rules are about constants folded into kernels (input counts, caps, bytes): they
    run with LAZYMATH_SCALAR_ARGS=0. How runtime scalars (the default) fuse is pinned in
    tests/test_scalar_args.py (one kernel, the scalars as 0-d inputs)."""
    monkeypatch.setenv("LAZYMATH_SCALAR_ARGS", "0")


@pytest.fixture
def restore_device():
    """Tests that switch the preset with lm.init_device put the default back."""
    yield
    lm.init_device(0, spec="ascend910")


# ----------------------------------------------------------------------------- elementwise


def test_elementwise_chain_is_one_vector_kernel():
    x = t(37)
    s = sched(lm.relu(lm.exp(x * 2.0 + 1.0) - 3.0))
    (k,) = s.kernels
    assert k.unit == "vector" and k.kind == "elementwise"
    assert k.ops == ["mul", "add", "exp", "sub", "relu"]
    assert len(k.inputs) == 1 and len(k.outputs) == 1
    assert not s.fusion_log, log_text(s)


def test_elementwise_tree_with_broadcasts_and_views_is_one_kernel():
    a, b, c = t(4, 6), t(6), t(4, 1)
    w = t(6, 4)  # read transposed
    z = t(4, 13)  # read through a strided slice
    out = lm.relu(a + b) * (c - w.T) + lm.tanh(a.T.T) * b[::-1] - z[:, 1::2] / 2.0
    s = sched(out)
    (k,) = s.kernels
    assert k.unit == "vector"
    assert sorted(k.ops) == sorted(["add", "relu", "sub", "mul", "tanh", "mul", "add", "div",
                                    "sub"])  # fmt: skip
    # one GM input per (buffer, view): a, b, c, w.T, b[::-1], z[:, 1::2]
    assert len(k.inputs) == 6
    assert k.outputs == ["sub[4, 6]:float32"]
    assert not s.fusion_log, log_text(s)


@pytest.mark.parametrize("dtype", ["float16", "float32", "int32"])
def test_elementwise_with_broadcast_over_prime_shapes(dtype):
    x, y = t(7, 1, 5, dtype=dtype), t(3, 1, dtype=dtype)
    s = sched(lm.maximum(x, y) * x - y)
    (k,) = s.kernels
    assert k.unit == "vector" and k.ops == ["maximum", "mul", "sub"]


def test_comparisons_and_where_fuse_with_bool():
    x, y = t(11), t(11)
    s = sched(lm.where((x > y) & (x > 0), x, y * 0.5))
    assert len(s.kernels) == 1 and s.kernels[0].unit == "vector"


def test_multi_output_kernel_reads_x_once():
    x = t(1000)
    a, b, c = lm.sin(x), lm.exp(x), lm.log(lm.abs(x) + 1e-10)
    s = sched(a, b, c)
    (k,) = s.kernels
    assert k.unit == "vector"
    assert k.inputs == ["buffer[1000]:float32"]  # x is read once for all three outputs
    assert len(k.outputs) == 3
    assert k.ops == ["sin", "exp", "abs", "add", "log"]


def test_multi_output_chain_where_one_output_feeds_another():
    x = t(64)
    y = x * 3.0
    z = lm.exp(y) + y
    s = sched(y, z)  # y is an output and also an input of z: one kernel writes both
    (k,) = s.kernels
    assert len(k.inputs) == 1 and len(k.outputs) == 2


def test_independent_outputs_of_different_shapes_are_separate_kernels():
    s = sched(t(8) + 1.0, t(3, 5) * 2.0)
    assert len(s.kernels) == 2


# ----------------------------------------------------------------------------- reductions


def test_reduce_prologue_and_epilogue_are_one_kernel():
    x = t(1000)
    s = sched((x * 2.0).sum() + 1.0)
    (k,) = s.kernels
    assert k.unit == "vector" and k.kind == "reduce"
    assert k.ops == ["mul", "sum", "add"]
    assert k.inputs == ["buffer[1000]:float32"]


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_mean_is_one_kernel(axis):
    s = sched(lm.mean(t(13, 7), axis=axis))
    (k,) = s.kernels
    assert k.kind == "reduce" and "sum" in k.ops


def test_reduce_along_axis_with_prologue_and_keepdims_epilogue():
    x = t(5, 9)
    s = sched(lm.sqrt(lm.abs(x * x - 1.0).max(axis=1, keepdims=True)) * 2.0)
    (k,) = s.kernels
    assert k.ops[:4] == ["mul", "sub", "abs", "max"]
    assert k.ops[-2:] == ["sqrt", "mul"]


def test_reduce_reduce_is_two_kernels():
    s = sched(t(8, 9).sum(axis=1).max())
    assert [k.ops for k in s.kernels] == [["sum"], ["max"]]


def test_reduce_reduce_refusal_is_logged():
    s = sched(t(8, 9).sum(axis=1).max())
    assert log_has(s, text=rules.FUSE[("reduce", "reduce")][1]), log_text(s)


def test_reduce_with_broadcast_consumer_is_refused_with_reason():
    # reduced axes that are not adjacent: no row kernel, the broadcast consumer runs apart
    y = t(3, 4, 5)
    s = sched(y - y.max(axis=(0, 2), keepdims=True))
    assert [k.ops for k in s.kernels] == [["max"], ["sub"]]
    assert log_has(s, "refuse", "iteration space"), log_text(s)


def test_reduce_with_broadcast_consumer_is_one_row_kernel():
    y = t(4, 6)
    s = sched(y - y.max(axis=1, keepdims=True))
    assert [(k.kind, k.ops) for k in s.kernels] == [("rows", ["max", "sub"])]
    assert log_has(s, "rows", "row-resident"), log_text(s)


def test_softmax_kernels():
    y = t(4, 6)
    s = sched(lm.softmax(y, axis=1))
    assert [k.ops for k in s.kernels] == [["max", "sub", "exp", "sum", "div"]]
    assert log_has(s, "rows", "row-resident")


# ----------------------------------------------------------------------------- matmul epilogue


def test_custom_op_is_one_cube_kernel_on_910():
    A, B = t(32, 48, dtype="float16"), t(48, 64, dtype="float16")
    scale = lm.tensor(np.float16(0.5))
    (k,) = sched(lm.mul(lm.relu(lm.matmul(A, B)), scale), spec="ascend910").kernels
    assert k.unit == "cube" and k.ops == ["matmul", "relu", "mul"]
    assert len(k.inputs) == 3  # A, B, the scale


def test_custom_op_plan_differs_on_910b(restore_device):
    A, B = t(32, 48, dtype="float16"), t(48, 64, dtype="float16")
    scale = lm.tensor(np.float16(0.5))
    lm.init_device(0, spec="ascend910b")
    s = sched(lm.mul(lm.relu(lm.matmul(A, B)), scale))
    assert s.spec.name == "ascend910b"
    assert [(k.unit, k.ops) for k in s.kernels] == [
        ("cube", ["matmul", "relu"]),  # relu stays: FixPipe applies it on the way L0C -> GM
        ("vector", ["mul"]),  # mul needs UB: a Vector kernel meeting the Cube one in GM
    ]
    assert log_has(s, "refuse", "FixPipe"), log_text(s)
    assert log_has(s, "refuse", "no UB")
    lm.init_device(0, spec="ascend910")
    out = lm.mul(lm.relu(lm.matmul(A, B)), scale)  # (not inside the assert: pytest's assert
    assert len(sched(out).kernels) == 1  # rewriting would keep the intermediates alive)


EPILOGUES = {
    "bias": (lambda m, v: m + v, ["matmul", "add"]),
    "clip": (lambda m, v: lm.clip(m, -1.0, 1.0), ["matmul", "maximum", "minimum"]),
    "sigmoid": (lambda m, v: lm.sigmoid(m), ["matmul", "sigmoid"]),
    "cast": (lambda m, v: m.astype("float32"), ["matmul", "cast"]),
    "relu_cast": (lambda m, v: lm.relu(m).astype("float32"), ["matmul", "relu", "cast"]),
}


@pytest.mark.parametrize("name", list(EPILOGUES))
def test_matmul_epilogues_fuse_on_910(name):
    A, B, v = t(16, 24, dtype="float16"), t(24, 40, dtype="float16"), t(40, dtype="float16")
    fn, ops = EPILOGUES[name]
    (k,) = sched(fn(A @ B, v), spec="ascend910").kernels
    assert k.unit == "cube" and k.ops == ops


@pytest.mark.parametrize("name", ["bias", "clip"])
def test_matmul_vector_epilogues_leave_the_cube_kernel_on_910b(name):
    """Cheap epilogues only: one with an expensive op (sigmoid) is a MIX kernel on the 910B
    (rules.MATMUL_MIX_EPILOGUE, tests/fusion/test_epilogues.py)."""
    A, B, v = t(16, 24, dtype="float16"), t(24, 40, dtype="float16"), t(40, dtype="float16")
    fn, ops = EPILOGUES[name]
    s = sched(fn(A @ B, v), spec="ascend910b")
    assert [k.unit for k in s.kernels] == ["cube", "vector"]
    assert s.kernels[0].ops == ["matmul"] and s.kernels[1].ops == ops[1:]
    assert log_has(s, "refuse", "ascend910b"), log_text(s)


@pytest.mark.parametrize("op", sorted(rules.FIXPIPE_OPS))
def test_fixpipe_ops_stay_in_the_cube_kernel_on_910b(op):
    A, B = t(16, 24, dtype="float16"), t(24, 40, dtype="float16")
    fix = lm.relu(A @ B) if op == "relu" else (A @ B).astype("float32")
    s = sched(fix * 2.0, spec="ascend910b")  # the mul forces a Vector kernel after it
    assert [(k.unit, k.ops) for k in s.kernels] == [("cube", ["matmul", op]), ("vector", ["mul"])]


def test_cast_alone_is_one_cube_kernel_on_910b():
    A, B = t(16, 24, dtype="float16"), t(24, 40, dtype="float16")
    (k,) = sched((A @ B).astype("float32"), spec="ascend910b").kernels
    assert k.unit == "cube" and k.ops == ["matmul", "cast"]


def test_relu_then_cast_is_one_cube_kernel_on_910b():
    A, B = t(16, 24, dtype="float16"), t(24, 40, dtype="float16")
    (k,) = sched(lm.relu(A @ B).astype("float32"), spec="ascend910b").kernels
    assert k.unit == "cube" and k.ops == ["matmul", "relu", "cast"]


def test_relu_then_cast_then_mul_on_910b():
    A, B = t(16, 24, dtype="float16"), t(24, 40, dtype="float16")
    s = sched(lm.relu(A @ B).astype("float32") * 2.0, spec="ascend910b")
    assert [(k.unit, k.ops) for k in s.kernels] == [
        ("cube", ["matmul", "relu", "cast"]),
        ("vector", ["mul"]),
    ]


def test_no_spurious_refusal_when_fixpipe_epilogue_fuses_on_910b():
    A, B = t(16, 24, dtype="float16"), t(24, 40, dtype="float16")
    s = sched(lm.relu(A @ B), spec="ascend910b")
    assert len(s.kernels) == 1
    assert not log_has(s, "refuse"), log_text(s)


def test_epilogue_reading_a_value_derived_from_the_matmul_is_refused_cycle():
    A, B = t(2, 8, 16, dtype="float16"), t(2, 16, 8, dtype="float16")
    m = A @ B
    out = lm.relu(m) + m.sum(axis=(0, 2), keepdims=True)  # not adjacent axes: no row kernel
    del m
    s = sched(out)
    assert [k.ops for k in s.kernels] == [["matmul"], ["sum"], ["relu", "add"]]
    assert log_has(s, "refuse", "cycle"), log_text(s)


def test_batched_matmul_with_epilogue_is_one_kernel():
    A, B = t(3, 8, 16, dtype="float16"), t(3, 16, 5, dtype="float16")
    (k,) = sched(lm.relu(A @ B) * 0.5).kernels
    assert k.unit == "cube" and k.ops == ["matmul", "relu", "mul"]


# ----------------------------------------------------------------------------- operand prologue


def test_relu_operand_prologue_is_one_mix_kernel():
    A, B = t(32, 48, dtype="float16"), t(48, 64, dtype="float16")
    (k,) = sched(lm.matmul(lm.relu(A), B)).kernels
    assert k.unit == "mix" and k.ops == ["relu", "matmul"]
    assert k.inputs == ["buffer[32, 48]:float16", "buffer[48, 64]:float16"]


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_operand_prologue_with_epilogue_on_both_presets(spec):
    A, B = t(8, 16, dtype="float16"), t(16, 8, dtype="float16")
    s = sched(lm.relu(lm.relu(A) @ B) * 2.0, spec=spec)
    if spec == "ascend910":
        assert [(k.unit, k.ops) for k in s.kernels] == [("mix", ["relu", "matmul", "relu", "mul"])]
    else:  # the AIC has no Vector unit: the prologue is its own Vector kernel; only the
        # FixPipe relu stays after the matmul
        assert [(k.unit, k.ops) for k in s.kernels] == [
            ("vector", ["relu"]),
            ("cube", ["matmul", "relu"]),
            ("vector", ["mul"]),
        ]


def test_cast_operand_prologue_is_one_kernel():
    A, B = t(32, 48, dtype="float32"), t(48, 64, dtype="float16")
    (k,) = sched(lm.matmul(A.astype("float16"), B)).kernels
    assert k.kind == "matmul" and k.unit == "mix" and k.ops == ["cast", "matmul"]
    assert k.inputs[0] == "buffer[32, 48]:float32"  # the cast: Vector instructions on UB (910)


def test_prologues_on_both_operands_and_a_transposed_operand():
    A, B = t(48, 32, dtype="float16"), t(48, 64, dtype="float16")
    (k,) = sched(lm.relu(A).T @ lm.abs(B)).kernels
    assert k.unit == "mix" and sorted(k.ops) == ["abs", "matmul", "relu"]


def test_plain_matmul_is_cube_with_transposed_view_operand():
    A, B = t(48, 32, dtype="float16"), t(48, 64, dtype="float16")
    (k,) = sched(A.T @ B).kernels
    assert k.unit == "cube" and k.ops == ["matmul"]


def test_heavy_operand_producer_reading_two_buffers_is_materialized():
    A, A2, B = t(32, 48, dtype="float16"), t(32, 48, dtype="float16"), t(48, 64, dtype="float16")
    s = sched((A + A2) @ B)
    assert [(k.unit, k.ops) for k in s.kernels] == [("vector", ["add"]), ("cube", ["matmul"])]
    assert log_has(s, "materialize", "reads 2 buffers"), log_text(s)


def _prologue_chain(A: lm.Tensor, n: int) -> lm.Tensor:
    for i in range(n):
        A = A + float(i + 1)
    return A


def test_operand_prologue_op_cap():
    A, B = t(8, 16, dtype="float16"), t(16, 8, dtype="float16")
    n = rules.OPERAND_PROLOGUE_MAX_OPS
    (k,) = sched(_prologue_chain(A, n) @ B).kernels
    assert k.unit == "mix" and len(k.ops) == n + 1
    s = sched(_prologue_chain(A, n + 1) @ B)
    assert [k.unit for k in s.kernels] == ["vector", "cube"]
    assert log_has(s, "materialize", f"has {n + 1} ops > {n}"), log_text(s)


# ----------------------------------------------------------------------------- multi-consumer


def _shared(n_ops: int, expensive: str | None = None):
    """x -> (n_ops cheap ops, or one expensive op) -> consumed by a sum and a max kernel."""
    x, y = t(10, 10), t(10, 10)
    v = x
    if expensive is not None:
        fn = getattr(lm, expensive)  # every expensive op of the registry has its binding
        if expensive in BINARY_OPS:
            v = fn(v, y)
        else:
            v = fn(v)
    for i in range(n_ops):
        v = v * 1.5 if i % 2 else v + 1.0
    return v.sum(axis=0), v.max(axis=1)


def test_cheap_shared_node_is_recomputed():
    s = sched(*_shared(1))
    assert [k.ops for k in s.kernels] == [["add", "sum"], ["add", "max"]]
    assert log_has(s, "recompute", "recomputed"), log_text(s)


def test_recompute_limit_is_rules_recompute_max_ops():
    n = rules.RECOMPUTE_MAX_OPS
    s = sched(*_shared(n))
    assert len(s.kernels) == 2 and all(len(k.ops) == n + 1 for k in s.kernels)
    assert not log_has(s, "materialize")
    s = sched(*_shared(n + 1))
    assert len(s.kernels) == 3  # computed once, then a sum and a max reading it
    assert s.kernels[0].ops == ["add", "mul"] * ((n + 1) // 2) + ["add"] * ((n + 1) % 2)
    assert log_has(s, "materialize", f"{n + 1} ops"), log_text(s)


@pytest.mark.parametrize("op", sorted(rules.EXPENSIVE_OPS))
def test_expensive_shared_node_is_materialized_once(op):
    s = sched(*_shared(0, expensive=op))
    assert len(s.kernels) == 3, [k.ops for k in s.kernels]
    assert s.kernels[0].ops == [op] and s.kernels[0].kind == "elementwise"
    assert [k.ops for k in s.kernels[1:]] == [["sum"], ["max"]]
    assert log_has(s, "materialize", "expensive"), log_text(s)


def test_shared_node_consumed_by_two_elementwise_outputs_is_one_kernel():
    x = t(50)
    e = lm.exp(x)
    out1, out2 = e + 1.0, e * 2.0
    del e
    (k,) = sched(out1, out2).kernels  # same iteration space: one multi-output kernel
    assert k.inputs == ["buffer[50]:float32"]
    assert k.ops.count("exp") == 1


def test_merged_shared_node_is_not_written():
    x = t(50)
    e = lm.exp(x)
    out1, out2 = e + 1.0, e * 2.0
    del e
    (k,) = sched(out1, out2).kernels
    assert len(k.outputs) == 2, k.outputs


def test_live_intermediate_is_an_output():
    x = t(20)
    y = x * 2.0  # kept alive: a later y.numpy() must not recompute it
    s = sched(y + 1.0)
    (k,) = s.kernels
    assert len(k.outputs) == 2
    del y


# ----------------------------------------------------------------------------- caps


def _chain_sum(n: int) -> lm.Tensor:
    xs = [t(8) for _ in range(n)]
    acc = xs[0]
    for x in xs[1:]:
        acc = acc + x
    return acc


def test_input_cap_splits_with_reason():
    n = rules.MAX_KERNEL_INPUTS + 4
    s = sched(_chain_sum(n))
    assert len(s.kernels) >= 2
    assert all(len(k.inputs) <= rules.MAX_KERNEL_INPUTS for k in s.kernels)
    assert log_has(s, "split", "GM inputs"), log_text(s)
    assert sum(len(k.ops) for k in s.kernels) == n - 1  # every add computed exactly once


def test_exactly_max_inputs_is_one_kernel():
    (k,) = sched(_chain_sum(rules.MAX_KERNEL_INPUTS)).kernels
    assert len(k.inputs) == rules.MAX_KERNEL_INPUTS


def test_input_cap_split_writes_no_unneeded_buffers():
    s = sched(_chain_sum(rules.MAX_KERNEL_INPUTS + 4))
    assert len(s.kernels) == 2
    assert [len(k.outputs) for k in s.kernels] == [1, 1]


def test_input_cap_with_many_inputs_converges():
    s = sched(_chain_sum(80))
    assert all(len(k.inputs) <= rules.MAX_KERNEL_INPUTS for k in s.kernels)


def _long_chain(n_pairs: int) -> lm.Tensor:
    y = t(8)
    for i in range(n_pairs):
        y = y * 1.01 + float(i)
    return y


def test_op_cap_splits_with_reason():
    s = sched(_long_chain(rules.MAX_KERNEL_OPS // 2 + 20))
    assert len(s.kernels) >= 2
    assert all(len(k.ops) <= rules.MAX_KERNEL_OPS for k in s.kernels)
    assert sum(len(k.ops) for k in s.kernels) == 2 * (rules.MAX_KERNEL_OPS // 2 + 20)
    assert log_has(s, "split", "ops (per-kernel caps"), log_text(s)
    assert all(k.unit == "vector" for k in s.kernels)


def test_fusion_log_has_no_stale_duplicates():
    s = sched(_long_chain(rules.MAX_KERNEL_OPS // 2 + 20))
    entries = [(e.what, e.nodes, e.reason) for e in s.fusion_log]
    assert len(entries) == len(set(entries)), log_text(s)


# ----------------------------------------------------------------------------- AI CPU


@pytest.mark.parametrize("dtype", ["float64", "complex64", "complex128"])
def test_types_the_ai_core_lacks_run_on_aicpu(dtype):
    x = lm.tensor(np.ones(5, dtype))
    (k,) = sched(x * 2 + 1).kernels
    assert k.unit == "aicpu" and k.ops == ["mul", "add"]


def test_float64_matmul_is_aicpu():
    A, B = t(4, 5, dtype="float64"), t(5, 3, dtype="float64")
    s = sched(lm.relu(A @ B))
    assert {k.unit for k in s.kernels} == {"aicpu"}
    assert [op for k in s.kernels for op in k.ops] == ["matmul", "relu"]


def test_aicpu_to_aicore_boundary_is_materialized_with_reason():
    d = lm.tensor(np.ones(5))
    s = sched((d * 2).astype("float32") + 1)
    assert [k.unit for k in s.kernels] == ["aicpu", "vector"]
    assert log_has(s, "materialize", rules.FUSE[("aicpu", "elementwise")][1]), log_text(s)


def test_aicore_to_aicpu_boundary_is_materialized_with_reason():
    x = t(5)
    s = sched((x * 2.0).astype("float64") + 1)
    assert [k.unit for k in s.kernels] == ["vector", "aicpu"]
    assert log_has(s, "materialize", rules.FUSE[("elementwise", "aicpu")][1]), log_text(s)


@pytest.mark.parametrize("kind", sorted(rules.AICPU_KINDS))
def test_aicpu_kinds(kind):
    x = t(4, 16)
    if kind == "pad":
        out = lm.pad(x, ((1, 1), (0, 2)))
    elif kind == "concat":
        out = lm.concat([x, t(4, 16)], axis=0)
    elif kind == "conv1d":
        # float16/float32 convolutions run on the Cube/Vector (tests/test_conv1d.py); a float64
        # one is still an AI CPU kernel
        out = lm.conv1d(lm.astype(t(1, 4, 16), lm.float64), t(4, 2, 3), groups=2, dilation=2)
    else:  # double precision (float32 inputs run on the Cube, tests/test_fft.py)
        out = lm.fft.fft(lm.astype(x, lm.float64))
    s = sched(out)
    assert any(k.unit == "aicpu" for k in s.kernels), [(k.unit, k.ops) for k in s.kernels]


# ----------------------------------------------------------------------------- views


def test_reshape_of_transposed_view_needs_a_copy_kernel():
    X = t(6, 4)
    s = sched(X.T.reshape(-1) + 1.0)
    assert [k.ops for k in s.kernels] == [["copy"], ["add"]]
    assert s.kernels[0].unit == "vector"
    assert log_has(s, "materialize", "needs a copy"), log_text(s)


def test_reshape_of_contiguous_and_of_sliced_rows_is_free():
    X = t(6, 4)
    s = sched(X.reshape(4, 6) * 2.0 + X[2:].reshape(-1)[:6].reshape(1, 6))
    assert len(s.kernels) == 1 and not s.fusion_log, log_text(s)


def test_flip_and_negative_strides_fuse():
    X = t(5, 7)
    (k,) = sched(lm.flip(X, 0)[:, ::-1] * X).kernels
    assert len(k.inputs) == 2 and k.ops == ["mul"]


# ----------------------------------------------------------------------------- the rules table


@lm.kernel
def _copy(k, x, y):
    """A user kernel (`lm.kernel`) for the rules: y = x through UB."""
    b = k.ub(x.dtype, 256, "b")
    with k.loop(lm.lowlevel.ceil_div(x.size, 256)) as i:
        n = k.let(lm.lowlevel.isa.imin(256, x.size - i * 256))
        k.copy_in(b, x[i * 256], n)
        k.copy_out(y[i * 256], b, n)


def _fuse_case(producer: str, consumer: str):
    """A graph whose one producer -> consumer edge is the FUSE entry (producer, consumer)."""
    f16 = "float16"
    cases = {
        ("custom", "elementwise"): lambda: _copy(t(9)) * 2.0,
        ("elementwise", "custom"): lambda: _copy(t(9) * 2.0),
        ("custom", "custom"): lambda: _copy(_copy(t(9))),
        ("custom", "reduce"): lambda: _copy(t(9)).sum(),
        ("custom", "matmul"): lambda: _copy(t(8, 16, dtype=f16)) @ t(16, 8, dtype=f16),
        ("elementwise", "elementwise"): lambda: lm.relu(t(9) * 2.0),
        ("view", "elementwise"): lambda: t(5, 3).T[::-1] + 1.0,
        ("elementwise", "reduce"): lambda: (t(9) * 2.0).sum(),
        ("reduce", "elementwise"): lambda: t(3, 9).sum(axis=1) * 2.0,
        ("matmul", "elementwise"): lambda: lm.relu(t(8, 16, dtype=f16) @ t(16, 8, dtype=f16)),
        ("elementwise", "matmul"): lambda: lm.relu(t(8, 16, dtype=f16)) @ t(16, 8, dtype=f16),
        ("reduce", "reduce"): lambda: t(8, 9).sum(axis=1).max(),
        ("matmul", "matmul"): lambda: (
            (t(8, 16, dtype=f16) @ t(16, 8, dtype=f16)) @ t(8, 4, dtype=f16)
        ),
        ("reduce", "matmul"): lambda: (
            t(8, 16, dtype=f16).sum(axis=0, keepdims=True) @ t(16, 8, dtype=f16)
        ),
        ("matmul", "reduce"): lambda: (t(8, 16, dtype=f16) @ t(16, 8, dtype=f16)).sum(),
        ("aicpu", "elementwise"): lambda: (lm.tensor(np.ones(5)) * 2).astype("float32") + 1,
        ("elementwise", "aicpu"): lambda: (t(5) * 2.0).astype("float64") + 1,
    }
    return cases[(producer, consumer)]()


def _rule_params():
    out = []
    for key in rules.FUSE:
        out.append(pytest.param(key, id=f"{key[0]}->{key[1]}"))
    return out


@pytest.mark.parametrize("key", _rule_params())
def test_every_fuse_rule(key):
    fuses, reason = rules.FUSE[key]
    s = sched(_fuse_case(*key))
    if fuses:
        assert len(s.kernels) == 1, [k.ops for k in s.kernels]
        assert not s.fusion_log, log_text(s)
    else:
        assert len(s.kernels) == 2, [k.ops for k in s.kernels]
        assert reason and log_has(s, None, reason), log_text(s)


@pytest.mark.parametrize("key", [k for k, (f, _) in rules.FUSE.items() if not f])
def test_every_refused_rule_splits(key):
    s = sched(_fuse_case(*key))
    assert len(s.kernels) == 2


def test_rules_tables_are_consistent():
    assert rules.FIXPIPE_OPS <= {"relu", "cast", "leaky_relu"}
    assert rules.AICPU_KINDS <= rules.MATERIALIZING_KINDS
    assert {"reduce", "matmul"} <= rules.MATERIALIZING_KINDS
    assert not (rules.EXPENSIVE_OPS & {"add", "sub", "mul", "relu", "maximum", "minimum"})
    assert 0 < rules.RECOMPUTE_MAX_OPS < rules.OPERAND_PROLOGUE_MAX_OPS < rules.MAX_KERNEL_OPS
    assert rules.MAX_KERNEL_INPUTS <= 64  # AscendC: at most 64 queue buffers per kernel
    for fuses, reason in rules.FUSE.values():
        assert fuses == (reason == ""), "every refusal carries a reason, no fusion carries one"


# ----------------------------------------------------------------------------- costs, names


def test_big_matmul_is_compute_bound_and_add_is_memory_bound():
    n = 2048
    A = lm.tensor(np.ones((n, n), np.float16))
    (k,) = sched(A @ A).kernels
    assert k.flops == 2 * n**3
    assert k.bytes == 3 * n * n * 2
    assert k.bound == "compute" and k.intensity > 100
    (k,) = sched(A + A).kernels
    assert k.bound == "memory"
    assert k.flops == n * n
    assert k.bytes == 2 * n * n * 2  # A read once (one view), the result written once


def test_small_matmul_below_the_ridge_is_memory_bound():
    (k,) = sched(t(8, 8, dtype="float16") @ t(8, 8, dtype="float16")).kernels
    assert k.bound == "memory"


def test_broadcast_input_bytes_are_counted_once():
    x, row = t(100, 50), t(50)
    (k,) = sched(x + row).kernels
    assert k.bytes == (100 * 50 + 50 + 100 * 50) * 4


def test_reduce_flops_and_bytes():
    (k,) = sched((t(64, 32) * 2.0).sum(axis=1)).kernels
    assert k.flops == 64 * 32 * 2  # the prologue mul and the accumulate per element
    assert k.bytes == (64 * 32 + 64) * 4


def test_kernel_names_are_unique_and_say_what_runs():
    x = t(6, 6)
    s = sched(lm.exp(x).sum(axis=0), lm.exp(x).max(axis=1), (x * 2.0).sum())
    names = [k.name for k in s.kernels]
    assert len(set(names)) == len(names)
    for i, k in enumerate(s.kernels):
        assert k.name.startswith(f"k{i}_")
        assert k.ops[0] in k.name


def test_schedule_compiles_and_executes_nothing(monkeypatch):
    from lazymath.graph import reference

    x = t(33)
    out = lm.sin(x) + 1.0
    before = dict(reference.CALLS)
    import lazymath.engine as engine

    stats = engine.PROGRAMS.stats()
    s = sched(out)
    assert len(s.kernels) == 1 and s.kernels[0].compiled is None
    assert out._node.realized is None  # still lazy
    assert reference.CALLS == before and engine.PROGRAMS.stats() == stats
