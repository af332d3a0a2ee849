"""AI CPU kernels carry a kernel IR like the others (`kernel_ir.AicpuKernel`): a frozen
straight-line program of whole-array steps, built by fusion, printed by `as_text()` and run by
the backend's `AicpuRunner`, with no graph node behind it."""

import dataclasses

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend.npu.host_kernels import AicpuRunner
from lazymath.backend.npu.kernel_ir import AicpuKernel, AicpuStep, ArgView, kernel_args
from lazymath.graph.node import Node


def _aicpu(t):
    ks = [k for k in lm.schedule(t).kernels if k.unit == "aicpu"]
    assert ks, lm.schedule(t)
    return ks


def _no_nodes(x) -> bool:
    if isinstance(x, Node):
        return False
    if dataclasses.is_dataclass(x):
        return all(_no_nodes(getattr(x, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, (tuple, list)):
        return all(map(_no_nodes, x))
    return True


def _check_ir(ir: AicpuKernel) -> None:
    assert isinstance(ir, AicpuKernel) and ir.kind == "aicpu"
    assert _no_nodes(ir)
    hash(ir)  # frozen, hashable like the other IRs
    n_in = 0
    for i, st in enumerate(ir.steps):
        assert isinstance(st, AicpuStep)
        assert all(0 <= j < i for j in st.srcs)
        if st.op == "load":
            assert isinstance(st.arg, int) and st.arg < len(ir.inputs)
            assert st.shape == ir.inputs[st.arg].shape and st.dtype == ir.inputs[st.arg].dtype
            n_in += 1
    assert n_in == len(ir.inputs)  # every input is loaded once
    for r, v in zip(ir.results, ir.outputs, strict=True):
        assert ir.steps[r].shape == v.shape and v.contiguous
    assert kernel_args(ir) == ir.inputs + ir.outputs


def test_float64_matmul_with_epilogue_is_one_program():
    a = np.arange(12.0).reshape(3, 4)
    b = np.linspace(-1, 1, 8).reshape(4, 2)
    y = (lm.tensor(a) @ lm.tensor(b)) * 2.0 + 1.0
    (sk,) = _aicpu(y)
    _check_ir(sk.ir)
    assert [s.op for s in sk.ir.steps if s.op not in ("load", "const", "expand")] == [
        "matmul",
        "mul",
        "add",
    ]
    text = sk.as_text()
    # a, b and the two runtime scalars (LAZYMATH_SCALAR_ARGS, the default: 0-d inputs)
    assert "aicpu kernel: 4 input(s)" in text and "matmul %0 %1 -> float64[3, 2]" in text, text
    np.testing.assert_allclose(y.numpy(), (a @ b) * 2.0 + 1.0)


def test_views_are_steps_over_the_input():
    base = np.arange(30.0).reshape(5, 6)
    w = np.arange(10.0).reshape(5, 2)
    y = lm.tensor(base).T[::-1] @ lm.tensor(w)  # transposed, flipped: a float64 matmul
    (sk,) = _aicpu(y)
    _check_ir(sk.ir)
    ops = [s.op for s in sk.ir.steps]
    assert "permute" in ops and "slice" in ops and "matmul" in ops, sk.ir.as_text()
    assert sk.ir.inputs[0].shape == (5, 6) and sk.ir.inputs[0].contiguous
    np.testing.assert_array_equal(y.numpy(), base.T[::-1] @ w)


@pytest.mark.parametrize("case", ["pad_concat", "fft", "conv1d", "empty"])
def test_programs_match_numpy(case):
    rng = np.random.default_rng(0)
    if case == "pad_concat":
        x = rng.standard_normal((3, 4))
        tx = lm.tensor(x)
        t = lm.concatenate([lm.pad(tx, ((1, 0), (0, 2))), lm.pad(tx[:2], ((0, 0), (1, 1)))], 0)
        want = np.concatenate([np.pad(x, ((1, 0), (0, 2))), np.pad(x[:2], ((0, 0), (1, 1)))], 0)
        t, want = t[1:5:2], want[1:5:2]
    elif case == "fft":
        x = rng.standard_normal((3, 7)) + 1j * rng.standard_normal((3, 7))
        t = lm.fft.fft(lm.tensor(x)) * 0.5
        want = np.fft.fft(x) * 0.5
    elif case == "conv1d":
        x = rng.standard_normal((2, 3, 11))
        w = rng.standard_normal((4, 3, 3))
        t = lm.conv1d(lm.tensor(x), lm.tensor(w), padding=1)
        want = sum(
            np.einsum("oc,ncl->nol", w[:, :, j], np.pad(x, ((0, 0), (0, 0), (1, 1)))[:, :, j:j + 11])
            for j in range(3)
        )  # fmt: skip
    else:
        x = np.zeros((0, 3))
        t = lm.tensor(x) @ lm.tensor(np.ones((3, 2)))
        want = np.zeros((0, 2))
    for sk in _aicpu(t):
        _check_ir(sk.ir)
        assert sk.ir.as_text().count("\n") >= len(sk.ir.steps)
    got = t.numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_runner_executes_the_ir_alone():
    """The IR is all the runner needs: hand-written, no graph anywhere."""
    f64 = "float64"
    ir = AicpuKernel(
        inputs=(ArgView(f64, (2, 3), (3, 1)),),
        steps=(
            AicpuStep("load", f64, (2, 3), (), 0),
            AicpuStep("permute", f64, (3, 2), (0,), (1, 0)),
            AicpuStep("const", f64, (), (), 3.0),
            AicpuStep("expand", f64, (3, 2), (2,)),
            AicpuStep("mul", f64, (3, 2), (1, 3)),
            AicpuStep("reduce", f64, (2,), (4,), ("sum", (0,))),
        ),
        results=(4, 5),
        outputs=(ArgView(f64, (3, 2), (2, 1)), ArgView(f64, (2,), (1,))),
    )
    x = np.arange(6.0).reshape(2, 3)
    out0, out1 = np.empty((3, 2)), np.empty(2)
    k = AicpuRunner("k", ir)
    k(x, out0, out1)
    np.testing.assert_array_equal(out0, x.T * 3)
    np.testing.assert_array_equal(out1, (x.T * 3).sum(0))
    assert k.isa_text == ir.as_text()
