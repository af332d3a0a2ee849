"""torch.compile(backend="lazymath") against torch eager on a model zoo written in plain
PyTorch (issue 32): MLP, Conv1d stack with residuals, nn.MultiheadAttention, a pre-norm
GPT-style decoder block with causal attention (d=768, 12 heads), an embedding + mean-pool text
classifier; fp32 at rtol 1e-4, fp16 at 1e-2; gradients of every parameter and the input equal
eager's; a 20-step Adam loop whose losses match eager's step by step.

Protects: the ATen lowerings (dtype fix-ups against torch's promotion, views, layer_norm's
saved statistics, attention forward/backward from the logsumexp), graph breaks (an op with no
lowering runs in torch eager with the segments around it in lazymath, reported by explain and
at LAZYMATH_DEBUG=1), guards (a shape or dtype change recompiles), dynamic=True, the
registered backend name and the entry point. torch is a test extra: no skip when it is absent.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import tomllib
import torch
import torch._dynamo
from torch import nn

import lazymath as lm
import lazymath.torch as lt

F = nn.functional


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch.manual_seed(32)
    yield
    torch._dynamo.reset()


TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float16: dict(rtol=1e-2, atol=1e-2)}


# ----------------------------------------------------------------------------- the zoo


class MLP(nn.Module):
    def __init__(self, d_in=33, hidden=64, d_out=7):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.SiLU(), nn.Linear(hidden, d_out))  # fmt: skip

    def forward(self, x):
        return self.net(x)


class ConvStack(nn.Module):
    """Conv1d blocks with residual connections (same padding keeps the length)."""

    def __init__(self, c=16, k=3, depth=3):
        super().__init__()
        self.inp = nn.Conv1d(4, c, 1)
        self.convs = nn.ModuleList(nn.Conv1d(c, c, k, padding=k // 2) for _ in range(depth))
        self.out = nn.Conv1d(c, 2, 1)

    def forward(self, x):
        h = self.inp(x)
        for conv in self.convs:
            h = h + F.gelu(conv(h))
        return self.out(h)


class MHA(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x):
        y, _ = self.attn(x, x, x, need_weights=False)
        return y


class GPTBlock(nn.Module):
    """Pre-norm decoder block: x + attn(ln1(x)) with a causal mask, then x + mlp(ln2(x))."""

    def __init__(self, d=768, heads=12):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TextClassifier(nn.Module):
    """Embedding, mean over the sequence, a hidden layer, log-probabilities."""

    def __init__(self, vocab=101, d=32, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.fc = nn.Linear(d, d)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):
        h = self.emb(tokens).mean(dim=1)
        return F.log_softmax(self.head(torch.tanh(self.fc(h))), dim=-1)


def _zoo():
    return {
        "mlp": (MLP, lambda: torch.randn(5, 33)),
        "conv1d": (ConvStack, lambda: torch.randn(3, 4, 17)),
        "mha": (MHA, lambda: torch.randn(2, 11, 64)),
        "gpt": (GPTBlock, lambda: torch.randn(2, 8, 768)),
        "classifier": (TextClassifier, lambda: torch.randint(0, 101, (4, 13))),
    }


ZOO = _zoo()


def _close(a, b, dtype=torch.float32):
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("name", list(ZOO))
def test_inference_fp32_equals_eager(name):
    cls, make = ZOO[name]
    model = cls().eval()
    x = make()
    compiled = lt.compile(model)
    with torch.no_grad():
        got, want = compiled(x), model(x)
    _close(got, want)
    session = compiled._lazymath_session
    assert session.graphs and all(g.calls == 1 for g in session.graphs)


@pytest.mark.parametrize("name", ["mlp", "conv1d", "mha", "gpt"])
def test_inference_fp16_equals_eager(name):
    cls, make = ZOO[name]
    model = cls().eval()
    x = make()
    ref = model(x).detach()  # float32 eager: the value float16 approximates
    m16 = copy.deepcopy(model).half()
    compiled = lt.compile(m16)
    with torch.no_grad():
        got = compiled(x.half())
        eager16 = m16(x.half())
    assert got.dtype == torch.float16
    _close(got, eager16, torch.float16)
    torch.testing.assert_close(got.float(), ref, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("name", list(ZOO))
def test_gradients_equal_eager(name):
    cls, make = ZOO[name]
    model = cls()
    twin = copy.deepcopy(model)
    x = make()
    floating = x.dtype.is_floating_point
    xa = x.clone().requires_grad_(floating)
    xb = x.clone().requires_grad_(floating)
    compiled = lt.compile(model)
    w = torch.randn_like(twin(xb)).detach()
    (compiled(xa) * w).sum().backward()
    (twin(xb) * w).sum().backward()
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        assert p.grad is not None, n
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
    if floating:
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)
    kinds = {g.kind for g in compiled._lazymath_session.graphs}
    assert kinds == {"forward", "backward"}


def test_adam_20_steps_losses_match_eager():
    model = TextClassifier()
    twin = copy.deepcopy(model)
    tokens = torch.randint(0, 101, (16, 9))
    labels = torch.randint(0, 5, (16,))
    compiled = lt.compile(model)
    opt_a = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt_b = torch.optim.Adam(twin.parameters(), lr=1e-2)
    losses_a, losses_b = [], []
    for m, opt, losses in ((compiled, opt_a, losses_a), (twin, opt_b, losses_b)):
        for _ in range(20):
            opt.zero_grad()
            loss = F.nll_loss(m(tokens), labels)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses_a[-1] < losses_a[0] * 0.5  # it learns
    torch.testing.assert_close(torch.tensor(losses_a), torch.tensor(losses_b), rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------- graph breaks


def _with_cummax(x, w):
    h = torch.relu(x @ w)  # lazymath segment 1
    c = torch.cummax(h, dim=1).values  # no lowering: torch eager
    return torch.tanh(c) * 2 + h  # lazymath segment 2


def test_graph_break_runs_in_eager_and_is_reported(capfd):
    x, w = torch.randn(6, 5), torch.randn(5, 7)
    compiled = lt.compile(_with_cummax)
    with lm.settings.override(LAZYMATH_DEBUG=1):
        got = compiled(x, w)
    torch.testing.assert_close(got, _with_cummax(x, w), rtol=1e-5, atol=1e-6)
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "graph break" in ln]
    assert len(lines) == 1 and "aten.cummax" in lines[0], err
    (g,) = compiled._lazymath_session.graphs
    assert g.segments == 2 and any("aten.cummax" in why for why in g.breaks.values())
    text = lm.explain(compiled)
    assert "graph break" in text and "aten.cummax" in text and "segment 2 of 2" in text
    assert "matmul" in text  # the lazymath segments' kernels are shown


@pytest.fixture
def ascend910b():
    """The ascend910b device (bfloat16 on the AI Core) for one test."""
    lm.init_device(0, spec="ascend910b")
    yield
    lm.init_device(0, spec="ascend910")


def _bf16_block(x, w, b):
    return F.layer_norm(torch.relu(x @ w) + b, (w.shape[1],))


def test_bfloat16_on_ascend910b(ascend910b):
    x, w = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    b = torch.randn(16, dtype=torch.bfloat16)
    compiled = lt.compile(_bf16_block)
    got = compiled(x, w, b)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, _bf16_block(x, w, b), rtol=1e-2, atol=2e-2)
    (g,) = compiled._lazymath_session.graphs
    assert not g.breaks and g.eager is None and g.segments == 1


def test_bfloat16_on_ascend910_runs_the_graph_in_eager(capfd):
    """The ascend910 preset refuses bfloat16 at realize: the graph runs in torch eager
    (reported once), the answer is torch's."""
    x, w = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    b = torch.randn(16, dtype=torch.bfloat16)
    compiled = lt.compile(_bf16_block)
    with lm.settings.override(LAZYMATH_DEBUG=1):
        got = compiled(x, w, b)
        got2 = compiled(x, w, b)
    torch.testing.assert_close(got, _bf16_block(x, w, b))
    torch.testing.assert_close(got2, got)
    (g,) = compiled._lazymath_session.graphs
    assert g.eager is not None and "bfloat16" in g.eager and g.calls == 2
    err = [ln for ln in capfd.readouterr().err.splitlines() if "runs in torch eager" in ln]
    assert len(err) == 1 and "bfloat16" in err[0]
    assert "whole graph runs in torch eager" in lm.explain(compiled)


