"""lazymath.distributed: sharded lazy graphs realized on a Dask cluster, like a multi-card NPU.

    import lazymath as lm, lazymath.distributed as ld
    A = ld.shard(np_array_or_dask_array_or_npy_path, axis=0, n=16)
    out = lm.mul(lm.relu(A @ B), 0.5)     # every lazymath op accepts a sharded tensor
    print(lm.explain(out))                # shard programs, collectives, tails
    ld.compute(out)                       # runs on the cluster; results stay on the workers
    out.numpy()                           # gathers;  ld.to_dask(out): a lazy dask.array
    ld.worker_stats()                     # per worker: compiled, program_hits, ...

Owns the planner (`plan.py`: placements, split rules, collectives), the Dask task graph
(`execute.py`), what runs on a worker (`worker.py`), which cluster (`cluster.py`), the
explanation (`Plan.explain` in `plan.py`; `dot.py` the picture) and the multi-device simulation
(`simulate.py`). Needs the optional extra `lazymath[distributed]` (dask and distributed).
"""

from lazymath.distributed.api import (
    Source,
    compute,
    explain,
    gather,
    is_sharded,
    plan,
    shard,
    shards,
    to_dask,
    to_dot,
    worker_stats,
)
from lazymath.distributed.cluster import SCHEDULER_ENV, close, get_client
from lazymath.distributed.plan import Plan, PlanError
from lazymath.distributed.simulate import placeholder, scaling, scaling_table, simulate
from lazymath.distributed.worker import ShardError

__all__ = [
    "SCHEDULER_ENV",
    "Plan",
    "PlanError",
    "ShardError",
    "Source",
    "close",
    "compute",
    "explain",
    "gather",
    "is_sharded",
    "get_client",
    "placeholder",
    "plan",
    "scaling",
    "scaling_table",
    "shard",
    "shards",
    "simulate",
    "to_dask",
    "to_dot",
    "worker_stats",
]
