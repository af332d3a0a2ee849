"""Scale-out on Dask: a batched workload on sharded data read from .npy memory maps.

    pip install -e ".[distributed]" && python examples/distributed.py

The input lives in a .npy file; `ld.shard(path, n=8)` makes a sharded lazymath tensor whose
8 row blocks each worker reads through its own memory map (the data never passes through this
process). The lazy graph relu(A_i @ B) * 0.5 plus a column sum over all rows is planned into one
shard program (the same on every shard: compiled once per worker) and an all-reduce tree for the
sum. With no scheduler address, a LocalCluster with one worker per core starts and stops by
itself (set LAZYMATH_DASK_SCHEDULER=tcp://host:port to use an existing cluster).
"""

import logging
import os
import sys
import tempfile

# this script is named like the `distributed` package: keep its directory off the import path
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import numpy as np  # noqa: E402

import lazymath as lm  # noqa: E402

try:
    from distributed import LocalCluster  # noqa: F401  (the extra is installed)

    import lazymath.distributed as ld
except ImportError as e:  # the optional extra is missing: say so and stop cleanly
    print(f"lazymath.distributed needs dask and distributed (pip install lazymath[distributed]): "
          f"{e}")  # fmt: skip
    sys.exit(0)


def main() -> None:
    logging.getLogger("distributed").setLevel(logging.CRITICAL)  # Dask's shutdown chatter
    rng = np.random.default_rng(0)
    rows, k, n, shards = 8 * 128, 256, 128, 8
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "activations.npy")
        a = rng.standard_normal((rows, k)).astype(np.float32)
        np.save(path, a)
        b = rng.standard_normal((k, n)).astype(np.float32)

        A = ld.shard(path, axis=0, n=shards)  # 8 row blocks, each read by memory map
        B = lm.tensor(b)  # replicated: every shard reads all of it
        out = lm.relu(A @ B) * 0.5  # lazy; every lazymath op accepts a sharded tensor
        colsum = out.sum(axis=0)  # crosses shards: an all-reduce

        print(lm.explain(out, colsum))
        ld.compute(out, colsum)  # embedded LocalCluster (or LAZYMATH_DASK_SCHEDULER)
        for _ in range(2):  # more batches of the same shapes: program-cache hits on the workers
            ld.compute(lm.relu(ld.shard(path, axis=0, n=shards) @ B) * 0.5)

        print("\nper-worker task counts")
        for s in ld.worker_stats():
            print(f"  {s['worker']}: {s['programs_run']} program tasks, {s['combines']} combine "
                  f"tasks, {s['compiled']} kernels compiled, {s['programs_built']} programs "
                  f"built, {s['program_hits']} program-cache hits")  # fmt: skip

        want = np.maximum(a @ b, 0) * 0.5
        got = out.numpy()  # gathers the shards
        err = float(np.max(np.abs(got - want)))
        sum_err = float(np.max(np.abs(colsum.numpy() - want.sum(axis=0))))
        ok = err < 1e-3 and sum_err < 1e-2 * float(np.abs(want).sum(axis=0).max())
        print(f"\nresult check: max |out - numpy| = {err:.2e}, column sums {sum_err:.2e}: "
              f"{'OK' if ok else 'MISMATCH'}")  # fmt: skip
        print(f"as a dask array: {ld.to_dask(out)}")
    ld.close()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":  # the LocalCluster starts worker processes: keep the guard
    main()
