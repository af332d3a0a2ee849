"""The replay path of torch.compile(backend="lazymath"): a graph without breaks is traced once
per replay signature into a stored lazymath program, then launched on each call's buffers.

Protects: replayed calls equal eager (inference and training, float32/float16/bfloat16, both
device presets, the llvm backend's bound launch and the interp backend's lm.jit call), a new
input shape, dtype or layout retraces, in-place updates of an input or a parameter between
calls are seen (also through a kept parameter view), outputs are fresh per call (never
aliased across calls), and what must not be replayed is not: graphs with graph breaks, and a
graph whose trace computed a value from the data on the host (lm.nn.embedding's gather: the
captured constant would be served stale).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch import nn

import lazymath as lm
import lazymath.torch as lt
from lazymath import engine

F = nn.functional


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch.manual_seed(32)
    yield
    torch._dynamo.reset()


@pytest.fixture(params=["llvm", "interp"])
def compiled_backend(request, monkeypatch) -> str:
    """llvm replays through the bound launch (native kernels), interp through lm.jit's call."""
    monkeypatch.setenv("LAZYMATH_BACKEND", request.param)
    return request.param


class MLP(nn.Module):
    def __init__(self, d_in=13, hidden=31, d_out=7):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.GELU(), nn.Linear(hidden, d_out))  # fmt: skip

    def forward(self, x):
        return self.net(x)


def _graphs(compiled):
    return compiled._lazymath_session.graphs


def _replays(compiled) -> int:
    return sum(g.replays for g in _graphs(compiled))


@pytest.mark.parametrize("batch", [1, 5, 0])
def test_replay_equals_eager_inference(compiled_backend, preset, batch):
    model = MLP().eval()
    compiled = lt.compile(model)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(batch, 13)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    (g,) = _graphs(compiled)
    if batch:
        assert g.replays == 2 and g.traces == 1  # call 1 lowers, call 2 traces, 3-4 launch
    assert "replay" in lm.explain(compiled)


def test_long_programs_replay(compiled_backend, monkeypatch):
    """A program at or above engine.LONG_WORK (the GPT block's forward) replays through
    lm.jit's general call and the realize thread: its second call raised AttributeError
    ('_Realized' object has no attribute 'addr') before, so the benchmark's GPT block died."""
    monkeypatch.setattr(engine, "LONG_WORK", 0)  # every program counts as long
    model = MLP().eval()
    compiled = lt.compile(model)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(7, 13)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    (g,) = _graphs(compiled)
    assert g.replays == 2


def test_in_place_input_and_parameter_updates_are_seen(compiled_backend):
    model = MLP().eval()
    compiled = lt.compile(model)
    x = torch.randn(3, 13)
    with torch.no_grad():
        for step in range(6):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
            if step % 3 == 0:
                x.mul_(-1.5)  # the input, in place
            elif step % 3 == 1:
                model.net[0].weight.add_(0.25)  # a weight read through a kept t(w)
            else:
                model.net[2].bias.copy_(torch.randn(31))
    assert _replays(compiled) >= 4


def test_outputs_are_fresh_per_call(compiled_backend):
    compiled = lt.compile(lambda x, y: (torch.relu(x @ y) * 2, x + 1))
    x, y = torch.randn(4, 6), torch.randn(6, 3)
    outs = [compiled(x + i, y) for i in range(4)]
    for i, (a, b) in enumerate(outs):  # earlier results are not overwritten by later calls
        torch.testing.assert_close(a, torch.relu((x + i) @ y) * 2)
        torch.testing.assert_close(b, x + i + 1)
    ptrs = {t.data_ptr() for pair in outs for t in pair}
    assert len(ptrs) == 8
    assert _replays(compiled) >= 2
    outs[-1][0].zero_()  # writing into a result changes nothing the next call computes
    torch.testing.assert_close(compiled(x, y)[0], torch.relu(x @ y) * 2)


def test_new_shape_dtype_or_layout_retraces(compiled_backend):
    def fn(x, y):
        return torch.tanh(x * y + 1).sum(dim=-1)

    compiled = lt.compile(fn, dynamic=True)
    base = torch.randn(7, 11)
    cases = [base, base[:5], base.t().contiguous().t(), base[::2], base.double(), base.half()]
    for x in cases * 2:
        y = torch.randn(x.shape[-1], dtype=x.dtype)
        tol = dict(rtol=1e-2, atol=1e-2) if x.dtype == torch.float16 else {}
        torch.testing.assert_close(compiled(x, y), fn(x, y), **tol)
    assert _replays(compiled) > 0
    assert sum(g.traces for g in _graphs(compiled)) >= 2  # more than one signature traced


