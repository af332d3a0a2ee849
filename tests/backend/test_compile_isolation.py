"""Crash isolation for the compiler (issue 13, defect 2): LLVM aborting or hanging on a kernel
costs a warning and a fallback, never the user's process after the first crash.

The first process dies inside LLVM (simulated: the optimizer calls abort()) and leaves its
compile marker behind; the next process compiles that kernel in a child process, which also
aborts while the vectorizers are on (simulated), so it retries with them off and succeeds; the
result is stored, so a third process loads it from the disk cache. With
LAZYMATH_COMPILE_ISOLATE=1 and a compiler that hangs every time, the kernel runs on the
interpreter after the timeouts, with warnings that say so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llvmlite.binding")

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json, os, sys, warnings
import numpy as np
warnings.simplefilter("always")
import lazymath as lm
from lazymath.backend.native import kernel_cache, workers
if os.environ.get("CRASH_IN_PROCESS"):  # LLVM aborting in a compile worker
    def compile(self, ir_text, module_name, level, vectorize=True):
        os.abort()
    workers.Compiler.compile = compile
x = np.linspace(-3, 3, 1001).astype(np.float32)
with warnings.catch_warnings(record=True) as caught:
    got = (lm.exp(lm.tensor(x)) * float(sys.argv[1])).numpy()
ok = bool(np.allclose(got, np.exp(x) * float(sys.argv[1]), rtol=1e-6))
print(json.dumps({**kernel_cache.cache_info(), "ok": ok,
                  "warnings": [str(m.message) for m in caught
                               if issubclass(m.category, RuntimeWarning)]}))
"""


def _run(cache: Path, scale: float, **env) -> subprocess.CompletedProcess:
    e = {**os.environ, "LAZYMATH_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT),
         "LAZYMATH_BACKEND": "llvm", **env}  # fmt: skip
    e.pop("LAZYMATH_CACHE", None)
    for k in ("LAZYMATH_COMPILE_ISOLATE", "LAZYMATH_TEST_COMPILE_FAULT"):
        if k not in env:
            e.pop(k, None)  # the default, whatever the test run's environment says
    return subprocess.run([sys.executable, "-c", _SCRIPT, str(scale)], env=e,
                          capture_output=True, timeout=300)  # fmt: skip


