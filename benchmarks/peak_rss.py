"""Process peak RSS of relu(A @ B) * scale on 4096x4096 float16: lazymath vs numpy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/peak_rss.py [--n 4096]
        [--skip-np16] [--np16-timeout SECONDS]

Issue 5 target: lazymath's peak RSS at most 54% of numpy's float32 version.

Each case runs in a fresh subprocess that imports its libraries, creates its own inputs (filled
in 256-row chunks, so input creation never holds a full-size temporary), computes the
composite once and reports `resource.getrusage(RUSAGE_SELF).ru_maxrss` plus the RSS right after
the imports (the libraries' baseline). The parent also reads each child's peak through
`os.wait4`, which works for a child it had to kill.

Cases:
For lazymath the child first realizes the same composite on 64x64 (the fixed cost independent
of n: the runtime, and the kernel's native code -- LLVM and MCJIT on a cold cache, only the
small ELF loader on a warm one) and reports the RSS after it too, plus the RSS once the inputs
exist and whether `llvmlite.binding` was ever imported (a warm process must not load LLVM).

- lazymath (cold): float16 inputs, `lm.mul(lm.relu(lm.matmul(A, B)), scale).realize()`, with
  an empty kernel cache directory, so the process also compiles the kernel with LLVM;
- lazymath (warm): the same in a new process whose kernel cache (the same directory) already
  holds the kernel: a deployed process that never compiles;
- numpy float32: float32 inputs, `np.maximum(A @ B, 0) * scale` (OpenBLAS sgemm);
- numpy float16: float16 inputs, the same expression. numpy has no float16 BLAS kernel and its
  float16 matmul loop is extremely slow at 4096 (minutes to tens of minutes): it is time-boxed
  by --np16-timeout (on timeout the peak reached so far is reported), or skipped with
  --skip-np16.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCALE = 0.125


def _rss_now_kib() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def _fill(arr, seed: int) -> None:
    """Random normal values, 256 rows at a time (no full-size float32/float64 temporary)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for r in range(0, arr.shape[0], 256):
        chunk = rng.standard_normal((min(256, arr.shape[0] - r), arr.shape[1]), np.float32)
        arr[r : r + chunk.shape[0]] = chunk


def _check(out, a_rows, b, scale) -> float:
    """Max relative error of an 8x256 corner against a float32 reference (a few MiB at most;
    it runs after the peak is read anyway)."""
    import numpy as np

    b_cols = b[:, :256].astype(np.float32)
    ref = np.maximum(a_rows.astype(np.float32) @ b_cols, 0) * np.float32(scale)
    got = np.asarray(out[: a_rows.shape[0], :256], dtype=np.float32)
    return float(np.abs(got - ref).max() / max(1.0, float(np.abs(ref).max())))


def child(case: str, n: int) -> None:
    """Run one case and print a JSON line with its measurements."""
    import numpy as np

    numpy_kib = _rss_now_kib()

    if case.startswith("lazymath"):
        sys.path.insert(0, ROOT)
        import lazymath as lm

        lm.current_device()  # initialize the runtime (threads, pools) before the baseline
    base_kib = _rss_now_kib()
    jit_kib = None
    if case.startswith("lazymath"):
        # the same composite on 64x64: loads LLVM, the JIT and the kernel cache (a fixed cost
        # independent of n), so `jit_kib` separates it from the memory that scales with n
        w = np.ones((64, 64), np.float16)
        lm.mul(lm.relu(lm.matmul(lm.tensor(w), lm.tensor(w))), lm.tensor(np.float16(1))).numpy()
        jit_kib = _rss_now_kib()
    t0 = time.perf_counter()
    if case.startswith("lazymath"):
        a = np.empty((n, n), np.float16)
        _fill(a, 0)
        A = lm.tensor(a)  # a copy: drop the numpy one
        check_rows = a[:8].copy()
        del a
        b = np.empty((n, n), np.float16)
        _fill(b, 1)
        B = lm.tensor(b)
        del b
        scale = lm.tensor(np.float16(SCALE))
        inputs_kib = _rss_now_kib()
        t1 = time.perf_counter()
        out = lm.mul(lm.relu(lm.matmul(A, B)), scale).realize()
        t2 = time.perf_counter()
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        err = _check(out.numpy(), check_rows, B.numpy(), SCALE)  # .numpy(): no copy
        ci = lm.cache_info()
        info = {"kernels": ci.get("compiled"), "elf_loads": ci.get("elf_loads"),
                "binding": "llvmlite.binding" in sys.modules, "inputs_kib": inputs_kib}  # fmt: skip
    else:
        dtype = np.float32 if case == "numpy-f32" else np.float16
        a = np.empty((n, n), dtype)
        _fill(a, 0)
        b = np.empty((n, n), dtype)
        _fill(b, 1)
        t1 = time.perf_counter()
        result = np.maximum(a @ b, dtype(0)) * dtype(SCALE)
        t2 = time.perf_counter()
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        err = _check(result, a[:8], b, SCALE)
        info = {}
    report = {"case": case, "peak_kib": peak_kib, "base_kib": base_kib, "jit_kib": jit_kib,
              "numpy_kib": numpy_kib, "inputs_s": t1 - t0}  # fmt: skip
    print(json.dumps({**report, "compute_s": t2 - t1, "rel_err": err, **info}))


