"""The benchmark runner (`python -m benchmarks`, benchmarks/run.py) and its plots run end to end
on tiny sizes; nothing about timings is asserted (speed belongs to the benchmarks)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_run_writes_the_table_and_results(tmp_path, capsys, monkeypatch):
    run = _load("run")
    # smaller than --quick, on the interpreter (no LLVM compile): this checks the plumbing
    monkeypatch.setattr(run, "QUICK", {"matmul": [16], "elementwise": [256, 512]})
    monkeypatch.setenv("LAZYMATH_BACKEND", "interp")
    out = tmp_path / "results.json"
    doc = run.main(["--quick", "--only", "matmul,elementwise", "--peers", "numpy",
                    "--out", str(out)])  # fmt: skip
    text = capsys.readouterr().out
    assert "peer/lm" in text and "GFLOPS" in text and "GB/s" in text
    saved = json.loads(out.read_text())
    assert saved["quick"] is True and saved["machine"]["cores"] >= 1
    assert "host_target" in saved["machine"] and "numpy" in saved["machine"]["versions"]
    suites = [r["suite"] for r in saved["results"]]
    assert suites == ["matmul"] * len(run.QUICK["matmul"]) + ["elementwise"] * len(
        run.QUICK["elementwise"]
    )
    for r in saved["results"]:
        assert set(r["seconds"]) == {"lazymath", "numpy"}
        assert all(t > 0 for t in r["seconds"].values())
        assert [row["peer"] for row in r["rows"]] == ["lazymath", "numpy"]
    assert doc["results"][0]["unit"] == "GFLOPS"

    pytest.importorskip("matplotlib")
    plot = _load("plot")
    paths = plot.main([str(out), "--outdir", str(tmp_path / "plots")])
    assert sorted(pathlib.Path(p).name for p in paths) == ["elementwise.png", "matmul.png"]
    assert all(pathlib.Path(p).read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_numexpr_peer_times_its_own_expression(tmp_path, capsys, monkeypatch):
    """numexpr looks variables up in its caller's frame unless given them: the runner passes
    them, so the peer runs from inside the timing loop (it raised KeyError: 'x' there)."""
    pytest.importorskip("numexpr")
    run = _load("run")
    monkeypatch.setattr(run, "QUICK", {"elementwise": [256]})
    monkeypatch.setenv("LAZYMATH_BACKEND", "interp")
    doc = run.main(["--quick", "--only", "elementwise", "--peers", "numpy,numexpr",
                    "--out", str(tmp_path / "r.json")])  # fmt: skip
    (r,) = doc["results"]
    assert set(r["seconds"]) == {"lazymath", "numpy", "numexpr"}
    assert all(t > 0 for t in r["seconds"].values())


def test_unknown_suite_is_refused():
    run = _load("run")
    with pytest.raises(SystemExit):
        run.main(["--only", "fft"])


def test_sharing_benchmark_runs(capsys, monkeypatch):
    """benchmarks/sharing.py end to end on tiny sizes (the plumbing, not the timings)."""
    sharing = _load("sharing")
    monkeypatch.setenv("LAZYMATH_BACKEND", "interp")
    rows = sharing.main(["--quick", "--reps", "1", "--pause", "0", "--options", "default,1 thread",
                         "--only", "custom_op"])  # fmt: skip
    assert [(r["case"], r["option"]) for r in rows] == [("custom_op", "default"),
                                                         ("custom_op", "1 thread")]  # fmt: skip
    assert all(r["alone"] > 0 and r["after"] > 0 for r in rows)
    assert "after/alone" in capsys.readouterr().out


def test_torch_backend_benchmark_runs(capsys):
    """benchmarks/torch_backend.py on a tiny block, lazymath against eager, without the
    peak-memory processes (the plumbing: both peers timed, the table printed)."""
    tb = _load("torch_backend")
    (r,) = tb.main(["--quick", "--peers", "lazymath,eager", "--modes", "fwd+bwd", "--dtypes",
                    "float32", "--no-peak"])  # fmt: skip
    assert (r["mode"], r["dtype"]) == ("fwd+bwd", "float32")
    assert set(r["steady"]) == set(r["cold"]) == {"lazymath", "eager"}
    assert all(t > 0 for t in r["steady"].values())
    assert "fwd+bwd float32" in capsys.readouterr().out


def test_runner_knows_the_torch_backend_suite():
    run = _load("run")
    assert "torch_backend" in run.CASES and "torch_backend" in run.OPT_IN
    assert "torch_backend" not in run.SUITES  # opt-in: Inductor compiles take minutes


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_attention_suite_checks_values_against_torch_and_restores_the_device(
    tmp_path, capsys, monkeypatch, backend
):
    """The opt-in attention suite (`--only attention`) runs float32 (fused kernel, 910) and
    bfloat16 (910B) on an awkward sequence length, asserts lazymath's values against torch's
    inside the case, and leaves the caller's device current."""
    torch = pytest.importorskip("torch")
    del torch
    import lazymath as lm

    run = _load("run")
    monkeypatch.setattr(run, "QUICK", {"attention": [(1, 2, 17, 16, "float32"),
                                                     (1, 1, 17, 16, "bfloat16")]})  # fmt: skip
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    before = lm.current_device()
    doc = run.main(["--quick", "--only", "attention", "--peers", "torch",
                    "--out", str(tmp_path / "r.json")])  # fmt: skip
    assert lm.current_device() is before
    assert [r["case"] for r in doc["results"]] == [
        "causal sdpa 1x2x17x16 float32",
        "causal sdpa 1x1x17x16 bfloat16",
    ]
    for r in doc["results"]:
        assert set(r["seconds"]) == {"lazymath", "torch"} and r["unit"] == "GFLOPS"
    assert "causal sdpa" in capsys.readouterr().out
