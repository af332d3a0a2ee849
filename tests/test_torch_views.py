"""Views across the torch backend's boundary (lazymath/torch/_views.py).

Protects: a forward graph output that is a view (a Linear's transposed weight saved for the
backward, a reshaped activation) is returned as a torch view of its base instead of a copy
kernel, and a view of a transposed base that torch could not make is left to lazymath; a
non-contiguous input that is a permutation of a contiguous layout enters lazymath through its
contiguous base (no copy) while any other layout is still copied; results and gradients stay
eager's on both presets, through the llvm bound replay and the interp backend's lm.jit call.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch._dynamo
from torch import nn

import lazymath as lm
import lazymath.torch as lt
from lazymath.torch import _views

F = nn.functional


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch.manual_seed(7)
    yield
    torch._dynamo.reset()


@pytest.fixture(params=["llvm", "interp"])
def compiled_backend(request, monkeypatch) -> str:
    monkeypatch.setenv("LAZYMATH_BACKEND", request.param)
    return request.param


class Block(nn.Module):
    """Pre-norm causal attention + MLP at odd sizes: its training forward saves transposed
    weights, reshaped activations and the attention output's alias."""

    def __init__(self, d=20, heads=4):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc = nn.Linear(d, 3 * d)
        self.out = nn.Linear(3 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(x), approximate="tanh"))


def _graph(compiled, kind):
    (g,) = [g for g in compiled._lazymath_session.graphs if g.kind == kind]
    return g


@pytest.mark.parametrize("preset", ["ascend910", "ascend910b"])
def test_saved_views_are_torch_views_and_gradients_equal_eager(compiled_backend, preset):
    lm.init_device(spec=preset)
    try:
        model = Block()
        twin = copy.deepcopy(model)
        compiled = lt.compile(model)
        for _ in range(4):  # the first call, its trace, then replays
            x = torch.randn(3, 7, 20)
            for m in (model, twin):
                for p in m.parameters():
                    p.grad = None
            y = compiled(x)
            y.square().sum().backward()
            want = twin(x)
            want.square().sum().backward()
            torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)
            for (name, p), q in zip(model.named_parameters(), twin.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    finally:
        lm.init_device(spec="ascend910")
    fwd = _graph(compiled, "forward")
    bases = {b.op for b, _chain in fwd._out_views.values()}
    # the four transposed weights are views of the parameters, the reshaped activations
    # views of lazymath buffers
    assert "placeholder" in bases and "call_function" in bases
    n_weights = sum(1 for b, ch in fwd._out_views.values()
                    if b.op == "placeholder" and ch[-1].target == torch.ops.aten.permute.default)  # fmt: skip
    assert n_weights == 4
    assert fwd.replays >= 2 and _graph(compiled, "backward").replays >= 2


def test_training_forward_runs_no_weight_copy():
    """The forward of a Linear in training: its only kernel is the matmul (before, the
    transposed weight saved for the backward was a second, copy, kernel)."""
    lin = nn.Linear(24, 40)
    compiled = lt.compile(lin)
    x = torch.randn(5, 24)
    compiled(x).sum().backward()
    text = lt.explain(compiled).split("backward graph")[0]
    kernels = re.findall(r"^(k\d+_\w+)", text, flags=re.M)
    assert kernels and all("copy" not in k for k in kernels) and any("matmul" in k for k in kernels)
    torch.testing.assert_close(lin.weight.grad, torch.ones(5, 40).t() @ x)


def _base_of(n):
    while n.op == "call_function" and n.target in _views.VIEW_OPS:
        n = n.args[0]
    return n


def test_view_of_a_transposed_base_is_left_to_lazymath():
    """The training forward's attention output is laid out (B, T, H, D) by torch and seen as
    (B, H, T, D): the saved `view(permute(o))` is a valid view only of that layout, not of
    lazymath's contiguous (B, H, T, D) buffer, so that output stays a lazymath value (a copy,
    as before) while the outputs beside it are views; the gradients are eager's."""
    model = Block()
    twin = copy.deepcopy(model)
    compiled = lt.compile(model)
    x = torch.randn(2, 5, 20)
    compiled(x).sum().backward()
    twin(x).sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    fwd = _graph(compiled, "forward")
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    outs = fwd.nodes[-1].args[0]
    of_attention = [pos for pos, v in enumerate(outs)
                    if isinstance(v, torch.fx.Node) and v.target == torch.ops.aten.view.default
                    and _base_of(v).args[0].target == sdpa]  # fmt: skip
    assert of_attention and not set(of_attention) & set(fwd._out_views)
    assert len(fwd._out_views) >= 4


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(6, 4).t(),  # a transposed matrix
        lambda: torch.randn(2, 3, 5).permute(2, 0, 1),
        lambda: torch.randn(1, 6, 4).transpose(1, 2),  # size-1 dims: any stride
    ],
)
def test_dense_permutations_cross_without_a_copy(make):
    t = make()
    order = _views.dense_order(t)
    assert order is not None and t.permute(order).is_contiguous()
    assert t.permute(order).permute(_views.inverse(order)).stride() == t.stride()
    x = lt._to_lm(t)
    assert x.numpy().tolist() == t.tolist()


@pytest.mark.parametrize(
    "t",
    [
        torch.randn(4, 6),  # contiguous: nothing to do
        torch.randn(4, 6)[:, ::2],  # gaps
        torch.randn(4, 1).expand(4, 6),  # a broadcast
        torch.randn(4, 6)[:, 1:5],  # a slice
        torch.randn(0, 3).t(),
    ],
)
def test_other_layouts_have_no_dense_order(t):
    if t.numel():
        assert _views.dense_order(t) is None
    assert lt._to_lm(t).numpy().tolist() == t.tolist()


def test_backward_takes_permuted_inputs_in_place(compiled_backend):
    """A function of a transposed input (the backward graph's saved weights): equal to eager
    on every call, replayed."""

    def f(w, x):
        return x @ w.t() + 1.0

    w, x = torch.randn(9, 5), torch.randn(4, 5)
    wt = w.t()  # (5, 9), strides (1, 5): the compiled function receives a permuted layout

    def g(wt, x):
        return f(wt.t(), x)

    compiled = lt.compile(g)
    for _ in range(3):
        torch.testing.assert_close(compiled(wt, x), g(wt, x))
    (cg,) = compiled._lazymath_session.graphs
    assert cg.replays >= 1
    (rec,) = [r for r in cg._stored.values() if r is not None]
    assert rec.perms == {0: (1, 0)}