def test_training_steps_replay_forward_and_backward(compiled_backend):
    model = MLP()
    twin = copy.deepcopy(model)
    compiled = lt.compile(model)
    opt_a = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt_b = torch.optim.Adam(twin.parameters(), lr=1e-2)
    x, target = torch.randn(9, 13), torch.randn(9, 7)
    for step in range(6):
        losses = []
        for m, opt in ((compiled, opt_a), (twin, opt_b)):
            opt.zero_grad()
            loss = F.mse_loss(m(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-6), step
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    kinds = {g.kind: g.replays for g in _graphs(compiled)}
    assert kinds["forward"] >= 4 and kinds["backward"] >= 4


class CausalBlock(nn.Module):
    """Pre-norm causal self-attention + MLP (odd sizes): the training forward's causal mask
    is made of aranges the trace computes on the host from the shape alone."""

    def __init__(self, d=20, heads=4):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc = nn.Linear(d, 3 * d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc(x)[..., :C].tanh()


@pytest.mark.parametrize("preset", ["ascend910", "ascend910b"])
def test_causal_training_graphs_replay(compiled_backend, preset):
    """The training forward and backward of a causal block replay (the aranges of the causal
    mask are constants of the signature, not data the trace read): gradients equal eager on
    every call, including after an optimizer step changed the weights in place."""
    lm.init_device(0, spec=preset)
    try:
        model = CausalBlock()
        twin = copy.deepcopy(model)
        compiled = lt.compile(model)
        opt_a = torch.optim.SGD(model.parameters(), lr=0.05)
        opt_b = torch.optim.SGD(twin.parameters(), lr=0.05)
        for step in range(4):
            x = torch.randn(3, 7, 20)  # T = 7: a prime, not a tile multiple
            for m, opt in ((compiled, opt_a), (twin, opt_b)):
                opt.zero_grad()
                (m(x) ** 2).mean().backward()
            for p, q in zip(model.parameters(), twin.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=f"step {step}")
            opt_a.step()
            opt_b.step()
        kinds = {g.kind: g.replays for g in _graphs(compiled)}
        assert kinds == {"forward": 2, "backward": 2}  # call 1 lowers, 2 traces, 3-4 replay
    finally:
        lm.init_device(0, spec="ascend910")


def test_gathers_with_new_indices_are_not_served_stale(compiled_backend):
    """torch.gather and x[idx] lower to host gathers (lm.take*): lm.jit's realize watch keeps
    no program for them, so new indices (same shapes) give new rows on every call."""

    def fn(x, idx, rows):
        return torch.gather(x, 1, idx) * 2 + x[rows].sum(dim=1, keepdim=True)

    compiled = lt.compile(fn)
    x = torch.randn(5, 11)
    for _ in range(4):
        idx = torch.randint(0, 11, (5, 3))
        rows = torch.randint(0, 5, (5,))
        torch.testing.assert_close(compiled(x, idx, rows), fn(x, idx, rows))
    assert _replays(compiled) == 0


def test_bfloat16_replay_on_ascend910b(compiled_backend):
    lm.init_device(0, spec="ascend910b")
    try:
        model = MLP().to(torch.bfloat16).eval()
        compiled = lt.compile(model)
        with torch.no_grad():
            for _ in range(3):
                x = torch.randn(2, 13, dtype=torch.bfloat16)
                got = compiled(x)
                assert got.dtype == torch.bfloat16
                torch.testing.assert_close(got, model(x), rtol=2e-2, atol=2e-2)
        assert _replays(compiled) >= 1
    finally:
        lm.init_device(0, spec="ascend910")


def test_graph_with_a_break_is_not_replayed_and_stays_correct():
    def fn(x, w):
        return torch.cummax(torch.relu(x @ w), dim=1).values * 2  # cummax: torch eager

    compiled = lt.compile(fn)
    w = torch.randn(5, 6)
    for _ in range(3):
        x = torch.randn(4, 5)
        torch.testing.assert_close(compiled(x, w), fn(x, w), rtol=1e-5, atol=1e-6)
    (g,) = _graphs(compiled)
    assert g.breaks and g.replays == 0


def test_host_computed_values_are_not_captured():
    """lm.nn.embedding gathers on the host at the trace: the rows it read would be a stale
    constant of a stored program, so that signature keeps the per-call path."""
    emb = nn.Embedding(17, 4)
    compiled = lt.compile(emb)
    tokens = torch.randint(0, 17, (3, 5))
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(compiled(tokens), emb(tokens))
            emb.weight.add_(1.0)
            tokens = torch.randint(0, 17, (3, 5))
    assert _replays(compiled) == 0


def test_replay_off_with_debug_says_why(capfd, monkeypatch):
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    emb = nn.Embedding(17, 4)
    compiled = lt.compile(emb)
    tokens = torch.randint(0, 17, (3, 5))
    with torch.no_grad():
        compiled(tokens)
        compiled(tokens)
    err = capfd.readouterr().err
    assert "not replayed" in err and "host" in err


def test_linear_backward_compiles_in_lazymath():
    """A Linear -> tanh GELU -> Linear backward: the GELU-backward epilogue value feeds both the
    bias gradient (a column sum fused into its matmul) and the next matmul through a reshape;
    the merge dropped it as "read only inside", the second matmul read an unwritten buffer
    (KeyError) and the whole backward ran in torch eager since 59cbea8, silently correct."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(approximate="tanh"), nn.Linear(64, 16))
    ref = copy.deepcopy(model)
    x = torch.randn(1, 5, 16, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    compiled = lt.compile(model)
    compiled(x).sum().backward()
    ref(xr).sum().backward()
    assert [g.eager for g in _graphs(compiled)] == [None, None]
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_short_multi_stream_backward_takes_the_bound_launch(monkeypatch):
    """The MLP's backward graph is a program on two streams (independent gradient matmuls):
    short, so it is bound in order on the caller's thread (BoundReplay.make(in_order=True)),
    and the gradients stay eager's on every replayed step."""
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    model = MLP()
    twin = copy.deepcopy(model)
    compiled = lt.compile(model)
    x = torch.randn(3, 13)
    for _ in range(4):
        for m in (model, twin):
            for p in m.parameters():
                p.grad = None
            m(x).square().sum().backward() if m is twin else compiled(x).square().sum().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    (bwd,) = [g for g in _graphs(compiled) if g.kind == "backward"]
    (rec,) = [r for r in bwd._stored.values() if r is not None]
    entry = next(iter(rec.jitted._entries.values()))
    assert not entry.prog.inline  # several streams: lm.jit's own bound launch refuses it
    assert entry.bound is None and rec.bound is not None
    assert bwd.replays >= 2