def _out(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def test_a_crash_in_llvm_is_survived_by_the_next_process(tmp_path):
    """LAZYMATH_COMPILE_ISOLATE=auto (in-process compiles): the first crash ends the process,
    its marker sends the next process's compile of that kernel to a child."""
    cache = tmp_path / "kc"
    first = _run(cache, 2.0, CRASH_IN_PROCESS="1", LAZYMATH_COMPILE_ISOLATE="auto")
    assert first.returncode == -signal.SIGABRT
    assert list(cache.glob(".*.compiling")), "the crashed compile left its marker"
    second = _out(_run(cache, 2.0, LAZYMATH_TEST_COMPILE_FAULT="abort-vectorized",
                       LAZYMATH_COMPILE_ISOLATE="auto"))  # fmt: skip
    w = "\n".join(second["warnings"])
    assert second["ok"] and second["compiled"] == 1 and second["disk_writes"] == 1
    assert "a previous process died compiling it" in w
    assert "died of SIGABRT" in w and "retrying with the vectorizers off" in w
    assert "compiled with the vectorizers off in a separate process" in w
    assert not list(cache.glob(".*.compiling"))
    third = _out(_run(cache, 2.0))
    assert third["ok"] and third["disk_hits"] == 1 and third["compiled"] == 0
    assert not third["warnings"]


def test_a_compiler_that_always_fails_falls_back_to_the_interpreter(tmp_path):
    out = _out(_run(tmp_path / "kc", 3.0, LAZYMATH_COMPILE_ISOLATE="1",
                    LAZYMATH_COMPILE_TIMEOUT="1", LAZYMATH_TEST_COMPILE_FAULT="hang"))  # fmt: skip
    w = "\n".join(out["warnings"])
    assert out["ok"] and out["disk_writes"] == 0
    assert "did not finish in time" in w and "numpy interpreter" in w


def test_compile_server_survives_an_abort_on_a_fresh_process_first_compile(tmp_path):
    """LAZYMATH_COMPILE_ISOLATE=server: no first-crash window. A fresh process whose very
    first compile aborts LLVM (simulated in the server: every attempt with the vectorizers on
    aborts) lives on: the server is restarted, the kernel compiled with the vectorizers off,
    the result is right and the object reaches the disk cache for the next process."""
    cache = tmp_path / "kc"
    out = _out(_run(cache, 2.0, LAZYMATH_COMPILE_ISOLATE="server",
                    LAZYMATH_TEST_COMPILE_FAULT="abort-vectorized"))  # fmt: skip
    w = "\n".join(out["warnings"])
    assert out["ok"] and out["compiled"] == 1 and out["disk_writes"] == 1
    assert "died of SIGABRT" in w and "in the compile server" in w
    assert "compiling again with the vectorizers off" in w and "interpreter" not in w
    again = _out(_run(cache, 2.0))  # the next process: a disk hit, no LLVM, no warning
    assert again["ok"] and again["disk_hits"] == 1 and again["compiled"] == 0
    assert not again["warnings"]


def test_compile_server_that_always_aborts_falls_back_to_the_interpreter(tmp_path):
    out = _out(_run(tmp_path / "kc", 3.0, LAZYMATH_COMPILE_ISOLATE="server",
                    LAZYMATH_TEST_COMPILE_FAULT="abort"))  # fmt: skip
    w = "\n".join(out["warnings"])
    assert out["ok"] and out["disk_writes"] == 0  # correct, from the interpreter
    assert "even with the vectorizers off" in w and "numpy interpreter" in w


def test_compile_server_mode_without_faults_compiles_and_reuses_its_server(tmp_path):
    script = _SCRIPT.replace("print(json.dumps({", "from lazymath.backend.native import isolate\n"
                             "y = (lm.tanh(lm.tensor(x)) + 1.0).numpy()\n"
                             "ok = ok and bool(np.allclose(y, np.tanh(x) + 1, rtol=1e-5, atol=1e-6))\n"
                             "print(json.dumps({'servers': len(isolate._servers), ")  # fmt: skip
    e = {**os.environ, "LAZYMATH_CACHE_DIR": str(tmp_path / "kc"), "PYTHONPATH": str(ROOT),
         "LAZYMATH_BACKEND": "llvm", "LAZYMATH_COMPILE_ISOLATE": "server",
         "LAZYMATH_COMPILE_THREADS": "1"}  # fmt: skip
    out = _out(subprocess.run([sys.executable, "-c", script, "1.5"], env=e,
                              capture_output=True, timeout=300))  # fmt: skip
    assert out["ok"] and out["compiled"] == 2 and not out["warnings"]
    assert out["servers"] == 1  # one compile thread: one server, kept for both kernels


def test_compile_server_kills_a_hung_compile_and_retries(tmp_path):
    """A compile that hangs in the server (simulated: every attempt with the vectorizers on
    sleeps) is killed after LAZYMATH_COMPILE_TIMEOUT seconds, the server restarted and the
    kernel compiled with the vectorizers off: a correct result, a warning that says so, and
    the object in the disk cache. The in-process path could only abandon the thread."""
    out = _out(_run(tmp_path / "kc", 2.5, LAZYMATH_COMPILE_ISOLATE="server",
                    LAZYMATH_COMPILE_TIMEOUT="2", LAZYMATH_COMPILE_THREADS="1",
                    LAZYMATH_TEST_COMPILE_FAULT="hang-vectorized"))  # fmt: skip
    w = "\n".join(out["warnings"])
    assert out["ok"] and out["compiled"] == 1 and out["disk_writes"] == 1
    assert "did not finish compiling kernel" in w and "within 2 s" in w and "killed" in w
    assert "compiling again with the vectorizers off" in w and "interpreter" not in w


def test_compile_server_that_always_hangs_falls_back_to_the_interpreter(tmp_path):
    out = _out(_run(tmp_path / "kc", 3.5, LAZYMATH_COMPILE_ISOLATE="server",
                    LAZYMATH_COMPILE_TIMEOUT="1.5", LAZYMATH_COMPILE_THREADS="1",
                    LAZYMATH_TEST_COMPILE_FAULT="hang"))  # fmt: skip
    w = "\n".join(out["warnings"])
    assert out["ok"] and out["disk_writes"] == 0  # correct, from the interpreter
    assert "within 1.5 s" in w and "even with the vectorizers off" in w
    assert "numpy interpreter" in w


def test_compile_server_boots_without_the_tensor_layer():
    """The server imports only settings and backend.native.jit/host/workers (isolate._BOOT): no
    numpy, no lazymath/__init__ -- its boot was ~0.6 s of `import lazymath` before."""
    from lazymath.backend.native import isolate

    code = isolate._BOOT.replace(
        "server_main(sys.argv[2])",
        "import json; print(json.dumps(sorted(m for m in sys.modules if m.startswith(('lazymath', "
        "'numpy', 'ml_dtypes')))))",
    )
    p = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT / "lazymath"), "",
                        json.dumps(sys.path)], capture_output=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    mods = json.loads(p.stdout.decode())
    assert "lazymath.tensor" not in mods and not any(m.startswith("numpy") for m in mods), mods
    assert "lazymath.backend.native.workers" in mods
    assert "site" not in mods  # (-S: the parent's sys.path instead)


