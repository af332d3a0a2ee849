"""Measured autotuning of the host GEMM plan (backend/autotune.py).

No timed assertions: which candidate wins depends on the machine; the tests check that
candidates are measured once, the record is reused by a later process without timing anything,
the result is correct whichever plan won, and explain says where the plan came from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

import lazymath as lm
from lazymath.backend import autotune
from lazymath.backend.host import gemm

SCRIPT = textwrap.dedent(
    """
    import json, numpy as np, lazymath as lm
    from lazymath.backend import autotune
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (40, 72)).astype(np.float32)
    b = rng.uniform(-1, 1, (72, 50)).astype(np.float32)
    y = lm.relu(lm.tensor(a) @ lm.tensor(b)) * 0.5
    text = lm.explain(y)
    got = np.asarray(y.realize())
    ok = bool(np.allclose(got, np.maximum(a @ b, 0) * 0.5, rtol=1e-5, atol=1e-5))
    print(json.dumps({"stats": autotune.stats, "ok": ok, "explain": text}))
    """
)


def _run(cache_dir) -> dict:
    env = dict(os.environ, LAZYMATH_CACHE_DIR=str(cache_dir), LAZYMATH_AUTOTUNE="1",
               LAZYMATH_BACKEND="llvm")  # fmt: skip
    env.pop("LAZYMATH_CACHE", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=600, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_reuses_the_measurement(tmp_path):
    first = _run(tmp_path)
    assert first["ok"] and first["stats"]["timed"] >= 1 and first["stats"]["records_written"] == 1
    records = list((tmp_path / "autotune").glob("*.json"))
    assert len(records) == 1
    rec = json.loads(records[0].read_text())
    assert f"{rec['plan']}:{rec['kc']}" in rec["times"]
    second = _run(tmp_path)
    assert second["ok"] and second["stats"]["timed"] == 0 and second["stats"]["records_read"] >= 1
    assert "measured: " in second["explain"] and rec["plan"] in second["explain"]


def test_precompile_autotune_measures_and_explain_shows_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LAZYMATH_AUTOTUNE", raising=False)
    monkeypatch.delenv("LAZYMATH_BACKEND", raising=False)
    # two candidates keep the test short: the model's and a narrower one
    model = gemm.model_plan()
    other = gemm.GemmPlan(gemm.Microkernel(6, 16, model.uk.vw, model.uk.fma), 32)
    monkeypatch.setattr(gemm, "candidate_plans", lambda target: [model, other])
    monkeypatch.setattr(autotune, "ROUNDS", 2)
    lm.clear_cache()
    autotune._memory.clear()
    before = autotune.stats["timed"]
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (33, 47)).astype(np.float32)
    b = rng.uniform(-1, 1, (47, 29)).astype(np.float32)

    def f(x, y):
        return x @ y

    assert lm.precompile(f, a, b, autotune=True) == 1
    assert autotune.stats["timed"] == before + 2
    text = lm.explain(lm.tensor(a) @ lm.tensor(b))
    assert "measured: " in text and "6x16" in text
    np.testing.assert_allclose(np.asarray((lm.tensor(a) @ lm.tensor(b)).realize()), a @ b,
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    # without autotuning and without a record, the model picks
    autotune._memory.clear()
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path / "empty"))
    c = lm.tensor(rng.uniform(-1, 1, (5, 47)).astype(np.float32))
    assert "[model]" in lm.explain(c @ lm.tensor(b))
    lm.clear_cache()
