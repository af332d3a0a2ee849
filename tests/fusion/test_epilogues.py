"""Matmul epilogues of a transformer MLP (issue 33): x @ w.T + bias, GELU / SiLU, + residual as
ONE kernel on both presets -- the coupled 910's Cube kernel (epilogue in UB after L0C), the split
910B's MIX kernel (`rules.MATMUL_MIX_EPILOGUE`: the AIVs run the epilogue on tiles the AIC hands
over) -- with values equal to torch on llvm and interp, and the fusion log's reason where the
910B keeps two kernels (a cheap epilogue).
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath.fusion import rules

torch = pytest.importorskip("torch")
F = torch.nn.functional

RNG = np.random.default_rng(3301)
ACTS = {
    "gelu": (lambda y: lm.nn.gelu(y), lambda y: F.gelu(y), "erf"),
    "gelu_tanh": (lambda y: lm.nn.gelu(y, "tanh"), lambda y: F.gelu(y, approximate="tanh"),
                  "tanh"),
    "silu": (lm.nn.silu, F.silu, "sigmoid"),
}  # fmt: skip


def _mlp_in(m, k, n, dtype="float32", batch=()):
    x = RNG.standard_normal((*batch, m, k)).astype(dtype)
    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(dtype)
    b = RNG.standard_normal(n).astype(dtype)
    res = RNG.standard_normal((*batch, m, n)).astype(dtype)
    return x, w, b, res


def _lm(act, x, w, b, res):
    return ACTS[act][0](lm.nn.linear(lm.tensor(x), lm.tensor(w), lm.tensor(b))) + lm.tensor(res)


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_bias_activation_residual_is_one_kernel(act, spec):
    s = lm.schedule(_lm(act, *_mlp_in(64, 96, 128)), spec=spec)
    (k,) = s.kernels
    assert k.unit == ("cube" if spec == "ascend910" else "mix")
    assert k.ops[0] == "matmul" and ACTS[act][2] in k.ops and k.ops.count("add") >= 2
    if spec == "ascend910b":
        assert "epilogue" in lm.explain(_lm(act, *_mlp_in(64, 96, 128)))


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_epilogue_matches_torch(backend, preset, act, dtype):
    """Awkward sizes: M 17 (batch 2), K 80, N 33 -- partial tiles on every edge."""
    x, w, b, res = _mlp_in(17, 80, 33, dtype, batch=(2,))
    t = [torch.from_numpy(a.astype(np.float32)) for a in (x, w, b, res)]
    want = (ACTS[act][1](F.linear(t[0], t[1], t[2])) + t[3]).numpy()
    got = _lm(act, x, w, b, res).numpy()
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=1e-2, atol=2e-2)
    np.testing.assert_allclose(got.astype(np.float32), want, **tol)


def test_cheap_epilogue_keeps_two_kernels_on_910b_and_says_why():
    s = lm.schedule(lm.nn.linear(*map(lm.tensor, _mlp_in(64, 96, 128)[:3])) * 2.0,
                    spec="ascend910b")  # fmt: skip
    assert [k.unit for k in s.kernels] == ["cube", "vector"]
    assert any(e.what == "refuse" and "expensive op" in e.reason for e in s.fusion_log)
    (k,) = lm.schedule(lm.nn.linear(*map(lm.tensor, _mlp_in(64, 96, 128)[:3])) * 2.0,
                       spec="ascend910").kernels  # fmt: skip
    assert k.unit == "cube"


def test_rule_off_restores_the_two_kernel_plan(monkeypatch):
    monkeypatch.setattr(rules, "MATMUL_MIX_EPILOGUE", False)
    s = lm.schedule(_lm("silu", *_mlp_in(64, 96, 128)), spec="ascend910b")
    assert [k.unit for k in s.kernels] == ["cube", "vector"]


@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_mix_epilogue_is_modelled_faster_than_cube_plus_vector(act, monkeypatch):
    """The reason for the rule, on the cycle model (no execution): the MLP's first layer
    (4096 tokens, 768 -> 3072) as one MIX kernel beats the Cube kernel + Vector kernel."""
    from lazymath.backend.compile import build_program
    from lazymath.backend.npu import cost

    def seconds(out):
        s = lm.schedule(out, spec="ascend910b")
        progs = [build_program(k.group.ir, s.spec, k.name) for k in s.kernels]
        return [k.unit for k in s.kernels], sum(cost.estimate(p, s.spec).seconds for p in progs)

    z = [np.zeros(a.shape, np.float32) for a in _mlp_in(1, 768, 3072)]
    x = np.zeros((4096, 768), np.float32)
    res = np.zeros((4096, 3072), np.float32)
    units, mix = seconds(_lm(act, x, z[1], z[2], res))
    monkeypatch.setattr(rules, "MATMUL_MIX_EPILOGUE", False)
    units2, two = seconds(_lm(act, x, z[1], z[2], res))
    assert units == ["mix"] and units2 == ["cube", "vector"]
    assert mix < two
