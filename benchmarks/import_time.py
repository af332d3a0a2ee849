"""`import lazymath` and the first realize in a fresh process (issue 36: a refactor that moves
modules must not make either slower). Each sample is a new interpreter, so nothing is warm but the
OS page cache and lazymath's kernel cache (a fresh LAZYMATH_CACHE_DIR per sample, so the first
relu compiles). Peers in the same run: `import numpy` alone, as the floor every sample pays.

    /work/bin/lmbench python benchmarks/import_time.py --reps 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_PROBE = r"""
import json, time
t0 = time.perf_counter()
import numpy
t1 = time.perf_counter()
if {full}:
    import lazymath as lm
    t2 = time.perf_counter()
    x = lm.asarray(numpy.arange(-500, 500, dtype=numpy.float32))
    lm.maximum(x, 0).realize()
    t3 = time.perf_counter()
else:
    t2 = t3 = t1
print(json.dumps({{"numpy": t1 - t0, "import": t2 - t1, "first_realize": t3 - t2}}))
"""


def sample(full: bool) -> dict[str, float]:
    """One fresh interpreter's timings (seconds), with an empty kernel cache."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "LAZYMATH_CACHE_DIR": d}
        out = subprocess.run(
            [sys.executable, "-c", _PROBE.format(full=full)],
            env=env,
            cwd=d,  # `python -c` puts the cwd first on sys.path: a checkout there shadows it
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    rows = [sample(True) for _ in range(args.reps)]
    np_only = [sample(False)["numpy"] for _ in range(args.reps)]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"reps={args.reps} (medians, fresh process each)")
    print(f"  import numpy alone          {1e3 * statistics.median(np_only):8.1f} ms")
    print(f"  import lazymath (after np)  {1e3 * med['import']:8.1f} ms")
    print(f"  first relu realize, cold    {1e3 * med['first_realize']:8.1f} ms")
    print(f"  ratio import lazymath / numpy {med['import'] / statistics.median(np_only):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
