"""The ATen lowerings of lazymath.torch one family at a time, against torch eager (issue 32):
each function below exercises several lowerings in one FX graph, on awkward shapes (size 1,
primes, broadcasting, negative dims, strided slices), and the graph must run with no graph
break (so the lowerings, not the torch fallback, produced the values).

Protects: torch semantics that numpy's differ from: integer floor division and remainder of
negatives, division's rounding modes, 0-d tensor promotion, clamp with tensor bounds, slice
ends beyond the size, var's correction, bool arithmetic, masked_fill's scalar fill.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import lazymath.torch as lt


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch.manual_seed(7)
    yield
    torch._dynamo.reset()


def elementwise(x, y):
    return (
        torch.exp(x).clamp(max=5.0) * torch.sigmoid(y),
        torch.where(x > y, x, y) - torch.maximum(x, y),
        torch.erf(x) + torch.tanh(y) * torch.rsqrt(y.abs() + 1),
        torch.pow(x, 2) + torch.pow(y.abs() + 1, 0.5) + torch.pow(2.0, x),
        (x >= 0) & (y < 0.5) | (x == y),
        torch.clamp(x, min=torch.zeros(1, 7), max=y.abs()),
        x.masked_fill(y > 0, -3.5),
        torch.nn.functional.leaky_relu(x, 0.2) + torch.nn.functional.silu(y),
        torch.nn.functional.gelu(x) - torch.log1p(y.abs()),
        x / (y.abs() + 0.5) + torch.tensor(2.5) * x,  # a 0-d tensor does not promote
    )


def integers(a, b):
    return (
        torch.div(a, b, rounding_mode="floor"),
        a % b,
        torch.div(a.float(), b.float(), rounding_mode="trunc"),
        a // 3,
        (a * b + 7).to(torch.int32),
        a / b,  # true division of integers gives float32
        torch.bitwise_and(a, 6) ^ b,
    )


def shapes(x):
    parts = torch.split(x, [2, 3, 6], dim=1)
    return (
        torch.cat([parts[2], parts[0]], dim=-1),
        torch.stack(parts[:1] * 2, dim=0),
        x[:, 1:10:3],
        x[-2:, -1:],
        x[:, 5:100],
        x.flip(-1).transpose(0, 1).reshape(-1),
        x.unsqueeze(1).expand(5, 3, 11),
        torch.nn.functional.pad(x, (1, 2, 0, 3), value=0.5),
        torch.tril(x, -1) + torch.triu(x, 2),
        x.t().contiguous()[::2],
        x.select(1, -1),
    )


def reductions(x):
    return (
        x.sum(dim=(0, 2)),
        x.mean(-1, keepdim=True),
        x.amax(1),
        x.amin(dim=(0, 1)),
        x.argmax(-1),
        x.max(dim=1).values,
        x.var(dim=-1),
        x.var(dim=0, correction=0),
        x.prod(dim=2),
        (x > 1).any(dim=-1),
        x.sum(),
        torch.log_softmax(x, dim=1),
        torch.softmax(x, dim=0),
    )


def creation(x):
    n = x.shape[0]
    return (
        torch.arange(n, dtype=torch.float32) + x[:, 0],
        torch.arange(2, 3 * n, 3) * 2,
        torch.full((n, 2), 1.5) + torch.zeros_like(x[:, :2]),
        torch.ones(n, dtype=torch.int64) + n,
        x.to(torch.float16).to(torch.float32),
        x.to(torch.int32),
    )


def matmuls(a, b, bias, c):
    return (
        torch.addmm(bias, a, b),
        torch.baddbmm(c, c, c.transpose(1, 2), alpha=0.5, beta=2.0),
        a @ b + 1,
        torch.index_select(b, 0, torch.tensor([4, 0, 2])),
    )


CASES = {
    "elementwise": (elementwise, lambda: (torch.randn(5, 7), torch.randn(1, 7))),
    "integers": (
        integers,
        lambda: (torch.randint(-20, 20, (3, 5)), torch.tensor([3, -4, 5, -7, 2])),
    ),  # fmt: skip
    "shapes": (shapes, lambda: (torch.randn(5, 11),)),
    "reductions": (reductions, lambda: (torch.randn(3, 5, 7),)),
    "creation": (creation, lambda: (torch.randn(7, 3),)),
    "matmuls": (
        matmuls,
        lambda: (torch.randn(4, 6), torch.randn(6, 5), torch.randn(5), torch.randn(2, 3, 3)),
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(CASES))
def test_lowerings_equal_eager_without_breaks(name):
    fn, make = CASES[name]
    args = make()
    compiled = lt.compile(fn)
    got, want = compiled(*args), fn(*args)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=f"output {i}")
    graphs = compiled._lazymath_session.graphs
    assert graphs and all(not g.breaks for g in graphs), [g.breaks for g in graphs]
    assert all(g.segments == 1 for g in graphs)
