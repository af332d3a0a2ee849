"""Offline compile: lm.precompile in one process fills the disk cache; a second process runs
the same function on new data without compiling a single kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FN = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import lazymath as lm

    def custom_op(a, b, x):
        h = lm.relu(a @ b) * 0.5
        return h.sum(axis=1) + lm.sin(x).max()

    rng = np.random.default_rng(int(sys.argv[2]))
    a = rng.standard_normal((40, 24)).astype(np.float32)
    b = rng.standard_normal((24, 33)).astype(np.float32)
    x = rng.standard_normal(50).astype(np.float32)
    """
)


def _run(code: str, cache: str, *args: str) -> dict:
    env = dict(os.environ, LAZYMATH_CACHE_DIR=cache, LAZYMATH_BACKEND="llvm", PYTHONPATH=ROOT)
    env.pop("LAZYMATH_CACHE", None)
    out = subprocess.run([sys.executable, "-c", FN + textwrap.dedent(code), *args], env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_precompiled_kernels_load_without_compiling(tmp_path):
    cache = str(tmp_path / "cache")
    first = _run(
        """
        n = lm.precompile(custom_op, a, b, x)
        print(json.dumps({"kernels": n, "info": lm.cache_info()}))
        """,
        cache, "x", "1",
    )  # fmt: skip
    assert first["kernels"] >= 2
    assert first["info"]["compiled"] >= first["kernels"]
    assert first["info"]["disk_files"] >= 1
    second = _run(
        """
        out = custom_op(lm.tensor(a), lm.tensor(b), lm.tensor(x)).numpy()
        want = (np.maximum(a @ b, 0) * 0.5).sum(axis=1) + np.sin(x).max()
        assert np.allclose(out, want, rtol=1e-4, atol=1e-4), (out, want)
        print(json.dumps({"info": lm.cache_info()}))
        """,
        cache, "x", "2",
    )  # fmt: skip
    assert second["info"]["compiled"] == 0, second["info"]
    assert second["info"]["disk_hits"] >= first["kernels"]