# ----------------------------------------------------------------------------- guards, options


def test_shape_and_dtype_changes_recompile():
    def f(x, w):
        return torch.tanh(x @ w) + x.sum()

    compiled = lt.compile(f, dynamic=False)
    cases = [(5, torch.float32), (9, torch.float32), (5, torch.float64), (5, torch.float16),
             (5, torch.float32)]  # fmt: skip
    for batch, dtype in cases:
        x, w = torch.randn(batch, 6, dtype=dtype), torch.randn(6, 3, dtype=dtype)
        got = compiled(x, w)
        assert got.dtype == dtype
        torch.testing.assert_close(got, f(x, w), **TOL.get(dtype, TOL[torch.float32]))
    graphs = compiled._lazymath_session.graphs
    seen = [g._last_inputs[0][:2] for g in graphs]  # (shape, dtype) of x
    # one graph per signature; the last call (float32, batch 5 again) reused the first
    assert seen == [((5, 6), torch.float32), ((9, 6), torch.float32), ((5, 6), torch.float64),
                    ((5, 6), torch.float16)]  # fmt: skip
    assert [g.calls for g in graphs] == [2, 1, 1, 1]


def test_dynamic_true_compiles_per_concrete_shape():
    model = ConvStack().eval()
    compiled = lt.compile(model, dynamic=True)
    with torch.no_grad():
        for length in (7, 12, 1):
            x = torch.randn(2, 4, length)
            _close(compiled(x), model(x))