def run_case(case: str, n: int, env: dict, timeout: float | None) -> dict:
    """Run `case` in a fresh interpreter; returns its JSON report (or what wait4 saw)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case, "--n", str(n)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if timeout is not None and time.perf_counter() - t0 > timeout:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            timed_out = True
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    report = {"case": case, "peak_kib": usage.ru_maxrss, "wall_s": time.perf_counter() - t0,
              "timed_out": timed_out}  # fmt: skip
    for line in out.splitlines():
        if line.startswith("{"):
            report.update(json.loads(line))
    if proc.returncode not in (0, None) and not timed_out:
        report["error"] = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
    report["wait4_peak_kib"] = usage.ru_maxrss
    return report


def mib(kib: int) -> float:
    return kib / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--skip-np16", action="store_true", help="skip numpy float16 (very slow)")
    ap.add_argument("--np16-timeout", type=float, default=1800.0,
                    help="seconds before numpy float16 is killed (default 1800)")  # fmt: skip
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.n)
        return 0

    n = args.n
    cache = tempfile.mkdtemp(prefix="lm-peak-rss-")
    env = dict(os.environ, LAZYMATH_CACHE_DIR=cache)
    env.pop("LAZYMATH_DEBUG", None)
    cases = ["lazymath-cold", "lazymath-warm", "numpy-f32"]
    if not args.skip_np16:
        cases.append("numpy-f16")
    print(f"relu(A @ B) * {SCALE} on {n}x{n}; each case in a fresh process; "
          f"one {n}x{n} float16 array = {n * n * 2 / 2**20:.0f} MiB, float32 = "
          f"{n * n * 4 / 2**20:.0f} MiB")  # fmt: skip
    if args.skip_np16:
        print("numpy float16 skipped (--skip-np16): its matmul has no BLAS kernel and takes "
              "minutes at this size")  # fmt: skip
    reports = {}
    try:
        for case in cases:
            timeout = args.np16_timeout if case == "numpy-f16" else None
            r = run_case(case, n, env if case.startswith("lazymath") else dict(os.environ),
                         timeout)  # fmt: skip
            reports[case] = r
            note = ""
            if r.get("timed_out"):
                note = f"  (killed after {r['wall_s']:.0f} s: peak reached so far)"
            elif "error" in r:
                note = f"  ERROR: {r['error']}"
            base = r.get("base_kib")
            above = f"{mib(r['peak_kib'] - base):8.1f}" if base else "       ?"
            comp = f"{r['compute_s']:8.2f} s" if "compute_s" in r else "       ? s"
            err = f"{r['rel_err']:.1e}" if "rel_err" in r else "?"
            print(f"{case:14} peak {mib(r['peak_kib']):8.1f} MiB  above imports {above} MiB  "
                  f"compute {comp}  rel err {err}{note}", flush=True)  # fmt: skip
            if r.get("jit_kib"):
                llvm = "LLVM loaded" if r.get("binding") else "no LLVM (elfload)"
                print(f"{'':14}   RSS: python+numpy {mib(r['numpy_kib']):.1f} MiB, + lazymath "
                      f"runtime {mib(r['base_kib']):.1f}, after the 64x64 warm-up "
                      f"{mib(r['jit_kib']):.1f} [{llvm}, {r.get('kernels')} compiled, "
                      f"{r.get('elf_loads')} elf-loaded], with the inputs "
                      f"{mib(r['inputs_kib']):.1f}; peak above the inputs "
                      f"{mib(r['peak_kib'] - r['inputs_kib']):.1f} MiB")  # fmt: skip
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    f32 = reports["numpy-f32"]
    print()
    for case in ("lazymath-cold", "lazymath-warm"):
        r = reports[case]
        ratio = r["peak_kib"] / f32["peak_kib"]
        line = f"{case} / numpy-f32 peak RSS: {ratio:6.1%}  (target <= 54%)"
        if r.get("base_kib") and f32.get("base_kib"):
            above = (r["peak_kib"] - r["base_kib"]) / (f32["peak_kib"] - f32["base_kib"])
            line += f";  above the imports: {above:6.1%}"
        print(line)
    if "numpy-f16" in reports:
        r = reports["numpy-f16"]
        print(f"lazymath-warm / numpy-f16 peak RSS: "
              f"{reports['lazymath-warm']['peak_kib'] / r['peak_kib']:6.1%}"
              + ("  (numpy-f16 timed out)" if r.get("timed_out") else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
