"""End-to-end: every example script runs to completion and reports a correct result."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = sorted(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py"))


@pytest.mark.parametrize("script", EXAMPLES)
def test_example_runs(script, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, LAZYMATH_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("LAZYMATH_BACKEND", None)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert out.returncode == 0, f"{script} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert out.stdout.strip(), f"{script} printed nothing"
    assert "Traceback" not in out.stderr