def test_registered_name_and_entry_point():
    x = torch.randn(3, 4)
    f = torch.compile(lambda a: torch.sigmoid(a) * a, backend="lazymath")
    torch.testing.assert_close(f(x), torch.sigmoid(x) * x)
    assert "lazymath" in torch._dynamo.list_backends()
    meta = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["torch_dynamo_backends"] == {
        "lazymath": "lazymath.torch:backend"
    }
    assert "torch==2.13.0" in meta["project"]["optional-dependencies"]["test"]


def test_bad_options_are_clear_errors():
    with pytest.raises(TypeError, match="unknown option"):
        lt.compile(MLP(), mode="max-autotune")
    with pytest.raises(TypeError, match="Module or a function"):
        lt.compile(42)


def test_outputs_share_lazymath_buffers():
    """Results come back without a copy: the torch tensor's memory is the buffer lazymath
    wrote (DLPack), and inputs are read in place."""
    seen = {}

    def spy(x):
        return x * 3

    compiled = lt.compile(spy)
    x = torch.arange(12.0).reshape(3, 4)
    y = compiled(x)
    torch.testing.assert_close(y, x * 3)
    a = lt._to_lm(x)
    seen["ptr"] = a.numpy().ctypes.data
    assert seen["ptr"] == x.data_ptr()
    b = (a + 1).realize()
    assert lt._to_torch(b).data_ptr() == b.numpy().ctypes.data


# ------------------------------------------------------- weights transposed once, kept


def _graphs(compiled):
    return lt._session_of(compiled).graphs


def test_weight_transposes_are_kept_across_calls_and_follow_updates():
    """Linear lowers to mm(x, t(w)): the realized t(w) of a Parameter is reused while the
    weight is unchanged (no copy kernel per call), and an in-place update (version counter),
    a `.data` swap (storage pointer) or another module invalidates it: never a stale weight."""
    m = nn.Sequential(nn.Linear(13, 31), nn.GELU(), nn.Linear(31, 5)).eval()
    c = lt.compile(m)
    x = torch.randn(7, 13)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), **TOL[torch.float32])
        (g,) = _graphs(c)
        assert len(g._consts) == 2  # both weights' t()
        kept = {k: v[2] for k, v in g._consts.items()}
        hits = g.const_hits
        torch.testing.assert_close(c(x), m(x), **TOL[torch.float32])
        assert g.const_hits == hits + 2
        assert all(g._consts[k][2] is kept[k] for k in kept)  # the same realized buffer
        m[0].weight.mul_(-2.0)  # in place: bumps the version counter
        torch.testing.assert_close(c(x), m(x), **TOL[torch.float32])
        m[2].weight.data = torch.randn(5, 31)  # a new storage
        torch.testing.assert_close(c(x), m(x), **TOL[torch.float32])
        with torch.no_grad():
            m[2].weight[1:3] += 1.0  # an in-place slice write bumps the version too
        torch.testing.assert_close(c(x), m(x), **TOL[torch.float32])
    text = str(lm.explain(c))
    assert "2 parameter view(s)" in text
    # the steady-state segment has no copy kernel left: x is contiguous, the weights are kept
    assert "_copy" not in text.split("-- segment 1")[1]


def test_training_graphs_keep_no_weight_views():
    """Training graphs lower t(w) every call (old-style loops update `p.data` in place, which
    no version counter sees): 4 SGD steps match eager step by step, nothing is kept."""
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(9, 17), nn.Tanh(), nn.Linear(17, 3))
    ref = copy.deepcopy(m)
    c = lt.compile(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = torch.randn(11, 9), torch.randn(11, 3)
    for _ in range(4):
        for model, o in ((c, opt), (ref, opt_ref)):
            o.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            o.step()
            if model is c:
                got = loss.item()
            else:
                want = loss.item()
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert _graphs(c) and all(not g._consts for g in _graphs(c))


def test_activation_transposes_are_not_kept():
    """Only Parameters are kept: a transposed activation (a new tensor every call) is lowered
    as before, so a second call with other data gives the new answer."""
    c = lt.compile(lambda a, b: a @ b.t())
    a, b = torch.randn(4, 6), torch.randn(5, 6)
    torch.testing.assert_close(c(a, b), a @ b.t(), **TOL[torch.float32])
    b2 = torch.randn(5, 6)
    torch.testing.assert_close(c(a, b2), a @ b2.t(), **TOL[torch.float32])
    assert all(not g._consts for g in _graphs(c))
