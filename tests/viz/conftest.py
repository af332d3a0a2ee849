"""Fixtures for the visualization tests: the custom_op graph, Graphviz/Chromium availability,
and a way to hide Graphviz from lazymath (an empty PATH)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import lazymath as lm

SPEC = "ascend910"  # pictures are compared for the default (coupled) device


def custom_op(A, B, scale):
    return lm.mul(lm.relu(lm.matmul(A, B)), scale)


@pytest.fixture(autouse=True)
def _default_device():
    """Pictures, names and streams are asserted for the default preset: switch to it if an
    earlier test left another one current, and put that one back afterwards."""
    from lazymath.runtime.api import current_device, set_device

    prev = current_device()
    if prev.spec.name != SPEC:
        lm.init_device(0, spec=SPEC)
    yield
    set_device(prev)


@pytest.fixture
def custom_op_graph():
    """(out, line) for mul(relu(matmul(A, B)), 0.5) on float16; `line` is the file:line that
    created the three ops (the tooltip every op node must carry)."""
    A = lm.random.randn(64, 48, seed=0, dtype="float16").realize()
    B = lm.random.randn(48, 32, seed=1, dtype="float16").realize()
    out = custom_op(A, B, 0.5)
    return out, out._node.loc


@pytest.fixture
def hide_dot(monkeypatch, tmp_path):
    """Graphviz is not installed, as far as lazymath can tell: PATH holds one empty folder."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("dot") is None


@pytest.fixture
def needs_dot():
    if shutil.which("dot") is None:
        pytest.skip("Graphviz `dot` is not installed (.ci/run installs the graphviz package)")


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture
def chromium(tmp_path):
    """Run headless Chromium on a URL: `chromium(url, "--dump-dom")` -> stdout text."""
    exe = chromium_binary()
    if exe is None:
        pytest.skip("Chromium is not installed (.ci/run installs the chromium package)")

    def run(url: str, *args: str, timeout: float = 120.0) -> str:
        profile = tmp_path / f"chromium-profile-{len(list(tmp_path.iterdir()))}"
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
               f"--user-data-dir={profile}", *args, url]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")[-2000:]
        return proc.stdout.decode("utf-8", "replace")

    return run


@pytest.fixture(autouse=True)
def _folded_scalars(monkeypatch):
    """The drawings and listings here pin how folded constants look (a `const 0.5` node, a
    `vmuls` with an immediate, the input count of a kernel): they run with
    LAZYMATH_SCALAR_ARGS=0. Runtime scalars (the default) are tests/test_scalar_args.py's."""
    monkeypatch.setenv("LAZYMATH_SCALAR_ARGS", "0")