def test_the_default_survives_an_abort_on_a_fresh_process_first_compile(tmp_path):
    """Issue 37's criterion with no setting at all: the server is the default, so LLVM
    aborting on the very first compile of a fresh process (simulated in the server while the
    vectorizers are on) costs a restart and a retry; the process lives, the result is right."""
    out = _out(_run(tmp_path / "kc", 2.0, LAZYMATH_TEST_COMPILE_FAULT="abort-vectorized"))
    w = "\n".join(out["warnings"])
    assert out["ok"] and out["compiled"] == 1 and out["disk_writes"] == 1
    assert "died of SIGABRT" in w and "in the compile server" in w
    assert "interpreter" not in w


_MANY = r"""
import json, os, signal, sys, threading, warnings
import numpy as np
warnings.simplefilter("always")
import lazymath as lm
from lazymath.backend.native import isolate, kernel_cache
rng = np.random.default_rng(0)
x = rng.standard_normal((33, 17)).astype(np.float32)
w = rng.standard_normal((17, 9)).astype(np.float32)
out = {"ok": True, "pids": []}
with warnings.catch_warnings(record=True) as caught:
    for step in range(3):
        a, b = lm.asarray(x), lm.asarray(w)
        h = lm.softmax(lm.tanh(a @ b + step), axis=-1)
        s = lm.sum(lm.exp(a) * (step + 2), axis=0)
        lm.realize(h, s)
        z = np.tanh(x @ w + step)
        e = np.exp(z - z.max(-1, keepdims=True))
        out["ok"] &= bool(np.allclose(h.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-4,
                                      atol=1e-6))
        out["ok"] &= bool(np.allclose(s.numpy(), (np.exp(x) * (step + 2)).sum(0), rtol=1e-4))
        out["pids"].append(isolate._current.proc.pid)
        out["threads"] = sum(t.name.startswith("lazymath-compile-") for t in threading.enumerate())
        out["servers"] = len(isolate._servers)
        if step == 0:  # Ctrl-C in a terminal: the whole process group gets SIGINT
            os.kill(out["pids"][-1], signal.SIGINT)
        if step == 1:  # a server gone between compiles: the next compile starts a new one
            os.kill(out["pids"][-1], signal.SIGKILL)
            isolate._current.reader.join(5)
        lm.clear_cache()
print(json.dumps({**out, "compiled": kernel_cache.cache_info()["compiled"],
                  "warnings": [str(m.message) for m in caught
                               if issubclass(m.category, RuntimeWarning)]}))
"""


def test_one_server_per_process_serves_every_compile_thread(tmp_path):
    """Two compile threads, several kernels per realize: one server process for all of them
    (not one per thread), compiling them concurrently; it ignores SIGINT (a terminal's
    Ctrl-C goes to the whole process group); killed between compiles, it is replaced
    silently at the next compile."""
    e = {**os.environ, "LAZYMATH_CACHE_DIR": str(tmp_path / "kc"), "PYTHONPATH": str(ROOT),
         "LAZYMATH_BACKEND": "llvm", "LAZYMATH_COMPILE_THREADS": "2"}  # fmt: skip
    for k in ("LAZYMATH_COMPILE_ISOLATE", "LAZYMATH_TEST_COMPILE_FAULT", "LAZYMATH_CACHE"):
        e.pop(k, None)
    out = _out(subprocess.run([sys.executable, "-c", _MANY], env=e, capture_output=True,
                              timeout=300))  # fmt: skip
    assert out["ok"] and not out["warnings"], out
    assert out["servers"] == 1 and out["threads"] >= 2
    assert out["pids"][0] == out["pids"][1] != out["pids"][2]  # SIGINT ignored; KILL replaced
    assert out["compiled"] >= 6


def test_no_server_possible_compiles_in_process_with_one_warning(tmp_path):
    """Where no server can start (here: sys.executable points nowhere) the process compiles
    in-process as with LAZYMATH_COMPILE_ISOLATE=auto, and says so once."""
    script = _SCRIPT.replace(
        "import lazymath as lm\n", "import lazymath as lm\nsys.executable = '/nonexistent/python'\n"
    )
    e = {**os.environ, "LAZYMATH_CACHE_DIR": str(tmp_path / "kc"), "PYTHONPATH": str(ROOT),
         "LAZYMATH_BACKEND": "llvm"}  # fmt: skip
    for k in ("LAZYMATH_COMPILE_ISOLATE", "LAZYMATH_TEST_COMPILE_FAULT", "LAZYMATH_CACHE"):
        e.pop(k, None)
    out = _out(subprocess.run([sys.executable, "-c", script, "2.0"], env=e,
                              capture_output=True, timeout=300))  # fmt: skip
    assert out["ok"] and out["compiled"] == 1 and out["disk_writes"] == 1
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "no compile server" in out["warnings"][0]
    assert "compiling in this process" in out["warnings"][0]
